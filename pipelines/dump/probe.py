"""One teacher forward that yields logits, hidden states and the [CLS] attention score rows.

Only the [CLS] query row of a ranking layer is needed; how it is read depends on the architecture
(pipelines/dump/scores.py): never by asking the model for attention probabilities, which would force the
slow eager attention and materialise every [T, T] map. For TinyBERT's attention rows (`attention_layers`),
the whole query and key of those layers are kept instead: which query rows are stored is decided after
ranking, on the host.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

from pipelines.dump.scores import UnsupportedTeacherError, attention_projections, make_reader

__all__ = ["ProbeOutput", "TeacherProbe", "UnsupportedTeacherError", "attention_projections"]


@dataclass
class ProbeOutput:
    logits: torch.Tensor  # [B, C]
    hidden: dict[int, torch.Tensor]  # teacher layer (0 = embeddings) -> [B, T, d]
    cls_scores: dict[int, torch.Tensor]  # attention layer (1..L) -> [B, heads, T] pre-softmax [CLS] rows
    qk: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # layer -> [B, T, d] Q, K

    def start_host_copy(self) -> tuple[ProbeOutput, torch.cuda.Event | None]:
        """A host copy of this output, started without waiting: wait on the event before reading it.

        Copying right after the forward, before the next forward is queued, lets the device run
        that forward while the host selects from this one. Outputs already on the CPU come back
        as they are, with no event.
        """
        if self.logits.device.type != "cuda":
            return self, None

        def start(x: torch.Tensor) -> torch.Tensor:
            return torch.empty(x.shape, dtype=x.dtype, pin_memory=True).copy_(x, non_blocking=True)

        copy = ProbeOutput(
            start(self.logits),
            {j: start(h) for j, h in self.hidden.items()},
            {layer: start(s) for layer, s in self.cls_scores.items()},
            {layer: (start(q), start(k)) for layer, (q, k) in self.qk.items()},
        )
        done = torch.cuda.Event()
        done.record()
        return copy, done


class TeacherProbe:
    """Wraps a sequence classifier; call it on a batch to get a ProbeOutput."""

    def __init__(self, model: nn.Module, ranking_layers: list[int], attention_layers: list[int] = ()):
        self.model = model
        cfg = model.config
        self.num_heads = getattr(cfg, "num_attention_heads", None) or cfg.n_heads
        if ranking_layers and getattr(cfg, "pruned_heads", None):
            # Head-averaged [CLS] rows assume the config's head count in every layer.
            raise UnsupportedTeacherError(
                "this teacher has pruned attention heads (a ROSITA student): dump its plain/ export, or a "
                "logits-only config (0,0,0)"
            )
        self.ranking_layers = sorted(set(ranking_layers))
        self.attention_layers = sorted(set(attention_layers))
        needed = self.ranking_layers or self.attention_layers
        self.reader = make_reader(model, self.ranking_layers, self.attention_layers, self.num_heads) if needed else None

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()

    @torch.inference_mode()
    def __call__(self, input_ids, token_type_ids, attention_mask, hidden_layers: list[int]) -> ProbeOutput:
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        # One token type (RoBERTa, XLM-RoBERTa): no segments; none at all (DeBERTa-v3, ModernBERT)
        if token_type_ids is not None and (getattr(self.model.config, "type_vocab_size", 0) or 0) > 1:
            kwargs["token_type_ids"] = token_type_ids
        with self.reader.active() if self.reader is not None else nullcontext():
            out = self.model(**kwargs, output_hidden_states=bool(hidden_layers))
        hidden = {j: out.hidden_states[j] for j in hidden_layers}
        if self.reader is None:
            return ProbeOutput(out.logits, hidden, {})
        scores = {layer: self.reader.cls_rows[layer] for layer in self.ranking_layers}
        qk = {layer: self.reader.qk[layer] for layer in self.attention_layers}
        return ProbeOutput(out.logits, hidden, scores, qk)
