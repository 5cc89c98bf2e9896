"""Before a sweep runs anything: can each planned run train on its store?

Every run is checked with the trainer's own check (pipelines.train.kinds.distill.run_problems: the method
against the store, the student's depth against the store's layer map), on the selection its store
will have (hskstore.share.derive.plan_derive: nothing is derived to find out). `hsk sweep --dry-run`
shows the result per run; a sweep refuses to start while any run cannot run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from hskstore.format.config import ConfigError, HSKConfig, Selection
from hskstore.format.meta import StoreMeta
from hskstore.io.reader import open_store
from hskstore.share.derive import plan_derive
from pipelines.core.models import ModelLoadError
from pipelines.core.tasks import get_task
from pipelines.sweep.plan import PlannedRun
from pipelines.sweep.spec import SweepSpec, run_options
from pipelines.train.kinds.distill import run_problems


@dataclass(frozen=True)
class Blocked:
    """A planned run that cannot run, and why (the trainer's words, with what would fix it)."""

    run: PlannedRun
    problem: str


class SweepPlanError(ConfigError):
    """Some planned runs cannot run on their stores: nothing was run (one line per run, then a summary)."""


def _store_selection(source, store_config: str | None, value_dtype: str | None) -> Selection:
    if store_config is None:
        return source.selection
    return plan_derive(source, HSKConfig.parse(store_config), value_dtype).selection


def blocked_runs(spec: SweepSpec, runs: Sequence[PlannedRun]) -> list[Blocked]:
    """The runs whose store cannot serve their method and student, each with the trainer's refusal."""
    source = open_store(spec.source)
    task = get_task(source.metadata.task.name)
    found: dict[str, list[str]] = {}
    out: list[Blocked] = []
    for run in runs:
        options = run_options(spec, run.method, run.seed, run.stages, run.alpha)
        key = json.dumps([run.store_key, run.student, run.method, options.method_options, options.student_weights],
                         sort_keys=True, default=str)
        if key not in found:
            found[key] = _problems(source, task, run, options)
        out += [Blocked(run, problem) for problem in found[key][:1]]
    return out


def _problems(source, task, run: PlannedRun, options) -> list[str]:
    selection = _store_selection(source, run.store_config, run.value_dtype)
    meta = StoreMeta.parse({**source.meta, "selection": selection.to_dict()})
    try:
        problems = run_problems(task, selection, meta, student=run.student, method=run.method,
                                method_options=options.method_options, student_weights=options.student_weights)
    except (ConfigError, ModelLoadError) as exc:
        problems = [str(exc)]
    return ["; ".join(problems)] if problems else []


def describe(run: PlannedRun) -> str:
    dtype = f" {run.value_dtype}" if run.value_dtype else ""
    what = run.config if run.grid else f"method {run.method}"
    return f"run {run.run_id} ({what}{dtype}, {run.student}, seed {run.seed})"


def refusal(blocked: Sequence[Blocked], planned: int) -> SweepPlanError:
    """One line per run that cannot run, then what to do; nothing has run."""
    lines = [f"{describe(b.run)}: {b.problem}" for b in blocked]
    students = sorted({b.run.student for b in blocked})
    lines.append(
        f"{len(blocked)} of {planned} planned runs cannot run on their stores (students {', '.join(students)}); "
        "nothing was run: fix the store or the students as each line says, or leave those out of --students / "
        "--configs / --methods (`hsk sweep --dry-run` shows the plan)"
    )
    return SweepPlanError("\n".join(lines))
