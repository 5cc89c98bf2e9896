"""The dump on a dask.distributed cluster: the driver plans and finalizes, workers compute whole shards.

`hsk dump --workers N` starts a LocalCluster of N single-threaded processes on this machine;
`hsk dump --scheduler tcp://HOST:PORT` uses a running cluster. Either way:

- the driver loads the rows and the teacher once (on the CPU: it only needs the metadata), opens
  the store (creating or resuming it, as a single-process dump does) and sends one task per
  pending shard, carrying that shard's texts, row numbers, labels and text hashes;
- each worker process loads the teacher once and keeps it (`_TEACHERS`), checks that its weights
  hash is the one the store records (a worker on another host must see the same checkpoint),
  tokenizes, computes and writes its whole shard with the same code as the single-process dump
  (`compute_shard`, `shard_payload`), so the bytes are the same;
- a shard is the unit of failure: when a worker process dies, the scheduler gives its running
  shard to another worker, which rewrites it whole; shards already written stay written (the
  driver releases each finished task at once, so nothing finished is recomputed);
- the driver finalizes the checksums when every shard is done.

GPUs: one worker per device. With `--workers N --device cuda`, dask-cuda's LocalCUDACluster is
used when installed (it pins one GPU to each worker); otherwise worker k of the LocalCluster uses
`cuda:k mod <device count>`. Against a running scheduler, start one worker per GPU yourself
(e.g. `dask cuda worker tcp://HOST:8786`, or `dask worker ... --nworkers 1` with
CUDA_VISIBLE_DEVICES set per worker): each then uses its own `cuda`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from hskstore import __version__
from hskstore.errors import ProvenanceError, UserError
from hskstore.format.config import ConfigError, Selection
from hskstore.format.meta import StoreMeta
from hskstore.io.writer import StoreWriter, writing
from pipelines.core.models import load_classifier, load_tokenizer, weights_hash
from pipelines.core.tokenize import encode
from pipelines.dump.heap import release_free_memory
from pipelines.dump.probe import TeacherProbe
from pipelines.dump.stage import (
    DumpOptions,
    DumpResult,
    attention_probe_layers,
    compute_record,
    compute_shard,
    pending_shards,
    plan_dump,
    shard_payload,
)


class DistributedDumpError(UserError, RuntimeError):
    """The cluster could not finish the dump (a worker kept dying, or none could be reached)."""


@dataclass(frozen=True)
class TeacherSpec:
    """How a worker loads the teacher, and what it must turn out to be."""

    name: str
    weights_hash: str
    ranking_layers: tuple[int, ...]
    attention_layers: tuple[int, ...]  # TinyBERT attention rows (--attention-rows): layers whose rows are kept
    device: str
    device_per_worker: bool  # LocalCluster on several GPUs: worker k takes cuda:k mod count
    torch_threads: int | None  # CPU threads per worker process (None: leave the worker's setting)


@dataclass(frozen=True)
class ShardJob:
    """One shard to compute and write: everything a worker needs, nothing it must load but the teacher."""

    url: str
    meta: StoreMeta
    shard: int
    texts: tuple[list[str], ...]
    rows: np.ndarray
    text_hash: np.ndarray
    label: np.ndarray
    max_length: int
    batch_size: int
    teacher: TeacherSpec
    selection_engine: str = "torch"


# Per worker process: the loaded teacher (one at a time) and open store writers.
_TEACHERS: dict[TeacherSpec, tuple[TeacherProbe, object, str]] = {}
_WRITERS: dict[tuple[str, str, int], StoreWriter] = {}


def worker_device(device: str, per_worker: bool) -> str:
    """This worker's device: on a local cluster over several GPUs (`per_worker`), worker k takes cuda:k mod count."""
    if not (per_worker and device == "cuda" and torch.cuda.device_count() > 1):
        return device
    from distributed import get_worker

    name = get_worker().name
    return f"cuda:{name % torch.cuda.device_count()}" if isinstance(name, int) else device


def _teacher(spec: TeacherSpec) -> tuple[TeacherProbe, object, str]:
    """The worker's teacher: loaded on first use, kept for every later shard of this process."""
    if spec not in _TEACHERS:
        for probe, _, _ in _TEACHERS.values():
            probe.close()
        _TEACHERS.clear()
        if spec.torch_threads:
            torch.set_num_threads(spec.torch_threads)
        device = worker_device(spec.device, spec.device_per_worker)
        model = load_classifier(spec.name, device=device)
        if weights_hash(model) != spec.weights_hash:
            raise ProvenanceError(
                f"the teacher {spec.name} a dask worker loaded is not the one the store records: give every "
                "worker the same checkpoint (same path, same files)"
            )
        probe = TeacherProbe(model, list(spec.ranking_layers), list(spec.attention_layers))
        _TEACHERS[spec] = (probe, load_tokenizer(spec.name), device)
    return _TEACHERS[spec]


def worker_writer(url: str, meta: StoreMeta) -> StoreWriter:
    """A worker's writer of the store as the driver last recorded it (a new one when its identity or, for a
    streamed store the driver grows, its row count changed)."""
    key = (url, meta.identity, meta.layout.n_rows)
    if key not in _WRITERS:
        for old in _WRITERS.values():
            old.close()
        _WRITERS.clear()
        _WRITERS[key] = StoreWriter(url, meta)  # no lease: the driver holds it for the whole dump
    return _WRITERS[key]


@dataclass(frozen=True)
class WorkerTeacher:
    """How a dask worker loads an LM teacher and what it must turn out to be (a kind's spec adds how it loads)."""

    name: str
    weights_hash: str
    device: str
    device_per_worker: bool  # a local cluster on several GPUs: worker k takes cuda:k mod count
    torch_threads: int | None  # CPU threads per worker process (None: leave the worker's setting)


_LM_TEACHERS: dict[WorkerTeacher, tuple[object, str]] = {}


def worker_teacher(spec: WorkerTeacher, load: Callable[[str], object]) -> tuple[object, str]:
    """A worker's LM teacher (`load(device)`), loaded on first use and kept for every later shard of this
    process, its weights hash checked against the store's."""
    if spec not in _LM_TEACHERS:
        _LM_TEACHERS.clear()
        if spec.torch_threads:
            torch.set_num_threads(spec.torch_threads)
        device = worker_device(spec.device, spec.device_per_worker)
        model = load(device)
        if weights_hash(model) != spec.weights_hash:
            raise ProvenanceError(f"the teacher {spec.name} a dask worker loaded is not the one the store records: "
                                  "give every worker the same checkpoint (same path, same files)")
        _LM_TEACHERS[spec] = (model, device)
    return _LM_TEACHERS[spec]


def dump_shard(job: ShardJob) -> tuple[int, int]:
    """Worker task: compute and write one whole shard; returns (shard, rows)."""
    probe, tokenizer, device = _teacher(job.teacher)
    meta = job.meta
    selection = Selection.from_dict(meta.selection)
    enc = encode(tokenizer, job.texts, job.max_length)
    computed = compute_shard(probe, enc, selection, tokenizer.sep_token_id, job.batch_size, device,
                             engine=job.selection_engine, precision=meta.teacher.forward_precision)
    arrays = shard_payload(computed, enc, job.rows, job.text_hash, job.label)
    worker_writer(job.url, job.meta).write_shard(job.shard, arrays)
    release_free_memory()
    return job.shard, len(job.rows)


SCHEDULER_SCHEMES = ("tcp", "tls", "ucx", "ws", "wss")  # what dask's comm registry connects to


def check_scheduler(address: str | None) -> None:
    """Refuse, before anything is written, a --scheduler address dask cannot connect to by its form."""
    if address is None:
        return
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "tcp", address  # dask's default
    if scheme.lower() not in SCHEDULER_SCHEMES or not rest.strip("/"):
        raise ConfigError(f"--scheduler {address!r} is not a dask scheduler address: give HOST:PORT or "
                          f"{'|'.join(SCHEDULER_SCHEMES)}://HOST:PORT (what `dask scheduler` prints)")


@contextlib.contextmanager
def cluster_client(workers: int | None, scheduler: str | None, device: str, log=print) -> Iterator:
    """A dask Client: to the scheduler given, or to a LocalCluster of `workers` processes (loopback)."""
    import dask
    from distributed import Client, LocalCluster

    if scheduler:
        try:  # dask's own connect timeout (30 s unless the user's dask config says otherwise)
            client = Client(scheduler, timeout=dask.config.get("distributed.comm.timeouts.connect", "30s"))
        except OSError as exc:
            raise DistributedDumpError(
                f"no dask scheduler at {scheduler} ({exc}): start one, or use --workers N"
            ) from None
        log(f"dask: scheduler {scheduler}, {len(client.scheduler_info()['workers'])} workers")
        with client:
            yield client
        return
    # Loopback only: the scheduler, the workers and the scheduler's HTTP endpoint (random port).
    kwargs = dict(n_workers=workers, threads_per_worker=1, dashboard_address="127.0.0.1:0",
                  silence_logs=logging.ERROR)
    cluster = None
    if device.startswith("cuda"):
        try:
            from dask_cuda import LocalCUDACluster  # one GPU pinned to each worker

            cluster = LocalCUDACluster(**kwargs)
        except ImportError:
            pass
    cluster = cluster or LocalCluster(processes=True, host="127.0.0.1", **kwargs)
    log(f"dask: local cluster of {workers} processes ({type(cluster).__name__})")
    with cluster, Client(cluster) as client:
        yield client


def check_cluster(workers: int | None, scheduler: str | None, device_map: str | None = None) -> None:
    """Refuse, before anything loads, a cluster the options do not name well: --workers N or --scheduler, one."""
    if (workers is None) == (scheduler is None):
        raise ConfigError("give either --workers N (a local cluster) or --scheduler ADDRESS, not both")
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    if device_map:
        raise ConfigError("--device-map auto spreads one teacher over this process's devices; with --workers/"
                          "--scheduler each worker holds its own: drop --device-map")
    check_scheduler(scheduler)


def worker_threads(workers: int | None, threads_per_worker: int | None) -> int | None:
    """Torch threads per worker: as given, else the cores shared among a local cluster's workers (None: a running
    cluster's own setting)."""
    return threads_per_worker or (max(1, (os.cpu_count() or 1) // workers) if workers else None)


def cluster_compute(batch_size: int, device: str, threads: int | None) -> dict:
    """The store's compute record on a cluster: the workers' device and threads (None: a running cluster's own)."""
    return dict(compute_record(batch_size, device, threads), **({} if threads else {"torch_threads": None}))


def worker_path(teacher: str) -> str:
    """The teacher as a worker finds it: a local folder made absolute (workers may run in another folder)."""
    return os.path.abspath(teacher) if "://" not in teacher and os.path.isdir(teacher) else teacher


def worker_url(url: str) -> str:
    return url if "://" in url else os.path.abspath(url)


IN_FLIGHT_PER_WORKER = 2


def shard_key(prefix: str, shard: int, identity: str) -> str:
    """A shard task's dask key: the dump's prefix, the shard and the store's identity (two stores never share one)."""
    return f"{prefix}-shard-{shard}-{identity[7:19]}"


class ShardFutures:
    """Shard tasks sent to the cluster as the driver makes them, at most IN_FLIGHT_PER_WORKER per worker in flight
    (the driver's memory stays bounded); each finished task is released at once (never recomputed)."""

    def __init__(self, client):
        self.client = client
        self.window = IN_FLIGHT_PER_WORKER * max(1, len(client.scheduler_info()["workers"]))
        self.futures: list = []

    def submit(self, task: Callable, job: object, key: str) -> None:
        self.futures.append(self.client.submit(task, job, key=key, pure=False))
        while len(self.futures) >= self.window:
            self._collect()

    def _collect(self) -> None:
        from distributed import wait
        from distributed.scheduler import KilledWorker

        finished, _ = wait(self.futures, return_when="FIRST_COMPLETED")
        for future in finished:
            try:
                future.result()
            except KilledWorker as exc:
                raise DistributedDumpError(f"dask workers died repeatedly on one shard ({exc}): out of memory? "
                                           "Shards written so far are kept; rerun the same command to resume") from None
            future.release()
        self.futures = [f for f in self.futures if f not in finished]

    def drain(self) -> None:
        while self.futures:
            self._collect()

    def close(self) -> None:
        if self.futures:
            self.client.cancel(self.futures)
        self.futures = []


def _jobs(plan, writer: StoreWriter, pending: list[int], url: str, teacher: TeacherSpec,
          options: DumpOptions) -> Iterator[ShardJob]:
    examples, hashes = plan.examples, plan.examples.text_hashes()
    for shard in pending:
        start, stop = writer.shard_bounds(shard)
        yield ShardJob(
            url=url, meta=writer.metadata, shard=shard, texts=tuple(col[start:stop] for col in examples.texts),
            rows=examples.rows[start:stop], text_hash=hashes[start:stop], label=examples.labels[start:stop],
            max_length=plan.max_length, batch_size=options.batch_size, teacher=teacher,
            selection_engine=options.selection_engine,
        )


def _run_jobs(client, jobs: list[ShardJob], progress: bool, desc: str) -> None:
    """Submit every shard, wait for all; each finished task is released at once (never recomputed)."""
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    identity = jobs[0].meta.identity if jobs else ""  # one store: one identity
    futures = [client.submit(dump_shard, job, key=shard_key("hsk-dump", job.shard, identity), pure=False)
               for job in jobs]
    bar = tqdm(total=len(futures), unit="shard", desc=desc, disable=not progress or None)
    try:
        for future in as_completed(futures):
            try:
                future.result()
            except KilledWorker as exc:
                raise DistributedDumpError(
                    f"dask workers died repeatedly on one shard ({exc}): out of memory? Shards written so far are "
                    "kept; rerun the same command to resume"
                ) from None
            future.release()
            bar.update(1)
    except BaseException:
        client.cancel(futures)
        raise
    finally:
        futures.clear()
        bar.close()


def dump_distributed(
    task_name: str,
    options: DumpOptions,
    *,
    teacher: str,
    out: str,
    workers: int | None = None,
    scheduler: str | None = None,
    threads_per_worker: int | None = None,
    log=print,
    **data,
) -> DumpResult:
    """Write (or finish) the store at `out` on a dask cluster; `data` as for `stage.dump`
    (split, data_dir, data_file, text_columns, label_column, limit).

    `threads_per_worker`: torch CPU threads of each worker process [default: cores // workers on a
    local cluster; the workers' own setting on a running one]. On CPU, float32 sums depend on the
    thread count, so a worker's logits and scores equal a single-process dump's to the last bit
    when both use the same number of threads (the selected values, fp16, almost always anyway).
    """
    check_cluster(workers, scheduler)
    plan = plan_dump(task_name, options, teacher=teacher, out=out, device="cpu", **data)  # driver: no GPU
    plan.model = None  # the workers load their own
    spec = TeacherSpec(
        name=worker_path(teacher), weights_hash=plan.meta.teacher.weights_hash,
        ranking_layers=tuple(plan.selection.ranking_layers),
        attention_layers=tuple(attention_probe_layers(plan.selection)), device=options.device,
        device_per_worker=scheduler is None,
        torch_threads=worker_threads(workers, threads_per_worker),
    )
    # What the bytes depend on is the workers' device and threads (None: a running cluster's own setting).
    compute = cluster_compute(options.batch_size, options.device, spec.torch_threads)
    plan.meta = plan.meta.updated(compute=compute)
    # The driver is the store's one writer (the lease) for the whole dump; workers write
    # through plain StoreWriter(url, meta) objects, which take no lease, into writer.url (with
    # --overwrite a hidden staged sibling, swapped in when this block ends).
    with writing(out, plan.meta, overwrite=options.overwrite, software_version=__version__, log=log) as writer:
        pending = pending_shards(writer, out, log)
        if pending is None:
            return DumpResult(writer.meta, 0, 0.0)
        rows = sum(writer.shard_bounds(s)[1] - writer.shard_bounds(s)[0] for s in pending)
        seconds = 0.0
        if pending:
            url = worker_url(writer.url)
            with cluster_client(workers, scheduler, options.device, log=log) as client:
                started = time.perf_counter()  # cluster start-up excluded; each worker's one teacher load included
                _run_jobs(client, list(_jobs(plan, writer, pending, url, spec, options)), options.progress,
                          f"dump {plan.task.name}/{plan.split}")
                seconds = time.perf_counter() - started
        result = DumpResult(writer.finalize().to_dict(), rows, seconds)
    if rows:
        log(f"wrote {rows} examples in {result.seconds:.1f}s ({result.examples_per_s:.0f} ex/s) to {out}")
    return result
