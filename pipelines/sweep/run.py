"""`hsk sweep`: from one source store, derive a grid of smaller stores, train students on each, record results.

The experiment of METHOD.md (the paper's Table 5 idea): how good is a student distilled from A
units of hidden-state knowledge (A = N^D * N^L * N^W / d_T), for A from a tenth of a token vector
up to everything the source store keeps? One source store is dumped once with the teacher; every
smaller config is derived from it without the teacher (`hskstore.derive`), so the sweep never
loads the teacher.

A sweep is a list of runs (config x value dtype x student x seed, plus reference runs: logits-only
KD 'pred-only', the source itself 'full', and gold labels only 'no-kd'). Each run has a
deterministic `run_id` (hash of the source store's identity, the config, dtype, student, seed and
training settings), and its row is appended to the Parquet results table (`pipelines.sweep.results`) as
soon as it finishes. Rerunning the same sweep skips every run_id already in the table, so an
interrupted sweep resumes; a run interrupted mid-training also resumes from its own checkpoint.

Layout of `work_dir`:

    stores/<source identity>/<config>-<dtype>.zarr   derived stores, shared by every run that needs them
    stores/<source identity>/<name>.storage.json     cached storage reports
    runs/<config>-<dtype>-<student>-seed<k>-<run_id>/ one `hsk train` folder per run (train.log inside)
    results.parquet                                  the results table (default; see SweepSpec.results)

Independent runs go in parallel on a dask cluster, one process per run: a LocalCluster with
`workers` single-threaded processes, or any running scheduler (`scheduler="tcp://host:8786"`; the
workers must see the same filesystem paths). Every store a run needs is derived once before the
runs fan out, so two runs never derive the same store concurrently.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import shutil
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
import zarr

from hskstore.config import VALUE_DTYPES, ConfigError, HSKConfig
from hskstore.derive import derive, plan_derive
from hskstore.info import storage_report
from hskstore.outputs import claim_output, mark_output
from hskstore.reader import open_store
from hskstore.schema import META_KEY
from pipelines.methods import Context, get_method
from pipelines.sweep.grid import budget_grid, selection, table5_grid
from pipelines.sweep.results import append_results, read_results
from pipelines.train.distill import RUN_KIND, train
from pipelines.train.options import TrainOptions, result_fields

# --------------------------------------------------------------------------------------------------
# Config grids

# Special entries of SweepSpec.configs (besides 'ND,NL,W' strings).
GRID_TABLE5 = "table5"  # the Table-5-like grid of the source (`table5_grid`)
GRID_BUDGET = "budget"  # 'budget:BYTES': configs whose store fits BYTES per example (`budget_grid`)
PRED_ONLY = "pred-only"  # logits-only KD: the store derived at '0,0,0', stage 'pred' only
FULL = "full"  # the source store itself: the largest config there is
NO_KD = "no-kd"  # fine-tune on gold labels only (KD weight alpha = 0): a lower reference
REFERENCE_ENTRIES = (PRED_ONLY, FULL, NO_KD)
SWEEP_KIND = "sweep"  # the output kind of a sweep's work_dir (hskstore.outputs)
DEFAULT_CONFIGS = (GRID_TABLE5, PRED_ONLY, FULL, NO_KD)


# --------------------------------------------------------------------------------------------------
# The sweep's spec and runs

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


def _split(text: str | Sequence, sep: str) -> list[str]:
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
    train: dict[str, Any] = field(default_factory=dict)  # TrainOptions fields and method options by name
    work_dir: str = "runs/sweep"
    results: str | None = None  # default: <work_dir>/results.parquet
    data_dir: str | None = None  # glue_data folder for dev data (else $HSK_DATA_DIR, else the hub)
    per_amount: int = 2  # configs per amount group in the 'table5' grid
    # A finished run's checkpoint/ (model + optimizer state, ~3x the model) is deleted once its row
    # exists; best/ (the student, plain transformers format) is kept either way.
    keep_checkpoints: bool = False

    def __post_init__(self) -> None:
        self.source = str(self.source)
        self.configs = _split(self.configs, ";")
        self.students = _split(self.students, ",")
        self.seeds = [int(s) for s in _split(self.seeds, ",")] if not isinstance(self.seeds, int) else [self.seeds]
        self.value_dtypes = tuple(_split(self.value_dtypes, ","))
        self.train = dict(self.train)
        if not self.configs or not self.students or not self.seeds or not self.value_dtypes:
            raise ConfigError("a sweep needs at least one config, student, seed and value dtype")
        bad = [v for v in self.value_dtypes if v not in VALUE_DTYPES]
        if bad:
            raise ConfigError(f"value dtypes {bad} unknown; choose from {', '.join(VALUE_DTYPES)}")
        self.methods = [get_method(m).name for m in _split(self.methods, ",")]
        if not self.methods:
            raise ConfigError("a sweep needs at least one method")
        known = {f.name for f in dataclasses.fields(TrainOptions)}
        for key in self.train:
            if key in _FORBIDDEN_TRAIN:
                raise ConfigError(f"train setting {key!r} cannot be set in a sweep: {_FORBIDDEN_TRAIN[key]}")
            if key not in known and not any(key in _option_names(m) for m in self.methods):
                raise ConfigError(
                    f"train setting {key!r} is neither a TrainOptions field nor an option of method "
                    f"{', '.join(self.methods)}; TrainOptions fields: {sorted(known - set(_FORBIDDEN_TRAIN))}"
                )
        if self.per_amount < 1:
            raise ConfigError(f"per_amount must be >= 1, got {self.per_amount}")

    @property
    def results_path(self) -> Path:
        return Path(self.results) if self.results else Path(self.work_dir) / "results.parquet"

    def source_meta(self) -> dict:
        """The source store's metadata, read once per process (opening a store lists all its arrays)."""
        cached = self.__dict__.get("_source_meta")
        if cached is None:
            cached = self.__dict__["_source_meta"] = open_store(self.source).meta  # refuses incomplete stores
        return cached


def _option_names(method: str) -> set[str]:
    return {f.name for f in dataclasses.fields(get_method(method).options)}


@dataclass(frozen=True)
class Run:
    """One training run of a sweep."""

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
    def store_key(self) -> tuple[str, str | None] | None:
        return None if self.store_config is None else (self.store_config, self.value_dtype)

    @property
    def name(self) -> str:
        """The run folder's name: readable, and unique through the run_id."""
        student = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(self.student.rstrip("/")).name or self.student)
        label = self.config.replace(",", "_") if self.method == "mud" else self.method
        return f"{label}-{self.value_dtype or 'logits'}-{student}-seed{self.seed}-{self.run_id[:10]}"


def _parse_entry(entry: str, default_dtypes: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    token, _, dtypes = entry.partition("@")
    token = token.strip()
    if not dtypes:
        return token, default_dtypes
    chosen = tuple(_split(dtypes, "+"))
    bad = [v for v in chosen if v not in VALUE_DTYPES]
    if bad or not chosen:
        raise ConfigError(f"config entry {entry!r}: after '@' give value dtypes from {', '.join(VALUE_DTYPES)}, "
                          "joined by '+', e.g. '3,8,0.2@float16+int8'")
    return token, chosen


def expand_configs(spec: SweepSpec, source_meta: dict) -> list[tuple[str, str, str | None, str | None]]:
    """[(kind, config label, store config or None, value dtype or None)] in spec order, without repeats."""
    sel = selection(source_meta)
    src_cfg, src_dtype = str(sel.config), sel.value_dtype
    out: list[tuple[str, str, str | None, str | None]] = []

    def hsk(cfg: str, dtype: str) -> tuple[str, str, str | None, str | None]:
        # The source's own config at its own dtype is the source: no copy.
        same = cfg == src_cfg and dtype == src_dtype
        return ("hsk", cfg, None if same else cfg, dtype)

    for entry in spec.configs:
        token, dtypes = _parse_entry(entry, spec.value_dtypes)
        low = token.lower()
        if low == PRED_ONLY:
            out.append(("pred_only", PRED_ONLY, "0,0,0", None))
        elif low == NO_KD:
            out.append(("no_kd", NO_KD, "0,0,0", None))  # reads labels (and unused logits) only
        elif low == FULL:
            if sel.config.logits_only:
                raise ConfigError(f"the source store {spec.source} keeps logits only: 'full' would be 'pred-only'")
            for dtype in dtypes:
                out.append(("full", FULL, None if dtype == src_dtype else src_cfg, dtype))
        elif low == GRID_TABLE5:
            for cfg in table5_grid(source_meta, per_amount=spec.per_amount):
                out += [hsk(cfg, dtype) for dtype in dtypes]
        elif low.startswith(GRID_BUDGET):
            _, _, amount = low.partition(":")
            try:
                budget = float(amount)
            except ValueError:
                raise ConfigError(f"config entry {entry!r}: write 'budget:BYTES', e.g. 'budget:2000'") from None
            for dtype in dtypes:
                out += [hsk(cfg, dtype) for cfg in budget_grid(source_meta, budget, value_dtype=dtype)]
        else:
            cfg = HSKConfig.parse(token)
            if cfg.logits_only:
                out.append(("pred_only", PRED_ONLY, "0,0,0", None))
            else:
                out += [hsk(str(cfg), dtype) for dtype in dtypes]
    return list(dict.fromkeys(out))


def run_options(spec: SweepSpec, method: str, seed: int, stages: tuple[str, ...] = (),
                alpha: float | None = None) -> TrainOptions:
    """The TrainOptions of one run: the sweep's settings, the method's own options among them."""
    names = _option_names(method)
    method_options = {k: v for k, v in spec.train.items() if k in names}
    if method == "mud":
        method_options["stages"] = stages
        if alpha is not None:
            method_options["alpha"] = alpha
    fields = {f.name for f in dataclasses.fields(TrainOptions)}
    kwargs = {k: v for k, v in {**_SWEEP_TRAIN_DEFAULTS, **spec.train}.items() if k in fields and k not in names}
    if spec.data_dir is not None:
        kwargs["data_dir"] = spec.data_dir
    return TrainOptions(**kwargs, seed=seed, method=method, method_options=method_options)


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


def _method_target(spec: SweepSpec, method: str, meta: dict) -> tuple[str, str, str | None, str | None]:
    """(kind, label, store config, dtype) of a non-mud method: the logits store when it reads logits only."""
    from pipelines.core.tasks import get_task

    m = get_method(method)
    options = run_options(spec, method, 0).method_options
    ctx = Context(get_task(meta["task"]["name"]), selection(meta), meta)
    stages = m.stages(m.make_options(options), ctx)  # refuses a source that cannot serve the method
    if all(set(st.reads) <= {"logits", "labels"} for st in stages):
        return ("method", method, "0,0,0", None)
    return ("method", method, None, selection(meta).value_dtype)


def _targets(spec: SweepSpec, meta: dict) -> list[tuple[tuple, str]]:
    """[((kind, label, store config, dtype), method)] of the sweep."""
    out = []
    for method in spec.methods:
        if method == "mud":
            out += [(t, method) for t in expand_configs(spec, meta)]
        else:
            out.append((_method_target(spec, method, meta), method))
    return out


def plan_runs(spec: SweepSpec) -> list[Run]:
    """Every run of the sweep, in order (seed, then student, then config by amount), deterministic.

    Checks up front (ConfigError) that every config can be derived from the source and that the source
    can serve every method.
    """
    source = open_store(spec.source)
    spec.__dict__["_source_meta"] = meta = source.meta
    sel = source.selection
    d = sel.hidden_size
    targets = _targets(spec, meta)
    for key in dict.fromkeys((cfg, dtype) for (_, _, cfg, dtype), _ in targets if cfg is not None):
        plan_derive(source, HSKConfig.parse(key[0]), key[1])  # refuses what the source cannot give
    mud_stages = tuple(_split(spec.train.get("stages", ("hsk", "pred")), ","))

    def amount(t: tuple) -> float:
        kind, label, store_config, _ = t
        if kind == "full" or (kind == "method" and store_config is None):
            return sel.config.amount(d)
        return 0.0 if kind in ("pred_only", "no_kd", "method") else HSKConfig.parse(label).amount(d)

    kind_order = ("no_kd", "method", "pred_only", "hsk", "full")
    ordered = sorted(targets, key=lambda tm: (amount(tm[0]), kind_order.index(tm[0][0]), tm[0][1], tm[0][3] or ""))
    runs: dict[str, Run] = {}
    for seed in spec.seeds:
        for student in spec.students:
            for t, method in ordered:
                kind, label, store_config, dtype = t
                stages = () if method != "mud" else mud_stages if kind in ("hsk", "full") else ("pred",)
                alpha = 0.0 if kind == "no_kd" else spec.train.get("alpha") if method == "mud" else None
                options = run_options(spec, method, seed, stages, alpha)
                run_id = make_run_id(meta["identity"], kind, label, store_config, dtype, student, options)
                runs.setdefault(run_id, Run(run_id, kind, label, store_config, dtype, amount(t), student, seed,
                                            stages, alpha, method))
    return list(runs.values())


# --------------------------------------------------------------------------------------------------
# Stores


def store_dir(spec: SweepSpec) -> Path:
    """Where the stores derived from this source live (one folder per source identity)."""
    return Path(spec.work_dir) / "stores" / spec.source_meta()["identity"].split(":")[-1][:16]


def store_path(spec: SweepSpec, store_config: str, value_dtype: str | None) -> Path:
    cfg = HSKConfig.parse(store_config)
    if cfg.logits_only:
        return store_dir(spec) / "logits.zarr"
    return store_dir(spec) / f"{str(cfg).replace(',', '_')}-{value_dtype}.zarr"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Advisory lock: two sweeps (or workers) sharing a work_dir never derive one store at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_meta(url: str) -> dict | None:
    """A store's metadata without opening it as an HSKStore (no array listing); None when unreadable."""
    try:
        return zarr.open_group(url, mode="r").attrs.asdict().get(META_KEY)
    except Exception:  # nothing there, or not a readable store: derive over it
        return None


def ensure_store(spec: SweepSpec, store_config: str | None, value_dtype: str | None, *,
                 log: Callable[[str], Any] | None = None) -> str:
    """The url of the store a run trains from: the source, or a derived store (derived unless complete)."""
    if store_config is None:
        return spec.source
    out = store_path(spec, store_config, value_dtype)
    source = spec.source_meta()
    with _file_lock(out.with_name(out.name + ".lock")):
        meta = _read_meta(str(out))
        recorded = (meta or {}).get("derived_from") or {}
        same_source = (recorded.get("identity"), recorded.get("checksums")) == (
            source["identity"], source.get("checksums"))
        if meta is not None and meta.get("complete") and same_source:
            return str(out)  # reuse
        if log is not None:
            log(f"derive {store_config} ({value_dtype or 'logits only'}) -> {out}")
        # An interrupted derive of the same source resumes; anything else there is replaced.
        overwrite = meta is not None and (meta.get("complete") or not same_source)
        derive(spec.source, store_config, str(out), value_dtype=value_dtype, overwrite=bool(overwrite))
    return str(out)


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


def store_storage(spec: SweepSpec, url: str) -> dict:
    """storage_report numbers of a store, cached next to the derived stores (it reads every positions array)."""
    meta = _read_meta(url) or {}
    name = "source" if url == spec.source else Path(url).name.removesuffix(".zarr")
    cache = store_dir(spec) / f"{name}.storage.json"
    stamp = {"identity": meta.get("identity"), "created": meta.get("created")}
    if cache.exists():
        with contextlib.suppress(ValueError, OSError, KeyError):
            cached = json.loads(cache.read_text())
            if cached.get("stamp") == stamp:
                return cached["report"]
    store = open_store(url)
    report = storage_report(store)
    numbers = {k: v for k, v in report.items() if k != "arrays"}
    numbers["rows"] = len(store)
    cache.parent.mkdir(parents=True, exist_ok=True)
    _write_json_atomic(cache, {"stamp": stamp, "report": numbers})
    return numbers


# --------------------------------------------------------------------------------------------------
# One run


def train_options(run: Run, spec: SweepSpec) -> TrainOptions:
    return run_options(spec, run.method, run.seed, run.stages, run.alpha)


def run_dir(run: Run, spec: SweepSpec) -> Path:
    return Path(spec.work_dir) / "runs" / run.name


class _ThreadRouter(logging.Handler):
    """Writes each record to the log file of the run executing in the emitting thread (a dask worker with
    several threads runs several runs at once)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.handles: dict[int, Any] = {}

    def emit(self, record: logging.LogRecord) -> None:
        handle = self.handles.get(threading.get_ident())
        if handle is not None:
            with contextlib.suppress(Exception):
                handle.write(self.format(record) + "\n")


_QUIET_LOCK = threading.Lock()
_QUIET: dict[str, Any] = {"depth": 0, "saved": [], "bars": True, "router": None}


@contextlib.contextmanager
def _transformers_quiet(handle) -> Iterator[None]:
    """Route transformers' warnings (load reports) to the run's log and hide its progress bars; the first
    run in a process swaps the handlers, the last one out restores them."""
    from transformers.utils import logging as hf_logging

    logger = hf_logging.get_logger()  # the "transformers" library root logger
    with _QUIET_LOCK:
        if _QUIET["depth"] == 0:
            _QUIET.update(saved=list(logger.handlers), bars=hf_logging.is_progress_bar_enabled(),
                          router=_ThreadRouter())
            for h in _QUIET["saved"]:
                logger.removeHandler(h)
            logger.addHandler(_QUIET["router"])
            hf_logging.disable_progress_bar()
        _QUIET["depth"] += 1
        router = _QUIET["router"]
        router.handles[threading.get_ident()] = handle
    try:
        yield
    finally:
        with _QUIET_LOCK:
            router.handles.pop(threading.get_ident(), None)
            _QUIET["depth"] -= 1
            if _QUIET["depth"] == 0:
                logger.removeHandler(router)
                for h in _QUIET["saved"]:
                    logger.addHandler(h)
                if _QUIET["bars"]:
                    hf_logging.enable_progress_bar()


def run_one(run: Run, spec: SweepSpec) -> dict:
    """Derive (or reuse) the run's store, train the student, and return its results row."""
    store_url = ensure_store(spec, run.store_config, run.value_dtype)
    out = run_dir(run, spec)
    mark_output(str(out), RUN_KIND, method=run.method)  # before train.log: `hsk train` resumes a marked run
    # The run's own log (hsk train's lines, transformers' warnings): the sweep prints one line per run.
    with open(out / "train.log", "a") as handle, _transformers_quiet(handle):

        def log(msg: str) -> None:
            handle.write(f"{msg}\n")
            handle.flush()

        log(f"--- run {run.run_id}: {_describe(run)} (torch threads {torch.get_num_threads()}, pid {os.getpid()})")
        try:
            summary = train(train_options(run, spec), student=run.student, out_dir=str(out), store=store_url,
                            data_dir=spec.data_dir, log=log)
        except Exception:  # the traceback goes to the run's log; the sweep reports one line
            log(traceback.format_exc())
            raise
    if not spec.keep_checkpoints:
        shutil.rmtree(out / "checkpoint", ignore_errors=True)  # only resumes need it; runs add up to GBs
    storage = store_storage(spec, store_url)
    stages = summary.stages or {}
    score = summary.score
    return {
        "run_id": run.run_id,
        "source_store": store_url,
        "config": run.config,
        "kind": run.kind,
        "amount_hsk": run.amount_hsk,
        "value_dtype": run.value_dtype,
        "store_bytes": int(storage["total_bytes"]),
        "bytes_per_example": float(storage["bytes_per_example"]),
        "student": run.student,
        "seed": run.seed,
        "method": run.method,
        "method_options": json.dumps(summary.method_options, sort_keys=True, default=str),
        "stages": "+".join(stages) or "+".join(run.stages),
        "epochs_hsk": (stages.get("hsk") or {}).get("epochs"),
        "epochs_pred": (stages.get("pred") or {}).get("epochs"),
        # Offline runs read every row of their store: the source's dump decides the training subset.
        "train_limit": int(storage["rows"]),
        "metric_name": summary.metric,
        "metric": None if score is None or (isinstance(score, float) and math.isnan(score)) else float(score),
        "metrics_json": json.dumps(summary.dev, sort_keys=True, default=str),
        "train_seconds": summary.train_seconds,
        "examples_per_s": summary.examples_per_s,
    }


# --------------------------------------------------------------------------------------------------
# The sweep


class SweepError(RuntimeError):
    """Some runs failed; the others' rows are in the results table and a rerun retries only the failed."""

    def __init__(self, message: str, failures: list[tuple[Run, BaseException]]):
        super().__init__(message)
        self.failures = failures


def finished_run_ids(path: str | os.PathLike) -> set[str]:
    path = Path(path)
    return set(read_results(path).column("run_id").to_pylist()) if path.exists() else set()


def _describe(run: Run) -> str:
    dtype = f" {run.value_dtype}" if run.value_dtype else ""
    what = f"{run.kind} {run.config}" if run.method == "mud" else f"method {run.method}"
    return f"{what}{dtype} {run.student} seed {run.seed}"


def _row_line(row: dict, when: str) -> str:
    metric = "-" if row["metric"] is None else f"{row['metric']:.4f}"
    return f"{row['metric_name']} {metric} ({when})"


def _needed_stores(runs: list[Run]) -> list[tuple[str, str | None]]:
    return list(dict.fromkeys(r.store_key for r in runs if r.store_key is not None))


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _run_local(pending: list[Run], spec: SweepSpec, log: Callable, keep_going: bool) -> list:
    failures: list[tuple[Run, BaseException]] = []
    for store_config, dtype in _needed_stores(pending):
        ensure_store(spec, store_config, dtype, log=log)
    for i, run in enumerate(pending, 1):
        tick = time.perf_counter()
        try:
            row = run_one(run, spec)
        except Exception as exc:  # one run's failure does not lose the others; KeyboardInterrupt stops all
            failures.append((run, exc))
            log(f"[{i}/{len(pending)}] FAILED {_describe(run)}: {type(exc).__name__}: {exc}")
            if not keep_going:
                break
            continue
        append_results(spec.results_path, [row])  # at once: an interrupted sweep keeps this row
        log(f"[{i}/{len(pending)}] {_describe(run)}: {_row_line(row, f'{time.perf_counter() - tick:.1f} s')}")
    return failures


def _derive_task(spec: SweepSpec, store_config: str, value_dtype: str | None) -> str:
    return ensure_store(spec, store_config, value_dtype)


def _train_task(run: Run, spec: SweepSpec, threads_per_host: dict[str, int]) -> dict:
    """One run on a dask worker, with its share of the host's cores as torch threads."""
    from distributed import get_worker

    host = _host(get_worker().address)
    # Dask starts workers with OMP_NUM_THREADS=1; give each run its share of the machine instead.
    torch.set_num_threads(max(1, threads_per_host.get(host, 1)))
    return run_one(run, spec)


def _host(address: str) -> str:
    return address.split("://", 1)[-1].rsplit(":", 1)[0]


def _threads_per_host(client) -> dict[str, int]:
    """cores // worker threads, per host (runs on the same host share its cores)."""
    try:
        info = client.scheduler_info(n_workers=-1)
    except TypeError:  # older distributed: every worker is listed
        info = client.scheduler_info()
    slots = Counter()
    for address, worker in info.get("workers", {}).items():
        slots[_host(address)] += int(worker.get("nthreads", 1))
    cores = client.run(_cpu_count)  # {worker address: cores of its host}
    out = {}
    for address, n in cores.items():
        out[_host(address)] = max(1, n // max(1, slots[_host(address)]))
    return out


def _run_dask(pending: list[Run], spec: SweepSpec, log: Callable, keep_going: bool, scheduler: str | None,
              workers: int) -> list:
    from distributed import Client, LocalCluster, as_completed

    cluster = None
    if scheduler:
        client = Client(scheduler)
        log(f"dask: scheduler {scheduler}")
    else:
        # One single-threaded process per run: torch threads and the GIL never contend across runs.
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                               silence_logs=logging.CRITICAL)  # failures: see train.log
        client = Client(cluster)
        log(f"dask: local cluster of {workers} processes")
    failures: list[tuple[Run, BaseException]] = []
    try:
        # Each store is derived once, before any run starts (distinct stores in parallel).
        stores = _needed_stores(pending)
        derive_futures = [client.submit(_derive_task, spec, cfg, dtype, pure=False, key=f"derive-{cfg}-{dtype}")
                          for cfg, dtype in stores]
        if stores:
            log(f"deriving {len(stores)} store(s) on the cluster")
        for fut in as_completed(derive_futures):
            fut.result()  # a failed derive stops the sweep: its runs could not start
        threads = _threads_per_host(client)
        futures = {
            client.submit(_train_task, run, spec, threads, pure=False, key=f"hsk-run-{run.run_id}", priority=-i): run
            for i, run in enumerate(pending)
        }
        started = time.perf_counter()
        for done, fut in enumerate(as_completed(futures), 1):
            run = futures[fut]
            if fut.status == "error":
                exc = fut.exception()
                failures.append((run, exc))
                log(f"[{done}/{len(pending)}] FAILED {_describe(run)}: {type(exc).__name__}: {exc}")
                if not keep_going:
                    for other in futures:
                        other.cancel()
                    break
                continue
            row = fut.result()
            append_results(spec.results_path, [row])
            elapsed = f"{time.perf_counter() - started:.1f} s into the sweep"
            log(f"[{done}/{len(pending)}] {_describe(run)}: {_row_line(row, elapsed)}")
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    return failures


def run_sweep(spec: SweepSpec, *, scheduler: str | None = None, workers: int = 1,
              log: Callable[[str], Any] = print, keep_going: bool = True) -> pa.Table:
    """Run every planned run not yet in the results table; return the table's rows of this sweep.

    workers > 1 or a scheduler address: runs in parallel on dask (one process per run). A failed
    run is logged and the others go on (keep_going=False stops at the first); then SweepError is
    raised, with every finished run's row already in the table: rerun to retry only the failed.
    """
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    claim_output(spec.work_dir, SWEEP_KIND, overwrite=False)  # a foreign folder is refused, untouched
    runs = plan_runs(spec)
    mark_output(spec.work_dir, SWEEP_KIND)
    results = spec.results_path
    done = finished_run_ids(results)
    pending = [r for r in runs if r.run_id not in done]
    log(f"sweep: {len(runs)} runs planned, {len(runs) - len(pending)} already in {results}, "
        f"{len(pending)} to run")
    failures: list = []
    if pending:
        if scheduler or (workers > 1 and len(pending) > 1):  # one run: in this process, with every core
            failures = _run_dask(pending, spec, log, keep_going, scheduler, workers)
        else:
            failures = _run_local(pending, spec, log, keep_going)
    ids = {r.run_id for r in runs}
    table = read_results(results) if results.exists() else None
    if table is not None:
        keep = [i for i, run_id in enumerate(table.column("run_id").to_pylist()) if run_id in ids]
        table = table.take(keep)
    if failures:
        names = "; ".join(f"{_describe(r)} ({type(e).__name__}: {e})" for r, e in failures[:5])
        more = f" and {len(failures) - 5} more" if len(failures) > 5 else ""
        raise SweepError(
            f"{len(failures)} of {len(pending)} runs failed: {names}{more}. Finished runs are in {results}; "
            "rerun the same sweep to retry only the failed ones (see each run's train.log).",
            failures,
        )
    if table is None:
        from pipelines.sweep.results import rows_to_table

        table = rows_to_table([])
    return table
