"""LightPAFF: distillation in pre-training and in fine-tuning (docs/methods/lightpaff.md).

Both stages minimise (1 - l) MLE(gold) + l KL(teacher || student) (the paper's equation 1):

- `lightpaff-pretrain` on a masked-LM store: at every masked position, MLE of the original token
  plus the KL over the teacher's stored top-k ids and one tail bucket (the rest of the vocabulary).
  l = 1.0 by default, the paper's BERT setting. It trains the student's MLM head and encoder, run by
  the one loop with the pieces of pipelines.train.lightpaff_pretrain (source, feed, MLM student).
- `lightpaff` on a task store: (1 - l) CE(gold) + l KL(teacher) on rows with a gold label, KL
  alone on rows without one (label -1: unlabeled rows the teacher labelled softly). The paper picks
  l per task on dev and does not publish it; we default to 0.5, the middle, and no temperature (T = 1),
  as its equation 5 has none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipelines.methods.base import Context, Method, MethodError, Stage, Term, register
from pipelines.train.losses import TermInputs, loss_term, topk_kl

PAPER = ("Song, Sun, Tan, Qin, Lu, Liu, Liu, 'LightPAFF: A Two-Stage Distillation Framework for Pre-training "
         "and Fine-tuning' (2020)")


def _check_lambda(lam: float, epochs: float, lr: float | None) -> None:
    if not 0.0 <= lam <= 1.0:
        raise MethodError(f"--set lam must be in [0, 1], got {lam}")
    if epochs < 0:
        raise MethodError(f"--epochs must be >= 0, got {epochs}")
    if lr is not None and lr <= 0:
        raise MethodError(f"--lr must be > 0, got {lr}")


# --------------------------------------------------------------------------------------------------
# Loss terms


def lightpaff_rows(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                   lam: float) -> torch.Tensor:
    """Mean over rows of (1 - l) CE(gold) + l KL(teacher || student) where gold exists, KL alone where not."""
    log_q = F.log_softmax(student_logits.float(), dim=-1)
    log_p = F.log_softmax(teacher_logits.float(), dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    labels = labels.long()
    has_label = labels >= 0
    ce = -log_q.gather(-1, labels.clamp(min=0)[:, None])[:, 0]
    per_row = torch.where(has_label, (1.0 - lam) * ce + lam * kl, kl)
    return per_row.mean()


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


# --------------------------------------------------------------------------------------------------
# Pre-training distillation


@dataclass
class PretrainOptions:
    epochs: float = 1.0
    lr: float = 1e-4  # BERT's pre-training LR
    lam: float = 1.0  # the paper's BERT setting: KL only
    warmup_ratio: float = 0.01

    def __post_init__(self) -> None:
        _check_lambda(self.lam, self.epochs, self.lr)
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise MethodError(f"--set warmup_ratio must be in [0, 1), got {self.warmup_ratio}")


def _pretrain_terms(lam: float) -> tuple[Term, ...]:
    terms = []
    if lam < 1.0:
        terms.append(Term("mle", "mlm_mle", 1.0 - lam))
    if lam > 0.0:
        terms.append(Term("kl", "mlm_topk_kl", lam))
    return tuple(terms)


def _build_pretrain(o: PretrainOptions, ctx: Context) -> list[Stage]:
    return [Stage(name="pretrain", epochs=o.epochs, lr=o.lr, terms=_pretrain_terms(o.lam), schedule="warmup-linear",
                  warmup_ratio=o.warmup_ratio, reads=("mlm",), head="mlm")]


def _check_pretrain(o: PretrainOptions, ctx: Context) -> str | None:
    if ctx.meta.get("objective", "task") != "mlm":
        return ("needs a masked-LM store (`hsk dump --objective mlm`); this is a task store: use "
                "--method lightpaff for fine-tuning distillation")
    return None


# --------------------------------------------------------------------------------------------------
# Fine-tuning distillation


@dataclass
class FinetuneOptions:
    epochs: float = 4.0
    lr: float | None = None  # None: the task's, linear decay to 0
    lam: float = 0.5

    def __post_init__(self) -> None:
        _check_lambda(self.lam, self.epochs, self.lr)


def _build_finetune(o: FinetuneOptions, ctx: Context) -> list[Stage]:
    return [Stage(name="lightpaff", epochs=o.epochs, lr=o.lr or ctx.task.pred_lr,
                  terms=(Term("lightpaff", "lightpaff_ft", 1.0, (("lam", o.lam),)),), reads=("logits",),
                  select_best=True)]


def _check_finetune(o: FinetuneOptions, ctx: Context) -> str | None:
    if ctx.meta.get("objective", "task") != "task":
        return "needs a task store (logits); for a masked-LM store use --method lightpaff-pretrain"
    if ctx.task.is_regression:
        return f"distils class distributions; {ctx.task.name} is a regression task: use --method kd"
    return None


LIGHTPAFF_PRETRAIN = register(
    Method(
        name="lightpaff-pretrain",
        summary="LightPAFF pre-training distillation: (1 - l) MLE + l KL(teacher || student) over the stored "
        "top-k + tail at masked positions (l = 1); saves a pre-trained BertForMaskedLM",
        store_needs="a masked-LM store: `hsk dump --objective mlm` (top-k ids, logits, log-sum-exp)",
        paper=PAPER,
        options=PretrainOptions,
        build=_build_pretrain,
        check=_check_pretrain,
        objective="mlm",
    )
)

LIGHTPAFF = register(
    Method(
        name="lightpaff",
        summary="LightPAFF fine-tuning distillation: (1 - l) CE(gold) + l KL(teacher) on labelled rows, KL alone "
        "on unlabelled ones (l = 0.5); start from a lightpaff-pretrain output with --init",
        store_needs="logits (any task store; rows may lack gold labels)",
        paper=PAPER,
        options=FinetuneOptions,
        build=_build_finetune,
        check=_check_finetune,
    )
)
