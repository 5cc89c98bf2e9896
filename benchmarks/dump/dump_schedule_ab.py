"""The CPU dump's host schedule, A/B/C against the bare forward: host stages between forwards (the CPU
default since issue 35) or beside the forward (a GPU's schedule, the CPU's before), alternated in every round.

    python benchmarks/dump/dump_schedule_ab.py --limit 1024 --rounds 3 \
        --json benchmarks/dump/results/dump_schedule_ab.json

The real `hsk dump` on a random-weight MiniLM-sized teacher (benchmarks/dump/dump_throughput.py), QNLI dev
pairs at max length 128, batch 32, config 3,8,0.2, torch engine; the arms rotate each round so that the
machine's load hits them alike. Reported: examples/s per arm and round, the dump / forward ratio of each
schedule (median over rounds) and the load average at each round (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import torch
from transformers import BertForSequenceClassification, BertTokenizerFast

from benchmarks.dump.dump_throughput import DATA_DIR, bare_forward, make_teacher
from hskstore.format.config import HSKConfig
from pipelines.core.data import load_examples
from pipelines.core.tasks import get_task
from pipelines.core.tokenize import encode
from pipelines.dump.stage import DumpOptions, dump

ARMS = ("forward", "between", "beside")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", default="minilm")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    task = get_task("qnli")
    work = Path(tempfile.mkdtemp(prefix="hsk-schedule-ab-"))
    try:
        teacher = make_teacher(args.size, task.num_labels, work / "teacher")
        model = BertForSequenceClassification.from_pretrained(teacher).eval()
        n = len(load_examples(task, "dev", data_dir=DATA_DIR, limit=args.limit))
        enc = encode(BertTokenizerFast.from_pretrained(teacher),
                     load_examples(task, "dev", data_dir=DATA_DIR, limit=args.limit).texts, 128)

        def run(arm: str) -> float:
            if arm == "forward":
                return bare_forward(model, enc, 32, "cpu")
            options = DumpOptions(config=HSKConfig.parse("3,8,0.2"), max_length=128, batch_size=32, progress=False,
                                  overwrite=True, host_overlap=arm == "beside")
            return dump("qnli", options, teacher=teacher, out=str(work / "s.zarr"), split="dev", data_dir=DATA_DIR,
                        limit=args.limit, log=lambda *_: None).seconds

        run("forward")
        rounds = []
        for r in range(args.rounds):
            order = ARMS[r % 3:] + ARMS[: r % 3]
            seconds = {arm: run(arm) for arm in order}
            rounds.append({"round": r, "order": order, "ex_per_s": {a: n / s for a, s in seconds.items()},
                           "ratio": {a: seconds["forward"] / seconds[a] for a in ARMS[1:]},
                           "load_average": [round(x, 2) for x in os.getloadavg()]})
            print(json.dumps(rounds[-1]), flush=True)
        result = {"examples": n, "size": args.size, "torch_threads": torch.get_num_threads(),
                  "cores": os.cpu_count(), "rounds": rounds,
                  "median_ratio": {a: statistics.median(r["ratio"][a] for r in rounds) for a in ARMS[1:]}}
        print("median dump / forward:", result["median_ratio"])
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
