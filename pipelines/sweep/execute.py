"""`hsk sweep`: from one source store, derive a grid of smaller stores, train students on each, record results.

The experiment of METHOD.md (the paper's Table 5 idea): how good is a student distilled from A
units of hidden-state knowledge (A = N^D * N^L * N^W / d_T), for A from a tenth of a token vector
up to everything the source store keeps? One source store is dumped once with the teacher; every
smaller config is derived from it without the teacher (`hskstore.share.derive`), so the sweep never
loads the teacher.

The sweep in four modules: `spec` (what is asked: `SweepSpec`), `plan` (the runs: `plan_runs`,
`PlannedRun`), `stores` (derived stores, each derived once under a lock) and this one, which executes
the plan: one run (`run_one`: its store, its training, its results row, its own train.log through
`runlog`), in this process or on a dask cluster, and the sweep (`run_sweep`).

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

import json
import logging
import math
import os
import shutil
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from hskstore.format.config import ConfigError
from hskstore.io.outputs import claim_output, mark_output
from pipelines.core.output_kinds import SWEEP
from pipelines.sweep.plan import PlannedRun, plan_runs, run_dir, train_options
from pipelines.sweep.results import append_results, read_results, rows_to_table
from pipelines.sweep.runlog import no_progress_bars, run_log
from pipelines.sweep.spec import SweepSpec
from pipelines.sweep.stores import StoreSize, ensure_store, store_size
from pipelines.train.run.driver import RUN_KIND, train
from pipelines.train.run.summary import RunSummary

SWEEP_KIND = SWEEP.name  # the output kind of a sweep's work_dir (pipelines.core.output_kinds)

Log = Callable[[str], object]
Failures = list[tuple[PlannedRun, BaseException]]


# --------------------------------------------------------------------------------------------------
# One run


def run_one(run: PlannedRun, spec: SweepSpec) -> dict:
    """Derive (or reuse) the run's store, train the student, and return its results row."""
    store_url = ensure_store(spec, run.store_config, run.value_dtype)
    out = run_dir(run, spec)
    mark_output(str(out), RUN_KIND, method=run.method)  # before train.log: `hsk train` resumes a marked run
    # The run's own log (hsk train's lines, transformers' warnings): the sweep prints one line per run.
    with open(out / "train.log", "a") as handle, run_log(handle):

        def log(msg: str) -> None:
            handle.write(f"{msg}\n")
            handle.flush()

        log(f"--- run {run.run_id}: {run.describe()} (torch threads {torch.get_num_threads()}, pid {os.getpid()})")
        try:
            summary = train(train_options(run, spec), student=run.student, out_dir=str(out), store=store_url,
                            data_dir=spec.data_dir, log=log)
        except Exception:  # the traceback goes to the run's log; the sweep reports one line
            log(traceback.format_exc())
            raise
    if not spec.keep_checkpoints:
        shutil.rmtree(out / "checkpoint", ignore_errors=True)  # only resumes need it; runs add up to GBs
    return results_row(run, store_url, store_size(spec, store_url), summary)


def results_row(run: PlannedRun, store_url: str, size: StoreSize, summary: RunSummary) -> dict:
    """The run's row of the results table (pipelines.sweep.results.RESULTS_SCHEMA)."""
    stages = summary.stages or {}
    score = summary.score
    return {
        "run_id": run.run_id,
        "source_store": store_url,
        "config": run.config,
        "kind": run.kind,
        "amount_hsk": run.amount_hsk,
        "value_dtype": run.value_dtype,
        "store_bytes": size.total_bytes,
        "bytes_per_example": size.bytes_per_example,
        "student": run.student,
        "seed": run.seed,
        "method": run.method,
        "method_options": json.dumps(summary.method_options, sort_keys=True, default=str),
        "stages": "+".join(stages) or "+".join(run.stages),
        "epochs_hsk": (stages.get("hsk") or {}).get("epochs"),
        "epochs_pred": (stages.get("pred") or {}).get("epochs"),
        # Offline runs read every row of their store: the source's dump decides the training subset.
        "train_limit": size.rows,
        "metric_name": summary.metric,
        "metric": None if score is None or (isinstance(score, float) and math.isnan(score)) else float(score),
        "metrics_json": json.dumps(summary.dev, sort_keys=True, default=str),
        "train_seconds": summary.train_seconds,
        "examples_per_s": summary.examples_per_s,
    }


def _row_line(row: dict, when: str) -> str:
    metric = "-" if row["metric"] is None else f"{row['metric']:.4f}"
    return f"{row['metric_name']} {metric} ({when})"


def _needed_stores(runs: list[PlannedRun]) -> list[tuple[str, str | None]]:
    return list(dict.fromkeys(r.store_key for r in runs if r.store_key is not None))


# --------------------------------------------------------------------------------------------------
# In this process


def _run_local(pending: list[PlannedRun], spec: SweepSpec, log: Log, keep_going: bool) -> Failures:
    from pipelines.core.threads import use_threads

    use_threads(spec.threads, "train")  # as `hsk train` would: the readers keep a core busy
    failures: Failures = []
    for store_config, dtype in _needed_stores(pending):
        ensure_store(spec, store_config, dtype, log=log)
    for i, run in enumerate(pending, 1):
        tick = time.perf_counter()
        try:
            row = run_one(run, spec)
        except Exception as exc:  # one run's failure does not lose the others; KeyboardInterrupt stops all
            failures.append((run, exc))
            log(f"[{i}/{len(pending)}] FAILED {run.describe()}: {type(exc).__name__}: {exc}")
            if not keep_going:
                break
            continue
        append_results(spec.results_path, [row])  # at once: an interrupted sweep keeps this row
        log(f"[{i}/{len(pending)}] {run.describe()}: {_row_line(row, f'{time.perf_counter() - tick:.1f} s')}")
    return failures


# --------------------------------------------------------------------------------------------------
# On a dask cluster


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _derive_task(spec: SweepSpec, store_config: str, value_dtype: str | None) -> str:
    return ensure_store(spec, store_config, value_dtype)


def _train_task(run: PlannedRun, spec: SweepSpec, threads_per_host: dict[str, int]) -> dict:
    """One run on a dask worker, with its share of the host's cores as torch threads."""
    from distributed import get_worker
    from transformers.utils import logging as hf_logging

    host = _host(get_worker().address)
    # Dask starts workers with OMP_NUM_THREADS=1; give each run its share of the machine instead.
    torch.set_num_threads(spec.threads or max(1, threads_per_host.get(host, 1)))
    hf_logging.disable_progress_bar()  # a worker's stderr is no terminal: no load bars there
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


def _connect(scheduler: str | None, workers: int, log: Log) -> tuple[Any, Any]:
    """(client, the local cluster it owns or None)."""
    from distributed import Client, LocalCluster

    if scheduler:
        log(f"dask: scheduler {scheduler}")
        return Client(scheduler), None
    # One single-threaded process per run: torch threads and the GIL never contend across runs.
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                           silence_logs=logging.CRITICAL)  # failures: see train.log
    log(f"dask: local cluster of {workers} processes")
    return Client(cluster), cluster


def _derive_on(client, pending: list[PlannedRun], spec: SweepSpec, log: Log) -> None:
    """Each store derived once, before any run starts (distinct stores in parallel)."""
    from distributed import as_completed

    stores = _needed_stores(pending)
    futures = [client.submit(_derive_task, spec, cfg, dtype, pure=False, key=f"derive-{cfg}-{dtype}")
               for cfg, dtype in stores]
    if stores:
        log(f"deriving {len(stores)} store(s) on the cluster")
    for fut in as_completed(futures):
        fut.result()  # a failed derive stops the sweep: its runs could not start


def _train_on(client, pending: list[PlannedRun], spec: SweepSpec, log: Log, keep_going: bool) -> Failures:
    from distributed import as_completed

    threads = _threads_per_host(client)
    futures = {
        client.submit(_train_task, run, spec, threads, pure=False, key=f"hsk-run-{run.run_id}", priority=-i): run
        for i, run in enumerate(pending)
    }
    failures: Failures = []
    started = time.perf_counter()
    for done, fut in enumerate(as_completed(futures), 1):
        run = futures[fut]
        if fut.status == "error":
            exc = fut.exception()
            failures.append((run, exc))
            log(f"[{done}/{len(pending)}] FAILED {run.describe()}: {type(exc).__name__}: {exc}")
            if not keep_going:
                for other in futures:
                    other.cancel()
                break
            continue
        row = fut.result()
        append_results(spec.results_path, [row])
        elapsed = f"{time.perf_counter() - started:.1f} s into the sweep"
        log(f"[{done}/{len(pending)}] {run.describe()}: {_row_line(row, elapsed)}")
    return failures


def _run_dask(pending: list[PlannedRun], spec: SweepSpec, log: Log, keep_going: bool, scheduler: str | None,
              workers: int) -> Failures:
    client, cluster = _connect(scheduler, workers, log)
    try:
        _derive_on(client, pending, spec, log)
        return _train_on(client, pending, spec, log, keep_going)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


# --------------------------------------------------------------------------------------------------
# The sweep


class SweepError(RuntimeError):
    """Some runs failed; the others' rows are in the results table and a rerun retries only the failed."""

    def __init__(self, message: str, failures: Failures):
        super().__init__(message)
        self.failures = failures


def finished_run_ids(path: str | os.PathLike) -> set[str]:
    path = Path(path)
    return set(read_results(path).column("run_id").to_pylist()) if path.exists() else set()


def _sweep_rows(results: Path, runs: list[PlannedRun]) -> pa.Table:
    """The results table's rows of these runs (an empty table when there is none)."""
    if not results.exists():
        return rows_to_table([])
    ids = {r.run_id for r in runs}
    table = read_results(results)
    return table.take([i for i, run_id in enumerate(table.column("run_id").to_pylist()) if run_id in ids])


def _failed(failures: Failures, pending: int, results: Path) -> SweepError:
    names = "; ".join(f"{r.describe()} ({type(e).__name__}: {e})" for r, e in failures[:5])
    more = f" and {len(failures) - 5} more" if len(failures) > 5 else ""
    return SweepError(
        f"{len(failures)} of {pending} runs failed: {names}{more}. Finished runs are in {results}; "
        "rerun the same sweep to retry only the failed ones (see each run's train.log).",
        failures,
    )


def run_sweep(spec: SweepSpec, *, scheduler: str | None = None, workers: int = 1,
              log: Log = print, keep_going: bool = True) -> pa.Table:
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
    failures: Failures = []
    if pending:
        with no_progress_bars():
            if scheduler or (workers > 1 and len(pending) > 1):  # one run: in this process, with every core
                failures = _run_dask(pending, spec, log, keep_going, scheduler, workers)
            else:
                failures = _run_local(pending, spec, log, keep_going)
    table = _sweep_rows(results, runs)
    if failures:
        raise _failed(failures, len(pending), results)
    return table
