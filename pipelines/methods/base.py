"""What a distillation method is, as data: a `Method` names typed options and builds a list of `Stage`s.

A Stage says everything the one training loop (pipelines.train.loop) needs to run it: how long and
at what learning rate, what it reads from the store, what the student must output, which head it
trains and what else trains, whether it keeps the best dev checkpoint, and its loss as a weighted
sum of named `Term`s (each term is a function of pipelines.train.losses.LOSS_TERMS, logged on its
own in metrics.jsonl). Layer pairs are not written by hand: a Stage names a pairing rule of
pipelines.train.pairs, which computes them from the store's layer map and the student's depth.

The shape follows torchdistill's multi-stage boxes (a stage = epochs + optimiser + a weighted sum of
named sub-losses) and TextBrewer's intermediate matches (teacher layer, student layer, feature,
loss, weight, projection), kept as typed Python checked against the store before the first step.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hskstore.config import ConfigError, Selection
from pipelines.core.tasks import Task

SCHEDULES = ("constant", "linear", "warmup-linear")
# attention_scores: pre-softmax (q, k) of every self-attention call (pipelines.train.attention.ScoreRecorder)
OUTPUTS = ("logits", "hidden_states", "attentions", "attention_scores")
TRAINS = ("student", "projection")


class MethodError(ConfigError):
    """A method cannot run on this store / student, or got a bad option (one line, says what to do)."""


@dataclass(frozen=True)
class Term:
    """One named part of a stage's loss: weight * LOSS_TERMS[loss](inputs, **params)."""

    name: str  # as logged in metrics.jsonl ("ce", "kl", "hsk", "pkd", ...)
    loss: str  # key of pipelines.train.losses.LOSS_TERMS
    weight: float = 1.0
    params: tuple[tuple[str, Any], ...] = ()  # keyword arguments of the loss, e.g. (("T", 10.0),)

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.params)


@dataclass(frozen=True)
class Stage:
    """One stage of a method (see the module docstring)."""

    name: str
    epochs: float
    lr: float
    terms: tuple[Term, ...]
    schedule: str = "linear"  # constant | linear (decay to 0) | warmup-linear (warmup_ratio, then decay)
    warmup_ratio: float = 0.0
    reads: tuple[str, ...] = ()  # store arrays besides the inputs and labels: "logits", "layers", ...
    outputs: tuple[str, ...] = ("logits",)  # what the student's forward must return
    head: str = "task"  # the classification head this stage trains: task | ptp4 | mlm (pipelines.train.heads)
    fresh_head: bool = False  # start from a newly initialised head instead of the one kept aside
    trains: tuple[str, ...] = ("student",)  # "student", and "projection" (the shared W: d_S -> d_T)
    select_best: bool = False  # evaluate on dev (epoch ends, --eval-every) and keep the best checkpoint
    pairs: str | None = None  # layer pairing rule of pipelines.train.pairs ("store", "pkd-skip", "pkd-last")
    pair_loss: str | None = None  # the loss term the pairs feed (recorded with each pair)

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise MethodError(f"stage {self.name}: schedule must be one of {', '.join(SCHEDULES)}")
        if self.epochs < 0 or self.lr <= 0:
            raise MethodError(f"stage {self.name}: epochs must be >= 0 and lr > 0 (got {self.epochs}, {self.lr})")
        if not self.terms:
            raise MethodError(f"stage {self.name} has no loss terms")
        bad = [o for o in self.outputs if o not in OUTPUTS] + [t for t in self.trains if t not in TRAINS]
        if bad:
            raise MethodError(f"stage {self.name}: unknown outputs/trains {bad}")

    def describe(self) -> dict:
        """JSON-able (summary.json, metrics.jsonl)."""
        out = dataclasses.asdict(self)
        out["terms"] = [{"name": t.name, "loss": t.loss, "weight": t.weight, **t.kwargs} for t in self.terms]
        return out


@dataclass(frozen=True)
class Context:
    """What a method may look at when it builds its stages: the task and the store's selection."""

    task: Task | None  # None: a masked-LM store (no task, no layer selection)
    selection: Selection | None
    meta: Mapping[str, Any]
    warnings: list[str] = field(default_factory=list)  # what the run should say (and record) about its plan
    student: str | None = None  # the student asked for, when known (a sweep's plan, a run)
    student_layers: int | None = None  # its depth (effective layers of an SPS student), when known
    # offline runs: () -> (teacher logits [N, C], gold labels [N]) of every stored row, read when called
    stored_targets: Callable[[], tuple[Any, Any]] | None = None


@dataclass(frozen=True)
class Method:
    """A distillation method: typed options and the stages they give."""

    name: str
    summary: str  # one line for `hsk methods`
    store_needs: str  # what a store must hold to serve it, in words (`hsk methods`)
    paper: str  # where it comes from
    options: type  # a dataclass; every field has a default, __post_init__ validates
    build: Callable[[Any, Context], list[Stage]]
    check: Callable[[Any, Context], str | None] = field(default=lambda options, ctx: None)
    objective: str = "task"  # the store it distils from: "task" | "mlm" (a masked-LM store, `hsk dump --objective mlm`)

    def make_options(self, values: Mapping[str, Any] | None = None) -> Any:
        """The options dataclass from `values` (strings are converted to the field's type)."""
        values = dict(values or {})
        hints = typing.get_type_hints(self.options)
        known = {f.name for f in dataclasses.fields(self.options)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise MethodError(
                f"method {self.name} has no option {', '.join(unknown)}; its options: {', '.join(sorted(known))}"
            )
        return self.options(**{k: _coerce(k, v, hints[k]) for k, v in values.items()})

    def stages(self, options: Any, ctx: Context) -> list[Stage]:
        """Check the store against the method, then build its stages."""
        problem = self.check(options, ctx)
        if problem:
            raise MethodError(f"method {self.name}: {problem}")
        stages = self.build(options, ctx)
        if not stages:
            raise MethodError(f"method {self.name}: nothing to train with these options")
        return stages

    def option_dict(self, options: Any) -> dict[str, Any]:
        return dataclasses.asdict(options)


def _coerce(name: str, value: Any, hint: Any) -> Any:
    """A CLI string (or a number) as the option field's declared type."""
    if not isinstance(value, str):
        return tuple(value) if isinstance(value, list) else value
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    kind = args[0]
    origin = typing.get_origin(kind) or kind
    try:
        if value.lower() == "none" and type(None) in typing.get_args(hint):
            return None
        if origin is bool:
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
        if origin is tuple:
            return tuple(s.strip() for s in value.split(",") if s.strip())
        return origin(value)
    except (TypeError, ValueError):
        raise MethodError(f"option {name}: cannot read {value!r} as {getattr(origin, '__name__', origin)}") from None


# --------------------------------------------------------------------------------------------------
# The registry

_REGISTRY: dict[str, Method] = {}  # read through pipelines.methods.get_method / all_methods


def register(method: Method) -> Method:
    """Add a method to the registry (its name is what `hsk train --method` takes)."""
    if method.name in _REGISTRY and _REGISTRY[method.name] is not method:
        raise ValueError(f"a method named {method.name!r} is already registered")
    _REGISTRY[method.name] = method
    return method
