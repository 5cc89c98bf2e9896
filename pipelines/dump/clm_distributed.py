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

from dataclasses import dataclass
from typing import Any

import numpy as np

from hskstore import __version__
from hskstore.format.clm import ClmSelection, PackedRows
from hskstore.format.hidden_fit import FitEncoder
from hskstore.format.meta import StoreMeta
from hskstore.io.writer import StoreWriter, writing
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
from pipelines.dump.corpus import CorpusSource
from pipelines.dump.distributed import (
    ShardFutures,
    WorkerTeacher,
    check_cluster,
    cluster_client,
    cluster_compute,
    shard_key,
    worker_path,
    worker_teacher,
    worker_threads,
    worker_url,
    worker_writer,
)


@dataclass(frozen=True)
class ClmTeacherSpec(WorkerTeacher):
    """How a worker loads the causal-LM teacher: in the dtype the driver loaded it in."""

    dtype: str = "float32"


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
    encoder: FitEncoder | None = None  # a fitted basis's (--support hidden:fit)


def dump_clm_shard(job: ClmShardJob) -> int:
    """Worker task: compute and write one whole shard; returns its index."""
    spec = job.teacher
    model, device = worker_teacher(spec, lambda on: load_clm_teacher(spec.name, on, spec.dtype))
    sel = ClmSelection.from_dict(job.meta.selection)
    rows = np.arange(job.first_row, job.first_row + len(job.blocks), dtype=np.int64)
    compute = shard_compute(sel, job.encoder)
    arrays = compute(model, job.blocks, job.lengths, rows, sel, job.batch_size, device, job.precision, job.text)
    worker_writer(job.url, job.meta).write_shard(job.shard, arrays)
    return job.shard


class DaskShards(ShardFutures):
    """The causal-LM shards sent to the cluster as the driver packs them."""

    def __init__(self, client: Any, writer: StoreWriter, url: str, run: ShardRun, spec: ClmTeacherSpec):
        super().__init__(client)
        self.writer, self.url, self.run, self.spec = writer, url, run, spec

    def put(self, shard: int, rows: PackedRows, first_row: int) -> None:
        check_ids(rows.blocks, self.run.sel.vocab_size, self.run.teacher)
        job = ClmShardJob(self.url, self.writer.metadata, shard, rows.blocks, rows.lengths, first_row,
                          self.run.request.batch_size, self.run.precision, self.spec,
                          shard_text(rows, self.run.sel), self.run.encoder)
        self.submit(dump_clm_shard, job, shard_key("hsk-clm", shard, self.writer.metadata.identity))


def dump_clm_distributed(teacher: str, out: str, corpus: CorpusSource, request: ClmRequest, *, device: str = "cpu",
                         overwrite: bool = False, progress: bool = True, log: Any = print,
                         extra_meta: dict | None = None) -> dict:
    """Write (or finish) the causal-LM store at `out` on a dask cluster (request.workers or request.scheduler)."""
    check_cluster(request.workers, request.scheduler, request.device_map)
    threads = worker_threads(request.workers, request.threads_per_worker)
    plan = plan_clm(teacher, out, corpus, request, device=device, overwrite=overwrite, extra_meta=extra_meta,
                    compute=cluster_compute(request.batch_size, device, threads),
                    load_on="cpu")  # the driver's teacher: its config and weights hash only
    spec = ClmTeacherSpec(worker_path(teacher), plan.meta.teacher.weights_hash, device, request.scheduler is None,
                          threads, dtype=str(next(plan.model.parameters()).dtype).removeprefix("torch."))
    with writing(out, plan.meta, overwrite=overwrite, software_version=__version__, log=log) as writer:
        if writer.complete:
            log(f"{out} is already complete, nothing to do")
            return writer.meta
        plan.write_head(writer.group)  # a hidden-state store's head (and encoder): written once, by the driver
        run = ShardRun(plan.model, plan.sel, request, device, resolve_forward(request.precision, device), teacher,
                       plan.encoder)
        with cluster_client(request.workers, request.scheduler, device, log=log) as client:
            return write_stream(writer, out, corpus, plan.tokenizer, run, progress, log,
                                DaskShards(client, writer, worker_url(writer.url), run, spec))
