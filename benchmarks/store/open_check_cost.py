"""What checking the shard digests against the checksums costs when a store is opened (issue 19).

    python benchmarks/store/open_check_cost.py SOURCE_STORE [--shards 64 400] [--rounds 5]

Builds, from any complete store's metadata, a store of N shards of 8 rows each (random data, real
digests and checksums, so it opens), then times `open_store` with the check (this hsk) and
without it (the same open with `_checksum_problems` replaced by a no-op: the previous behaviour),
alternating the arms in every round. Writes benchmarks/store/results/open_check_cost.json with every
round and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from hskstore.format.schema import array_specs
from hskstore.io.reader import HSKStore, open_store
from hskstore.io.writer import StoreWriter


def build(source: str, out: str, shards: int) -> None:
    meta = {k: v for k, v in open_store(source).meta.items()
            if k not in ("checksums", "manifest", "complete", "identity", "inputs_hash")}
    rows = 8 * shards
    meta["layout"] = dict(meta["layout"], n_rows=rows, shard_rows=8, chunk_rows=8)
    meta["dataset"] = dict(meta["dataset"], n_rows=rows)
    rng = np.random.default_rng(0)
    with StoreWriter.open(out, meta) as writer:
        for shard in range(shards):
            start, stop = writer.shard_bounds(shard)
            data = {}
            for spec in array_specs(writer.meta):
                shape = (stop - start, *spec.shape[1:])
                data[spec.name] = rng.integers(0, 100, size=shape).astype(spec.dtype)
            writer.write_shard(shard, data)
        writer.finalize()


def timed(url: str, check: bool) -> float:
    original = HSKStore._checksum_problems
    if not check:
        HSKStore._checksum_problems = lambda self: []
    try:
        started = time.perf_counter()
        open_store(url)
        return time.perf_counter() - started
    finally:
        HSKStore._checksum_problems = original


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("source")
    parser.add_argument("--shards", type=int, nargs="+", default=[64, 400])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results = {"load_before": os.getloadavg(), "rounds": args.rounds, "by_shards": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for shards in args.shards:
            url = str(Path(tmp) / f"s{shards}.zarr")
            build(args.source, url, shards)
            rounds = []
            for _ in range(args.rounds):
                rounds.append({"with_check_s": timed(url, True), "without_check_s": timed(url, False)})
            med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
            results["by_shards"][shards] = {"rounds": rounds, "median": med}
            print(f"{shards} shards: open {med['without_check_s'] * 1e3:.1f} ms without the check, "
                  f"{med['with_check_s'] * 1e3:.1f} ms with it (median of {args.rounds})")
    results["load_after"] = os.getloadavg()
    out = Path(__file__).parent / "results" / "open_check_cost.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"load average {results['load_before']} -> {results['load_after']}; wrote {out}")


if __name__ == "__main__":
    main()
