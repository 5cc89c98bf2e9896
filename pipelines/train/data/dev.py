"""Dev data of a training run, found the way `hsk dump` found its training data.

Where, first match wins: an explicit --data-dir; the folder the store's rows came from (a store
dumped from a glue_data folder records its path); $HSK_DATA_DIR; the Hugging Face hub. No dev data
stops the run before training unless evaluation is turned off (--no-eval). Evaluating on the very
split the store was dumped from is allowed, with a warning recorded in summary.json.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hskstore.format.config import ConfigError
from hskstore.format.meta import StoreMeta
from pipelines.core.data import DataError, Examples, load_examples
from pipelines.core.tasks import Task

logger = logging.getLogger("hsk.train")


@dataclass
class DevData:
    examples: dict[str, Examples] = field(default_factory=dict)  # split -> rows ({} without evaluation)
    source: str | None = None  # where they came from
    on_training_split: bool = False  # the store's own rows are being used for evaluation

    def describe(self) -> dict:
        return {"splits": {s: len(ex) for s, ex in self.examples.items()}, "source": self.source,
                "on_training_split": self.on_training_split}


def recorded_data_dir(meta: StoreMeta) -> str | None:
    """The glue_data folder a store's rows came from, when the store records one (it may have moved since)."""
    source = str(meta.dataset.source or "")
    if not source.startswith("glue_data:"):
        return None
    return str(Path(source.removeprefix("glue_data:")).parent.parent)  # DIR/<Task>/<split>.tsv


def _load(task: Task, data_dir: str | None, limit: int | None) -> dict[str, Examples]:
    return {split: load_examples(task, split, data_dir=data_dir, limit=limit) for split in task.dev_splits}


def find_dev(task: Task, meta: StoreMeta, data_dir: str | None, limit: int | None, *, evaluate: bool,
             warn: Callable[[str], None]) -> DevData:
    """The dev splits of `task` (see the module docstring); raises ConfigError when none can be had."""
    if not evaluate:
        warn("--no-eval: no dev evaluation and no best-checkpoint selection (the last model is saved)")
        return DevData()
    tried = []
    recorded = None if data_dir else recorded_data_dir(meta)
    candidates = [data_dir] if data_dir else [recorded, None]
    for where in dict.fromkeys(candidates):
        try:
            dev = _load(task, where, limit)
        except DataError as exc:
            tried += _where_tried(exc, task, where, recorded)
            continue
        found = DevData(dev, next(iter(dev.values())).source)
        _check_training_split(found, task, meta, warn)
        return found
    raise ConfigError(
        f"no dev data for {task.name} ({'; '.join(tried)}): pass --data-dir DIR (a glue_data folder), set "
        "HSK_DATA_DIR, or give --no-eval to train without evaluation"
    )


def _where_tried(exc: DataError, task: Task, where: str | None, recorded: str | None) -> list[str]:
    """What one place that has no dev data says (the recorded folder named as such)."""
    if where is not None and where == recorded:
        return [f"the folder the store was dumped from, {where}, has no {task.name} dev data"]
    lines = str(exc).splitlines()
    return [line.strip(" -") for line in lines[1:] if line.startswith("  - ")] or lines[:1]


def _check_training_split(dev: DevData, task: Task, meta: StoreMeta, warn: Callable[[str], None]) -> None:
    train_split, train_source = meta.task.split, meta.dataset.source
    same = train_split in dev.examples or any(ex.source == train_source for ex in dev.examples.values())
    if same:
        dev.on_training_split = True
        warn(
            f"evaluating on {task.name}/{train_split}, the split the store was dumped from: dev scores measure "
            "fit to the training rows, not generalisation"
        )
