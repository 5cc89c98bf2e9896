"""LightPAFF: distillation in pre-training and in fine-tuning (docs/methods/lightpaff.md).

Both stages minimise (1 - l) MLE(gold) + l KL(teacher || student) (the paper's equation 1):

- `lightpaff-pretrain` on a masked-LM store: at every masked position, MLE of the original token
  plus the KL over the teacher's stored top-k ids and one tail bucket (the rest of the vocabulary).
  l = 1.0 by default, the paper's BERT setting. It trains the student's MLM head and encoder, run by
  the one loop with the pieces of pipelines.train.kinds.lightpaff_pretrain (source, feed, MLM student).
- `lightpaff` on a task store: (1 - l) CE(gold) + l KL(teacher) on rows with a gold label, KL
  alone on rows without one (label -1: unlabeled rows the teacher labelled softly). The paper picks
  l per task on dev and does not publish it; we default to 0.5, the middle, and no temperature (T = 1),
  as its equation 5 has none.

Its pieces: the loss terms `lightpaff_ft`, `mlm_mle` and `mlm_topk_kl` (with `lightpaff_rows` and
`topk_kl`) in pipelines/train/losses/terms.py; the pre-training run in pipelines/train/kinds/lightpaff_pretrain.py;
the masked-LM store it reads, written by `hsk dump --objective mlm` (pipelines/dump/mlm.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from hskstore.format.config import check_between
from hskstore.io.reader import store_type
from pipelines.registry import Context, Method, MethodError, Stage, Term, register

PAPER = ("Song, Sun, Tan, Qin, Lu, Liu, Liu, 'LightPAFF: A Two-Stage Distillation Framework for Pre-training "
         "and Fine-tuning' (2020)")


def _check_lambda(lam: float, epochs: float, lr: float | None) -> None:
    check_between("--set lam", lam, 0.0, 1.0, error=MethodError)
    if epochs < 0:
        raise MethodError(f"--epochs must be >= 0, got {epochs}")
    if lr is not None and lr <= 0:
        raise MethodError(f"--lr must be > 0, got {lr}")


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
        check_between("--set warmup_ratio", self.warmup_ratio, 0.0, 1.0, ends="[)", error=MethodError)


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
    if "mlm" not in store_type(ctx.meta).reads:  # what the store offers, as its kind declares
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
    if "logits" not in store_type(ctx.meta).reads:
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
        kinds=("mlm",),
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
