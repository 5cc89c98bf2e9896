"""The causal-LM dump on a dask.distributed cluster (`hsk dump --objective clm --workers N | --scheduler ADDRESS`).

The driver streams the corpus, tokenizes and packs it (as the one-process dump does: pipelines/dump/clm.py),
records each shard's corpus cursor, and sends each shard's blocks to a worker, at most two shards per worker
in flight (the driver's memory stays bounded). A worker loads the teacher once (its weights hash checked
against the store's), computes the shard with the one-process dump's code and writes it; the driver grows the
store and finalizes it. A killed worker's running shard is given to another by the scheduler and rewritten
whole; the bytes are a one-process dump's (on CPU, with the same torch threads per worker).

GPUs: one worker per device, as for the task dump (pipelines/dump/distributed.py): `--workers N --device cuda`
uses dask-cuda's LocalCUDACluster when installed, else worker k takes cuda:k mod count; against a running
scheduler, start one worker per GPU (`dask cuda worker tcp://HOST:8786`, or `dask worker ... --nworkers 1
--resources GPU=1` with CUDA_VISIBLE_DEVICES set per worker).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hskstore import __version__
from hskstore.errors import ProvenanceError
from hskstore.format.clm import ClmSelection, PackedRows
from hskstore.format.config import ConfigError
from hskstore.format.meta import StoreMeta
from hskstore.io.clm_store import write_head
from hskstore.io.writer import StoreWriter, writing
from pipelines.core.models import weights_hash
from pipelines.core.precision import resolve_forward
from pipelines.dump.clm import (
    ClmRequest,
    ShardRun,
    check_ids,
    load_clm_teacher,
    plan_clm,
    shard_compute,
    shard_text,
    write_stream,
)
from pipelines.dump.clm_hidden import head_arrays
from pipelines.dump.corpus import CorpusSource
from pipelines.dump.distributed import DistributedDumpError, check_scheduler, cluster_client
from pipelines.dump.stage import compute_record

IN_FLIGHT_PER_WORKER = 2


@dataclass(frozen=True)
class ClmTeacherSpec:
    """How a worker loads the causal-LM teacher, and what it must turn out to be."""

    name: str
    weights_hash: str
    dtype: str
    device: str
    device_per_worker: bool  # a local cluster on several GPUs: worker k takes cuda:k mod count
    torch_threads: int | None


@dataclass(frozen=True)
class ClmShardJob:
    """One shard to compute and write: its blocks, its first row, and the store's record as the driver has it."""

    url: str
    meta: StoreMeta
    shard: int
    blocks: np.ndarray
    lengths: np.ndarray
    first_row: int
    batch_size: int
    precision: str
    teacher: ClmTeacherSpec
    text: tuple[np.ndarray, np.ndarray] | None = None  # the rows' (token_bytes, text) when the store keeps them


_TEACHERS: dict[ClmTeacherSpec, tuple[Any, str]] = {}
_WRITERS: dict[tuple[str, str, int], StoreWriter] = {}


def _teacher(spec: ClmTeacherSpec) -> tuple[Any, str]:
    """The worker's teacher: loaded on first use, kept for every later shard of this process."""
    if spec not in _TEACHERS:
        _TEACHERS.clear()
        if spec.torch_threads:
            torch.set_num_threads(spec.torch_threads)
        device = spec.device
        if spec.device_per_worker and device == "cuda" and torch.cuda.device_count() > 1:
            from distributed import get_worker

            name = get_worker().name
            device = f"cuda:{name % torch.cuda.device_count()}" if isinstance(name, int) else device
        model = load_clm_teacher(spec.name, device, spec.dtype)
        if weights_hash(model) != spec.weights_hash:
            raise ProvenanceError(f"the teacher {spec.name} a dask worker loaded is not the one the store records: "
                                  "give every worker the same checkpoint (same path, same files)")
        _TEACHERS[spec] = (model, device)
    return _TEACHERS[spec]


def _writer(url: str, meta: StoreMeta) -> StoreWriter:
    """A writer of the store as the driver last resized it (a new one when its row count changed)."""
    key = (url, meta.identity, meta.layout.n_rows)
    if key not in _WRITERS:
        for old in _WRITERS.values():
            old.close()
        _WRITERS.clear()
        _WRITERS[key] = StoreWriter(url, meta)  # no lease: the driver holds it for the whole dump
    return _WRITERS[key]


def dump_clm_shard(job: ClmShardJob) -> int:
    """Worker task: compute and write one whole shard; returns its index."""
    model, device = _teacher(job.teacher)
    sel = ClmSelection.from_dict(job.meta.selection)
    rows = np.arange(job.first_row, job.first_row + len(job.blocks), dtype=np.int64)
    arrays = shard_compute(sel)(model, job.blocks, job.lengths, rows, sel, job.batch_size, device, job.precision,
                                job.text)
    _writer(job.url, job.meta).write_shard(job.shard, arrays)
    return job.shard


class DaskShards:
    """Shards sent to the cluster as the driver packs them, a bounded number in flight; each finished task is
    released at once (never recomputed)."""

    def __init__(self, client: Any, writer: StoreWriter, url: str, run: ShardRun, spec: ClmTeacherSpec):
        self.client, self.writer, self.url, self.run, self.spec = client, writer, url, run, spec
        self.window = IN_FLIGHT_PER_WORKER * max(1, len(client.scheduler_info()["workers"]))
        self.futures: list = []

    def put(self, shard: int, rows: PackedRows, first_row: int) -> None:
        check_ids(rows.blocks, self.run.sel.vocab_size, self.run.teacher)
        job = ClmShardJob(self.url, self.writer.metadata, shard, rows.blocks, rows.lengths, first_row,
                          self.run.request.batch_size, self.run.precision, self.spec,
                          shard_text(rows, self.run.sel))
        key = f"hsk-clm-shard-{shard}-{self.writer.metadata.identity[7:19]}"
        self.futures.append(self.client.submit(dump_clm_shard, job, key=key, pure=False))
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


def dump_clm_distributed(teacher: str, out: str, corpus: CorpusSource, request: ClmRequest, *, device: str = "cpu",
                         overwrite: bool = False, progress: bool = True, log: Any = print,
                         extra_meta: dict | None = None) -> dict:
    """Write (or finish) the causal-LM store at `out` on a dask cluster (request.workers or request.scheduler)."""
    if (request.workers is None) == (request.scheduler is None):
        raise ConfigError("give either --workers N (a local cluster) or --scheduler ADDRESS, not both")
    if request.workers is not None and request.workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {request.workers}")
    if request.device_map:
        raise ConfigError("--device-map auto spreads one teacher over this process's devices; with --workers/"
                          "--scheduler each worker holds its own: drop --device-map")
    check_scheduler(request.scheduler)
    threads = request.threads_per_worker or (max(1, (os.cpu_count() or 1) // request.workers)
                                             if request.workers else None)
    compute = dict(compute_record(request.batch_size, device, threads), **({} if threads else {"torch_threads": None}))
    plan = plan_clm(teacher, out, corpus, request, device=device, overwrite=overwrite, extra_meta=extra_meta,
                    compute=compute, load_on="cpu")  # the driver's teacher: its config and weights hash only
    local = "://" not in teacher and os.path.isdir(teacher)  # workers may run in another folder
    spec = ClmTeacherSpec(os.path.abspath(teacher) if local else teacher, plan.meta.teacher.weights_hash,
                          str(next(plan.model.parameters()).dtype).removeprefix("torch."), device,
                          request.scheduler is None, threads)
    with writing(out, plan.meta, overwrite=overwrite, software_version=__version__, log=log) as writer:
        if writer.complete:
            log(f"{out} is already complete, nothing to do")
            return writer.meta
        if plan.head is not None:  # a hidden-state store's head: written once, by the driver
            write_head(writer.group, *head_arrays(plan.head))
        run = ShardRun(plan.model, plan.sel, request, device, resolve_forward(request.precision, device), teacher)
        url = writer.url if "://" in writer.url else os.path.abspath(writer.url)
        with cluster_client(request.workers, request.scheduler, device, log=log) as client:
            return write_stream(writer, out, corpus, plan.tokenizer, run, progress, log,
                                DaskShards(client, writer, url, run, spec))
