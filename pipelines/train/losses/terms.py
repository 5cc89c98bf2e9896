"""Distillation losses as pure torch functions, and LOSS_TERMS: the implementation of every loss term name.

Every function takes plain tensors and returns a scalar tensor (or labels), so offline training
(targets from a store) and online training (targets from a live teacher) share them exactly.

The names are declared, torch-free, in pipelines.registry.LOSS_TERMS (a Term naming an undeclared
one is refused when it is built); `LOSS_TERMS` here maps each of them to its function. The terms of
one method sit together below, under a heading naming the method's module; method-specific maths
lives in a train module of its own (TinyBERT: attention.py; PEA-KD: ptp.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipelines import registry
from pipelines.methods.ptp import IGNORE, NUM_PTP_CLASSES, PTPThresholds
from pipelines.train.losses import lm
from pipelines.train.losses.attention import attention_mse, score_rows
from pipelines.train.losses.ptp import ptp_labels

# A term's denominator from this rank's count of what it averages over (a tensor): the count itself in one
# process (at least 1: an empty batch gives 0, not NaN), the mean count per rank under N ranks
# (pipelines.train.run.ddp.Ranks.mean_count), so that the ranks' losses average to the global batch's loss.
Counter = Callable[[torch.Tensor], torch.Tensor]


def local_count(count: torch.Tensor) -> torch.Tensor:
    """One process: the count itself (0 read as 1: the sum is then 0, the graph kept). No host sync."""
    return count.clamp(min=1)


def gather_positions(hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """hidden [B, T, d] at positions [B, N] (negative = unused slot, read as position 0) -> [B, N, d]."""
    idx = positions.clamp(min=0).long()
    return hidden.gather(1, idx.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))


def hsk_mse(
    student_hidden: torch.Tensor,
    positions: torch.Tensor,
    valid: torch.Tensor,
    teacher_dense: torch.Tensor,
    projection: nn.Module | None = None,
    masked_only: bool = False,
    count: Counter = local_count,
) -> torch.Tensor:
    """HSK loss of one kept layer: MSE(W * H^S_s, masked H^T_g(s)) at the stored token positions.

    docs/methods/mud.md: the teacher vector is zero-filled where the width mask dropped it,
    the student vector is not masked, and the squared error is averaged over all d_T elements of
    every valid token (slots of texts shorter than N^L are left out). The caller sums over layers.

    student_hidden [B, T, d_S]; positions [B, N^L] long; valid [B, N^L] bool; teacher_dense
    [B, N^L, d_T] float; projection: the shared Linear(d_S -> d_T) (None when d_S = d_T).
    masked_only=True averages over the kept (non-zero) teacher elements only: an option the paper
    does not use, never the default (a kept activation that is exactly 0.0 counts as dropped).
    `count` turns the number of averaged elements into the denominator (under N ranks: the global one).
    The error is summed in float32 whatever the autocast precision (a bf16 count is not exact past 256).
    """
    picked = gather_positions(student_hidden, positions)
    if projection is not None:
        picked = projection(picked)
    picked = picked.float()
    target = teacher_dense.float()
    if picked.shape[-1] != target.shape[-1]:
        raise ValueError(
            f"student vectors have width {picked.shape[-1]} but teacher vectors {target.shape[-1]}: "
            "a projection Linear(d_S -> d_T) is needed"
        )
    weight = valid.to(picked.dtype).unsqueeze(-1).expand_as(picked)
    if masked_only:
        weight = weight * (target != 0).to(picked.dtype)
    # no `if denom == 0` (a host sync): an empty batch sums to 0 over a count of 1, keeping the graph
    return ((picked - target) ** 2 * weight).sum() / count(weight.sum())


def soft_cross_entropy(student_logits: torch.Tensor, teacher_logits: torch.Tensor, T: float = 1.0) -> torch.Tensor:
    """Prediction distillation (docs/methods/mud.md): -sum softmax(t/T) log softmax(s/T), batch mean.

    TinyBERT's reference code takes .mean() over batch and classes, i.e. this value / C; with Adam
    the constant factor does not change training, so we keep the textbook per-example sum.
    """
    target = F.softmax(teacher_logits.float() / T, dim=-1)
    return -(target * F.log_softmax(student_logits.float() / T, dim=-1)).sum(dim=-1).mean()


def kd_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    T: float,
    alpha: float,
) -> torch.Tensor:
    """Vanilla KD (docs/methods/kd.md): (1 - a) CE(y, s) + a T^2 KL(softmax(t/T) || softmax(s/T)).

    KL is averaged over the batch; rows without a gold label (label < 0) only contribute the KD term.
    """
    s, t = student_logits.float(), teacher_logits.float()
    kl = F.kl_div(F.log_softmax(s / T, dim=-1), F.log_softmax(t / T, dim=-1), reduction="batchmean", log_target=True)
    labels = labels.long()
    has_label = labels >= 0
    ce = F.cross_entropy(s[has_label], labels[has_label]) if has_label.any() else s.sum() * 0.0
    return (1.0 - alpha) * ce + alpha * T * T * kl


def regression_mse(student_scores: torch.Tensor, gold: torch.Tensor, count: Counter = local_count) -> torch.Tensor:
    """Stage 2 for regression tasks (STS-B, docs/methods/mud.md): MSE to the gold score, NaN = no label.
    Unlabelled rows are zeroed, not indexed out (boolean indexing waits for the device)."""
    pred = student_scores.float().reshape(-1)
    gold = gold.float().reshape(-1)
    keep = ~torch.isnan(gold)
    error = torch.where(keep, pred - torch.nan_to_num(gold), torch.zeros_like(pred))
    return (error**2).sum() / count(keep.sum())


def pkd_loss(student_cls_list: list[torch.Tensor], teacher_cls_list: list[torch.Tensor]) -> torch.Tensor:
    """Patient KD (docs/methods/pkd.md): MSE between L2-normalised [CLS] vectors, mean over elements.

    Lists of [B, d] tensors, one per layer pair (student layers 1..S-1 vs teacher layers I_pt). As in
    the authors' code the pairs are stacked and averaged over all elements, hence the large beta.
    """
    if len(student_cls_list) != len(teacher_cls_list) or not student_cls_list:
        raise ValueError(f"pkd_loss needs equal, non-empty lists ({len(student_cls_list)} vs {len(teacher_cls_list)})")
    s = F.normalize(torch.stack([x.float() for x in student_cls_list], dim=1), p=2, dim=-1)
    t = F.normalize(torch.stack([x.float() for x in teacher_cls_list], dim=1), p=2, dim=-1)
    return F.mse_loss(s, t)


def lightpaff_rows(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                   lam: float) -> torch.Tensor:
    """LightPAFF fine-tuning: mean over rows of (1 - l) CE(gold) + l KL(teacher || student) where gold exists,
    KL alone where not (pipelines/methods/lightpaff.py)."""
    log_q = F.log_softmax(student_logits.float(), dim=-1)
    log_p = F.log_softmax(teacher_logits.float(), dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    labels = labels.long()
    has_label = labels >= 0
    ce = -log_q.gather(-1, labels.clamp(min=0)[:, None])[:, 0]
    per_row = torch.where(has_label, (1.0 - lam) * ce + lam * kl, kl)
    return per_row.mean()


def topk_probs(topk_logits: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher probabilities of the stored top-k ids [..., k] and the mass outside them [...] (MLM store)."""
    p = torch.exp(topk_logits.double() - lse.double()[..., None])
    return p, (1.0 - p.sum(-1)).clamp(min=0.0)


def topk_kl(
    student_logits: torch.Tensor, topk_ids: torch.Tensor, topk_logits: torch.Tensor, lse: torch.Tensor
) -> torch.Tensor:
    """KL(teacher || student) over the teacher's stored top-k ids plus one tail bucket, mean over positions.

    student_logits [N, V]; topk_ids, topk_logits [N, k]; lse [N] (the teacher's full log-sum-exp).
    Both distributions are read on the same k + 1 outcomes: each kept id, and "any other id" with
    the remaining mass (1 - sum of the kept probabilities). This is the full-vocabulary KL with the
    non-kept ids merged into one outcome, a lower bound of the full KL (LightPAFF, METHOD.md section 9).
    """
    p, p_tail = topk_probs(topk_logits, lse)
    log_q = F.log_softmax(student_logits.double(), dim=-1)
    log_q_k = log_q.gather(-1, topk_ids.long())
    q_tail = (1.0 - log_q_k.exp().sum(-1)).clamp(min=1e-12)
    kept = torch.where(p > 0, p * (p.clamp(min=1e-300).log() - log_q_k), torch.zeros_like(p)).sum(-1)
    tail = torch.where(p_tail > 0, p_tail * (p_tail.clamp(min=1e-300).log() - q_tail.log()), torch.zeros_like(p_tail))
    return (kept + tail).mean().to(student_logits.dtype)


# --------------------------------------------------------------------------------------------------
# Loss terms: the named parts a method's stages sum (pipelines.registry.Term.loss names one).


@dataclass
class TermInputs:
    """What a loss term may read: the student's outputs, the decoded batch, the stage's layer pairs."""

    outputs: Any  # the student's forward output (.logits, .hidden_states, .attentions)
    batch: dict[str, torch.Tensor]  # labels, logits (teacher), dense_<i> / positions_<i> / valid_<i>, ...
    pairs: list  # pipelines.train.losses.pairs.LayerPair of the stage
    projection: nn.Module | None  # the shared W: Linear(d_S -> d_T), None when the widths agree
    count: Counter = local_count  # averaged-over counts -> denominators (Ranks.mean_count under torchrun)


LOSS_TERMS: dict[str, Callable[..., torch.Tensor]] = {}


def loss_term(name: str) -> Callable:
    """Implement the loss term `name`, declared in pipelines.registry.LOSS_TERMS (TextBrewer-style: methods
    refer to losses by name)."""

    def add(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        if name not in registry.LOSS_TERMS:
            raise ValueError(f"loss term {name!r} is not declared: call pipelines.registry.declare_loss_term first")
        if name in LOSS_TERMS:
            raise ValueError(f"loss term {name!r} is already registered")
        LOSS_TERMS[name] = fn
        return fn

    return add


def _hsk_sum(x: TermInputs, masked_only: bool) -> torch.Tensor:
    loss = 0.0
    for pair in x.pairs:  # summed over kept layers (docs/methods/mud.md)
        i = pair.kept
        loss = loss + hsk_mse(
            x.outputs.hidden_states[pair.student_layer],
            x.batch[f"positions_{i}"],
            x.batch[f"valid_{i}"],
            x.batch[f"dense_{i}"],
            x.projection if pair.projection else None,
            masked_only=masked_only,
            count=x.count,
        )
    return loss


# mud (pipelines/methods/mud.py) and tinybert-att's HSK part


@loss_term("hsk_mse")
def term_hsk_mse(x: TermInputs) -> torch.Tensor:
    """Sum over the pairs of MSE(W h_s, zero-filled teacher vector) at the stored token positions."""
    return _hsk_sum(x, masked_only=False)


@loss_term("hsk_masked_mse")
def term_hsk_masked_mse(x: TermInputs) -> torch.Tensor:
    """As hsk_mse, averaged over the kept (non-zero) teacher elements only."""
    return _hsk_sum(x, masked_only=True)


# Patient KD (pipelines/methods/pkd.py; pea's KD stage)


@loss_term("pkd_cls")
def term_pkd_cls(x: TermInputs) -> torch.Tensor:
    """Patient KD over the pairs: normalised [CLS] (stored position 0) of each student layer vs teacher layer."""
    student_cls, teacher_cls = [], []
    for pair in x.pairs:
        h = x.outputs.hidden_states[pair.student_layer][:, 0]
        student_cls.append(x.projection(h) if pair.projection and x.projection is not None else h)
        teacher_cls.append(x.batch[f"dense_{pair.kept}"][:, 0])
    return pkd_loss(student_cls, teacher_cls)


# The logits: kd, finetune, mud's and tinybert-att's prediction stage (pipelines/methods/kd.py, finetune.py)


@loss_term("soft_ce")
def term_soft_ce(x: TermInputs, T: float = 1.0) -> torch.Tensor:
    return soft_cross_entropy(x.outputs.logits, x.batch["logits"], T)


def _masked_ce(logits: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor, count: Counter) -> torch.Tensor:
    """Mean cross-entropy over the rows `keep`: the sum over them (the others ignored, not indexed out: no
    host sync) over their count (the same bits as F.cross_entropy's mean; 0, not NaN, when there are none)."""
    ignored = torch.full_like(labels, IGNORE)
    return F.cross_entropy(logits, torch.where(keep, labels, ignored), ignore_index=IGNORE,
                           reduction="sum") / count(keep.sum())


@loss_term("ce")
def term_ce(x: TermInputs) -> torch.Tensor:
    """Cross-entropy to the gold label; rows without one (label < 0) are left out."""
    labels = x.batch["labels"].long()
    return _masked_ce(x.outputs.logits.float(), labels, labels >= 0, x.count)


@loss_term("kl")
def term_kl(x: TermInputs, T: float = 1.0) -> torch.Tensor:
    """T^2 KL(softmax(t/T) || softmax(s/T)), batch mean (the T^2 keeps gradients comparable across T)."""
    s, t = x.outputs.logits.float(), x.batch["logits"].float()
    kl = F.kl_div(F.log_softmax(s / T, dim=-1), F.log_softmax(t / T, dim=-1), reduction="batchmean", log_target=True)
    return T * T * kl


@loss_term("gold_mse")
def term_gold_mse(x: TermInputs) -> torch.Tensor:
    return regression_mse(x.outputs.logits, x.batch["labels"], x.count)


@loss_term("teacher_mse")
def term_teacher_mse(x: TermInputs) -> torch.Tensor:
    """Regression KD: MSE between the student's and the teacher's scores."""
    return F.mse_loss(x.outputs.logits.float().reshape(-1), x.batch["logits"].float().reshape(-1))


# TinyBERT (pipelines/methods/tinybert.py): the maths in pipelines/train/losses/attention.py


@loss_term("attention_mse")
def term_attention_mse(x: TermInputs, heads: str = "same") -> torch.Tensor:
    """Sum over the layer pairs above the embeddings of attention_mse(student rows, stored teacher rows)."""
    calls = x.outputs.attention_scores
    if calls is None:
        raise ValueError("attention_mse needs the stage to ask for the student's 'attention_scores' output")
    loss = None
    for pair in x.pairs:
        if pair.student_layer < 1 or f"attention_{pair.kept}" not in x.batch:
            continue  # the embedding output has no attention
        q, k, n_heads = calls[pair.student_layer - 1]
        positions, valid = x.batch[f"positions_{pair.kept}"], x.batch[f"valid_{pair.kept}"]
        rows = score_rows(q.float(), k.float(), positions, n_heads)
        part = attention_mse(rows, x.batch[f"attention_{pair.kept}"], valid, x.batch["attention_mask"], heads,
                             count=x.count)
        loss = part if loss is None else loss + part
    if loss is None:
        raise ValueError("attention_mse: no layer pair has stored attention rows")
    return loss


# PEA-KD (pipelines/methods/pea.py): the PTP labels in pipelines/methods/ptp.py and pipelines/train/losses/ptp.py


@loss_term("ptp_ce")
def term_ptp_ce(x: TermInputs, t1: float, t2: float) -> torch.Tensor:
    """Cross-entropy of the student's 4-way (ptp4) head to the PTP labels of the batch's stored logits."""
    labels = ptp_labels(x.batch["logits"], x.batch["labels"], PTPThresholds(t1, t2, "stage"))
    logits = x.outputs.logits.float()
    if logits.shape[-1] != NUM_PTP_CLASSES:
        raise ValueError(f"ptp_ce needs the 4-way ptp4 head on the student, got {logits.shape[-1]} outputs")
    return _masked_ce(logits, labels, labels != IGNORE, x.count)  # no gold label in the batch: 0


# LightPAFF (pipelines/methods/lightpaff.py): fine-tuning on a task store, pre-training on a masked-LM store


@loss_term("lightpaff_ft")
def term_lightpaff_ft(x: TermInputs, lam: float = 0.5) -> torch.Tensor:
    return lightpaff_rows(x.outputs.logits, x.batch["logits"], x.batch["labels"], lam)


@loss_term("mlm_mle")
def term_mlm_mle(x: TermInputs) -> torch.Tensor:
    """Cross-entropy of the original token at every masked position (outputs.logits: [N masked, V])."""
    return F.cross_entropy(x.outputs.logits.float(), x.batch["mlm_labels"].long())


@loss_term("mlm_topk_kl")
def term_mlm_topk_kl(x: TermInputs) -> torch.Tensor:
    """KL(teacher || student) over the stored top-k ids plus the tail bucket, mean over masked positions."""
    return topk_kl(x.outputs.logits.float(), x.batch["topk_ids"], x.batch["topk_logits"], x.batch["lse"])


# Causal-LM KD (pipelines/methods/clm_kd.py): the maths in pipelines/train/losses/lm.py. outputs.logits is
# [B, T, V]; the batch's ce_mask / kd_mask [B, T] pick the positions each term averages over.


@loss_term("clm_ce")
def term_clm_ce(x: TermInputs) -> torch.Tensor:
    mask = x.batch["ce_mask"]
    return lm.next_token_ce(x.outputs.logits[mask], x.batch["labels"][mask]).sum() / x.count(mask.sum())


def _kd_logprobs(x: TermInputs, temperature: float) -> torch.Tensor:
    return torch.log_softmax(x.outputs.logits[x.batch["kd_mask"]].float() / temperature, -1)


def _kd_mean(per_position: torch.Tensor, x: TermInputs) -> torch.Tensor:
    """The mean over the batch's kept positions: their sum over `count` of them (under torchrun the global
    count, so that the ranks' losses average to the global batch's whatever positions each rank keeps)."""
    return per_position.sum() / x.count(x.batch["kd_mask"].sum())


def _tempered(p: torch.Tensor, used: torch.Tensor, temperature: float) -> torch.Tensor:
    """The support's probabilities at temperature T, renormalized over the stored ids."""
    if temperature == 1.0:
        return p
    logits = torch.log(p.clamp(min=1e-30)).masked_fill(~used, float("-inf")) / temperature
    return torch.softmax(logits, -1)


@loss_term("clm_topk_kl")
def term_clm_topk_kl(x: TermInputs, tail: bool = True, temperature: float = 1.0) -> torch.Tensor:
    b = x.batch
    p = _tempered(b["kd_probs"], b["kd_used"], temperature)
    kl = lm.topk_tail_kl if tail else lm.topk_renormalized_kl
    return _kd_mean(kl(_kd_logprobs(x, temperature), b["kd_ids"], p, b["kd_used"]), x) * temperature ** 2


@loss_term("clm_sampled_ce")
def term_clm_sampled_ce(x: TermInputs) -> torch.Tensor:
    b = x.batch
    return _kd_mean(lm.sampled_ce(_kd_logprobs(x, 1.0), b["kd_ids"], b["kd_probs"], b["kd_used"]), x)


@loss_term("clm_full_kl")
def term_clm_full_kl(x: TermInputs, temperature: float = 1.0) -> torch.Tensor:
    teacher = torch.log_softmax(x.batch["teacher_logits"].float() / temperature, -1)
    return _kd_mean(lm.full_kl(_kd_logprobs(x, temperature), teacher), x) * temperature ** 2


@loss_term("clm_hidden_kl")
def term_clm_hidden_kl(x: TermInputs, temperature: float = 1.0) -> torch.Tensor:
    """clm_full_kl's maths on the logits the stored hidden states and head give (pipelines/train/kinds/clm.py,
    hidden_batch): its own name, so that a run loads a live teacher for clm_full_kl alone."""
    return term_clm_full_kl(x, temperature)


def _layer_pairs(x: TermInputs) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per pair: (the student's vectors at the stored positions, projected where the widths differ [B, P, d_T],
    the stored teacher vectors [B, P, d_T]) of an intermediate-layer batch (pipelines/train/kinds/clm_layers.py)."""
    b, out = x.batch, []
    for pair in x.pairs:
        picked = gather_positions(x.outputs.hidden_states[pair.student_layer], b["layer_positions"])
        if pair.projection and x.projection is not None:
            picked = x.projection(picked)
        out.append((picked.float(), b["layer_states"][:, :, pair.kept].float()))
    return out


def _summed_over_pairs(x: TermInputs, pair_loss: Callable[..., torch.Tensor]) -> torch.Tensor:
    """The sum over an intermediate-layer batch's pairs of pair_loss(student, teacher, valid, count)."""
    valid = x.batch["layer_valid"]
    loss = x.batch["layer_states"].new_zeros(())
    for student, teacher in _layer_pairs(x):
        loss = loss + pair_loss(student, teacher, valid, x.count)
    return loss


def _pair_mse(student: torch.Tensor, teacher: torch.Tensor, valid: torch.Tensor, count: Callable) -> torch.Tensor:
    weight = valid.to(student.dtype)[..., None].expand_as(student)
    return ((student - teacher) ** 2 * weight).sum() / count(weight.sum())


def _pair_cos(student: torch.Tensor, teacher: torch.Tensor, valid: torch.Tensor, count: Callable) -> torch.Tensor:
    distance = 1.0 - F.cosine_similarity(student, teacher, dim=-1)
    return (distance * valid).sum() / count(valid.sum())


@loss_term("clm_layer_mse")
def term_clm_layer_mse(x: TermInputs) -> torch.Tensor:
    """Sum over the pairs of the mean squared error per element over the stored real positions."""
    return _summed_over_pairs(x, _pair_mse)


@loss_term("clm_layer_cos")
def term_clm_layer_cos(x: TermInputs) -> torch.Tensor:
    """Sum over the pairs of the mean of 1 - cosine(student, teacher) over the stored real positions."""
    return _summed_over_pairs(x, _pair_cos)


# Cross-tokenizer KD (pipelines/methods/xtok.py; the batch from pipelines/train/data/xtok.py): outputs.logits is
# the student's [B, W, V_student] over its own tokens; x_pos / m_pos are flat indices into B * W.
# Each term is a sum over this rank's aligned positions (chunks) over `x.count` of them: the global count under
# torchrun, as every per-position term.


def _flat_logits(x: TermInputs, positions: torch.Tensor) -> torch.Tensor:
    logits = x.outputs.logits
    return logits.reshape(-1, logits.shape[-1])[positions].float()


@loss_term("uld")
def term_uld(x: TermInputs, tail: bool = True) -> torch.Tensor:
    b = x.batch
    probs = torch.softmax(_flat_logits(x, b["x_pos"]), -1)
    return lm.uld_l1(probs, b["x_probs"], b["x_used"], tail).sum() / x.count(b["x_pos"].new_tensor(b["x_pos"].numel()))


@loss_term("alm_chunks")
def term_alm_chunks(x: TermInputs) -> torch.Tensor:
    b, logits = x.batch, x.outputs.logits.float()
    picked = torch.log_softmax(logits, -1).gather(-1, b["labels"][..., None])[..., 0]
    cumulative = torch.nn.functional.pad(picked.cumsum(-1), (1, 0)).reshape(-1)  # [B * (W + 1)]
    student = cumulative[b["c_stop"]] - cumulative[b["c_start"]]
    count = x.count(b["c_stop"].new_tensor(b["c_stop"].numel()))
    return lm.binary_kl(b["c_teacher"].clamp(max=0.0), student).sum() / count


@loss_term("mined_kl")
def term_mined_kl(x: TermInputs) -> torch.Tensor:
    b = x.batch
    logprobs = torch.log_softmax(_flat_logits(x, b["m_pos"]), -1)
    return lm.mapped_ce(logprobs, b["m_ids"], b["m_probs"]).sum() / x.count(b["m_pos"].new_tensor(b["m_pos"].numel()))


def weighted_sum(terms, inputs: TermInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """sum(weight * term) over a stage's Terms, and each term's (unweighted) value for metrics.jsonl, detached
    and left on the device (reading it waits for the device: the loop reads them on logging steps only)."""
    total, values = None, {}
    for term in terms:
        if term.loss not in LOSS_TERMS:
            raise KeyError(f"no loss term {term.loss!r}; registered: {', '.join(sorted(LOSS_TERMS))}")
        value = LOSS_TERMS[term.loss](inputs, **term.kwargs)
        values[term.name] = value.detach()
        part = value if term.weight == 1.0 else term.weight * value
        total = part if total is None else total + part
    return total, values
