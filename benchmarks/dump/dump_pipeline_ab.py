"""The host pipeline's overlap, A/B: the dump's ceiling (benchmarks/dump/dump_ceiling.py: stored forward
outputs replayed, everything else real) with a serial host pipeline against the default one.

    python benchmarks/dump/dump_pipeline_ab.py --rows 4096 --json benchmarks/dump/results/dump_pipeline_ab.json

serial: one shard written at a time and each shard tokenized whole on one thread (the pipeline before
pipelines/dump/pipeline.py kept tokenizing and writing on one thread each, as here); pipelined: two
shards written at once and each shard tokenized in pieces on the cores (up to 4). The arms alternate
in every round (the order flips each round); the store's bytes are the same in both
(tests/test_dump.py). MiniLM-L6 size, torch engine, QNLI dev pairs at max length 128.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from benchmarks.dump.dump_ceiling import ReplayProbe, load_average, make_teacher, one_dump, record_outputs
from pipelines.core.data import load_examples
from pipelines.core.tasks import get_task

ARMS = {"serial": (1, 1), "pipelined": (2, None)}  # (write depth, tokenize threads; None: the dump's default)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--json", required=True)
    ap.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2].parent / "shared/data/glue"))
    ap.add_argument("--config", default="3,8,0.2")
    ap.add_argument("--engine", default="torch")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--shard-rows", type=int, default=1024)
    ap.add_argument("--probe-batches", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="hsk-pipeline-ab-"))
    runs = []
    try:
        task = get_task("qnli")
        teacher = make_teacher("minilm", task.num_labels, work / "teacher")
        texts = load_examples(task, "dev", data_dir=args.data_dir, limit=args.rows).texts
        replay = ReplayProbe(record_outputs(teacher, texts, args.max_length, args.batch_size, args.probe_batches))
        for r in range(args.rounds):
            for arm in (("serial", "pipelined") if r % 2 == 0 else ("pipelined", "serial")):
                arm_args = copy.copy(args)
                arm_args.write_depth, arm_args.tokenize_threads = ARMS[arm]
                run = one_dump(args.engine, args.config, teacher, replay, arm_args, str(work / "store.zarr"))
                run.update(arm=arm, round=r, load_average=load_average())
                runs.append(run)
                print(f"round {r} {arm:9s}: {run['ex_per_s']:6.0f} ex/s, {run['cpu_ms_per_example']:.3f} ms CPU/ex"
                      f"  (load {run['load_average']})", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"rows": args.rows, "config": args.config, "engine": args.engine, "cpu_count": os.cpu_count(),
              "arms": {k: {"write_depth": v[0], "tokenize_threads": v[1]} for k, v in ARMS.items()}, "runs": runs}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
