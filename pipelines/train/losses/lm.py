"""Losses of causal-LM distillation from a sparse support, per position (rows of [N, V] student log-probs).

Teacher targets come as a support: ids [N, S] with probabilities p [N, S] and `used` [N, S] (the slots that
hold an id). Each function returns the per-position loss [N]; the caller averages.

- `topk_tail_kl`: KL over the K stored ids plus one tail bucket (the teacher's tail mass 1 - sum p against the
  student's mass outside the ids): exact KL between the two distributions coarsened to K + 1 outcomes.
- `topk_renormalized_kl`: both distributions renormalized over the K ids (sparse KD as DistillKit and
  MaxText do it); biased: it ignores where the student puts its tail.
- `sampled_ce`: RS-KD. With p = counts / draws from N draws of the teacher, -sum p log q is an unbiased
  estimate of the cross-entropy H(teacher, student), whose gradient in the student's logits is q - p_teacher,
  the full-vocabulary KL's: so its expected gradient is the full KL's gradient.
- `full_kl`: KL(teacher || student) over the whole vocabulary (a live teacher's log-probs).
"""

from __future__ import annotations

import torch

TAIL_FLOOR = -80.0  # log-mass below which a tail counts as empty (exp(-80) ~ 1e-35)


def _gathered(student_logprobs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return student_logprobs.gather(-1, ids)


def topk_tail_kl(student_logprobs: torch.Tensor, ids: torch.Tensor, p: torch.Tensor,
                 used: torch.Tensor) -> torch.Tensor:
    """KL((p_1..p_K, tail) || (q_1..q_K, q_tail)) per position; ids of a position are distinct."""
    p = p * used
    q = _gathered(student_logprobs, ids)
    tail = (1.0 - p.sum(-1)).clamp(min=0.0)
    outside = student_logprobs.scatter(-1, ids, float("-inf"))  # the student's log-mass outside the ids
    # floored: when the ids cover the vocabulary the student's tail is exp(-inf), and the teacher's is 0 up to
    # rounding; 0 * -inf would be NaN
    log_q_tail = torch.logsumexp(outside, -1).clamp(min=TAIL_FLOOR)
    support = (torch.xlogy(p, p) - p * q).sum(-1)
    return support + torch.xlogy(tail, tail) - tail * log_q_tail


def topk_renormalized_kl(student_logprobs: torch.Tensor, ids: torch.Tensor, p: torch.Tensor,
                         used: torch.Tensor) -> torch.Tensor:
    """KL of the two distributions renormalized over the stored ids."""
    p = p * used
    p = p / p.sum(-1, keepdim=True).clamp(min=1e-12)
    q = _gathered(student_logprobs, ids).masked_fill(~used, float("-inf"))
    q = torch.log_softmax(q, -1)
    return (torch.xlogy(p, p) - p * q.masked_fill(~used, 0.0)).sum(-1)


def sampled_ce(student_logprobs: torch.Tensor, ids: torch.Tensor, p: torch.Tensor, used: torch.Tensor) -> torch.Tensor:
    """-sum (count / draws) log q(id): the RS-KD estimate of H(teacher, student)."""
    return -(p * used * _gathered(student_logprobs, ids)).sum(-1)


def full_kl(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    return (teacher_logprobs.exp() * (teacher_logprobs - student_logprobs)).sum(-1)


def next_token_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each position's next token [N]."""
    return torch.nn.functional.cross_entropy(logits.float(), labels, reduction="none")


# Cross-tokenizer distillation (pipelines/methods/xtok.py): the student's tokens are not the teacher's.


def uld_l1(student_probs: torch.Tensor, p: torch.Tensor, used: torch.Tensor, tail: bool) -> torch.Tensor:
    """Universal Logit Distillation (Boizard et al. 2024), per position: sum_i |p_(i) - q_(i)| between the
    teacher's probabilities and the student's, each sorted in decreasing order, the shorter padded with zeros.
    The teacher keeps S slots (top-K, or a sample's distinct ids); the student's vector is its top S, and the
    rest of its mass is compared with the teacher's tail as one more entry (`tail`: the mass outside a top-K
    support) or with zeros (no tail: a sampled support's counts sum to 1). With a support covering the whole
    vocabulary both readings are the paper's: the student's mass past S meets the teacher's zero padding."""
    slots = p.shape[-1]
    p_sorted = (p * used).sort(-1, descending=True).values
    q_top = student_probs.topk(min(slots, student_probs.shape[-1]), -1).values
    if q_top.shape[-1] < slots:  # a student vocabulary smaller than the support: zeros past it
        q_top = torch.nn.functional.pad(q_top, (0, slots - q_top.shape[-1]))
    rest = (1.0 - q_top.sum(-1)).clamp(min=0.0)
    p_rest = (1.0 - p_sorted.sum(-1)).clamp(min=0.0) if tail else torch.zeros_like(rest)
    return (p_sorted - q_top).abs().sum(-1) + (p_rest - rest).abs()


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x <= 0, stable at both ends (Maechler 2012)."""
    x = x.clamp(max=-1e-7)
    return torch.where(x > -0.6931, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def binary_kl(teacher_log: torch.Tensor, student_log: torch.Tensor) -> torch.Tensor:
    """KL(Bernoulli(p) || Bernoulli(q)) from log p and log q, p and q the teacher's and the student's likelihood
    of one chunk of text: ALM's binarised distance (Minixhofer et al. 2025, 'approximate likelihood matching')."""
    p = teacher_log.exp()
    return (p * (teacher_log - student_log)
            + (1.0 - p) * (_log1mexp(teacher_log) - _log1mexp(student_log)))


def mapped_ce(student_logprobs: torch.Tensor, ids: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """-sum p log q(id) over a support mapped onto the student's ids (p renormalized over the mapped ids, 0 at
    the others): KL(p || q) less the teacher's entropy, a constant (MinED, FuseLLM)."""
    return -(p * student_logprobs.gather(-1, ids)).sum(-1)
