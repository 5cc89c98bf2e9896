"""What a sweep is asked to do: `SweepSpec`, its config entries, and the TrainOptions of one of its runs.

Parsing and checking only: nothing here opens the source store beyond `SweepSpec.source_meta`, and
nothing is planned, derived or trained (that is `pipelines.sweep.plan`, `.stores` and `.execute`).
The config entries a spec may hold ('ND,NL,W', 'table5', 'budget:BYTES', 'pred-only', 'full', 'no-kd',
each optionally '@dtype+dtype') are named here; `pipelines.sweep.plan` expands them against the source.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hskstore.format.config import VALUES, ConfigError
from hskstore.format.meta import StoreMeta
from hskstore.io.reader import open_store
from pipelines.methods import get_method
from pipelines.train.options import TrainOptions

# Special entries of SweepSpec.configs (besides 'ND,NL,W' strings).
GRID_TABLE5 = "table5"  # the Table-5-like grid of the source (`table5_grid`)
GRID_BUDGET = "budget"  # 'budget:BYTES': configs whose store fits BYTES per example (`budget_grid`)
PRED_ONLY = "pred-only"  # logits-only KD: the store derived at '0,0,0', stage 'pred' only
FULL = "full"  # the source store itself: the largest config there is
NO_KD = "no-kd"  # fine-tune on gold labels only (KD weight alpha = 0): a lower reference
DEFAULT_CONFIGS = (GRID_TABLE5, PRED_ONLY, FULL, NO_KD)

# TrainOptions fields a sweep sets itself, or that an offline sweep cannot honour.
_FORBIDDEN_TRAIN = {
    "seed": "give seeds with SweepSpec.seeds (--seeds)",
    "method": "give methods with SweepSpec.methods (--methods)",
    "method_options": "give a method's options as train settings by name (e.g. alpha, epochs_pred)",
    "online": "a sweep trains offline, from derived stores",
    "train_limit": "offline training reads the whole store: dump a subset (`hsk dump --limit N`) as the source",
    "train_split": "the source store fixes the training split",
}
_SWEEP_TRAIN_DEFAULTS = {"progress": False}  # many runs, one log line each: no per-step bars


def split_list(text: str | Sequence, sep: str) -> list[str]:
    """'a,b' (or a sequence) -> ['a', 'b'], blanks dropped."""
    if isinstance(text, str):
        return [p.strip() for p in text.split(sep) if p.strip()]
    return [str(p).strip() for p in text if str(p).strip()]


@dataclass
class SweepSpec:
    """What to sweep. Lists also accept one string ('a;b' for configs, 'a,b' for the others)."""

    source: str  # the source store (path or fsspec URL), dumped once with the teacher at a generous config
    # 'ND,NL,W', 'table5', 'budget:BYTES', 'pred-only', 'full', 'no-kd'; '@int8' (or '@float16+int8')
    # after an entry overrides value_dtypes for it, e.g. '3,8,0.2@int8'.
    configs: list[str] = field(default_factory=lambda: list(DEFAULT_CONFIGS))
    students: list[str] = field(default_factory=lambda: ["bert2"])
    seeds: list[int] = field(default_factory=lambda: [0])
    # pipelines.methods names; `configs` are mud's (the marginal-utility grid), other methods run once per
    # (student, seed): on the logits-only store when they read logits only, else on the source store
    methods: list[str] = field(default_factory=lambda: ["mud"])
    value_dtypes: tuple[str, ...] = ("float16",)
    train: dict[str, object] = field(default_factory=dict)  # TrainOptions fields and method options by name
    work_dir: str = "runs/sweep"
    results: str | None = None  # default: <work_dir>/results.parquet
    data_dir: str | None = None  # glue_data folder for dev data (else $HSK_DATA_DIR, else the hub)
    per_amount: int = 2  # configs per amount group in the 'table5' grid
    # A finished run's checkpoint/ (model + optimizer state, ~3x the model) is deleted once its row
    # exists; best/ (the student, plain transformers format) is kept either way.
    keep_checkpoints: bool = False
    # torch CPU threads of each run (None: hsk train's default in this process; with dask, the worker's
    # share of its host's cores). Not part of a run's id: a sweep's rows are compared across machines.
    threads: int | None = None

    def __post_init__(self) -> None:
        self.source = str(self.source)
        self.configs = split_list(self.configs, ";")
        self.students = split_list(self.students, ",")
        self.seeds = [int(s) for s in split_list(self.seeds, ",")] if not isinstance(self.seeds, int) else [self.seeds]
        self.value_dtypes = tuple(split_list(self.value_dtypes, ","))
        self.train = dict(self.train)
        _check_lists(self)
        self.methods = [get_method(m).name for m in split_list(self.methods, ",")]
        if not self.methods:
            raise ConfigError("a sweep needs at least one method")
        _check_train(self.train, self.methods)
        if self.per_amount < 1:
            raise ConfigError(f"per_amount must be >= 1, got {self.per_amount}")

    @property
    def results_path(self) -> Path:
        return Path(self.results) if self.results else Path(self.work_dir) / "results.parquet"

    def source_meta(self) -> StoreMeta:
        """The source store's metadata, read once per process (opening a store lists all its arrays)."""
        cached = self.__dict__.get("_source_meta")
        if cached is None:
            cached = self.__dict__["_source_meta"] = open_store(self.source).metadata  # refuses incomplete stores
        return cached


def _check_lists(spec: SweepSpec) -> None:
    if not spec.configs or not spec.students or not spec.seeds or not spec.value_dtypes:
        raise ConfigError("a sweep needs at least one config, student, seed and value dtype")
    bad = [v for v in spec.value_dtypes if v not in VALUES.values]
    if bad:
        raise ConfigError(f"value dtypes {bad} unknown; choose from {', '.join(VALUES.values)}")


def _check_train(train: dict[str, object], methods: list[str]) -> None:
    """Every train setting is a TrainOptions field a sweep leaves to the user, or an option of one of its methods."""
    known = {f.name for f in dataclasses.fields(TrainOptions)}
    for key in train:
        if key in _FORBIDDEN_TRAIN:
            raise ConfigError(f"train setting {key!r} cannot be set in a sweep: {_FORBIDDEN_TRAIN[key]}")
        if key not in known and not any(key in _option_names(m) for m in methods):
            raise ConfigError(
                f"train setting {key!r} is neither a TrainOptions field nor an option of method "
                f"{', '.join(methods)}; TrainOptions fields: {sorted(known - set(_FORBIDDEN_TRAIN))}"
            )


def _option_names(method: str) -> set[str]:
    return {f.name for f in dataclasses.fields(get_method(method).options)}


def parse_entry(entry: str, default_dtypes: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """'3,8,0.2@float16+int8' -> ('3,8,0.2', ('float16', 'int8')); without '@', the spec's value dtypes."""
    token, _, dtypes = entry.partition("@")
    token = token.strip()
    if not dtypes:
        return token, default_dtypes
    chosen = tuple(split_list(dtypes, "+"))
    bad = [v for v in chosen if v not in VALUES.values]
    if bad or not chosen:
        raise ConfigError(f"config entry {entry!r}: after '@' give value dtypes from {', '.join(VALUES.values)}, "
                          "joined by '+', e.g. '3,8,0.2@float16+int8'")
    return token, chosen


def run_options(spec: SweepSpec, method: str, seed: int, stages: tuple[str, ...] = (),
                alpha: float | None = None) -> TrainOptions:
    """The TrainOptions of one run: the sweep's settings, the method's own options among them."""
    names = _option_names(method)
    method_options = {k: v for k, v in spec.train.items() if k in names}
    if get_method(method).sweep_grid:
        method_options["stages"] = stages
        if alpha is not None:
            method_options["alpha"] = alpha
    fields = {f.name for f in dataclasses.fields(TrainOptions)}
    kwargs = {k: v for k, v in {**_SWEEP_TRAIN_DEFAULTS, **spec.train}.items() if k in fields and k not in names}
    if spec.data_dir is not None:
        kwargs["data_dir"] = spec.data_dir
    return TrainOptions(**kwargs, seed=seed, method=method, method_options=method_options)
