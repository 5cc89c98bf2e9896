"""`pea`: PEA-KD (Cho et al.): PTP pre-training on a 4-way head, then Patient KD; docs/methods/pea.md.

Stage 'ptp': the student, with a fresh 4-way head ("ptp4"), learns to predict the PTP label of each
example (pipelines/methods/ptp.py: was the teacher right, was it confident; from the stored logits and
gold labels, with the authors' per-task thresholds unless --ptp-t1/--ptp-t2 say otherwise).
Stage 'kd': a fresh task head (the authors' code; `kd_head=kept`: the pre-PTP one) and Patient KD's loss,
(1 - a) CE(gold) + a T^2 KL + beta * PKD([CLS] of student layers 1..S-1 vs the teacher's I_pt);
beta = 0 leaves plain KD, which any store serves. PeaBERT is this method on an SPS student
(`--student sps<k>`, pipelines/train/students/sps.py); any other student works too.

Its pieces: the PTP thresholds, label rule and warning (torch-free) in pipelines/methods/ptp.py; the
`ptp4` head in pipelines/train/students/heads.py; the loss terms `ptp_ce` and `pkd_cls` in
pipelines/train/losses/terms.py, `ptp_ce` labelling each batch with pipelines/train/losses/ptp.py; the I_pt layer
pairs in pipelines/train/losses/pairs.py (from `pkd_teacher_layers` of pipelines/methods/pkd.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipelines.methods.kd import check_kd, kd_stage, prediction_terms
from pipelines.methods.pkd import PKD_RULES, pkd_dump_advice
from pipelines.methods.ptp import PTPThresholds, ptp_label_warning, ptp_thresholds
from pipelines.registry import Context, Method, MethodError, Stage, Term, register

KD_HEADS = ("fresh", "kept")


@dataclass
class PEAOptions:
    ptp_epochs: float = 2.0  # the authors run up to 4 and keep the lowest dev PTP loss; a store has no dev labels
    ptp_lr: float | None = None  # None: the task's (2e-5; MNLI 5e-5), linear decay to 0
    ptp_t1: float | None = None  # None: the authors' threshold for the task (pipelines/methods/ptp.py)
    ptp_t2: float | None = None
    epochs: float = 4.0  # the KD stage: Patient KD's settings
    lr: float | None = None
    temperature: float = 10.0
    alpha: float = 0.5
    beta: float = 500.0  # 0: plain KD after PTP (no [CLS] store needed)
    pairs: str = "pkd-skip"  # which teacher layers the PKD term uses: pkd-skip | pkd-last
    kd_head: str = "fresh"  # the KD stage's task head: fresh (the authors' code) | kept (the one from before PTP)

    def __post_init__(self) -> None:
        check_kd(self.epochs, self.lr, self.temperature, self.alpha)
        if self.ptp_epochs < 0 or (self.ptp_lr is not None and self.ptp_lr <= 0):
            raise MethodError(f"--ptp-epochs must be >= 0 and --ptp-lr > 0 (got {self.ptp_epochs}, {self.ptp_lr})")
        if self.beta < 0:
            raise MethodError(f"--beta must be >= 0, got {self.beta}")
        if self.pairs not in PKD_RULES:
            raise MethodError(f"--set pairs= must be one of {', '.join(PKD_RULES)}; got {self.pairs!r}")
        if self.kd_head not in KD_HEADS:
            raise MethodError(f"--set kd_head= must be one of {', '.join(KD_HEADS)}; got {self.kd_head!r}")


def _check(options: PEAOptions, ctx: Context) -> str | None:
    if ctx.task.is_regression:
        return f"PTP labels say whether the teacher chose the right class; {ctx.task.name} is a regression task"
    ptp_thresholds(ctx.task.name, options.ptp_t1, options.ptp_t2)  # raises with the flags to pass
    sel = ctx.selection
    if options.beta > 0 and (sel.config.logits_only or sel.token_strategy != "cls"):
        return (
            "the KD stage adds Patient KD's [CLS] loss: dump the store with --tokens cls and the teacher layers "
            f"I_pt: {pkd_dump_advice(options.pairs, sel.teacher_num_layers, ctx.student_layers)}; or pass --beta 0 "
            "for plain KD"
        )
    if ctx.student is not None and not re.fullmatch(r"sps\d+", ctx.student.strip().lower()):
        ctx.warnings.append(
            f"pea with student {ctx.student}: PEA-KD's method distils into SPS students (--student sps<k>: "
            "the same layers run twice, docs/methods/pea.md); this run trains the student you gave"
        )
    return None


def _check_ptp_labels(th: PTPThresholds, ctx: Context) -> None:
    """Warn (ctx.warnings) when the store's teacher gives degenerate PTP labels at these thresholds."""
    if ctx.stored_targets is None:
        return  # online: the teacher's logits are not known before training
    logits, gold = ctx.stored_targets()
    warning = ptp_label_warning(logits, gold, th)
    if warning:
        ctx.warnings.append(warning)


def _build(options: PEAOptions, ctx: Context) -> list[Stage]:
    task = ctx.task
    th = ptp_thresholds(task.name, options.ptp_t1, options.ptp_t2)
    if options.ptp_epochs > 0:
        _check_ptp_labels(th, ctx)
    ptp = Stage(
        name="ptp",
        epochs=options.ptp_epochs,
        lr=options.ptp_lr or task.pred_lr,
        terms=(Term("ptp", "ptp_ce", 1.0, (("t1", th.t1), ("t2", th.t2))),),
        schedule="linear",
        reads=("logits",),
        head="ptp4",
    )
    terms = prediction_terms(task, options.temperature, options.alpha)
    fresh = options.kd_head == "fresh" and options.ptp_epochs > 0
    if options.beta == 0:
        return [ptp, kd_stage(task, options.epochs, options.lr, terms, fresh_head=fresh)]
    terms += (Term("pkd", "pkd_cls", options.beta),)
    kd = kd_stage(task, options.epochs, options.lr, terms, outputs=("logits", "hidden_states"),
                  trains=("student", "projection"), pairs=options.pairs, pair_loss="pkd_cls",
                  reads=("logits", "layers"), fresh_head=fresh)
    return [ptp, kd]


PEA = register(
    Method(
        name="pea",
        summary="PEA-KD: PTP pre-training on a 4-way head (teacher right/wrong x confident/unsure), then Patient "
        "KD on the task head; use an SPS student (--student sps<k>)",
        store_needs="logits and gold labels; with beta > 0 also [CLS] vectors (--tokens cls) of the I_pt teacher "
        "layers of the student's effective depth (as pkd-skip / pkd-last)",
        paper="Cho, Kang, 'Pea-KD: Parameter-efficient and Accurate Knowledge Distillation on BERT' "
        "(arXiv:2009.14822, 2020)",
        options=PEAOptions,
        build=_build,
        check=_check,
    )
)
