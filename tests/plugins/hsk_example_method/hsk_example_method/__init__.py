"""`example-kd`: KD on the stored logits with its own defaults, registered from outside hsk.

hsk imports this module through the entry point in this package's pyproject.toml (group
`hsk.methods`); importing it registers the method.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.methods.kd import check_kd, kd_stage, prediction_terms
from pipelines.registry import Context, Method, Stage, register


@dataclass
class ExampleKDOptions:
    epochs: float = 1.0
    lr: float | None = None  # None: the task's
    temperature: float = 4.0
    alpha: float = 0.9

    def __post_init__(self) -> None:
        check_kd(self.epochs, self.lr, self.temperature, self.alpha)


def _build(options: ExampleKDOptions, ctx: Context) -> list[Stage]:
    return [kd_stage(ctx.task, options.epochs, options.lr,
                     prediction_terms(ctx.task, options.temperature, options.alpha))]


EXAMPLE_KD = register(
    Method(
        name="example-kd",
        summary="an installed package's method: KD at T 4, a 0.9, one epoch",
        store_needs="logits only (any store)",
        paper="none: the example of docs/methods/adding-a-method.md",
        options=ExampleKDOptions,
        build=_build,
    )
)
