"""`finetune`: plain fine-tuning on gold labels, no teacher signal (also what `hsk teacher` runs).

Standard BERT fine-tuning: cross-entropy to the gold label (MSE to the gold score on regression
tasks), linear warmup then linear decay, best dev checkpoint kept. From a store it reads the labels
only: the 'fine-tuning without KD' reference of a comparison. Its loss terms `ce` and `gold_mse` are in
pipelines/train/losses/terms.py; `hsk teacher` (pipelines/train/kinds/teacher.py) runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.registry import Context, Method, MethodError, Stage, Term, register


@dataclass
class FinetuneOptions:
    epochs: float = 4.0
    lr: float | None = None  # None: the task's (2e-5; MNLI 5e-5)
    warmup_ratio: float = 0.0  # fraction of the steps with a linearly rising LR (hsk teacher: 0.1)

    def __post_init__(self) -> None:
        if self.epochs < 0 or (self.lr is not None and self.lr <= 0) or not 0 <= self.warmup_ratio < 1:
            raise MethodError(
                f"finetune needs epochs >= 0, lr > 0 and 0 <= warmup_ratio < 1 "
                f"(got {self.epochs}, {self.lr}, {self.warmup_ratio})"
            )


def _build(options: FinetuneOptions, ctx: Context) -> list[Stage]:
    term = Term("mse", "gold_mse") if ctx.task.is_regression else Term("ce", "ce")
    schedule = "warmup-linear" if options.warmup_ratio else "linear"
    return [Stage(name="finetune", epochs=options.epochs, lr=options.lr or ctx.task.pred_lr, terms=(term,),
                  schedule=schedule, warmup_ratio=options.warmup_ratio, select_best=True)]


FINETUNE = register(
    Method(
        name="finetune",
        summary="fine-tuning on gold labels only, no distillation (the reference; `hsk teacher` runs it)",
        store_needs="gold labels (any store whose rows have them)",
        paper="Devlin et al., 'BERT: Pre-training of Deep Bidirectional Transformers' (NAACL 2019)",
        options=FinetuneOptions,
        build=_build,
    )
)
