"""TinyBERT's attention distillation against stored attention rows (`hsk dump --attention-rows`).

TinyBERT (Jiao et al., "TinyBERT: Distilling BERT for Natural Language Understanding", Findings of
EMNLP 2020) fits each student layer's attention *scores* (before the softmax) to those of its
mapped teacher layer with an MSE. A store keeps only the rows of the selected query tokens,
[heads, N^L, T] per kept layer, padded keys zeroed; the student's rows are taken at the same
positions, so the loss compares exactly the stored entries.

The student's scores come from `ScoreRecorder`: a forward hook on each self-attention module
recomputes the query and key projections of the call's input (so the fused attention kernel stays
in use, and an SPS student's swapped Q/K pass is recorded as it runs), one entry per call: entry
s - 1 is student layer s.

The method is pipelines/methods/tinybert.py (`tinybert-att`); its loss term `attention_mse`, in
pipelines/train/losses/terms.py, sums `attention_mse` below over the stage's layer pairs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from hskstore.format.config import ConfigError


def _is_self_attention(module: nn.Module) -> bool:
    return (
        isinstance(getattr(module, "query", None), nn.Linear)
        and isinstance(getattr(module, "key", None), nn.Linear)
        and isinstance(getattr(module, "num_attention_heads", None), int)
    )


class ScoreRecorder:
    """`with ScoreRecorder(model) as calls:` records (q, k, heads) of every self-attention call, in order."""

    def __init__(self, model: nn.Module):
        self.modules = [m for m in model.modules() if _is_self_attention(m)]
        if not self.modules:
            raise ConfigError(
                f"attention distillation reads the query/key projections of BERT-like self-attention; "
                f"{type(model).__name__} has none: use a BERT-like student (bert<k>, sps<k>, tinybert4)"
            )
        self.calls: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        self._hooks: list = []

    def _hook(self, module, args, kwargs, output) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        # module.query / module.key as bound now: an SPS student's primed pass has them swapped.
        self.calls.append((module.query(hidden), module.key(hidden), module.num_attention_heads))

    def __enter__(self) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
        self.calls.clear()
        self._hooks = [m.register_forward_hook(self._hook, with_kwargs=True) for m in self.modules]
        return self.calls

    def __exit__(self, *exc) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def score_rows(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Pre-softmax scores [B, heads, N, t] of the query rows at `positions` [B, N] (q, k [B, t, d])."""
    b, t, d = k.shape
    n, head = positions.shape[1], d // num_heads
    rows = q.gather(1, positions.clamp(min=0).long().unsqueeze(-1).expand(-1, -1, d))
    return torch.einsum("bnhe,bthe->bhnt", rows.view(b, n, num_heads, head), k.view(b, t, num_heads, head)) / (
        math.sqrt(head)
    )


def _same_heads(student: torch.Tensor, teacher: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if student.shape[1] != teacher.shape[1]:
        raise ConfigError(
            f"the student has {student.shape[1]} attention heads and the teacher {teacher.shape[1]}: TinyBERT pairs "
            "head h with head h; use a student with the teacher's head count, or --set heads=mean"
        )
    return student, teacher


def _mean_heads(student: torch.Tensor, teacher: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return student.mean(1, keepdim=True), teacher.mean(1, keepdim=True)


# pipelines.registry.HEAD_MAPS -> (student rows, teacher rows) -> the rows the MSE compares
HEAD_MAPS = {"same": _same_heads, "mean": _mean_heads}


def attention_mse(
    student: torch.Tensor, teacher: torch.Tensor, valid: torch.Tensor, key_mask: torch.Tensor, heads: str = "same",
    count: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """TinyBERT's attention loss of one layer: mean squared error of pre-softmax scores.

    student [B, H_S, N, t]; teacher [B, H_T, N, T] with T >= t (keys past t are padding, stored as
    zeros); valid [B, N] used slots; key_mask [B, t] real keys. The mean runs over heads, used slots
    and real keys only (TinyBERT's code averages over every entry of the padded [T, T] map, after
    zeroing masked scores on both sides, so its value depends on the batch's padding).
    heads: "same" pairs head h with teacher head h; "mean" compares the head-averaged rows.
    count: the number of compared entries -> the denominator (losses.local_count by default; under N ranks
    the global count, losses.Counter).
    """
    teacher = teacher[..., : student.shape[-1]].to(student.dtype)
    student, teacher = HEAD_MAPS[heads](student, teacher)
    weight = (valid[:, None, :, None] & key_mask.bool()[:, None, None, :]).to(student.dtype)
    weight = weight.expand_as(student)
    denom = weight.sum()
    # no `if denom == 0` (a host sync): with nothing to compare the sum is 0 over a count of 1
    return ((student - teacher) ** 2 * weight).sum() / (denom.clamp(min=1) if count is None else count(denom))
