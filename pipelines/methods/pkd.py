"""`pkd-skip` and `pkd-last`: Patient Knowledge Distillation (Sun et al.); docs/methods/pkd.md.

One stage: (1 - a) CE(gold) + a T^2 KL(teacher || student) + beta * PKD, where PKD is the MSE between
the L2-normalised [CLS] vectors of student layers 1..S-1 and of the teacher's layers I_pt, averaged
over all elements (hence the large beta). I_pt comes from pipelines.train.losses.pairs: Skip takes every
(L/S)-th teacher layer, Last the S-1 layers just below the top. The store must hold the [CLS]
vectors of those layers (`hsk dump --tokens cls --layers ...`).

Its pieces: I_pt (`pkd_teacher_layers`) and the dump advice are here, torch-free; the layer pairs
they give in pipelines/train/losses/pairs.py (rules "pkd-skip", "pkd-last"); the loss term `pkd_cls` in
pipelines/train/losses/terms.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from hskstore.format.config import ConfigError
from pipelines.methods.kd import check_kd, kd_stage, prediction_terms
from pipelines.registry import Context, Method, MethodError, Term, register

PKD_RULES = ("pkd-skip", "pkd-last")  # the layer pairing rules (pipelines.registry.PAIR_RULES) of Patient KD


def pkd_teacher_layers(rule: str, n_teacher: int, n_student: int) -> list[int]:
    """Patient KD's I_pt for student layers 1..S-1, for any depths L >= S >= 2.

    Skip: every (L/S)-th layer, floor(k * L / S) for k = 1..S-1 (12->6: 2,4,6,8,10; 12->3: 4,8;
    6->3: 2,4; 6->2: 3). Last: the S-1 layers just below the top, L-S+1..L-1 (12->6: 7..11;
    12->3: 10,11; 6->3: 4,5; 6->2: 5). The top layer L itself is learnt through the logits.
    """
    if n_student < 2 or n_student > n_teacher:
        raise ConfigError(
            f"Patient KD pairs student layers 1..S-1 with teacher layers: it needs 2 <= S <= L "
            f"(student {n_student} layers, teacher {n_teacher})"
        )
    if rule == "pkd-skip":
        return [k * n_teacher // n_student for k in range(1, n_student)]
    if rule == "pkd-last":
        return list(range(n_teacher - n_student + 1, n_teacher))
    raise ConfigError(f"unknown Patient KD rule {rule!r}")


def pkd_dump_advice(rule: str, n_teacher: int, n_student: int | None) -> str:
    """The `hsk dump` that makes a [CLS] store for Patient KD's I_pt, computed for this teacher and
    student (for an example student of half the teacher's depth when the student is not known)."""
    depth = n_student if n_student is not None else max(2, n_teacher // 2)
    try:
        layers = ",".join(map(str, pkd_teacher_layers(rule, n_teacher, depth)))
    except ConfigError as exc:
        return str(exc)
    which = f"a {depth}-layer student" if n_student is not None else f"e.g. a {depth}-layer student"
    return (f"`hsk dump --tokens cls --layers {layers} --config {len(layers.split(','))},1,1` ({rule}'s teacher "
            f"layers for this {n_teacher}-layer teacher and {which})")


@dataclass
class PKDOptions:
    epochs: float = 4.0
    lr: float | None = None  # None: the task's (2e-5; MNLI 5e-5), linear decay to 0
    temperature: float = 10.0
    alpha: float = 0.5
    beta: float = 500.0  # the authors' preset (their grid: 10, 100, 500, 1000)

    def __post_init__(self) -> None:
        check_kd(self.epochs, self.lr, self.temperature, self.alpha)
        if self.beta < 0:
            raise MethodError(f"--beta must be >= 0, got {self.beta}")


def _checker(rule: str):
    def check(options: PKDOptions, ctx: Context) -> str | None:
        sel = ctx.selection
        if sel.config.logits_only or sel.token_strategy != "cls":
            return (
                "PKD compares [CLS] vectors: dump the store with --tokens cls and the teacher layers I_pt: "
                f"{pkd_dump_advice(rule, sel.teacher_num_layers, ctx.student_layers)}"
            )
        return None

    return check


def _builder(rule: str):
    def build(options: PKDOptions, ctx: Context):
        terms = prediction_terms(ctx.task, options.temperature, options.alpha)
        terms += (Term("pkd", "pkd_cls", options.beta),)
        return [kd_stage(ctx.task, options.epochs, options.lr, terms, outputs=("logits", "hidden_states"),
                         trains=("student", "projection"), pairs=rule, pair_loss="pkd_cls",
                         reads=("logits", "layers"))]

    return build


_PAPER = "Sun, Cheng, Gan, Liu, 'Patient Knowledge Distillation for BERT Model Compression' (EMNLP 2019)"

PKD_SKIP = register(
    Method(
        name="pkd-skip",
        summary="Patient KD, Skip: CE + KL + beta * MSE of normalised [CLS] of student layers vs every (L/S)-th "
        "teacher layer",
        store_needs="logits and [CLS] vectors (--tokens cls) of teacher layers k*L/S, k = 1..S-1 "
        "(12->6: 2,4,6,8,10; 12->3: 4,8)",
        paper=_PAPER,
        options=PKDOptions,
        build=_builder("pkd-skip"),
        check=_checker("pkd-skip"),
    )
)

PKD_LAST = register(
    Method(
        name="pkd-last",
        summary="Patient KD, Last: CE + KL + beta * MSE of normalised [CLS] of student layers vs the S-1 teacher "
        "layers below the top",
        store_needs="logits and [CLS] vectors (--tokens cls) of teacher layers L-S+1..L-1 "
        "(12->6: 7..11; 12->3: 10,11)",
        paper=_PAPER,
        options=PKDOptions,
        build=_builder("pkd-last"),
        check=_checker("pkd-last"),
    )
)
