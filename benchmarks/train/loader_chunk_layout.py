"""What the inner chunk layout costs a whole-shard read: the default (chunk_rows = shard_rows / 4) against
one chunk per shard, through hsk's read (HSKStore.read_shard: one object per array, decoded by hsk) and
through zarr's (HSKStore.read of the shard's rows, as read_shard did before), digests checked in both.

    OMP_NUM_THREADS=1 python benchmarks/train/loader_chunk_layout.py          # 3,8,0.2, 5 rounds

CPU microseconds per example (process time: one thread does the reads), arms alternated within each
round; the stores are benchmarks/train/loader_throughput.py's synthetic d-768 stores, same rows, written at
each chunk layout (the stored bytes of each are reported: smaller chunks compress a little worse).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from loader_throughput import build  # benchmarks/train/ is on sys.path when run as a script

from hskstore import open_store
from hskstore.format.digest import shard_digest


def read_hsk(store) -> None:
    for shard in range(store.n_shards):
        store.read_shard(shard, verify=True)


def read_zarr(store) -> None:
    """The previous read_shard: zarr reads the rows of every array, then each is hashed."""
    for shard in range(store.n_shards):
        for arr in store.read(slice(*store.shard_bounds(shard))).values():
            shard_digest(arr)


def us_per_example(store, read) -> float:
    cpu = time.process_time()
    read(store)
    return round((time.process_time() - cpu) / len(store) * 1e6, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="3,8,0.2")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--shard-rows", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to build (or reuse) the stores; default a temp dir")
    ap.add_argument("--out", default="benchmarks/train/results/loader_chunk_layout.json")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="hsk-chunks-"))
    layouts = {"default": args.shard_rows // 4, "whole_shard": args.shard_rows}
    stores = {}
    for name, chunk_rows in layouts.items():
        url = root / f"{args.config.replace(',', '_')}_{args.rows}_{args.shard_rows}_{chunk_rows}.zarr"
        if not url.exists():
            build(str(url), args.rows, args.shard_rows, args.config, chunk_rows)
        stores[name] = open_store(str(url))
        read_hsk(stores[name])  # warm-up: page cache, imports
    arms = [(layout, reader) for layout in layouts for reader in ("hsk", "zarr")]
    rounds: dict[str, list] = {f"{layout}/{reader}": [] for layout, reader in arms}
    for r in range(args.rounds):
        for layout, reader in arms if r % 2 == 0 else arms[::-1]:
            rounds[f"{layout}/{reader}"].append(
                us_per_example(stores[layout], read_hsk if reader == "hsk" else read_zarr))
        print(r, {k: v[-1] for k, v in rounds.items()}, os.getloadavg(), flush=True)
    stored = {layout: sum(f.stat().st_size for f in Path(stores[layout].url).rglob("*") if f.is_file())
              for layout in layouts}
    result = {"config": args.config, "rows": args.rows, "shard_rows": args.shard_rows, "chunk_rows": layouts,
              "unit": "CPU microseconds per example, read + digest checks", "stored_bytes": stored,
              "median": {k: statistics.median(v) for k, v in rounds.items()}, "rounds": rounds,
              "load_average_end": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(result["median"]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
