"""The student's forward as fixed output keys, whatever the model (TextBrewer's adaptor idea).

Loss terms read `StudentOutputs` only: `logits` (the task head's [B, C], or the MLM head's [N masked, V]
at the batch's masked positions), `hidden_states` (embeddings first, one entry per effective layer:
an SPS student's repeated pass adds its own), `attentions` and `attention_scores` (the pre-softmax
(q, k, heads) of every self-attention call, pipelines.train.losses.attention.ScoreRecorder). A stage names
what it needs (Stage.outputs); the head it trains picks the adapter (`adapter_for`), registered by head name
with `student_adapter` (a package's kind declares its head with pipelines.registry.declare_head). Models whose
forward takes no token_type_ids (or has no type vocabulary, as a pruned ROSITA student may not, or a
single type, as RoBERTa) are called without them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from pipelines import registry
from pipelines.registry import MethodError


@dataclass
class StudentOutputs:
    """What a loss term may read from the student (pipelines.train.losses.terms.TermInputs.outputs)."""

    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    attention_scores: list[Any] | None = None  # (q, k, n_heads) per self-attention call


# (model, runner or None, batch, outputs asked for) -> the outputs
Adapter = Callable[[nn.Module, nn.Module | None, dict, tuple[str, ...]], StudentOutputs]
ADAPTERS: dict[str, Adapter] = {}  # head (pipelines.registry.HEADS) -> what the student's forward returns


def student_adapter(*heads: str) -> Callable[[Adapter], Adapter]:
    """Register `fn` as the student's forward for each of `heads`, declared in pipelines.registry.HEADS."""

    def add(fn: Adapter) -> Adapter:
        for head in heads:
            if head not in registry.HEADS:
                raise ValueError(f"head {head!r} is not declared: call pipelines.registry.declare_head first")
            if head in ADAPTERS:
                raise ValueError(f"head {head!r} already has an adapter ({ADAPTERS[head].__name__})")
            ADAPTERS[head] = fn
        return fn

    return add


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


@student_adapter("task", "ptp4")
def classifier_outputs(model: nn.Module, runner: nn.Module | None, batch: dict,
                       outputs: tuple[str, ...]) -> StudentOutputs:
    """A sequence classifier (task or PEA-KD's ptp4 head): logits [B, C]."""
    out, scores = _call(runner or model, model, _inputs(model, batch), outputs)
    return StudentOutputs(out.logits, getattr(out, "hidden_states", None), getattr(out, "attentions", None), scores)


@student_adapter("mlm")
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


@student_adapter("clm")
def causal_lm_outputs(model: nn.Module, runner: nn.Module | None, batch: dict,
                      outputs: tuple[str, ...]) -> StudentOutputs:
    """An AutoModelForCausalLM: its LM head's logits at every position, [B, T, V] (the terms pick positions)."""
    kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    out, scores = _call(runner or model, model, kwargs, outputs)
    return StudentOutputs(out.logits, getattr(out, "hidden_states", None), getattr(out, "attentions", None), scores)


@student_adapter("s2s")
def seq2seq_outputs(model: nn.Module, runner: nn.Module | None, batch: dict,
                    outputs: tuple[str, ...]) -> StudentOutputs:
    """A seq2seq student (encoder-decoder, or decoder-only on prompt + target): its LM head's logits at the
    target's positions, [B, T, V] (batch["pair"]: pipelines.core.pair_models.PairInputs)."""
    pair = batch["pair"]
    out, scores = _call(runner or model, model, pair.kwargs, outputs)
    return StudentOutputs(pair.target_logits(out.logits), getattr(out, "hidden_states", None),
                          getattr(out, "attentions", None), scores)


def adapter_for(head: str) -> Adapter:
    """The student's forward for a stage training `head`; a one-line MethodError for a head none registered."""
    try:
        return ADAPTERS[head]
    except KeyError:
        raise MethodError(f"head {head!r} has no student adapter; known: {', '.join(ADAPTERS)} (a package's kind "
                          "registers its own with pipelines.train.students.adapter.student_adapter)") from None
