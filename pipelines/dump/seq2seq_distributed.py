"""The seq2seq dump on a dask.distributed cluster (`hsk dump --objective seq2seq --workers N | --scheduler
ADDRESS`), as the causal-LM dump on dask: the driver streams the pairs, tokenizes them
and records each shard's corpus cursors; a worker loads the teacher once (its weights hash checked against the
store's), decodes and computes the supports of whole shards with the one-process dump's code and writes them. A
killed worker's shard is given to another and rewritten whole: the bytes are a one-process dump's (on CPU, with
the same torch threads per worker). GPUs: one worker per device, as pipelines/dump/distributed.py says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hskstore import __version__
from hskstore.format.meta import StoreMeta
from hskstore.format.seq2seq import Seq2seqSelection
from hskstore.io.writer import StoreWriter, writing
from pipelines.core.pair_models import pair_model
from pipelines.core.precision import resolve_forward
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
from pipelines.dump.seq2seq import (
    PairRows,
    Seq2seqRequest,
    Seq2seqRun,
    check_pair_ids,
    compute_seq2seq_shard,
    plan_seq2seq,
    write_pairs,
)


@dataclass(frozen=True)
class Seq2seqTeacherSpec(WorkerTeacher):
    """How a worker loads the seq2seq teacher: as its architecture (encoder-decoder or decoder-only) loads."""

    architecture: str = "encoder-decoder"


@dataclass(frozen=True)
class Seq2seqShardJob:
    """One shard to compute and write: its tokenized pairs, its first row, and the store's record as the driver has
    it."""

    url: str
    meta: StoreMeta
    shard: int
    pairs: dict[str, np.ndarray]
    first_row: int
    batch_size: int
    precision: str
    teacher: Seq2seqTeacherSpec


def dump_seq2seq_shard(job: Seq2seqShardJob) -> int:
    """Worker task: compute and write one whole shard; returns its index."""
    spec = job.teacher
    model, device = worker_teacher(spec, lambda on: pair_model(spec.architecture).load(spec.name, on))
    sel = Seq2seqSelection.from_dict(job.meta.selection)
    rows = np.arange(job.first_row, job.first_row + len(job.pairs["source_ids"]), dtype=np.int64)
    arrays = compute_seq2seq_shard(model, job.pairs, rows, sel, job.batch_size, device, job.precision)
    worker_writer(job.url, job.meta).write_shard(job.shard, arrays)
    return job.shard


class DaskPairShards(ShardFutures):
    """The seq2seq shards sent to the cluster as the driver tokenizes them."""

    def __init__(self, client: Any, writer: StoreWriter, run: Seq2seqRun, spec: Seq2seqTeacherSpec):
        super().__init__(client)
        self.writer, self.url, self.run, self.spec = writer, worker_url(writer.url), run, spec

    def put(self, shard: int, rows: PairRows, first_row: int) -> None:
        check_pair_ids(rows.arrays, self.run.sel.vocab_size, self.run.teacher)
        job = Seq2seqShardJob(self.url, self.writer.metadata, shard, rows.arrays, first_row,
                              self.run.request.batch_size, self.run.precision, self.spec)
        self.submit(dump_seq2seq_shard, job, shard_key("hsk-s2s", shard, self.writer.metadata.identity))


def dump_seq2seq_distributed(teacher: str, out: str, source: Any, request: Seq2seqRequest, *, device: str = "cpu",
                             overwrite: bool = False, progress: bool = True, log: Any = print,
                             extra_meta: dict | None = None) -> dict:
    """Write (or finish) the seq2seq store at `out` on a dask cluster (request.workers or request.scheduler)."""
    check_cluster(request.workers, request.scheduler)
    threads = worker_threads(request.workers, request.threads_per_worker)
    plan = plan_seq2seq(teacher, out, source, request, device=device, overwrite=overwrite, extra_meta=extra_meta,
                        compute=cluster_compute(request.batch_size, device, threads),
                        load_on="cpu")  # the driver's teacher: its config and weights hash only
    spec = Seq2seqTeacherSpec(worker_path(teacher), plan.meta.teacher.weights_hash, device, request.scheduler is None,
                              threads, architecture=plan.sel.architecture)
    with writing(out, plan.meta, overwrite=overwrite, software_version=__version__, log=log) as writer:
        if writer.complete:
            log(f"{out} is already complete, nothing to do")
            return writer.meta
        run = Seq2seqRun(plan.model, plan.sel, request, device, resolve_forward(request.precision, device), teacher)
        with cluster_client(request.workers, request.scheduler, device, log=log) as client:
            return write_pairs(writer, out, source, plan.tokenizer, run, progress, log,
                               DaskPairShards(client, writer, run, spec))
