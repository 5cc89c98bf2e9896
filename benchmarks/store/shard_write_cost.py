"""What writing a store's shards costs: hsk's own shard encoder against zarr's write path.

    hsk dump --task qnli --split dev --teacher T --limit 4096 --config 3,8,0.2 --out /tmp/q.zarr
    python benchmarks/store/shard_write_cost.py --store /tmp/q.zarr \
        --json benchmarks/store/results/shard_write_cost.json

Every shard of STORE is read once, then written again into a fresh store with StoreWriter, once per
arm and round, arms alternated: `hsk` (hskstore/format/shard_codec.py encodes each shard's object) and
`zarr` (the writer's shard layouts switched off: `array[start:stop] = data`, zarr's async pipeline).
Reported: CPU microseconds per example (the process's CPU time, every thread) and wall, and the
Blosc-only cost of the same inner chunks on one thread, the floor both arms pay.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numcodecs.blosc
import numpy as np

from hskstore import open_store
from hskstore.format.shard_codec import ShardLayout
from hskstore.io.writer import StoreWriter

DERIVED_FIELDS = ("checksums", "manifest", "complete", "identity", "stored_bytes", "inputs_hash",
                  "format_version", "created", "software_version")


def write_all(url: str, meta: dict, shards: list[dict], arm: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) to write every shard, in a fresh store."""
    shutil.rmtree(url, ignore_errors=True)
    with StoreWriter.open(url, meta, overwrite=True) as writer:
        if arm == "zarr":
            writer._layouts = dict.fromkeys(writer._layouts)  # noqa: SLF001 (the arm under test)
        cpu, wall = time.process_time(), time.perf_counter()
        for shard, arrays in enumerate(shards):
            writer.write_shard(shard, arrays)
        return time.process_time() - cpu, time.perf_counter() - wall


def blosc_floor(url: str, shards: list[dict]) -> float:
    """Seconds to compress every inner chunk of every shard once, on one thread."""
    store = open_store(url)
    encoders = {name: ShardLayout.of(store.group[name]) for name in shards[0]}
    start = time.perf_counter()
    for arrays in shards:
        for name, data in arrays.items():
            enc = encoders[name]
            for c in range(0, len(data), enc.chunk_rows):
                enc.blosc.encode(np.ascontiguousarray(data[c : c + enc.chunk_rows]))
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True, help="a complete task store to rewrite")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    numcodecs.blosc.set_nthreads(1)
    source = open_store(args.store)
    shards = [source.read_shard(s) for s in range(source.n_shards)]
    meta = {k: v for k, v in source.meta.items() if k not in DERIVED_FIELDS}
    n = len(source)
    runs = []
    with tempfile.TemporaryDirectory(prefix="hsk-write-") as work:
        for r in range(args.rounds):
            for arm in ("hsk", "zarr") if r % 2 == 0 else ("zarr", "hsk"):
                cpu, wall = write_all(str(Path(work) / "s.zarr"), meta, shards, arm)
                runs.append({"arm": arm, "round": r, "cpu_us_per_example": 1e6 * cpu / n,
                             "wall_us_per_example": 1e6 * wall / n,
                             "load_average": [round(x, 2) for x in os.getloadavg()]})
                print(f"round {r} {arm:4s}: {runs[-1]['cpu_us_per_example']:6.1f} us CPU/ex, "
                      f"{runs[-1]['wall_us_per_example']:6.1f} us wall/ex (load {runs[-1]['load_average']})")
        floor = 1e6 * blosc_floor(args.store, shards) / n
    print(f"Blosc alone, one thread: {floor:.1f} us/ex")
    result = {"store": args.store, "rows": n, "config": source.meta["selection"]["config"],
              "value_dtype": source.meta["selection"]["value_dtype"], "blosc_only_us_per_example": floor,
              "runs": runs}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
