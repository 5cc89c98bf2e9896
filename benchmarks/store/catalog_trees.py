"""`hskstore.share.catalog.catalog` over N fake stores, timed in two source trees alternately (before/after a change).

    python benchmarks/store/catalog_trees.py --trees /work/main . --n 1000 --rounds 5

The fakes are copies of one small synthetic store's metadata (every file but the chunks), 10 per folder
of 100, built once (by this tree's code) and listed by each tree's code in a fresh interpreter, arms
alternating within every round. Each figure is the median of 3 calls in that interpreter (the first
call warms the page cache for everyone). The load average is recorded with every round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]
TIMER = """
import statistics, sys, time
from hskstore.share.catalog import catalog
times = []
for _ in range(4):
    start = time.perf_counter(); found = catalog([sys.argv[1]]); times.append(time.perf_counter() - start)
assert len(found) == int(sys.argv[2]) and all(e.status == "complete" for e in found)
print(statistics.median(times[1:]))
"""


def build_store(out: Path) -> None:
    sys.path.insert(0, str(HERE / "tests"))
    from test_store import make_meta, shard_arrays

    from hskstore.io.writer import StoreWriter

    meta = make_meta(n_rows=8)
    with StoreWriter.open(str(out), meta) as writer:
        for shard in writer.pending_shards():
            writer.write_shard(shard, shard_arrays(meta, *writer.shard_bounds(shard)))
        writer.finalize()


def fake_stores(store: Path, root: Path, n: int) -> None:
    files = [p.relative_to(store) for p in store.rglob("*") if p.is_file() and "c" not in p.relative_to(store).parts]
    for i in range(n):
        dest = root / f"team-{i // 100:02d}" / f"store-{i:04d}.zarr"
        for rel in files:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(store / rel, dest / rel)


def time_tree(tree: str, root: Path, n: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", TIMER, str(root), str(n)], env=env, check=True,
                         capture_output=True, text=True)
    return round(float(out.stdout.strip()), 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs=2, required=True, help="two source trees: before, after")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(HERE / "benchmarks" / "store" / "results" / "catalog_trees.json"))
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        build_store(Path(tmp) / "one.zarr")
        root = Path(tmp) / "many"
        fake_stores(Path(tmp) / "one.zarr", root, args.n)
        for r in range(args.rounds):
            order = args.trees if r % 2 == 0 else args.trees[::-1]
            row = {tree: time_tree(tree, root, args.n) for tree in order}
            rounds.append({"round": r, "before_s": row[args.trees[0]], "after_s": row[args.trees[1]],
                           "load": [round(x, 2) for x in os.getloadavg()]})
            print(rounds[-1], flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"trees": args.trees, "n": args.n, "rounds": rounds}, indent=2) + "\n")


if __name__ == "__main__":
    main()
