"""Peak memory of `hsk dump` against the number of examples: it should stay flat.

    python benchmarks/dump_memory.py --teacher runs/sweep_sst2/teacher --data-dir ../shared/data/glue

Runs the real CLI in a fresh process per size and reads the child's peak resident set size
(ru_maxrss). The dump holds one shard being computed and at most one being written, so memory
depends on shard size, batch size and model, not on the number of examples.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def peak_rss_mib(args: list[str]) -> float:
    """Peak RSS of one fresh process running the CLI, as it reports its own ru_maxrss."""
    code = (
        "import resource, sys; from pipelines.cli import main; rc = main(sys.argv[1:]); "
        "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)"
    )
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    peak_kib = int(next(line for line in out.stdout.splitlines() if line.startswith("PEAK")).split()[1])
    return peak_kib / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--sizes", default="1000,4000,16000")
    ap.add_argument("--config", default="3,8,0.2")
    ap.add_argument("--out", default="benchmarks/results/dump_memory.json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="hsk-mem-") as work:
        for n in [int(x) for x in args.sizes.split(",")]:
            cli = [
                "dump",
                "--task",
                "sst2",
                "--teacher",
                args.teacher,
                "--config",
                args.config,
                "--data-dir",
                args.data_dir,
                "--limit",
                str(n),
                "--out",
                str(Path(work) / f"s{n}.zarr"),
                "--no-progress",
            ]
            rows.append({"examples": n, "peak_rss_mib": peak_rss_mib(cli)})
            print(f"{n:>7} examples: peak RSS {rows[-1]['peak_rss_mib']:.0f} MiB")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"config": args.config, "teacher": args.teacher, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
