"""How a family of models reads a source/target pair: the two seq2seq architectures, registered by the name a
seq2seq store records (`selection.architecture`; hskstore.format.seq2seq).

- `encoder-decoder` (AutoModelForSeq2SeqLM: T5, BART, Marian, ...): the encoder reads the source; the decoder
  reads [decoder start] + target[:-1], and its position t predicts target token t.
- `decoder-only` (AutoModelForCausalLM: GPT-2, Llama, SmolLM2, ...): one sequence, the prompt (the source in
  the store's template) then the target; position len(prompt) - 1 + t predicts target token t, and the
  prompt's own tokens carry no loss.

Each gives the teacher-forced inputs of a batch of pairs with, per target position, where its logits are
(`PairInputs`); the teacher's own output (`generate`: greedy or beam search, nothing else of the model's
generation defaults); and a student of the teacher's first k layers. The dump, `hsk train --method s2s-kd`
and `hsk eval --pairs-file` all go through here, so that the three read a pair the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hskstore.format.seq2seq import Decoding, Seq2seqSelection
from pipelines.core.models import ModelLoadError, load_config, resolve_model

if TYPE_CHECKING:
    from transformers import PreTrainedConfig, PreTrainedModel

# The config keys that hold a seq2seq model's encoder and decoder depths (T5: num_layers / num_decoder_layers;
# BART, Marian, mBART, Pegasus: encoder_layers / decoder_layers).
ENCODER_DEPTH_KEYS = ("num_layers", "encoder_layers")
DECODER_DEPTH_KEYS = ("num_decoder_layers", "decoder_layers")


@dataclass
class PairInputs:
    """A batch of pairs as the model's forward takes them, and where each target position's logits are:
    `index` [b, T] into the sequence axis (decoder-only), or None (the decoder's positions are the target's)."""

    kwargs: dict[str, torch.Tensor]
    index: torch.Tensor | None

    def target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """[b, L, V] -> [b, T, V]: position t's logits predict target token t."""
        if self.index is None:
            return logits
        return logits.gather(1, self.index[..., None].expand(-1, -1, logits.shape[-1]))


def _mask(lengths: np.ndarray, width: int, device: str) -> torch.Tensor:
    return torch.as_tensor(np.arange(width)[None, :] < lengths[:, None], device=device).long()


def _strip(out: torch.Tensor, eos_id: int) -> list[list[int]]:
    """Generated ids -> each sequence up to and including its first EOS."""
    rows = []
    for seq in out.tolist():
        rows.append(seq[: seq.index(eos_id) + 1] if eos_id in seq else seq)
    return rows


def _generate(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, decoding: Decoding,
              sel: Seq2seqSelection) -> torch.Tensor:
    """Plain greedy or beam search. The model's own generation defaults (forced tokens, length penalties,
    n-gram blocking, sampling) are set aside for the call, not merged in: the recorded options say everything."""
    from transformers import GenerationConfig

    plain = GenerationConfig(max_new_tokens=decoding.max_new_tokens, num_beams=decoding.beams, do_sample=False,
                             eos_token_id=sel.eos_id, pad_token_id=sel.pad_id,
                             decoder_start_token_id=sel.decoder_start_id, early_stopping=decoding.beams > 1)
    own, model.generation_config = model.generation_config, plain
    try:
        return model.generate(input_ids=input_ids, attention_mask=attention_mask)
    finally:
        model.generation_config = own


@dataclass(frozen=True)
class PairModel:
    """One architecture: its loader, teacher-forced inputs, generation and first-k student."""

    name: str
    auto_class: str  # the transformers Auto class that loads it
    inputs: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Seq2seqSelection, str], PairInputs]
    generate: Callable[[Any, np.ndarray, np.ndarray, Decoding, Seq2seqSelection], list[list[int]]]
    depth_keys: Callable[[Any], list[str]]  # the config keys first<k> sets to k

    def load(self, name: str, device: str, **config_changes: Any) -> Any:
        import transformers

        auto = getattr(transformers, self.auto_class)
        try:
            model = auto.from_pretrained(resolve_model(name), dtype=torch.float32, **config_changes)
        except Exception as exc:  # transformers raises many kinds; say what to pass instead
            raise ModelLoadError(f"cannot load {name} as an {self.name} model ({str(exc).splitlines()[0][:200]}): "
                                 f"pass a folder or hub id of an {self.auto_class}") from None
        return model.to(device).eval()

    def first_layers(self, teacher: str, k: int, device: str) -> Any:
        """The teacher's first k layers (of the encoder and of the decoder), with its embeddings and LM head."""
        config = load_config(teacher)
        keys = self.depth_keys(config)
        depth = min(getattr(config, key) for key in keys)
        if not 1 <= k <= depth:
            raise ModelLoadError(f"first{k} needs 1..{depth} layers of the store's teacher {teacher}")
        return self.load(teacher, device, **dict.fromkeys(keys, k)).train()


def encoder_decoder_inputs(source: np.ndarray, source_length: np.ndarray, target: np.ndarray,
                           target_length: np.ndarray, sel: Seq2seqSelection, device: str) -> PairInputs:
    decoder = np.empty_like(target)
    decoder[:, 0] = sel.decoder_start_id
    decoder[:, 1:] = target[:, :-1]
    kwargs = {"input_ids": torch.as_tensor(source.astype(np.int64), device=device),
              "attention_mask": _mask(source_length, source.shape[1], device),
              "decoder_input_ids": torch.as_tensor(decoder.astype(np.int64), device=device)}
    return PairInputs(kwargs, None)


def decoder_only_inputs(source: np.ndarray, source_length: np.ndarray, target: np.ndarray,
                        target_length: np.ndarray, sel: Seq2seqSelection, device: str) -> PairInputs:
    width = int((source_length + target_length).max(initial=1))
    seq = np.full((len(source), width), sel.pad_id, dtype=np.int64)
    for i, (ls, lt) in enumerate(zip(source_length, target_length)):
        seq[i, :ls] = source[i, :ls]
        seq[i, ls:ls + lt] = target[i, :lt]
    index = np.clip(source_length[:, None] - 1 + np.arange(target.shape[1])[None, :], 0, width - 1)
    kwargs = {"input_ids": torch.as_tensor(seq, device=device),
              "attention_mask": _mask(source_length + target_length, width, device)}
    return PairInputs(kwargs, torch.as_tensor(index.astype(np.int64), device=device))


@torch.no_grad()
def encoder_decoder_generate(model: PreTrainedModel, source: np.ndarray, source_length: np.ndarray, decoding: Decoding,
                             sel: Seq2seqSelection) -> list[list[int]]:
    device = model.device
    out = _generate(model, torch.as_tensor(source.astype(np.int64), device=device),
                    _mask(source_length, source.shape[1], device), decoding, sel)
    return _strip(out[:, 1:].cpu(), sel.eos_id)  # the first is the decoder's start


@torch.no_grad()
def decoder_only_generate(model: PreTrainedModel, source: np.ndarray, source_length: np.ndarray, decoding: Decoding,
                          sel: Seq2seqSelection) -> list[list[int]]:
    """Prompts padded on the left (generation continues each at the right edge)."""
    width = int(source_length.max(initial=1))
    left = np.full((len(source), width), sel.pad_id, dtype=np.int64)
    for i, length in enumerate(source_length):
        left[i, width - length:] = source[i, :length]
    mask = torch.as_tensor(np.arange(width)[None, :] >= width - source_length[:, None], device=model.device).long()
    out = _generate(model, torch.as_tensor(left, device=model.device), mask, decoding, sel)
    return _strip(out[:, width:].cpu(), sel.eos_id)


def _encoder_decoder_depths(config: PreTrainedConfig) -> list[str]:
    keys = [key for group in (ENCODER_DEPTH_KEYS, DECODER_DEPTH_KEYS) for key in group if hasattr(config, key)]
    if len(keys) != 2:
        raise ModelLoadError(f"first<k> does not know where a {config.model_type} config keeps its encoder and "
                             f"decoder depths (looked for {ENCODER_DEPTH_KEYS} and {DECODER_DEPTH_KEYS}); pass a "
                             "student folder instead")
    return keys


PAIR_MODELS: dict[str, PairModel] = {
    "encoder-decoder": PairModel("encoder-decoder", "AutoModelForSeq2SeqLM", encoder_decoder_inputs,
                                 encoder_decoder_generate, _encoder_decoder_depths),
    "decoder-only": PairModel("decoder-only", "AutoModelForCausalLM", decoder_only_inputs, decoder_only_generate,
                              lambda config: ["num_hidden_layers"]),
}


def architecture_of(model_name: str) -> str:
    """The architecture a model's config declares (`is_encoder_decoder`)."""
    return "encoder-decoder" if getattr(load_config(model_name), "is_encoder_decoder", False) else "decoder-only"


def pair_model(architecture: str) -> PairModel:
    if architecture not in PAIR_MODELS:
        raise ModelLoadError(f"no seq2seq architecture {architecture!r}; known: {', '.join(PAIR_MODELS)}")
    return PAIR_MODELS[architecture]
