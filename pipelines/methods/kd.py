"""`kd`: vanilla knowledge distillation (Hinton et al.), one stage on the stored logits; docs/methods/kd.md.

L = (1 - a) CE(gold, s) + a T^2 KL(softmax(t/T) || softmax(s/T)). Defaults T = 10, a = 0.5: the
middle of Patient KD's grid (T in {5, 10, 20}, a in {0.2, 0.5, 0.7}), the values its authors'
code presets. On regression tasks: (1 - a) MSE(gold) + a MSE(teacher score).

Its pieces: the loss terms `ce`, `kl`, `soft_ce`, `gold_mse`, `teacher_mse` in pipelines/train/losses/terms.py
(the other logit-based methods build on `prediction_terms` and `kd_stage` here).
"""

from __future__ import annotations

from dataclasses import dataclass

from hskstore.format.config import check_between
from pipelines.core.tasks import Task
from pipelines.registry import Context, Method, MethodError, Stage, Term, register


def prediction_terms(task: Task, temperature: float, alpha: float | None) -> tuple[Term, ...]:
    """The loss on the logits: soft CE at T (alpha None), or the KD mixture; MSE terms on regression."""
    if task.is_regression:
        if alpha is None:
            return (Term("mse", "gold_mse"),)
        return (Term("mse", "gold_mse", 1.0 - alpha), Term("teacher_mse", "teacher_mse", alpha))
    if alpha is None:
        return (Term("soft_ce", "soft_ce", 1.0, (("T", temperature),)),)
    return (Term("ce", "ce", 1.0 - alpha), Term("kl", "kl", alpha, (("T", temperature),)))


def check_kd(epochs: float, lr: float | None, temperature: float, alpha: float) -> None:
    check_between("--alpha", alpha, 0.0, 1.0, error=MethodError)
    if temperature <= 0:
        raise MethodError(f"--temperature must be > 0, got {temperature}")
    if epochs < 0:
        raise MethodError(f"--epochs must be >= 0, got {epochs}")
    if lr is not None and lr <= 0:
        raise MethodError(f"--lr must be > 0, got {lr}")


@dataclass
class KDOptions:
    epochs: float = 4.0  # Patient KD's setting for every task
    lr: float | None = None  # None: the task's (2e-5; MNLI 5e-5), linear decay to 0
    temperature: float = 10.0
    alpha: float = 0.5

    def __post_init__(self) -> None:
        check_kd(self.epochs, self.lr, self.temperature, self.alpha)


def kd_stage(task: Task, epochs: float, lr: float | None, terms: tuple[Term, ...], **kw) -> Stage:
    """The one stage of logit-based methods: linear decay, best dev checkpoint kept."""
    kw.setdefault("reads", ("logits",))
    return Stage(name="kd", epochs=epochs, lr=lr or task.pred_lr, terms=terms, schedule="linear", select_best=True,
                 **kw)


def _build(options: KDOptions, ctx: Context) -> list[Stage]:
    return [kd_stage(ctx.task, options.epochs, options.lr,
                     prediction_terms(ctx.task, options.temperature, options.alpha))]


KD = register(
    Method(
        name="kd",
        summary="vanilla KD: (1 - a) CE(gold) + a T^2 KL(teacher || student) on the stored logits, one stage",
        store_needs="logits only (any store; `hsk derive --config 0,0,0` makes the smallest)",
        paper="Hinton, Vinyals, Dean, 'Distilling the Knowledge in a Neural Network' (2015); settings of "
        "Sun et al., 'Patient Knowledge Distillation for BERT Model Compression' (EMNLP 2019)",
        options=KDOptions,
        build=_build,
    )
)
