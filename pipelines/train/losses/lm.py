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
