"""The dump's host pipeline: tokenizing ahead, and shards written in the background with bounded depth.

Off the CPU (a GPU), three stages overlap: the next shard is tokenized (in pieces, on several threads:
the fast tokenizer's Rust encoding releases the GIL) while the current one is computed (forward,
selection, encoding) and earlier ones are compressed and written (Blosc's zstd releases the GIL too).
Every queue is bounded: one shard tokenized ahead, at most `depth` shards being written, and their
arrays reused once written, so the dump's memory does not grow with its length.

On a CPU the forward already runs on every core (torch's OpenMP threads), and a host thread that takes
one of those cores stalls the others at the forward's next barrier: a tokenizing or writing thread
there cost the forward more than its own CPU time.
So on a CPU the stages take turns (`overlaps_forward`): after a shard is computed, its write and the
next shard's tokenizing run together, spread over the cores, and the next forward starts once both are
done. No stage changes what another computes: the store's bytes are the same at every depth, piece count
and either schedule (tests/test_dump.py).

Write processes (`write_processes`, `hsk dump --write-processes N`): a write releases the GIL only in part
(Blosc and hashing do; zarr's object writes and the progress records are Python), and a many-core GPU host
feeding tens of thousands of examples a second may run out of the dump's one GIL before its cores. N
processes then write whole shards, each with its own StoreWriter on the same store (safe on disjoint
shards, as the distributed dump's workers are); a shard's arrays are pickled to the process once, and the
same bytes are written. On a small CPU they take little off this process's GIL and cost their start
(docs/guide/gpu-dump.md); whether they pay on a GPU host is benchmarks/gpu/gpu_suite.py's.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager

import numpy as np

from hskstore.errors import UserError
from hskstore.format.meta import StoreMeta
from hskstore.io.writer import StoreWriter
from pipelines.core.tokenize import encode

Arrays = dict[str, np.ndarray]


def host_cores() -> int:
    """The cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def overlaps_forward(device: str) -> bool:
    """Whether host stages run alongside the teacher's forward: off the CPU only (see the module docstring)."""
    return device.split(":")[0] != "cpu"


def default_tokenize_threads(device: str = "cpu") -> int:
    """Threads that tokenize a shard's pieces. On a CPU: its cores (at most 4), used between forwards. Off
    it: a quarter of the host's cores, 2 to 8, beside the writers (more gains little: building a piece's
    arrays from the Rust encodings holds the GIL, about a third of tokenizing's CPU)."""
    cores = host_cores()
    return max(1, min(4, cores)) if not overlaps_forward(device) else max(2, min(8, cores // 4))


def default_write_depth(device: str) -> int:
    """Shards written at once: on a GPU a quarter of the host's cores, 2 to 8 (zstd releases the GIL, so each
    shard in flight uses a core; each holds one shard's arrays, the memory bound); 1 on a CPU, where a write
    runs between forwards."""
    return 1 if not overlaps_forward(device) else max(2, min(8, host_cores() // 4))


class Tokenized:
    """One shard's tokenizing, split into pieces on a thread pool; `result()` joins them in row order."""

    def __init__(self, pool: ThreadPoolExecutor, tokenizer, texts: Sequence[list[str]], max_length: int, pieces: int):
        n = len(texts[0])
        step = max(1, -(-n // max(1, pieces)))
        self._parts: list[Future] = [
            pool.submit(encode, tokenizer, tuple(col[start : start + step] for col in texts), max_length)
            for start in range(0, n, step)
        ]

    def wait(self) -> None:
        """Until every piece is tokenized (raising a piece's failure)."""
        for part in self._parts:
            part.result()

    def result(self) -> Arrays:
        parts = [part.result() for part in self._parts]
        if len(parts) == 1:
            return parts[0]
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


class ShardWrites:
    """Shards written in the background, at most `depth` at once, in submission order.

    Each shard's computed arrays come back, once written, as buffers for a later shard (`spare()`): with
    depth d, d + 1 shards' arrays exist at most (d being written, one being computed). A failed write is
    raised when its shard is retired, before another shard is submitted. With `processes` > 0 the shards are
    written by that many processes (the module docstring says when that pays), at most that many at once.
    """

    def __init__(self, writer: StoreWriter, depth: int, processes: int = 0):
        if depth < 1 or processes < 0:
            raise ValueError(f"write depth must be >= 1 and processes >= 0, got {depth} and {processes}")
        self.writer, self.depth = writer, processes or depth
        self._pool: Executor
        if processes:
            # spawn, not fork: the parent may hold a CUDA context, which a forked child must not inherit
            self._pool = ProcessPoolExecutor(max_workers=processes, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_open_writer,
                                             initargs=(writer.url, writer.metadata, os.getpid()))
            self._write = _write_in_process
        else:
            self._pool = ThreadPoolExecutor(max_workers=depth, thread_name_prefix="hsk-shard")
            self._write = writer.write_shard
        self._in_flight: deque[tuple[Future, Arrays]] = deque()
        self._free: list[Arrays] = []
        self.process_cpu_s = 0.0  # CPU the write processes spent on the shards retired so far (not their start)

    def spare(self) -> Arrays:
        """Arrays of a shard already written, to fill again; {} while none is free."""
        return self._free.pop() if self._free else {}

    def submit(self, shard: int, arrays: Arrays, computed: Arrays) -> None:
        """Write `arrays` as `shard` in the background; `computed` (a part of them) is reused once written."""
        while len(self._in_flight) >= self.depth:
            self._retire()
        with _one_line_if_a_process_died():
            job = self._pool.submit(self._write, shard, arrays)
        self._in_flight.append((job, computed))

    def drain(self) -> None:
        """Wait until every shard submitted is written (raising the first failure)."""
        while self._in_flight:
            self._retire()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _retire(self) -> None:
        job, computed = self._in_flight.popleft()
        with _one_line_if_a_process_died():
            self.process_cpu_s += job.result() or 0.0  # threads' writes return None
        self._free.append(computed)


class WriteProcessDied(UserError, RuntimeError):
    """A shard-writing process ended without finishing its shard (the store stays resumable)."""


@contextmanager
def _one_line_if_a_process_died():
    try:
        yield
    except BrokenProcessPool:
        raise WriteProcessDied(
            "a write process died (killed, or out of memory?): the shards written so far are kept; rerun the same "
            "command to resume (with fewer --write-processes if memory ran out)"
        ) from None


_PROCESS_WRITER: list[StoreWriter] = []  # a write process's own writer, opened once by `_open_writer`


def _open_writer(url: str, meta: StoreMeta, parent: int) -> None:
    """A write process's initializer: its StoreWriter on the dump's store (no lease: the dump holds it)."""
    _follow_parent(parent)
    _PROCESS_WRITER.append(StoreWriter(url, meta))


def _follow_parent(parent: int) -> None:
    """End this process soon after the dump that started it is gone. A dump killed with -9 cannot stop its write
    processes, and one left waiting for work would live on for good, holding the dump's stdout (a caller reading
    it to the end would hang) and keeping multiprocessing's resource tracker alive; a shard it was writing is
    left unfinished, which a rerun redoes."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="hsk-follow-parent", daemon=True).start()


def _write_in_process(shard: int, arrays: Arrays) -> float:
    """Write one shard with the process's writer; the process's CPU seconds it took (one shard at a time here)."""
    start = time.process_time()
    _PROCESS_WRITER[0].write_shard(shard, arrays)
    return time.process_time() - start
