"""`RunSummary`: what `hsk train` returns and writes to OUT/summary.json, typed.

One shape for every run: a task run fills every field; a LightPAFF pre-training run (a masked-LM
store: no task, dev set or layer map) leaves the task's fields None. `hsk sweep` and the catalog read
it by attribute; `summary["steps"]` also works (the JSON's keys are the fields' names).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunSummary:
    task: str | None = None  # None: a masked-LM run
    mode: str = "offline"  # offline | online
    source: str = ""  # the store's URL (or online:<teacher>)
    store_content_address: str | None = None
    stores_read: list[dict] = field(default_factory=list)  # lineage: every store read, by content address
    method: str = ""
    method_options: dict[str, object] = field(default_factory=dict)
    options: dict[str, object] = field(default_factory=dict)  # options.run_options: --max-steps, --seed, ...
    plan: list[dict] = field(default_factory=list)  # Stage.describe() of every stage
    student: dict[str, object] = field(default_factory=dict)  # StudentInfo.describe()
    student_init: str | None = None
    stages: dict[str, dict] = field(default_factory=dict)  # per stage: steps, epochs, final loss, speed
    steps: int = 0
    examples: int = 0
    train_seconds: float = 0.0
    examples_per_s: float = 0.0
    metric: str | None = None
    score: float | None = None  # the best dev score (None: no dev evaluation)
    best_step: int | None = None
    dev: dict | None = None  # the best evaluation's metrics, per dev split
    dev_data: dict | None = None
    eval_on_training_split: bool = False
    model_dir: str = ""
    layer_pairs: list[dict] = field(default_factory=list)
    layer_map: list[dict] = field(default_factory=list)
    store_bytes: dict[str, int] = field(default_factory=dict)  # {"total", "read"}
    config: str | None = None  # the store's HSK config
    batch_size: int = 0  # the global batch
    world_size: int = 1  # torchrun ranks
    # torch CPU threads of a CPU run started by `hsk train` (None: a GPU run, or the Python API's own setting).
    # Recorded, not part of the run's identity: like the rank count, it changes the last bits, and a run
    # resumes under another count (elastic resume) with results equal to rounding.
    torch_threads: int | None = None
    precision: str = "fp32"  # the step's precision, resolved (pipelines.core.precision; older runs: fp32)
    compile: str | None = None  # torch.compile's mode of the step (--compile), None: eager
    warnings: list[str] = field(default_factory=list)
    # what a rerun must share with this run to be it (pipelines.train.run.checkpoints.RunIdentity.to_json)
    identity: dict[str, object] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        """summary["steps"]: the summary.json key (scripts written against the JSON keep working)."""
        if name not in _FIELDS:
            raise KeyError(name)
        return getattr(self, name)

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def read(cls, path: Path) -> RunSummary:
        """A summary.json (keys this version does not know, from another one, are left out)."""
        data = json.loads(Path(path).read_text())
        return cls(**{k: v for k, v in data.items() if k in _FIELDS})


_FIELDS = frozenset(f.name for f in dataclasses.fields(RunSummary))
