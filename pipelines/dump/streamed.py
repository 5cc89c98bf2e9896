"""A store written shard by shard from a streamed corpus (the causal-LM and seq2seq dumps): where a resumed dump
takes up the corpus, the store grown as its rows come, each shard's corpus cursors recorded before the shard
(pipelines.dump.corpus.ShardCursors), and the corpus's fingerprint recorded at the end. What makes a shard's rows
(packing, pairs) and what computes and writes them (this process, a dask cluster) are the callers'."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from hskstore.format.meta import DataRef
from hskstore.io.writer import StoreWriter
from pipelines.core.data import DataError
from pipelines.dump.corpus import Cursor, ShardCursors
from pipelines.dump.pipeline import ShardWrites, default_write_depth, overlaps_forward

STREAM_KEY = "stream"  # the corpus's signature: a rerun on the same corpus resumes (or reopens) its store


@contextmanager
def frozen_heap() -> Iterator[None]:
    """The objects alive when the corpus starts to stream (the teacher, the tokenizer, every module imported:
    hundreds of thousands) kept out of the garbage collector's full passes until it ends: each pass over them
    took 0.3-0.5 s here, about one per 10^6 tokens of capture. Reference counting still frees what they drop."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def resumed_record(out: str, meta: dict) -> dict:
    """`meta` with the layout and dataset of the streamed store already at `out` for the same corpus (its rows,
    grown as they were written, and once complete its fingerprint), so that the writer resumes or reopens it."""
    from hskstore.io.writer import _read_meta

    try:
        existing = _read_meta(out)
    except Exception:  # not a store: the writer refuses it in its own words
        return meta
    if not existing or (existing.get(STREAM_KEY) or {}).get("signature") != meta[STREAM_KEY]["signature"]:
        return meta
    return {**meta, "layout": existing["layout"], "dataset": existing["dataset"]}


class LocalShards:
    """Shards computed (`compute(rows, first_row)`) and written by this process (by threads while the next one
    computes, off the CPU: on a CPU the forward already has every core, pipelines.dump.pipeline says why they
    take turns there)."""

    def __init__(self, writer: StoreWriter, compute: Callable[[Any, int], dict[str, np.ndarray]], device: str):
        self.writer, self.compute = writer, compute
        self.writes = ShardWrites(writer, default_write_depth(device)) if overlaps_forward(device) else None

    def put(self, shard: int, rows: Any, first_row: int) -> None:
        arrays = self.compute(rows, first_row)
        if self.writes:
            self.writes.submit(shard, arrays, {})
        else:
            self.writer.write_shard(shard, arrays)

    def drain(self) -> None:
        if self.writes:
            self.writes.drain()

    def close(self) -> None:
        if self.writes:
            self.writes.close()


class StreamedShards:
    """The store's pending shards written from the corpus: `first` is the first pending one, `start` where its rows
    begin in the corpus (and how much of that document the shard before it holds)."""

    def __init__(self, writer: StoreWriter, out: str, corpus: Any, log: Callable[[str], Any]):
        self.writer, self.corpus = writer, corpus
        self.cursors = ShardCursors(writer.group, writer.n_shards)
        self.done = writer.done_shards()
        self.first = int(np.argmin(self.done)) if not self.done.all() else len(self.done)
        self.start: tuple[Cursor, int] = self.cursors.resume_point(self.first)
        self.written = 0
        if self.first:
            state = self.start[0].state
            log(f"resuming {out}: {self.first} shards already written; the corpus is read from file "
                f"{self.start[0].file} at {self.start[0].offset}"
                + (f" (its stream taken up at row {state.row})" if state is not None else ""))

    def run(self, shards: Iterator, sink: Any, n_rows: Callable[[Any], int], update: Callable[[Any], Any],
            empty: str) -> None:
        """Write each shard's rows (of `shards`, from the first pending on) through `sink`, those already
        written skipped; `update(rows)` after each (a progress bar); `empty` is said of a corpus with no rows."""
        with frozen_heap():
            shard = self._stream(shards, sink, n_rows, update, empty)
        self.written = shard - self.first

    def _stream(self, shards: Iterator, sink: Any, n_rows: Callable[[Any], int], update: Callable[[Any], Any],
                empty: str) -> int:
        """run's loop; the shard after the last one written."""
        shard_rows = self.writer.metadata.layout.shard_rows
        shard = self.first
        try:
            # read on even when every shard the store has room for is done: it grows as the corpus comes, so a
            # dump stopped just before it grew has more corpus to read, and one stopped at the corpus's end none
            for rows in shards:
                self._make_room(shard, n_rows(rows), rows.last)
                pending = shard >= len(self.done) or not self.done[shard]
                self.cursors.advance(shard, rows, record=pending)
                if pending:
                    sink.put(shard, rows, shard * shard_rows)
                update(rows)
                shard += 1
            if shard == 0:
                raise DataError(f"{self.corpus.described} {empty}")
            if shard == self.first and self.writer.metadata.layout.n_rows > shard * shard_rows:
                self.writer.resize_rows(shard * shard_rows)  # the corpus ended where the written shards did
            sink.drain()
        finally:
            sink.close()
        return shard

    def _make_room(self, shard: int, rows: int, last: bool) -> None:
        """Rows for shard `shard`: the store grows (doubling) while the corpus runs, and takes its exact row count
        before its last shard is written."""
        writer = self.writer
        have = writer.metadata.layout.n_rows
        need = shard * writer.metadata.layout.shard_rows + rows
        target = need if last else max(2 * have, need) if need > have else have
        if target != have:
            writer.resize_rows(target)
            self.cursors.resize(writer.n_shards)

    def finalize(self) -> dict:
        """The store finalized with the corpus's fingerprint (its bookkeeping removed); its metadata."""
        fingerprint, documents = self.cursors.fingerprint()
        self.cursors.remove()
        corpus = self.corpus
        return self.writer.finalize(dataset=DataRef(corpus.described, fingerprint, documents),
                                    data_origin={"kind": "stream", "source": corpus.described,
                                                 "signature": corpus.signature}).to_dict()
