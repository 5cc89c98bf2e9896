"""The training-side loader: a shard-aware shuffled stream of store rows (decoded on the device by decode.py).

    store = open_store("sst2.zarr")
    stream = StoreStream(store, batch_size=32, seed=0)
    for epoch in range(epochs):
        stream.set_epoch(epoch)
        for batch in stream:                    # dict of numpy arrays, one row per example
            t = decode_batch(batch, store.layers, store.hidden_size, "cuda", store.selection.value_dtype)

An epoch's order is global (`global_plan`), after MosaicML streaming's canonical nodes: the shard
order is permuted (seeded by seed and epoch) and dealt round-robin to c = min(C, W, shards, global
batch) canonical streams (C = `canonical`, default 8; W = `buffer_shards`, the shuffle window). Each
stream mixes its shards W/c at a time (the window split evenly over the streams), each run's rows
permuted; global batch t is, stream by stream, each stream's next share (the batch split evenly),
while every stream has rows; the rows the longer streams have left form the epoch's last batches.
So every batch is full but the last and every example is visited exactly once per epoch, and a
batch mixes the rows of W shards. The plan is a pure function of the store's layout, seed, epoch,
global batch, W and C: not of the number of ranks, nor of thread timing, nor of where the store
lives. A data-parallel rank takes its slice of every global batch (`rank_slice`): when N divides c,
the shares of its c/N streams, so it reads only their shards, 1/N of the store (plus a few shards
of the last batches) and holds W/N shards; otherwise the batch sorted by row id cut in N parts.
Each shard is read at most once per epoch; rows a later batch needs stay in memory. A resumed
stream skips shards without reading them. C is part of the order: state_dict records it and a
state with another C is refused. Unlike MosaicML's num_canonical_nodes, which defaults to the first
run's physical nodes, C is a constant here, so no run's machines ever shape the order; and the
window is split over the streams (W/c shards each), so W bounds memory whatever C is.

Background threads (not processes: zarr 3 runs its I/O on an event loop that does not survive a
fork, and blosc/zstd/blake2 release the GIL) prefetch the next shards in that fixed order.
Memory stays near `buffer_shards + read_ahead` shards (read_ahead defaults to `workers`; fewer on a rank
of several: it reads only its shards).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from hskstore import CorruptStoreError, HSKStore, IncompleteStoreError
from hskstore.format.config import ConfigError

TRIMMED = ("input_ids", "token_type_ids")  # cut to the batch's longest text


@dataclass
class StreamStats:
    """What the last pass did; memory is counted in shards (carried rows, < one batch, are not)."""

    shards_read: list[int] = field(default_factory=list)  # in the order reads were asked for
    peak_buffer_shards: int = 0  # shards whose rows sat in the shuffle buffer at once
    peak_resident_shards: int = 0  # buffer + read ahead by the workers


CANONICAL_STREAMS = 8  # C: the most ranks that each read only their share of the store (part of the order)


@dataclass
class Plan:
    """An epoch's global order: its global batches (row ids, each the canonical streams' shares in
    stream order) and the windows of shards whose rows were permuted together, in order of first use."""

    batches: list[np.ndarray]
    windows: list[list[int]]
    canonical: int  # streams in use: min(C, window, shards, global batch); 1 without shuffle


@dataclass
class _Part:
    """One rank's run of batches that start no new window: its slices (global row ids) and the shards of
    the windows its first slice opens (the read order)."""

    shards: list[int]
    batches: list[np.ndarray]
    first_batch: int = 0  # epoch-wide index of batches[0]


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng([seed, *key])


def _split(total: int, parts: int, i: int) -> int:
    """Part i of `total` cut in `parts` as evenly as it goes (any run of parts/N parts sums to total/N)."""
    return (i + 1) * total // parts - i * total // parts


def canonical_streams(layout, global_batch: int, window: int, canonical: int, shuffle: bool = True) -> int:
    """The canonical streams an order uses: C, but never more than the window's shards (each stream
    mixes at least one shard), the store's shards or the global batch (each gives a row per batch)."""
    return min(canonical, window, layout.n_shards, global_batch) if shuffle else 1


def _stream_rows(layout, shards: list[int], width: int, key: tuple, shuffle: bool) -> tuple[np.ndarray, list]:
    """One canonical stream's rows in order: its shards `width` at a time, each window's rows permuted."""
    seq, windows = [], []
    for g in range(0, len(shards), width):
        chunk = shards[g : g + width]
        rows = np.concatenate([np.arange(*layout.shard_bounds(s)) for s in chunk])
        seq.append(rows[_rng(*key, g).permutation(len(rows))] if shuffle else rows)
        windows.append((chunk, len(rows)))
    return (np.concatenate(seq) if seq else np.empty(0, dtype=np.int64)), windows


def global_plan(layout, global_batch: int, epoch: int, *, seed: int = 0, shuffle: bool = True, window: int = 4,
                drop_last: bool = False, canonical: int = CANONICAL_STREAMS) -> Plan:
    """The epoch's global batches, from the store's layout alone (n_shards, shard_bounds): a pure
    function of (rows and shards of the store, seed, epoch, global batch, window, C, shuffle, drop_last).

    The shard order is permuted (seeded by seed, epoch) and dealt round-robin to c = min(C, window,
    shards, batch) canonical streams; stream i mixes window*i/c-sized runs of its shards (the window
    split evenly), each run's rows permuted. Global batch t is, stream by stream, the next share of
    each (the batch split evenly over the streams), while every stream has its share; the rows the
    longer streams have left then form the last batches, stream by stream. The number of ranks plays
    no part: each rank takes its slice of every global batch (`rank_slice`).
    """
    n = layout.n_shards
    order = [int(s) for s in (_rng(seed, epoch).permutation(n) if shuffle else np.arange(n))]
    c = canonical_streams(layout, global_batch, window, canonical, shuffle)
    shares = [_split(global_batch, c, i) for i in range(c)]
    seqs, opened = [], []  # opened: (first row of the stream's sequence using it, stream, window shards)
    for i in range(c):
        seq, windows = _stream_rows(layout, order[i::c], _split(window, c, i), (seed, epoch, c, i), shuffle)
        seqs.append(seq)
        first = 0
        for chunk, size in windows:
            opened.append((first // shares[i], i, chunk))
            first += size
    steps = min(len(seq) // share for seq, share in zip(seqs, shares))
    batches = [np.concatenate([seq[t * s : (t + 1) * s] for seq, s in zip(seqs, shares)]) for t in range(steps)]
    tail = np.concatenate([seq[steps * s :] for seq, s in zip(seqs, shares)])
    keep = len(tail) if not drop_last else len(tail) // global_batch * global_batch
    batches += [tail[i : i + global_batch] for i in range(0, keep, global_batch)]
    return Plan(batches, [chunk for _, _, chunk in sorted(opened, key=lambda o: o[:2])], c)


def rank_slice(rows: np.ndarray, rank: int, world_size: int, canonical: int = 1) -> np.ndarray:
    """Rank `rank`'s rows of a global batch. One process keeps the batch's order. When the ranks divide
    the canonical streams, each rank takes its streams' shares (the batch cut in N contiguous parts),
    so it reads only its streams' shards; otherwise the batch sorted by row id is cut in N parts, so a
    rank's rows at least sit in few shards. A partial last batch splits as evenly as it goes."""
    if world_size == 1:
        return rows
    return np.array_split(rows if canonical % world_size == 0 else np.sort(rows), world_size)[rank]


class _Prefetcher:
    """Reads shards in a fixed order on `workers` background threads, keeping `depth` reads ahead
    (in flight or queued for a thread; default: one per thread). `place(shard)`, called in the caller's
    thread as a read is submitted, gives the arrays to decode it into (None: arrays of its own)."""

    def __init__(self, read, shards: list[int], workers: int, stats: StreamStats, on_submit, depth: int = 0,
                 place=lambda shard: None):
        self._read = read
        self._place = place
        self._todo = iter(shards)
        self._pending: deque[tuple[int, Future | None, dict | None]] = deque()
        self._depth = max(1, depth or workers) if workers else 1
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="hsk-stream") if workers else None
        self._stats = stats
        self._on_submit = on_submit
        for _ in range(self._depth):
            self._submit()

    def _submit(self) -> None:
        shard = next(self._todo, None)
        if shard is None:
            return
        self._stats.shards_read.append(shard)
        self._on_submit()
        out = self._place(shard)
        # workers=0: read lazily in the caller's thread (debugging, or stores on slow remote I/O)
        self._pending.append((shard, self._pool.submit(self._read, shard, out) if self._pool else None, out))

    def next(self) -> tuple[int, dict[str, np.ndarray]]:
        shard, future, out = self._pending.popleft()
        data = future.result() if future is not None else self._read(shard, out)
        self._submit()
        return shard, data

    def close(self) -> None:
        for _, future, _ in self._pending:
            if future is not None:
                future.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


class _Pools:
    """Where each part's shards land: part k's pool holds the rows carried from earlier parts, then
    the kept rows of its shards in read order, and is allocated when its first read is submitted, so
    a store that can (HSKStore.read_shard(out=...)) decodes a shard whose rows are all kept straight
    into it: no copy of every row into a pool (for reads ahead, the pool of the part they belong to)."""

    def __init__(self, stream: StoreStream, reads: list[list[int]], when: np.ndarray):
        self._stream = stream
        self._in_place = isinstance(stream.store, HSKStore)
        self.part, self.offset, self._whole, self.size = {}, {}, {}, []
        self.carried = self._carried(reads, when)
        for k, shards in enumerate(reads):
            at = int(self.carried[k])
            for shard in shards:
                rows = when[slice(*stream.store.shard_bounds(shard))]
                n = int((rows >= k).sum())
                self.part[shard], self.offset[shard], self._whole[shard] = k, at, n == len(rows)
                at += n
            self.size.append(at)
        self._pools: dict[int, dict[str, np.ndarray]] = {}

    def _carried(self, reads: list[list[int]], when: np.ndarray) -> np.ndarray:
        """Per part, the rows earlier parts read that it or a later part uses (they open its pool)."""
        read_at = np.full(len(when), -1, dtype=np.int64)
        for k, shards in enumerate(reads):
            for shard in shards:
                rows = slice(*self._stream.store.shard_bounds(shard))
                read_at[rows] = np.where(when[rows] >= k, k, -1)
        kept = read_at >= 0  # row r sits in the pools of parts read_at[r] .. when[r]
        change = np.bincount(read_at[kept] + 1, minlength=len(reads) + 2)
        change -= np.bincount(when[kept] + 1, minlength=len(reads) + 2)
        return np.cumsum(change)[: len(reads)]

    def _pool(self, k: int) -> dict[str, np.ndarray]:
        if k not in self._pools:
            self._pools[k] = self._stream._empty_pool(self.size[k])
        return self._pools[k]

    def take(self, k: int, held: int) -> dict[str, np.ndarray]:
        """Part k's pool, once its first `held` rows are to be filled with the rows carried to it."""
        assert held == self.carried[k], (k, held, self.carried[k])
        for done in [j for j in self._pools if j < k]:
            del self._pools[done]
        return self._pool(k)

    def place(self, shard: int) -> dict[str, np.ndarray] | None:
        """The arrays shard `shard` decodes into (None: it is read whole, then its kept rows copied in)."""
        pool = self._pool(self.part[shard])
        if not (self._in_place and self._whole[shard]):
            return None
        start, stop = self._stream.store.shard_bounds(shard)
        at = self.offset[shard]
        return {name: arr[at : at + stop - start] for name, arr in pool.items()}


class StoreStream:
    """Shuffled, resumable batches of store rows for one training rank.

    `batch_size` is this rank's batch; the global batch is batch_size * world_size. Each rank of a
    torch DDP run builds its own stream with its rank and world size; they share the epoch's global
    batches and take disjoint slices of each, so N ranks step through the batches of one process with
    the global batch. Several ranks drop the epoch's last batch when it is partial (it would not split
    into equal slices, and DDP's steps stay in lockstep), whatever drop_last says.
    One pass at a time: do not iterate the same stream from two loops at once.
    """

    def __init__(
        self,
        store: HSKStore,
        *,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        buffer_shards: int = 4,
        workers: int = 2,
        read_ahead: int = 0,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        names: list[str] | None = None,
        canonical: int = CANONICAL_STREAMS,
    ):
        if not store.metadata.complete:  # opened with allow_incomplete: still not trainable
            raise IncompleteStoreError(
                f"{store.url} is incomplete: finish its dump (rerun the same `hsk dump` command) "
                "before training"
            )
        if batch_size < 1 or buffer_shards < 1 or workers < 0 or read_ahead < 0 or canonical < 1:
            raise ValueError(f"need batch_size >= 1, buffer_shards >= 1, workers >= 0, read_ahead >= 0, canonical >= 1;"
                             f" got {batch_size}, {buffer_shards}, {workers}, {read_ahead}, {canonical}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
        if world_size > store.n_shards:
            raise ConfigError(
                f"{store.url} has {store.n_shards} shards, fewer than the {world_size} ranks that would "
                "share them: every rank needs at least one (write the store with smaller shards)"
            )
        self.store = store
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.buffer_shards = buffer_shards
        self.workers = workers
        self.read_ahead = read_ahead  # shards read ahead (0: one per worker); hides object-store latency
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.canonical = canonical  # C: canonical streams of the order (recorded in state_dict)
        self.names = self._resolve_names(names)
        self.epoch = 0
        self.batches_done = 0
        self.stats = StreamStats()
        self._plan_cache: tuple[tuple, list[_Part], int] | None = None
        self._buffer = 0
        self._queued = 0

    def _resolve_names(self, names: list[str] | None) -> list[str]:
        known = list(self.store.specs)
        if names is None:
            return known
        unknown = [n for n in names if n not in self.store.specs]
        if unknown:
            raise ConfigError(f"{self.store.url} has no arrays {unknown}; it has {known}")
        wanted = set(names) | {"row"}  # row identifies every example (logging, checks)
        if wanted & set(TRIMMED):
            wanted.add("length")  # trimming needs the lengths
        return [n for n in known if n in wanted]  # store order: digests are checked in that order

    # --- the plan ------------------------------------------------------------------------------
    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def _global_plan(self, epoch: int) -> Plan:
        return global_plan(self.store, self.global_batch, epoch, seed=self.seed, shuffle=self.shuffle,
                           window=self.buffer_shards, drop_last=self.drop_last or self.world_size > 1,
                           canonical=self.canonical)

    def _plan(self, epoch: int) -> tuple[list[_Part], int]:
        """This rank's slices of the epoch's global batches, cut where a slice opens a window, and their count."""
        key = (epoch, self.seed)
        if self._plan_cache is not None and self._plan_cache[0] == key:
            return self._plan_cache[1], self._plan_cache[2]
        plan = self._global_plan(epoch)
        window_of = np.zeros(self.store.n_shards, dtype=np.int64)
        for w, shards in enumerate(plan.windows):
            window_of[shards] = w
        shard_rows = self.store.metadata.layout.shard_rows
        parts: list[_Part] = []
        seen: set[int] = set()
        for t, rows in enumerate(plan.batches):
            mine = rank_slice(rows, self.rank, self.world_size, plan.canonical)
            new = {int(w) for w in np.unique(window_of[mine // shard_rows])} - seen
            if new or not parts:
                seen |= new
                parts.append(_Part([s for w in sorted(new) for s in plan.windows[w]], [mine], t))
            else:
                parts[-1].batches.append(mine)
        self._plan_cache = (key, parts, len(plan.batches))
        return parts, len(plan.batches)

    def __len__(self) -> int:
        """Batches in the current epoch for this rank (all of them, not only those still to come)."""
        return self._plan(self.epoch)[1]

    # --- position --------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its first batch; setting the current epoch again keeps the position,
        so a loop that calls set_epoch at the top of every epoch does not undo load_state_dict."""
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self.batches_done = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batches_done": self.batches_done, "seed": self.seed, "canonical": self.canonical}

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where the saved stream stopped (same store layout, global batch and window;
        any number of ranks: the position counts global batches). A state without `canonical` is taken
        as this stream's C; one with another C is refused (the order would differ)."""
        saved = int(state.get("canonical", self.canonical))
        if saved != self.canonical:
            raise ConfigError(f"the checkpoint's data order has {saved} canonical streams, this run's "
                              f"{self.canonical}: resume with the same number")
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        done = int(state["batches_done"])
        total = len(self)
        if not 0 <= done <= total:
            raise ConfigError(f"state says {done} batches done, but epoch {self.epoch} has {total} on this "
                              "rank: was it saved with another global batch size or shuffle window?")
        self.batches_done = done

    # --- reading ---------------------------------------------------------------------------------
    def _read(self, shard: int, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        try:
            if out is not None:
                return self.store.read_shard(shard, verify=True, names=self.names, out=out)
            return self.store.read_shard(shard, verify=True, names=self.names)
        except CorruptStoreError as exc:
            start, stop = self.store.shard_bounds(shard)
            raise CorruptStoreError(
                f"streaming stopped at shard {shard} (rows {start}:{stop}) of epoch {self.epoch}: {exc}"
            ) from exc

    def _note(self) -> None:
        resident = self._buffer + self._queued
        self.stats.peak_buffer_shards = max(self.stats.peak_buffer_shards, self._buffer)
        self.stats.peak_resident_shards = max(self.stats.peak_resident_shards, resident)

    def _on_submit(self) -> None:
        self._queued += 1
        self._note()

    def _empty_pool(self, n: int) -> dict[str, np.ndarray]:
        return {name: np.empty((n, *self.store.specs[name].shape[1:]), dtype=self.store.specs[name].dtype)
                for name in self.names}

    def _batch(self, pool: dict[str, np.ndarray], slots: np.ndarray) -> dict[str, np.ndarray]:
        out = {}
        width = max(1, int(pool["length"][slots].max())) if "length" in pool else None
        for name, arr in pool.items():
            # fancy indexing copies: the batch owns its memory and the buffer can go
            out[name] = arr[slots, :width] if name in TRIMMED else arr[slots]
        return out

    def _schedule(self, parts: list[_Part], start: int) -> tuple[list[list[int]], np.ndarray]:
        """The shards each remaining part reads (those holding its rows that no earlier part read, so
        every shard is read at most once per pass), and the part that uses each row (-1: none)."""
        shard_rows = self.store.metadata.layout.shard_rows
        when = np.full(len(self.store), -1, dtype=np.int64)
        reads, done = [], set()
        for k, part in enumerate(parts):
            mine = [b for i, b in enumerate(part.batches) if part.first_batch + i >= start]
            rows = np.concatenate(mine) if mine else np.empty(0, dtype=np.int64)
            when[rows] = k
            needed = {int(s) for s in np.unique(rows // shard_rows)} - done
            # rows carried from earlier windows first (their shards, ascending), then the window's order
            ordered = sorted(needed - set(part.shards)) + [s for s in part.shards if s in needed]
            reads.append(ordered)
            done |= needed
        return reads, when

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        """The rest of the current epoch's batches; once they are all out, the epoch counter moves on."""
        parts, total = self._plan(self.epoch)
        start = self.batches_done
        self.stats = StreamStats()
        self._buffer = self._queued = 0
        todo = [p for p in parts if p.first_batch + len(p.batches) > start and p.first_batch < total]
        if todo:
            # a resumed pass reads only the shards holding rows still to come, skipped windows' not
            reads, when = self._schedule(todo, start)
            pools = _Pools(self, reads, when)
            reader = _Prefetcher(self._read, [s for r in reads for s in r], self.workers, self.stats,
                                 self._on_submit, self.read_ahead, pools.place)
            try:
                yield from self._run(todo, reads, when, start, total, reader, pools)
            finally:
                reader.close()
        if self.batches_done >= total:  # a finished epoch moves on, so state_dict() points at the next
            self.epoch += 1
            self.batches_done = 0

    def _fill(self, k: int, shards: list[int], when: np.ndarray, held: dict[str, np.ndarray], held_rows: np.ndarray,
              reader: _Prefetcher, pools: _Pools) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Part k's pool: the rows kept from earlier parts, then the rows of its shards used now or later
        (decoded in place where the store can, see _Pools)."""
        if not shards:  # nothing new: the pool is what earlier parts kept
            return held, held_rows
        pool = pools.take(k, len(held_rows))
        for name, arr in held.items():
            pool[name][: len(held_rows)] = arr
        rows = [held_rows]
        for expected in shards:
            shard, data = reader.next()
            assert shard == expected, (shard, expected)
            self._queued -= 1
            self._buffer += 1
            self._note()
            shard_rows = np.arange(*self.store.shard_bounds(shard))
            keep = when[shard_rows] >= k
            at, n = pools.offset[shard], int(keep.sum())
            for name, arr in data.items():
                if arr.base is not pool[name]:  # not decoded in place: copied in
                    pool[name][at : at + n] = arr if n == len(arr) else arr[keep]
            rows.append(shard_rows[keep])
            del data
        return pool, np.concatenate(rows)

    def _run(self, todo: list[_Part], reads: list[list[int]], when: np.ndarray, start: int, total: int,
             reader: _Prefetcher, pools: _Pools) -> Iterator[dict[str, np.ndarray]]:
        slot = np.full(len(self.store), -1, dtype=np.int64)  # row id -> its place in the pool
        held, held_rows = self._empty_pool(0), np.empty(0, dtype=np.int64)
        for k, part in enumerate(todo):
            pool, pool_rows = self._fill(k, reads[k], when, held, held_rows, reader, pools)
            slot[pool_rows] = np.arange(len(pool_rows))
            for i, rows in enumerate(part.batches):
                index = part.first_batch + i
                if index < start:
                    continue
                if index >= total:
                    return
                batch = self._batch(pool, slot[rows])
                self.batches_done = index + 1  # counted before the yield: a checkpoint taken after
                yield batch  # the step that consumed this batch must not replay it
            later = when[pool_rows] > k  # rows carried into later windows stay; the rest can go
            if not later.all():
                held = {name: arr[later] for name, arr in pool.items()}
                held_rows = pool_rows[later]
            else:
                held, held_rows = pool, pool_rows
            del pool
            self._buffer = 0
