"""The methods table: every distillation method on the same student, SST-2 and MRPC, one CPU schedule.

For each task, with the fine-tuned MiniLM-L6 teacher (6 layers, d 384) and students of 3 layers'
parameters (`bert3`: the teacher's first 3 layers; PEA-KD's `sps3`: the same 3 layers run twice,
Q and K swapped on the second pass), everything through the CLI a user runs:

  1. `hsk dump` three times over the first --train-rows training rows: the mud store (config
     3,8,0.2, a 3-layer reference student), the same with the teacher's attention rows
     (`--attention-rows`, for tinybert-att) and the Patient KD store ([CLS] vectors of teacher
     layers 1..5: Skip {2,4} and Last {4,5} of a 6 -> 3 student, and all five for PEA-KD's sps3,
     whose effective depth is 6);
  2. `hsk sweep --methods ...` on each store, every run appending to one results table. Two protocols
     (--protocol), one learning rate --lr for every stage, batch 32, dev metric on the whole dev set,
     the best dev evaluation kept:
       equal-total (the default; the methods table of docs/benchmarks.md): --epochs (2) epochs in all, a
         two-stage method 1 + 1 (mud, tinybert-att: HSK then prediction; pea: PTP then KD);
       equal-pred (the papers' protocol): every method gets the same prediction-stage training,
         --epochs epochs; a method with an extra stage gets it on top, --extra-epochs epochs (mud's
         and tinybert-att's HSK stage, pea's PTP stage), so what it costs shows in its train time;
  3. a markdown table: dev metric mean ± sample std over seeds, store bytes per example (of the
     store each method trained from: logits-only methods read the derived 0,0,0 store; the [CLS]
     store holds 5 layers, more than pkd-skip and pkd-last read), train time.

--methods takes NAME@STORE[:STUDENT], STORE being `mud`, `att`, `cls` or a store path. Every step
resumes when rerun (dumps resume, sweeps skip finished runs). --mud-store TASK=PATH trains mud (and
the logits-only methods, from its derived 0,0,0 store) from an existing store instead of dumping one,
and --reuse RESULTS copies the rows of another results table whose run ids a sweep here plans (the
same store, config, student, seed and settings): e.g. a marginal-utility sweep's 3,8,0.2 runs are not
rerun. Not run by the tests.

    python benchmarks/evidence/methods_table/methods_table.py --data-dir ../shared/data/glue --train-rows 2000 \
        --teachers runs/teachers
    python benchmarks/evidence/methods_table/methods_table.py --protocol equal-pred --epochs 3 --extra-epochs 1 \
        --seeds 0,1,2 ...
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
from pathlib import Path

DEFAULT_METHODS = "finetune@mud,kd@mud,pkd-skip@cls,pkd-last@cls,pea@cls:sps3,mud@mud,tinybert-att@att"
PROTOCOLS = ("equal-total", "equal-pred")
TWO_STAGE = {  # method -> its stage flags (extra stage, prediction stage)
    "mud": ("--epochs-hsk", "--epochs-pred", "--lr-hsk", "--lr-pred"),
    "tinybert-att": ("--epochs-hsk", "--epochs-pred", "--lr-hsk", "--lr-pred"),
}


def sh(*args: str) -> None:
    print("+", " ".join(args), flush=True)
    subprocess.run(args, check=True)


def dump_stores(task: str, teacher: str, data_dir: str, rows: int, work: Path,
                mud_store: str | None = None) -> dict[str, str]:
    stores = {"mud": work / f"{task}-3_8_0.2.zarr", "att": work / f"{task}-3_8_0.2-att.zarr",
              "cls": work / f"{task}-cls-1_5.zarr"}
    if mud_store:  # an existing store serves mud and the logits-only methods (it must be derivable to 3,8,0.2)
        stores["mud"] = Path(mud_store)
    flags = {"mud": ["--student-layers", "3", "--config", "3,8,0.2"],
             "att": ["--student-layers", "3", "--config", "3,8,0.2", "--attention-rows"],
             "cls": ["--tokens", "cls", "--layers", "1,2,3,4,5", "--config", "5,1,1"]}
    for name, path in stores.items():
        if name == "mud" and mud_store:
            continue
        if subprocess.run(["hsk", "verify", str(path)], capture_output=True).returncode != 0:
            sh("hsk", "dump", "--task", task, "--teacher", teacher, "--data-dir", data_dir, "--limit", str(rows),
               *flags[name], "--no-progress", "--out", str(path))
    return {k: str(v) for k, v in stores.items()}


def schedule_flags(method: str, args) -> list[str]:
    """The stage flags of one method under args.protocol (see the module docstring)."""
    if args.protocol == "equal-pred":
        extra, pred = str(args.extra_epochs), str(args.epochs)
    else:
        extra = pred = str(args.epochs / 2)
    if method in TWO_STAGE:
        e1, e2, l1, l2 = TWO_STAGE[method]
        flags = [e1, extra, e2, pred, l1, str(args.lr), l2, str(args.lr)]
        return flags + (["--configs", "3,8,0.2"] if method == "mud" else [])
    if method == "pea":  # PTP then KD; the PTP stage takes the same LR
        return ["--epochs", pred, "--lr", str(args.lr), "--set", f"ptp_epochs={extra}", "--set", f"ptp_lr={args.lr}"]
    return ["--epochs", str(args.epochs), "--lr", str(args.lr)]


def reuse_rows(command: list[str], tables: list[str], results: Path) -> None:
    """Copy into `results` the rows of `tables` whose run ids `command` (an `hsk sweep`) plans."""
    from pipelines.sweep.results import append_results, read_results

    tables = [t for t in tables if Path(t).exists()]
    if not tables:
        return
    listing = subprocess.run([*command, "--dry-run"], check=True, capture_output=True, text=True).stdout
    planned = set(re.findall(r"^\s+([0-9a-f]{16})\s", listing, flags=re.M))
    for reuse in tables:
        have = set(read_results(results).column("run_id").to_pylist()) if results.exists() else set()
        rows = [r for r in read_results(reuse).to_pylist() if r["run_id"] in planned - have]
        if rows:
            print(f"reuse: {len(rows)} finished run(s) from {reuse}", flush=True)
            append_results(results, rows)


def sweep(store: str, method: str, student: str, args, work: Path, results: Path) -> None:
    common = ["--students", student, "--seeds", args.seeds, "--batch-size", "32", "--data-dir", args.data_dir,
              "--work-dir", str(work / "sweep"), "--results", str(results)]
    if args.eval_limit:
        common += ["--eval-limit", str(args.eval_limit)]
    command = ["hsk", "sweep", "--source", store, "--methods", method, *schedule_flags(method, args), *common]
    if args.reuse:
        reuse_rows(command, args.reuse, results)
    sh(*command)


def table(results: Path, tasks: list[str]) -> str:
    import pyarrow.parquet as pq

    groups: dict[tuple, list[dict]] = {}
    for r in pq.read_table(results).to_pylist():
        parts = Path(r["source_store"]).parts  # every store of a task lives under WORK/<task>/
        task = next((t for t in tasks if t in parts), "?")
        groups.setdefault((r["method"] or "mud", r["student"], task, r["metric_name"]), []).append(r)
    lines = ["| method | student | task | dev metric (mean ± std) | seeds | store bytes/example | train s (mean) |",
             "|---|---|---|---:|---:|---:|---:|"]
    for (method, student, task, metric), runs in sorted(groups.items(), key=lambda kv: (kv[0][2], kv[0][0])):
        values = [100 * r["metric"] for r in runs if r["metric"] is not None]
        mean = sum(values) / len(values) if values else float("nan")
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        secs = sum(r["train_seconds"] or 0 for r in runs) / len(runs)
        lines.append(f"| {method} | {student} | {task} | {metric} {mean:.2f} ± {std:.2f} | {len(values)} | "
                     f"{runs[0]['bytes_per_example']:,.0f} | {secs:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=os.environ.get("HSK_DATA_DIR", "../shared/data/glue"))
    ap.add_argument("--tasks", default="sst2,mrpc")
    ap.add_argument("--teachers", default="runs/teachers",
                    help="folder with one fine-tuned teacher per task (`hsk teacher --task T --out TEACHERS/T`)")
    ap.add_argument("--methods", default=DEFAULT_METHODS, help="NAME@STORE, STORE: mud, cls or a store path")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--train-rows", type=int, default=4000)
    ap.add_argument("--protocol", choices=PROTOCOLS, default="equal-total",
                    help="equal-total: --epochs in all; equal-pred: --epochs of prediction stage for every method, "
                         "--extra-epochs of a method's extra stage on top")
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--extra-epochs", type=float, default=1.0, help="equal-pred: epochs of the extra stage")
    ap.add_argument("--mud-store", action="append", default=[], metavar="TASK=PATH",
                    help="train mud and the logits-only methods of TASK from this store instead of dumping one")
    ap.add_argument("--reuse", action="append", default=[], metavar="RESULTS",
                    help="copy rows of this results table whose run ids a sweep here plans (not rerun; repeatable)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--eval-limit", type=int, default=None, help="first N dev rows only (smoke runs)")
    ap.add_argument("--work", default="runs/methods_table")
    ap.add_argument("--out", default="benchmarks/evidence/methods_table")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.parquet"
    for task in args.tasks.split(","):
        teacher = str(Path(args.teachers) / task)
        if not (Path(teacher) / "config.json").exists():
            print(f"skip {task}: no teacher at {teacher}", file=sys.stderr)
            continue
        work = Path(args.work) / task
        work.mkdir(parents=True, exist_ok=True)
        mud_store = dict(item.split("=", 1) for item in args.mud_store).get(task)
        stores = dump_stores(task, teacher, args.data_dir, args.train_rows, work, mud_store)
        for item in args.methods.split(","):
            name, _, where = item.partition("@")
            where, _, student = where.partition(":")
            sweep(stores.get(where or "mud", where), name, student or "bert3", args, work, results)
    protocol = {"equal-total": f"equal total budget: {args.epochs:g} epochs in all",
                "equal-pred": f"equal prediction budget: {args.epochs:g} prediction epochs for every method, "
                              f"plus {args.extra_epochs:g} of a method's extra stage"}[args.protocol]
    text = f"Protocol: {protocol}, lr {args.lr:g}, seeds {args.seeds}.\n\n" + table(results, args.tasks.split(","))
    (out / "methods_table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
