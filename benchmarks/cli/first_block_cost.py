"""What the first flow's commands cost on this CPU at full size: measured rates on slices, projected.

Fine-tunes MiniLM-L6 (`hsk teacher --base minilm`) on the first --teacher-rows SST-2 rows for one
epoch and dumps the first --dump-rows rows at 3,8,0.2, each --rounds times (alternating). Records
the whole commands' times and their own loop rates (the teacher's train_seconds from hsk_teacher.json,
the dump's "ex/s"), and projects the full commands (all 67,349 SST-2 training rows; `hsk teacher`'s
default 3 epochs) from the median loop rates. Writes benchmarks/cli/results/first_block_cost.json with the load average.

    python benchmarks/cli/first_block_cost.py --data-dir ../shared/data/glue
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

SST2_TRAIN_ROWS = 67_349
TEACHER_EPOCHS = 3  # `hsk teacher`'s default


def _timed(cmd: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, done.stdout + done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--teacher-rows", type=int, default=512)
    parser.add_argument("--dump-rows", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/cli/results/first_block_cost.json")
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            teacher = Path(tmp) / f"teacher{r}"
            t_s, _ = _timed(["hsk", "teacher", "--task", "sst2", "--base", "minilm", "--data-dir", args.data_dir,
                             "--train-limit", str(args.teacher_rows), "--epochs", "1", "--eval-limit", "32",
                             "--no-progress", "--out", str(teacher)])
            d_s, text = _timed(["hsk", "dump", "--task", "sst2", "--teacher", str(teacher), "--config", "3,8,0.2",
                                "--student-layers", "2", "--data-dir", args.data_dir, "--limit", str(args.dump_rows),
                                "--no-progress", "--out", str(Path(tmp) / f"sst2-{r}.zarr")])
            inner = re.search(r"\((\d+) ex/s\)", text)
            train_s = json.loads((teacher / "hsk_teacher.json").read_text())["train_seconds"]
            rounds.append({"teacher_s": t_s, "teacher_ex_per_s": args.teacher_rows / t_s,
                           "teacher_train_s": train_s, "teacher_ex_per_s_inner": args.teacher_rows / train_s,
                           "dump_s": d_s,
                           "dump_ex_per_s": args.dump_rows / d_s,
                           "dump_ex_per_s_inner": float(inner.group(1)) if inner else None,
                           "load_average": os.getloadavg()})
            print(json.dumps(rounds[-1]))
    # The commands' own rates (training loop; dump loop): model loading and start-up do not grow with the rows.
    teacher_rate = statistics.median(r["teacher_ex_per_s_inner"] for r in rounds)
    dump_rate = statistics.median(r["dump_ex_per_s_inner"] for r in rounds)
    result = {
        "command": f"python benchmarks/cli/first_block_cost.py --data-dir {args.data_dir}",
        "teacher_rows": args.teacher_rows, "dump_rows": args.dump_rows, "rounds": rounds,
        "teacher_ex_per_s_inner_median": teacher_rate, "dump_ex_per_s_inner_median": dump_rate,
        "projected_teacher_full_h": SST2_TRAIN_ROWS * TEACHER_EPOCHS / teacher_rate / 3600,
        "projected_dump_full_min": SST2_TRAIN_ROWS / dump_rate / 60,
        "note": "projections, not measurements: full SST-2 train (67,349 rows), hsk teacher's default 3 epochs",
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))


if __name__ == "__main__":
    main()
