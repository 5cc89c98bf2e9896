"""What `hsk` costs to start (issue 20: one-way command registration must not make it slower).

    python benchmarks/cli/cli_startup.py BEFORE_TREE [--rounds 5] [--out benchmarks/cli/results/cli_startup.json]

BEFORE_TREE is a checkout of the code to compare with (e.g. `git archive <commit> | tar -x -C DIR`);
the other arm is this checkout. Per round and arm, alternating the arms: `python -X importtime -c
'import pipelines.cli'` (the cumulative import time of pipelines.cli, as Python reports it) and the wall
time of `hsk --help` (the installed console script), each in a fresh process with PYTHONPATH set to the arm's
tree. Writes every round and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]


def _env(tree: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": tree, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def import_ms(tree: str) -> float:
    """Cumulative import time of pipelines.cli, in ms (python -X importtime)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import pipelines.cli"], env=_env(tree),
                          capture_output=True, text=True, check=True)
    line = next(ln for ln in reversed(done.stderr.splitlines()) if re.search(r"\|\s*pipelines\.cli$", ln))
    return int(line.split("|")[1]) / 1000


def help_s(tree: str) -> float:
    """Wall seconds of `hsk --help`."""
    hsk = shutil.which("hsk", path=str(Path(sys.executable).parent)) or "hsk"
    tick = time.perf_counter()
    subprocess.run([hsk, "--help"], env=_env(tree), capture_output=True, check=True)
    return time.perf_counter() - tick


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="the tree to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(HERE / "benchmarks" / "cli" / "results" / "cli_startup.json"))
    args = parser.parse_args()
    arms = {"before": str(Path(args.before).resolve()), "after": str(HERE)}
    rounds = []
    load_before = os.getloadavg()
    for i in range(args.rounds):
        order = list(arms) if i % 2 == 0 else list(reversed(arms))
        row = {"round": i, "order": order}
        for arm in order:
            row[f"{arm}_import_ms"] = import_ms(arms[arm])
            row[f"{arm}_help_s"] = help_s(arms[arm])
        rounds.append(row)
        print(json.dumps(row))
    summary = {f"{arm}_{what}_median": statistics.median(r[f"{arm}_{what}"] for r in rounds)
               for arm in arms for what in ("import_ms", "help_s")}
    result = {"command": " ".join(sys.argv), "arms": arms, "rounds": rounds, "summary": summary,
              "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
