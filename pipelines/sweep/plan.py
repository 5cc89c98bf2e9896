"""Which runs a sweep makes: the spec's entries expanded against the source store, one `PlannedRun` each.

Pure planning: the source store is opened and every derived config checked against it
(`hskstore.share.derive.plan_derive`), but nothing is derived or trained. A run's `run_id` hashes everything
that decides its result (the source's identity, the config, dtype, student, method options and
training settings), so plans are deterministic and a rerun recognises finished runs. Which configs a
grid holds is `pipelines.sweep.grid`'s; deriving and training is `pipelines.sweep.execute`'s.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from hskstore.format.config import ConfigError, HSKConfig, Selection
from hskstore.format.meta import StoreMeta
from hskstore.io.reader import open_store
from hskstore.share.derive import plan_derive
from pipelines.methods import Context, get_method
from pipelines.sweep.grid import budget_grid, selection, table5_grid
from pipelines.sweep.spec import (
    FULL,
    GRID_BUDGET,
    GRID_TABLE5,
    NO_KD,
    PRED_ONLY,
    SweepSpec,
    parse_entry,
    run_options,
    split_list,
)
from pipelines.train.options import TrainOptions, result_fields

# Order of kinds among runs with the same amount of HSK: references first, the source last.
_KIND_ORDER = ("no_kd", "method", "pred_only", "hsk", "full")


@dataclass(frozen=True)
class Target:
    """What a (student, seed) pair trains on: a config of mud's grid, a reference, or another method's store."""

    kind: str  # pipelines.sweep.results.KINDS: hsk | pred_only | full | no_kd, or 'method'
    label: str  # what the results table shows: 'ND,NL,W', 'pred-only', 'full', 'no-kd' or the method
    store_config: str | None  # the config to derive; None: the source store itself
    value_dtype: str | None  # None for logits-only stores
    method: str = "mud"


_LOGITS_ONLY = Target("pred_only", PRED_ONLY, "0,0,0", None)


@dataclass(frozen=True)
class PlannedRun:
    """One training run of a sweep (the trainer's own run state is pipelines.train's)."""

    run_id: str
    kind: str  # pipelines.sweep.results.KINDS: hsk | pred_only | full | no_kd
    config: str  # what the results table shows: 'ND,NL,W', 'pred-only', 'full' or 'no-kd'
    store_config: str | None  # the config to derive; None: train from the source store itself
    value_dtype: str | None  # None for logits-only stores (no HSK values at all)
    amount_hsk: float
    student: str
    seed: int
    stages: tuple[str, ...]  # mud's stages; () for other methods
    alpha: float | None  # mud: None keeps the settings' value; 0.0 for no-kd (pure cross-entropy on gold labels)
    method: str = "mud"

    @property
    def grid(self) -> bool:
        """Whether the run is one of a method's config grid (mud's), labelled by its config."""
        return get_method(self.method).sweep_grid

    @property
    def store_key(self) -> tuple[str, str | None] | None:
        return None if self.store_config is None else (self.store_config, self.value_dtype)

    @property
    def name(self) -> str:
        """The run folder's name: readable, and unique through the run_id."""
        student = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(self.student.rstrip("/")).name or self.student)
        label = self.config.replace(",", "_") if self.grid else self.method
        return f"{label}-{self.value_dtype or 'logits'}-{student}-seed{self.seed}-{self.run_id[:10]}"

    def describe(self) -> str:
        """One line for the sweep's log: what the run trains."""
        dtype = f" {self.value_dtype}" if self.value_dtype else ""
        what = f"{self.kind} {self.config}" if self.grid else f"method {self.method}"
        return f"{what}{dtype} {self.student} seed {self.seed}"


def train_options(run: PlannedRun, spec: SweepSpec) -> TrainOptions:
    return run_options(spec, run.method, run.seed, run.stages, run.alpha)


def run_dir(run: PlannedRun, spec: SweepSpec) -> Path:
    return Path(spec.work_dir) / "runs" / run.name


# --------------------------------------------------------------------------------------------------
# Expanding the spec's entries


def expand_configs(spec: SweepSpec, source_meta: StoreMeta) -> list[Target]:
    """mud's targets, in spec order, without repeats."""
    sel = selection(source_meta)
    out: list[Target] = []
    for entry in spec.configs:
        token, dtypes = parse_entry(entry, spec.value_dtypes)
        out += _expand_entry(spec, source_meta, sel, entry, token, dtypes)
    return list(dict.fromkeys(out))


def _expand_entry(spec: SweepSpec, source_meta: StoreMeta, sel: Selection, entry: str, token: str,
                  dtypes: tuple[str, ...]) -> list[Target]:
    low = token.lower()
    if low == PRED_ONLY:
        return [_LOGITS_ONLY]
    if low == NO_KD:
        return [Target("no_kd", NO_KD, "0,0,0", None)]  # reads labels (and unused logits) only
    if low == FULL:
        return _full(spec, sel, dtypes)
    if low == GRID_TABLE5:
        grid = table5_grid(source_meta, per_amount=spec.per_amount)
        return [_hsk(sel, cfg, dtype) for cfg in grid for dtype in dtypes]
    if low.startswith(GRID_BUDGET):
        budget = _budget(entry, low)
        return [_hsk(sel, cfg, dtype) for dtype in dtypes
                for cfg in budget_grid(source_meta, budget, value_dtype=dtype)]
    cfg = HSKConfig.parse(token)
    if cfg.logits_only:
        return [_LOGITS_ONLY]
    return [_hsk(sel, str(cfg), dtype) for dtype in dtypes]


def _hsk(sel: Selection, cfg: str, dtype: str) -> Target:
    # The source's own config at its own dtype is the source: no copy.
    same = cfg == str(sel.config) and dtype == sel.value_dtype
    return Target("hsk", cfg, None if same else cfg, dtype)


def _full(spec: SweepSpec, sel: Selection, dtypes: tuple[str, ...]) -> list[Target]:
    if sel.config.logits_only:
        raise ConfigError(f"the source store {spec.source} keeps logits only: 'full' would be 'pred-only'")
    return [Target("full", FULL, None if dtype == sel.value_dtype else str(sel.config), dtype) for dtype in dtypes]


def _budget(entry: str, low: str) -> float:
    _, _, amount = low.partition(":")
    try:
        return float(amount)
    except ValueError:
        raise ConfigError(f"config entry {entry!r}: write 'budget:BYTES', e.g. 'budget:2000'") from None


def _method_target(spec: SweepSpec, method: str, meta: StoreMeta) -> Target:
    """A non-mud method's target: the logits store when it reads logits only, else the source."""
    from pipelines.core.tasks import get_task

    m = get_method(method)
    options = run_options(spec, method, 0).method_options
    ctx = Context(get_task(meta.task.name), selection(meta), meta)
    stages = m.stages(m.make_options(options), ctx)  # refuses a source that cannot serve the method
    if all(set(st.reads) <= {"logits", "labels"} for st in stages):
        return Target("method", method, "0,0,0", None, method)
    return Target("method", method, None, selection(meta).value_dtype, method)


def _targets(spec: SweepSpec, meta: StoreMeta) -> list[Target]:
    out: list[Target] = []
    for method in spec.methods:
        if get_method(method).sweep_grid:
            out += expand_configs(spec, meta)
        else:
            out.append(_method_target(spec, method, meta))
    return out


# --------------------------------------------------------------------------------------------------
# Runs


def make_run_id(source_identity: str, kind: str, config: str, store_config: str | None, value_dtype: str | None,
                student: str, options: TrainOptions) -> str:
    """sha256 over everything that decides a run's result, 16 hex digits: the store, the student, the method's
    name and resolved options, and the TrainOptions fields marked as changing the result (not where or how
    the run is written)."""
    method = get_method(options.method)
    resolved = dataclasses.asdict(method.make_options(options.method_options))
    key = {
        "source": source_identity, "kind": kind, "config": config, "store_config": store_config,
        "value_dtype": value_dtype, "student": student, "method": method.name, "method_options": resolved,
        "train": {name: getattr(options, name) for name in result_fields() if name not in ("method",
                                                                                               "method_options")},
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _amount(target: Target, sel: Selection) -> float:
    d = sel.hidden_size
    if target.kind == "full" or (target.kind == "method" and target.store_config is None):
        return sel.config.amount(d)
    return 0.0 if target.kind in ("pred_only", "no_kd", "method") else HSKConfig.parse(target.label).amount(d)


def _stages_alpha(target: Target, spec: SweepSpec) -> tuple[tuple[str, ...], float | None]:
    """A grid method's stages and KD weight for a target (other methods: none of either)."""
    if not get_method(target.method).sweep_grid:
        return (), None
    mud_stages = tuple(split_list(spec.train.get("stages", ("hsk", "pred")), ","))
    stages = mud_stages if target.kind in ("hsk", "full") else ("pred",)
    return stages, 0.0 if target.kind == "no_kd" else spec.train.get("alpha")


def plan_runs(spec: SweepSpec) -> list[PlannedRun]:
    """Every run of the sweep, in order (seed, then student, then config by amount), deterministic.

    Checks up front (ConfigError) that every config can be derived from the source and that the source
    can serve every method.
    """
    source = open_store(spec.source)
    spec.__dict__["_source_meta"] = meta = source.metadata
    sel = source.selection
    targets = _targets(spec, meta)
    for cfg, dtype in dict.fromkeys((t.store_config, t.value_dtype) for t in targets if t.store_config is not None):
        plan_derive(source, HSKConfig.parse(cfg), dtype)  # refuses what the source cannot give
    ordered = sorted(targets, key=lambda t: (_amount(t, sel), _KIND_ORDER.index(t.kind), t.label, t.value_dtype or ""))
    runs: dict[str, PlannedRun] = {}
    for seed in spec.seeds:
        for student in spec.students:
            for t in ordered:
                stages, alpha = _stages_alpha(t, spec)
                options = run_options(spec, t.method, seed, stages, alpha)
                run_id = make_run_id(meta.identity, t.kind, t.label, t.store_config, t.value_dtype, student,
                                     options)
                runs.setdefault(run_id, PlannedRun(run_id, t.kind, t.label, t.store_config, t.value_dtype,
                                                   _amount(t, sel), student, seed, stages, alpha, t.method))
    return list(runs.values())
