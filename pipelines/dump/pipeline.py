"""The dump's host pipeline: tokenizing ahead, and shards written in the background with bounded depth.

Three stages overlap: the next shard is tokenized (in pieces, on several threads: the fast tokenizer's
Rust encoding releases the GIL) while the current one is computed (forward, selection, encoding) and
earlier ones are compressed and written (Blosc's zstd releases the GIL too). Every queue is bounded:
one shard tokenized ahead, at most `depth` shards being written, and their arrays reused once written,
so the dump's memory does not grow with its length. No stage changes what another computes: the store's
bytes are the same at every depth and piece count (tests/test_dump.py).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from hskstore.writer import StoreWriter
from pipelines.core.tokenize import encode

Arrays = dict[str, np.ndarray]


def default_tokenize_threads() -> int:
    """Threads that tokenize a shard's pieces: the host's cores, at most 4 (more gains little: the rest
    of a shard's tokenizing, building its arrays, holds the GIL)."""
    return max(1, min(4, os.cpu_count() or 1))


def default_write_depth(device: str) -> int:
    """Shards written at once: 2 where the forward runs off the host (its cores are free for zstd), 1 on
    a CPU, whose forward already uses every core."""
    return 1 if device.split(":")[0] == "cpu" else 2


class Tokenized:
    """One shard's tokenizing, split into pieces on a thread pool; `result()` joins them in row order."""

    def __init__(self, pool: ThreadPoolExecutor, tokenizer, texts: Sequence[list[str]], max_length: int, pieces: int):
        n = len(texts[0])
        step = max(1, -(-n // max(1, pieces)))
        self._parts: list[Future] = [
            pool.submit(encode, tokenizer, tuple(col[start : start + step] for col in texts), max_length)
            for start in range(0, n, step)
        ]

    def result(self) -> Arrays:
        parts = [part.result() for part in self._parts]
        if len(parts) == 1:
            return parts[0]
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


class ShardWrites:
    """Shards written in the background, at most `depth` at once, in submission order.

    Each shard's computed arrays come back, once written, as buffers for a later shard (`spare()`): with
    depth d, d + 1 shards' arrays exist at most (d being written, one being computed). A failed write is
    raised when its shard is retired, before another shard is submitted.
    """

    def __init__(self, writer: StoreWriter, depth: int):
        if depth < 1:
            raise ValueError(f"write depth must be >= 1, got {depth}")
        self.writer, self.depth = writer, depth
        self._pool = ThreadPoolExecutor(max_workers=depth, thread_name_prefix="hsk-shard")
        self._in_flight: deque[tuple[Future, Arrays]] = deque()
        self._free: list[Arrays] = []

    def spare(self) -> Arrays:
        """Arrays of a shard already written, to fill again; {} while none is free."""
        return self._free.pop() if self._free else {}

    def submit(self, shard: int, arrays: Arrays, computed: Arrays) -> None:
        """Write `arrays` as `shard` in the background; `computed` (a part of them) is reused once written."""
        while len(self._in_flight) >= self.depth:
            self._retire()
        self._in_flight.append((self._pool.submit(self.writer.write_shard, shard, arrays), computed))

    def drain(self) -> None:
        """Wait until every shard submitted is written (raising the first failure)."""
        while self._in_flight:
            self._retire()

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _retire(self) -> None:
        job, computed = self._in_flight.popleft()
        job.result()
        self._free.append(computed)
