"""Shuffle quality, memory and per-rank reads of the windowed global order, against a full permutation.

    python benchmarks/train/shuffle_quality.py                  # 64 shards of 1024 rows, global batch 32

The training order (pipelines/train/data/stream.py global_plan) permutes the shards, deals them to
c = min(C, W) canonical streams, and permutes each stream's windows (W/c shards each); a global
batch is every stream's share. Computed from the plan alone (no store is read), on a store whose rows are
sorted by label (the worst case: a dump of a label-sorted file; half label 0, then half label 1):
  - label imbalance: mean over global batches of |fraction of label 1 in the batch - 0.5|; a full
    random permutation gives about 0.07 at batch 32 (binomial), a sorted order 0.5;
  - consecutive distance: median |original position of row i+1 - of row i| / n_rows over the epoch,
    each batch's rows taken in a random order (full permutation: about 0.29);
  - memory: the window's shards, in rows and in bytes for a d 768 store at --config;
  - reads: under N ranks, the fraction of the store's shards each rank reads per epoch (the
    trade-off of the window: a rank's slices of a wide window's batches touch more shards).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from hskstore.format.schema import array_specs
from pipelines.train.data.stream import CANONICAL_STREAMS, global_plan, rank_slice


class Layout:
    def __init__(self, n_rows: int, shard_rows: int):
        self.n_rows, self.shard_rows = n_rows, shard_rows
        self.n_shards = -(-n_rows // shard_rows)

    def shard_bounds(self, shard: int) -> tuple[int, int]:
        return shard * self.shard_rows, min((shard + 1) * self.shard_rows, self.n_rows)


def bytes_per_row(config: str) -> int:
    from loader_overhead import store_meta  # benchmarks/train/ is on sys.path when run as a script

    specs = array_specs(store_meta(1024, 1024, config))
    return sum(int(np.prod(s.shape[1:])) * np.dtype(s.dtype).itemsize for s in specs if not s.name.endswith("/scores"))


def quality(batches: list[np.ndarray], n_rows: int) -> dict:
    label = lambda rows: rows >= n_rows // 2  # noqa: E731 - rows sorted by label
    imbalance = float(np.mean([abs(label(b).mean() - 0.5) for b in batches if len(b)]))
    # a batch is a set to the gradient, and the canonical order lists it stream by stream: measure the
    # distance in a random order within each batch, so the statistic compares mixing, not listing
    rng = np.random.default_rng(0)
    seq = np.concatenate([rng.permutation(b) for b in batches])
    distance = float(np.median(np.abs(np.diff(seq))) / n_rows)
    return {"label_imbalance": round(imbalance, 4), "median_consecutive_distance": round(distance, 4)}


def rank_reads(batches: list[np.ndarray], layout: Layout, world: int, canonical: int) -> list[float]:
    """The fraction of the store's shards each rank reads in the epoch."""
    fractions = [len(np.unique(np.concatenate([rank_slice(b, r, world, canonical) for b in batches])
                               // layout.shard_rows)) / layout.n_shards for r in range(world)]
    return fractions


def reference(n: int, batch_size: int, epochs: int) -> dict:
    """The statistics of a full random permutation of the epoch's rows."""
    full = []
    for epoch in range(epochs):
        perm = np.random.default_rng([0, epoch]).permutation(n)
        full.append(quality([perm[i : i + batch_size] for i in range(0, n, batch_size)], n))
    return {"window": "full permutation", **{k: round(float(np.mean([q[k] for q in full])), 4) for k in full[0]}}


def window_row(layout: Layout, args, window: int, row_bytes: int) -> dict:
    per_epoch, reads = [], {2: [], 4: []}
    for epoch in range(args.epochs):
        plan = global_plan(layout, args.batch_size, epoch, seed=0, window=window, drop_last=True,
                           canonical=args.canonical)
        per_epoch.append(quality(plan.batches, layout.n_rows))
        for world in reads:
            reads[world].extend(rank_reads(plan.batches, layout, world, plan.canonical))
    return {
        "window": window,
        "canonical_streams": min(args.canonical, window, layout.n_shards, args.batch_size),
        **{k: round(float(np.mean([q[k] for q in per_epoch])), 4) for k in per_epoch[0]},
        "window_rows": window * args.shard_rows,
        "window_mib": round(window * args.shard_rows * row_bytes / 2**20, 1),
        **{f"shards_read_per_rank_{w}_ranks": round(float(np.mean(v)), 3) for w, v in reads.items()},
        **{f"shards_read_max_rank_{w}_ranks": round(float(np.max(v)), 3) for w, v in reads.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--shard-rows", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=32, help="global batch")
    ap.add_argument("--windows", default="1,4,16,64")
    ap.add_argument("--config", default="3,8,0.2")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--canonical", type=int, default=CANONICAL_STREAMS, help="C, canonical streams")
    ap.add_argument("--out", default="benchmarks/train/results/shuffle_quality.json")
    args = ap.parse_args()
    layout = Layout(args.shards * args.shard_rows, args.shard_rows)
    n = layout.n_rows
    row_bytes = bytes_per_row(args.config)
    rows = [reference(n, args.batch_size, args.epochs)]
    rows += [window_row(layout, args, window, row_bytes) for window in (int(w) for w in args.windows.split(","))]
    for r in rows:
        print(json.dumps(r))
    result = {"shards": args.shards, "shard_rows": args.shard_rows, "global_batch": args.batch_size,
              "config": args.config, "canonical": args.canonical, "bytes_per_row": row_bytes, "epochs": args.epochs,
              "rows": rows,
              "load_average": os.getloadavg()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
