"""`mud`: Marginal Utility Diminishes (Liu et al.), hsk's default recipe; docs/methods/mud.md.

Stage 'hsk': the sum over stored layers of MSE(W h_student, zero-filled teacher vector) at the stored
token positions, constant LR, the student and the projection W train. Stage 'pred': the student's
logits fit the stored teacher logits (soft cross-entropy at T, or with `alpha` the KD mixture
(1 - a) CE(gold) + a T^2 KL; MSE to the gold score on regression tasks), linear decay, best dev
checkpoint kept.

Its pieces: the loss terms `hsk_mse`, `hsk_masked_mse` (and `pkd_cls` for --hsk-loss pkd) and the
logit terms in pipelines/train/losses/terms.py; the "store" layer pairs in pipelines/train/losses/pairs.py; the
pinned loss curve in tests/test_pinned_curves.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from hskstore.format.config import check_between
from pipelines.methods.kd import prediction_terms
from pipelines.registry import Context, Method, MethodError, Stage, Term, register

STAGE_NAMES = ("hsk", "pred")
HSK_LOSSES = {"mse": "hsk_mse", "masked-mse": "hsk_masked_mse", "pkd": "pkd_cls"}


@dataclass
class MudOptions:
    stages: tuple[str, ...] = STAGE_NAMES  # 'hsk,pred', 'hsk' or 'pred'
    epochs_hsk: float | None = None  # None: the task's (CoLA 30, SST-2 10, QNLI/MNLI/QQP 5, others 20)
    epochs_pred: float | None = 5.0
    lr_hsk: float = 5e-5  # constant, no warmup
    lr_pred: float | None = None  # None: the task's (2e-5; MNLI 5e-5), linear decay to 0
    temperature: float = 1.0
    alpha: float | None = None  # None: pure soft CE to the teacher; a: (1 - a) CE(gold) + a T^2 KL
    hsk_loss: str = "mse"  # mse (reference) | masked-mse | pkd ([CLS] vectors; a --tokens cls store)

    def __post_init__(self) -> None:
        self.stages = _stage_names(self.stages)
        if self.hsk_loss not in HSK_LOSSES:
            raise MethodError(f"--hsk-loss must be one of {', '.join(HSK_LOSSES)}; got {self.hsk_loss!r}")
        check_between("--alpha", self.alpha, 0.0, 1.0, error=MethodError)
        if self.temperature <= 0:
            raise MethodError(f"--temperature must be > 0, got {self.temperature}")
        _check_schedule(self)


def _stage_names(stages: str | tuple[str, ...]) -> tuple[str, ...]:
    """--stages as a tuple of known stage names, each once, in training order (else a MethodError)."""
    if isinstance(stages, str):
        stages = tuple(s.strip() for s in stages.split(",") if s.strip())
    stages = tuple(stages)
    bad = [s for s in stages if s not in STAGE_NAMES]
    if bad or not stages or len(set(stages)) != len(stages):
        raise MethodError(f"--stages must be 'hsk,pred', 'hsk' or 'pred'; got {','.join(stages)}")
    if list(stages) != sorted(stages, key=STAGE_NAMES.index):
        raise MethodError("stage 'hsk' comes before stage 'pred' (docs/methods/mud.md)")
    return stages


def _check_schedule(options: MudOptions) -> None:
    """Epochs are >= 0 and learning rates > 0 (None: the task's default)."""
    for name in ("epochs_hsk", "epochs_pred", "lr_hsk", "lr_pred"):
        value = getattr(options, name)
        if value is not None and (value < 0 or (name.startswith("lr") and value == 0)):
            raise MethodError(f"--{name.replace('_', '-')} must be > 0, got {value}")

def _check(options: MudOptions, ctx: Context) -> str | None:
    sel = ctx.selection
    if "hsk" in options.stages and options.hsk_loss == "pkd" and not sel.config.logits_only and (
        sel.token_strategy != "cls"
    ):
        return (
            "--hsk-loss pkd compares [CLS] vectors: dump the store with --tokens cls (e.g. --config 3,1,1), "
            "or use --hsk-loss mse"
        )
    if options.stages == ("hsk",) and sel.config.logits_only:
        return "nothing to train: the store keeps logits only (config 0,0,0); use --stages pred"
    return None


def _build(options: MudOptions, ctx: Context) -> list[Stage]:
    task, stages = ctx.task, []
    if "hsk" in options.stages and ctx.selection.config.logits_only:
        ctx.warnings.append("the store keeps logits only (config 0,0,0): stage 'hsk' is skipped")
    elif "hsk" in options.stages:
        loss = HSK_LOSSES[options.hsk_loss]
        stages.append(
            Stage(
                name="hsk",
                epochs=task.hsk_epochs if options.epochs_hsk is None else options.epochs_hsk,
                lr=options.lr_hsk,
                terms=(Term("hsk", loss),),
                schedule="constant",
                reads=("layers",),
                outputs=("hidden_states",),
                trains=("student", "projection"),
                pairs="store",
                pair_loss=loss,
            )
        )
    if "pred" in options.stages:
        stages.append(pred_stage(options, task))
    return stages


def pred_stage(options, task) -> Stage:
    """MUD's prediction stage: fit the stored logits, linear decay, best dev checkpoint kept (also tinybert-att's)."""
    return Stage(
        name="pred",
        epochs=5.0 if options.epochs_pred is None else options.epochs_pred,
        lr=options.lr_pred or task.pred_lr,
        terms=prediction_terms(task, options.temperature, options.alpha),
        schedule="linear",
        reads=("logits",),
        select_best=True,
    )


MUD = register(
    Method(
        name="mud",
        summary="Marginal Utility Diminishes: fit the stored hidden-state knowledge, then the teacher's logits",
        store_needs="logits, and HSK layers for stage 'hsk' (any `hsk dump --config ND,NL,W`; 0,0,0 runs 'pred' only)",
        paper="Liu et al., 'Marginal Utility Diminishes: Exploring the Minimum Knowledge for BERT Knowledge "
        "Distillation' (ACL 2021)",
        options=MudOptions,
        build=_build,
        check=_check,
        sweep_grid=True,
    )
)
