"""`tinybert-att`: TinyBERT's attention distillation plus the HSK loss; docs/methods/tinybert-att.md.

Stage 'hsk': for every stored layer pair, the HSK loss of `mud` (MSE of W h_student to the stored
teacher vectors) plus TinyBERT's attention loss (MSE of the student's pre-softmax attention scores
to the stored teacher rows of the same query tokens, pipelines.train.losses.attention); constant LR, the
student and the projection train. Stage 'pred': the logits fit the teacher's, as in `mud`.
The store must keep attention rows (`hsk dump --attention-rows`).

Its pieces: the loss term `attention_mse` in pipelines/train/losses/terms.py, its maths (the recorder of
the student's pre-softmax scores, the head maps) in pipelines/train/losses/attention.py; `hsk_mse` and the
"store" layer pairs as mud's (pipelines/train/losses/pairs.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from hskstore.format.config import check_between
from pipelines.methods.mud import pred_stage
from pipelines.registry import HEAD_MAPS, Context, Method, MethodError, Stage, Term, register


@dataclass
class TinyBERTAttOptions:
    epochs_hsk: float | None = None  # None: the task's (as mud)
    epochs_pred: float | None = 5.0
    lr_hsk: float = 5e-5  # constant, no warmup
    lr_pred: float | None = None  # None: the task's, linear decay to 0
    temperature: float = 1.0
    alpha: float | None = None  # None: soft CE to the teacher; a: (1 - a) CE(gold) + a T^2 KL
    att_weight: float = 1.0  # TinyBERT sums its attention and hidden-state losses with weight 1
    hsk_weight: float = 1.0
    heads: str = "same"  # head mapping: same (equal head counts) | mean (head-averaged rows)

    def __post_init__(self) -> None:
        if self.heads not in HEAD_MAPS:
            raise MethodError(f"--set heads= must be one of {', '.join(HEAD_MAPS)}; got {self.heads!r}")
        check_between("--alpha", self.alpha, 0.0, 1.0, error=MethodError)
        if self.temperature <= 0:
            raise MethodError(f"--temperature must be > 0, got {self.temperature}")
        for name in ("epochs_hsk", "epochs_pred", "lr_hsk", "lr_pred", "att_weight", "hsk_weight"):
            value = getattr(self, name)
            if value is not None and (value < 0 or (name.startswith("lr") and value == 0)):
                raise MethodError(f"--{name.replace('_', '-')} must be >= 0 (lr > 0), got {value}")


def _check(options: TinyBERTAttOptions, ctx: Context) -> str | None:
    sel = ctx.selection
    if sel.config.logits_only or not sel.attention_rows:
        return (
            "TinyBERT's attention loss reads the teacher's attention rows, which this store does not keep: dump "
            "one with `hsk dump --attention-rows --config ND,NL,W` (e.g. 3,8,0.2), or derive from a store that "
            "has them (`hsk derive` keeps them)"
        )
    return None


def _build(options: TinyBERTAttOptions, ctx: Context) -> list[Stage]:
    task = ctx.task
    hsk = Stage(
        name="hsk",
        epochs=task.hsk_epochs if options.epochs_hsk is None else options.epochs_hsk,
        lr=options.lr_hsk,
        terms=(
            Term("hsk", "hsk_mse", options.hsk_weight),
            Term("att", "attention_mse", options.att_weight, (("heads", options.heads),)),
        ),
        schedule="constant",
        reads=("layers", "attention"),
        outputs=("hidden_states", "attention_scores"),
        trains=("student", "projection"),
        pairs="store",
        pair_loss="hsk_mse+attention_mse",
    )
    return [hsk, pred_stage(options, task)]


TINYBERT_ATT = register(
    Method(
        name="tinybert-att",
        summary="TinyBERT attention distillation: MSE of pre-softmax attention rows + the HSK loss, then the "
        "teacher's logits",
        store_needs="logits, HSK layers and their attention rows (`hsk dump --attention-rows`); a student with the "
        "teacher's head count (or --set heads=mean)",
        paper="Jiao et al., 'TinyBERT: Distilling BERT for Natural Language Understanding' (Findings of EMNLP "
        "2020); HSK selection of Liu et al. (ACL 2021)",
        options=TinyBERTAttOptions,
        build=_build,
        check=_check,
    )
)
