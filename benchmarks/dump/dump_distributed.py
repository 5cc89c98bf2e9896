"""Dump throughput on dask workers against the single-process dump, and a projected cost table.

    python benchmarks/dump/dump_distributed.py --data-dir ../shared/data/glue

Part 1 (measured): the same rows dumped by the single-process dump and by `--workers 1` and
`--workers 2` (local dask clusters, started once and reused, so cluster start-up is not timed; a
warm-up round loads each worker's teacher). Rounds alternate the arms. A MiniLM-L6-H384-sized
teacher with random weights (throughput does not depend on them), QNLI rows, max length 128.

Part 2 (projection): MNLI (393k rows) and QQP (364k rows) dumped at 3,8,0.2, from the measured
host cost per example (tokenizing; selection and encoding) and the store's measured bytes per
example of sentence-pair rows at max length 128. MNLI and QQP files are not on this machine:
QNLI's pairs stand in for both (its texts are longer than MNLI's and QQP's, so the figures err
on the high side). On a GPU the forward leaves the host and the host work bounds each worker, so
N GPU workers (each with its own host cores) take rows * host_ms / N. The GPU forward itself was
not measured (no GPU here): the figures are floors on time, marked as projections.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from distributed import LocalCluster
from dump_throughput import host_side_ms_per_example, make_teacher
from transformers import BertTokenizerFast

from hskstore import open_store
from hskstore.format.config import HSKConfig
from hskstore.io.info import storage_report
from pipelines.core.data import load_examples
from pipelines.core.tasks import get_task
from pipelines.dump.distributed import dump_distributed
from pipelines.dump.stage import DumpOptions, dump

FULL_ROWS = {"mnli": 392_702, "qqp": 363_846}


def options(args, **kw) -> DumpOptions:
    return DumpOptions(config=HSKConfig.parse(args.config), max_length=args.max_length, batch_size=args.batch_size,
                       shard_rows=args.shard_rows, device="cpu", progress=False, overwrite=True, **kw)


def scaling(args, teacher: str, work: Path) -> dict:
    data = dict(split="dev", data_dir=args.data_dir, limit=args.limit)  # the QNLI split on this machine
    clusters = {n: LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                                dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) for n in (1, 2)}
    cores = torch.get_num_threads()

    def run(arm: str) -> float:
        out = str(work / f"{arm}.zarr")
        if arm == "single":
            return dump("qnli", options(args), teacher=teacher, out=out, log=lambda *_: None, **data).seconds
        n = int(arm[-1])
        return dump_distributed("qnli", options(args), teacher=teacher, out=out, log=lambda *_: None,
                                scheduler=clusters[n].scheduler_address, threads_per_worker=max(1, cores // n),
                                **data).seconds

    arms = ["single", "workers1", "workers2"]
    try:
        for arm in arms[1:]:
            run(arm)  # warm-up: each worker loads its teacher once
        rounds = []
        for r in range(args.rounds):
            row = {arm: args.limit / run(arm) for arm in (arms if r % 2 == 0 else arms[::-1])}
            rounds.append(row)
            print(f"round {r}: " + ", ".join(f"{a} {row[a]:.1f} ex/s" for a in arms), flush=True)
    finally:
        for c in clusters.values():
            c.close()
    median = {a: statistics.median(r[a] for r in rounds) for a in arms}
    same = open_store(str(work / "workers2.zarr")).meta["checksums"] == open_store(
        str(work / "workers1.zarr")).meta["checksums"]
    return {"rows": args.limit, "torch_threads_single": cores, "rounds": rounds, "median_ex_s": median,
            "speedup_vs_single": {a: median[a] / median["single"] for a in arms},
            "workers1_equals_workers2_checksums": same}


def task_costs(args, task_name: str, work: Path) -> dict:
    """Measured host ms per example and store bytes per example of one task at the config."""
    task = get_task(task_name)
    teacher = make_teacher("minilm", task.num_labels, work / f"teacher-{task_name}")
    model = __import__("transformers").BertForSequenceClassification.from_pretrained(teacher).eval()
    examples = load_examples(task, "dev", data_dir=args.data_dir, limit=args.cost_rows)
    host = host_side_ms_per_example(model, BertTokenizerFast.from_pretrained(teacher), examples.texts, options(args))
    out = work / f"cost-{task_name}.zarr"
    dump(task_name, options(args), teacher=teacher, out=str(out), split="dev", data_dir=args.data_dir,
         limit=args.cost_rows, log=lambda *_: None)
    bpe = storage_report(open_store(str(out)))["bytes_per_example"]
    return {"host_ms_per_example": max(host["tokenize_ms"], host["select_encode_ms"]), "host": host,
            "bytes_per_example": bpe}


def projection(costs: dict) -> list[dict]:
    table = []
    for task, rows in FULL_ROWS.items():
        c = costs[task]
        for gpus in (1, 8):
            seconds = rows * c["host_ms_per_example"] / 1e3 / gpus
            table.append({"task": task, "rows": rows, "gpus": gpus, "projected_host_bound_s": seconds,
                          "store_gb": rows * c["bytes_per_example"] / 1e9,
                          "write_mb_s_needed": rows * c["bytes_per_example"] / 1e6 / seconds})
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--limit", type=int, default=512)
    ap.add_argument("--cost-rows", type=int, default=512)
    ap.add_argument("--shard-rows", type=int, default=64)
    ap.add_argument("--config", default="3,8,0.2")
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/dump/results/dump_distributed.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hsk-bench-"))
    try:
        teacher = make_teacher("minilm", 2, work / "teacher")  # QNLI: 2 labels
        started = time.perf_counter()
        result = {"config": args.config, "max_length": args.max_length, "batch_size": args.batch_size,
                  "shard_rows": args.shard_rows, "scaling": scaling(args, teacher, work)}
        costs = dict.fromkeys(FULL_ROWS, task_costs(args, "qnli", work))  # QNLI pairs stand in for both
        result["costs"] = costs
        result["projection"] = projection(costs)
        result["note"] = ("projection: host-bound floors (GPU forward not measured); one host core pair per GPU "
                          "worker assumed; per-example costs measured on QNLI pairs (no MNLI/QQP files here)")
        result["seconds"] = time.perf_counter() - started
        for row in result["projection"]:
            print(f"{row['task']} {row['gpus']} GPU(s): >= {row['projected_host_bound_s'] / 60:.1f} min, "
                  f"store {row['store_gb']:.2f} GB, writes {row['write_mb_s_needed']:.1f} MB/s")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
