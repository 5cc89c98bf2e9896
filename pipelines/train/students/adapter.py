"""The student's forward as fixed output keys, whatever the model (TextBrewer's adaptor idea).

Loss terms read `StudentOutputs` only: `logits` (the task head's [B, C], or the MLM head's [N masked, V]
at the batch's masked positions), `hidden_states` (embeddings first, one entry per effective layer:
an SPS student's repeated pass adds its own), `attentions` and `attention_scores` (the pre-softmax
(q, k, heads) of every self-attention call, pipelines.train.losses.attention.ScoreRecorder). A stage names
what it needs (Stage.outputs); the head it trains picks the adapter (`adapter_for`). Models whose
forward takes no token_type_ids (or has no type vocabulary, as a pruned ROSITA student may not, or a
single type, as RoBERTa) are called without them.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn


@dataclass
class StudentOutputs:
    """What a loss term may read from the student (pipelines.train.losses.terms.TermInputs.outputs)."""

    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    attention_scores: list[Any] | None = None  # (q, k, n_heads) per self-attention call


@functools.cache
def _forward_parameters(model_class: type) -> frozenset[str]:
    """The keyword arguments a model class's forward takes (read once per class, not every step)."""
    return frozenset(inspect.signature(model_class.forward).parameters)


def _inputs(model: nn.Module, batch: dict) -> dict[str, torch.Tensor]:
    kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    # One token type (RoBERTa, XLM-RoBERTa): no segments, so a pair store's second-segment ids are left out.
    if "token_type_ids" in _forward_parameters(type(model)) and (getattr(model.config, "type_vocab_size", 0) or 0) > 1:
        kwargs["token_type_ids"] = batch["token_type_ids"]
    return kwargs


def _call(fn: Any, model: nn.Module, kwargs: dict, outputs: tuple[str, ...]) -> tuple[Any, list | None]:
    """fn(**kwargs) with the outputs asked for; the attention scores recorded when asked."""
    kwargs = {**kwargs, "output_hidden_states": "hidden_states" in outputs}
    if "attentions" in outputs:
        kwargs["output_attentions"] = True
    if "attention_scores" not in outputs:
        return fn(**kwargs), None
    from pipelines.train.losses.attention import ScoreRecorder

    with ScoreRecorder(model) as calls:
        out = fn(**kwargs)
    return out, list(calls)


def classifier_outputs(model: nn.Module, runner: nn.Module | None, batch: dict,
                       outputs: tuple[str, ...]) -> StudentOutputs:
    """A sequence classifier (task or PEA-KD's ptp4 head): logits [B, C]."""
    out, scores = _call(runner or model, model, _inputs(model, batch), outputs)
    return StudentOutputs(out.logits, getattr(out, "hidden_states", None), getattr(out, "attentions", None), scores)


def masked_lm_outputs(model: nn.Module, runner: nn.Module | None, batch: dict,
                      outputs: tuple[str, ...]) -> StudentOutputs:
    """A BertForMaskedLM: the MLM head's logits at the used masked positions only, [N masked, V]
    (batch["positions"] [B, M], -1 = unused; batch["used"] = positions >= 0)."""
    out, scores = _call(model.bert, model, _inputs(model, batch), outputs)
    hidden, positions = out.last_hidden_state, batch["positions"]
    gathered = hidden.gather(1, positions.clamp(min=0)[..., None].expand(-1, -1, hidden.shape[-1]))
    logits = model.cls(gathered[batch["used"]])
    return StudentOutputs(logits, getattr(out, "hidden_states", None), getattr(out, "attentions", None), scores)


def masked_lm_batch(input_ids: np.ndarray, token_type_ids: np.ndarray, length: np.ndarray, positions: np.ndarray,
                    labels: np.ndarray, device: str) -> dict[str, torch.Tensor]:
    """What a masked-LM batch holds for the adapter and the loss terms (numpy in, tensors out): the inputs,
    the masked slots (positions [B, M], -1 = unused; used) and the original token of every used slot."""
    ids = torch.as_tensor(input_ids.astype(np.int64), device=device)
    lengths = torch.as_tensor(length.astype(np.int64), device=device)
    positions = torch.as_tensor(positions.astype(np.int64), device=device)
    used = positions >= 0
    return {"input_ids": ids, "token_type_ids": torch.as_tensor(token_type_ids.astype(np.int64), device=device),
            "attention_mask": (torch.arange(ids.shape[1], device=device)[None, :] < lengths[:, None]).long(),
            "positions": positions, "used": used,
            "mlm_labels": torch.as_tensor(labels.astype(np.int64), device=device)[used]}


def causal_lm_outputs(model: nn.Module, runner: nn.Module | None, batch: dict,
                      outputs: tuple[str, ...]) -> StudentOutputs:
    """An AutoModelForCausalLM: its LM head's logits at every position, [B, T, V] (the terms pick positions)."""
    kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    out, scores = _call(runner or model, model, kwargs, outputs)
    return StudentOutputs(out.logits, getattr(out, "hidden_states", None), getattr(out, "attentions", None), scores)


def seq2seq_outputs(model: nn.Module, runner: nn.Module | None, batch: dict,
                    outputs: tuple[str, ...]) -> StudentOutputs:
    """A seq2seq student (encoder-decoder, or decoder-only on prompt + target): its LM head's logits at the
    target's positions, [B, T, V] (batch["pair"]: pipelines.core.pair_models.PairInputs)."""
    pair = batch["pair"]
    out, scores = _call(runner or model, model, pair.kwargs, outputs)
    return StudentOutputs(pair.target_logits(out.logits), getattr(out, "hidden_states", None),
                          getattr(out, "attentions", None), scores)


# head -> adapter; every other is a classifier's
ADAPTERS = {"mlm": masked_lm_outputs, "clm": causal_lm_outputs, "s2s": seq2seq_outputs}


def adapter_for(head: str):
    return ADAPTERS.get(head, classifier_outputs)
