"""PEA-KD's Shuffled Parameter Sharing (SPS) students: `--student sps<k>`.

A k-layer SPS student holds the parameters of k BERT layers and runs them twice: L1..Lk, then the
top r of them again, L(k-r+1)'..Lk', where a primed layer reuses its layer's parameters with the
Query and Key projections swapped (the Query Linear computes keys and the Key Linear queries). The
paper repeats every layer of 1-, 2- and 3-layer students (r = k) and only the top 3 of a 6-layer
student; for k >= 4 we repeat the top 3 (r = min(k, 3)) unless `sps_repeat` says otherwise.

The model is a BERT whose encoder follows that schedule, so its parameter names are BERT's own
(bert.encoder.layer.<i>.*, i < k) and `hidden_states` has one entry per *effective* layer
(k + r + 1 with the embeddings). It saves with its own config class (`model_type` "hsk_sps"),
registered with the transformers Auto classes when this module is imported: no remote code. Its
`save_pretrained` also writes a model card saying what loads where.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
)
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions
from transformers.models.bert.modeling_bert import BertEncoder, BertLayer, BertSelfAttention
from transformers.utils.output_capturing import OutputRecorder

SPS_MODEL_TYPE = "hsk_sps"
MAX_REPEATED = 3  # PEA-KD repeats at most the top 3 layers (its 6-layer student)


def default_repeat(num_layers: int) -> int:
    """How many top layers run a second time: all of a k <= 3 student, the top 3 otherwise."""
    return min(num_layers, MAX_REPEATED)


class SPSConfig(BertConfig):
    """A BERT config plus `sps_repeat`: the number of top layers run again with Q/K swapped."""

    model_type = SPS_MODEL_TYPE
    sps_repeat: int | None = None

    def __post_init__(self, **kwargs) -> None:
        if self.sps_repeat is None:
            self.sps_repeat = default_repeat(self.num_hidden_layers)
        if not 1 <= self.sps_repeat <= self.num_hidden_layers:
            raise ValueError(f"sps_repeat must be in 1..{self.num_hidden_layers}, got {self.sps_repeat}")
        if self.is_decoder or self.add_cross_attention:
            raise ValueError("SPS students are encoders: is_decoder and add_cross_attention must be False")
        super().__post_init__(**kwargs)

    @property
    def sps_effective_layers(self) -> int:
        """Layers the forward runs: k + r (what a layer map and hidden_states count)."""
        return self.num_hidden_layers + self.sps_repeat

    def sps_schedule(self) -> list[tuple[int, bool]]:
        """(parameter layer index, Q/K swapped) for each effective layer, bottom to top."""
        k = self.num_hidden_layers
        return [(i, False) for i in range(k)] + [(i, True) for i in range(k - self.sps_repeat, k)]


@contextlib.contextmanager
def swapped_qk(attention: BertSelfAttention) -> Iterator[None]:
    """Within the block, `attention` computes queries with its Key Linear and keys with its Query Linear."""
    query, key = attention.query, attention.key
    attention.query, attention.key = key, query
    try:
        yield
    finally:
        attention.query, attention.key = query, key


class SPSEncoder(BertEncoder):
    """BertEncoder running `config.sps_schedule()`: each layer's output is recorded as it runs."""

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        past_key_values=None,
        use_cache=None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        for index, swapped in self.config.sps_schedule():
            layer = self.layer[index]
            with swapped_qk(layer.attention.self) if swapped else contextlib.nullcontext():
                hidden_states = layer(hidden_states, attention_mask, **kwargs)
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states)


def _hidden_states_recorder() -> OutputRecorder:
    """hidden_states are recorded per call of a BertLayer, so the repeated pass adds its own entries.

    Where transformers can resolve negative `output_hidden_states` indices (`num_hidden_layers_key`;
    5.24 has it, 5.17 does not), they count effective layers; older versions lack the field, and hsk asks only
    for all hidden states (a flag), which needs no count.
    """
    if "num_hidden_layers_key" in {f.name for f in dataclasses.fields(OutputRecorder)}:
        return OutputRecorder(BertLayer, index=0, num_hidden_layers_key="sps_effective_layers")
    return OutputRecorder(BertLayer, index=0)


_RECORD = {"hidden_states": _hidden_states_recorder(), "attentions": OutputRecorder(BertSelfAttention, index=1)}


class SPSModel(BertModel):
    config_class = SPSConfig
    _can_record_outputs = _RECORD

    def __init__(self, config: SPSConfig, add_pooling_layer: bool = True):
        super().__init__(config, add_pooling_layer=add_pooling_layer)
        self.encoder = SPSEncoder(config)
        self.post_init()


class SPSForSequenceClassification(BertForSequenceClassification):
    config_class = SPSConfig
    _can_record_outputs = _RECORD

    def __init__(self, config: SPSConfig):
        super().__init__(config)
        self.bert = SPSModel(config)
        self.post_init()

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        super().save_pretrained(save_directory, *args, **kwargs)
        Path(save_directory, "README.md").write_text(model_card(self.config))


def sps_from_bert(model: BertForSequenceClassification, repeat: int | None = None) -> SPSForSequenceClassification:
    """The SPS student over the very parameters of a k-layer BERT classifier (e.g. bert<k>)."""
    fields = model.config.to_dict()
    for key in ("model_type", "architectures", "transformers_version"):
        fields.pop(key, None)
    config = SPSConfig(**fields, sps_repeat=repeat)
    config._attn_implementation = model.config._attn_implementation
    sps = SPSForSequenceClassification(config)
    sps.load_state_dict(model.state_dict(), strict=True)
    return sps.to(next(model.parameters()).device).train(model.training)


def model_card(config: SPSConfig) -> str:
    k, r = config.num_hidden_layers, config.sps_repeat
    order = ", ".join(f"L{i + 1}{chr(39) if swapped else ''}" for i, swapped in config.sps_schedule())
    return f"""# SPS student (PEA-KD shuffled parameter sharing), written by hsk

- Parameters: {k} BERT layers (`bert.encoder.layer.0` .. `bert.encoder.layer.{k - 1}`), BERT's own
  parameter names, plus the embeddings, pooler and classifier of a `BertForSequenceClassification`.
- Forward: {k + r} effective layers, in this order: {order}. A primed layer L' reuses L's parameters
  with the Query and Key projections swapped (the `key` Linear makes the queries, `query` the keys).
  `hidden_states` has {k + r + 1} entries (embeddings first).
- Config: `model_type` "{SPS_MODEL_TYPE}", field `sps_repeat` = {r} (the top layers run a second time).

## Loading

```python
import pipelines.train.students.sps  # registers the SPS classes with the transformers Auto classes (hsk installed)
from transformers import AutoModelForSequenceClassification
model = AutoModelForSequenceClassification.from_pretrained("THIS_FOLDER")
```

Without hsk, transformers does not know `model_type` "{SPS_MODEL_TYPE}" and refuses the folder. Loading
the weights into a plain `BertForSequenceClassification` (e.g. with `config=BertConfig.from_pretrained`)
gives every tensor a home but runs only L1..L{k}: different outputs from the model trained here.
"""


def _register() -> None:
    AutoConfig.register(SPS_MODEL_TYPE, SPSConfig, exist_ok=True)
    AutoModel.register(SPSConfig, SPSModel, exist_ok=True)
    AutoModelForSequenceClassification.register(SPSConfig, SPSForSequenceClassification, exist_ok=True)


_register()

__all__ = ["SPSConfig", "SPSForSequenceClassification", "SPSModel", "model_card", "sps_from_bert", "swapped_qk"]

