"""PEA-KD against plain KD with teachers of two strengths, on bert3 and sps3 (issue 28). Resumable.

For each teacher (NAME=PATH, e.g. the quickstart's 77% MiniLM and an 85% one), over the first --rows
SST-2 training rows, through the CLI a user runs:

  1. two stores: logits only (`--config 0,0,0`) and Patient KD's [CLS] store (`--tokens cls
     --layers 1,2,3,4,5 --config 5,1,1`: Skip {2,4} for bert3, all five for sps3's 6 effective layers);
  2. four arms per seed: kd on bert3, pea on bert3, kd on sps3, pea on sps3 (bert3 vs sps3 separates
     the SPS student from the PTP stage). One schedule: --epochs in all (pea: half PTP, half KD), LR
     --lr for every stage, batch 32, the best dev evaluation on the whole dev set kept;
  3. every finished run appended to --results (JSON) with the machine's load average, and a markdown
     table (mean ± sample std over seeds) printed and written next to it.

Arms alternate inside each (seed, teacher) round. Rerun the same command to continue: dumps resume,
finished runs are read back, an interrupted `hsk train` resumes from its checkpoint. --max-runs N stops
after N new runs (the CPU budget of one sitting). Not run by the tests.

    python benchmarks/evidence/pea_strength.py --teacher weak=runs/qs/teacher --teacher strong=runs/t85 \
        --data-dir ../shared/data/glue --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import time
from pathlib import Path

ARMS = (("bert3", "kd"), ("bert3", "pea"), ("sps3", "kd"), ("sps3", "pea"))
STORES = {"logits": ["--config", "0,0,0"], "cls": ["--tokens", "cls", "--layers", "1,2,3,4,5", "--config", "5,1,1"]}


def sh(args: list[str]) -> None:
    print("+", " ".join(args), flush=True)
    subprocess.run(args, check=True)


def dump_stores(teacher: str, args, work: Path) -> dict[str, Path]:
    stores = {name: work / f"{name}.zarr" for name in STORES}
    for name, path in stores.items():
        if subprocess.run(["hsk", "verify", str(path)], capture_output=True).returncode != 0:
            sh(["hsk", "dump", "--task", "sst2", "--teacher", teacher, "--data-dir", args.data_dir, "--limit",
                str(args.rows), *STORES[name], "--device", "cpu", "--no-progress", "--out", str(path)])
    return stores


def train_command(student: str, method: str, seed: int, store: Path, out: Path, args) -> list[str]:
    if method.startswith("pea"):  # PTP then KD, half of the epochs each, the same LR
        half = str(args.epochs / 2)
        schedule = ["--epochs", half, "--set", f"ptp_epochs={half}", "--set", f"ptp_lr={args.lr}"]
        if method == "pea-kept":  # the KD stage goes on with the head PTP trained (kd_head=kept)
            schedule += ["--set", "kd_head=kept"]
    else:
        schedule = ["--epochs", str(args.epochs)]
    return ["hsk", "train", "--method", method.split("-")[0], "--store", str(store), "--student", student, *schedule,
            "--lr", str(args.lr), "--seed", str(seed), "--batch-size", "32", "--data-dir", args.data_dir,
            "--no-progress", "--out", str(out)]


def teacher_dev(teacher: str) -> float | None:
    card = Path(teacher, "hsk_teacher.json")
    if not card.exists():
        return None
    return (json.loads(card.read_text()).get("dev_metrics") or {}).get("dev", {}).get("accuracy")


def run_one(key: dict, teacher: str, stores: dict[str, Path], work: Path, args) -> dict:
    student, method, seed = key["student"], key["method"], key["seed"]
    store = stores["cls" if method.startswith("pea") else "logits"]
    out = work / f"{method}-{student}-s{seed}"
    command = train_command(student, method, seed, store, out, args)
    load_before, start = os.getloadavg(), time.time()
    finished = (out / "summary.json").exists()  # a run made before (e.g. by hand with the same flags): read back
    if not finished:
        sh(command)
    summary = json.loads((out / "summary.json").read_text())
    ptp = next((t for s in summary["plan"] for t in s["terms"] if t["loss"] == "ptp_ce"), None)
    return {**key, "teacher_path": teacher, "teacher_dev_accuracy": teacher_dev(teacher),
            "dev_accuracy": summary["score"], "best_step": summary["best_step"], "steps": summary["steps"],
            "wall_s": None if finished else round(time.time() - start, 1),
            "load_before": None if finished else load_before, "load_after": None if finished else os.getloadavg(),
            "pea_options": summary["method_options"] if method.startswith("pea") else None,
            "ptp_term": ptp, "command": " ".join(command)}


def table(rows: list[dict]) -> str:
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault((r["teacher"], r["teacher_dev_accuracy"], r["student"], r["method"]), []).append(
            100 * r["dev_accuracy"])
    lines = ["| teacher (dev acc) | student | method | dev accuracy (mean ± std) | seeds | per seed |",
             "|---|---|---|---:|---:|---|"]
    for (teacher, tacc, student, method), values in sorted(groups.items(), key=lambda kv: kv[0]):
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        shown = f"{100 * tacc:.2f}" if tacc else "?"
        lines.append(f"| {teacher} ({shown}) | {student} | {method} | {mean:.2f} ± {std:.2f} | {len(values)} | "
                     f"{', '.join(f'{v:.2f}' for v in values)} |")
    return "\n".join(lines) + "\n"


def run_missing(rows: list[dict], args, results: Path) -> None:
    """Every (seed, teacher, arm) not in `rows` yet, in that order, each appended to --results when done."""
    done = {(r["teacher"], r["student"], r["method"], r["seed"]) for r in rows}
    arms = [tuple(a.split("@")[::-1]) for a in args.arms.split(",")]
    todo = [(seed, name, teacher, student, method) for seed in map(int, args.seeds.split(","))
            for name, teacher in dict(t.split("=", 1) for t in args.teacher).items()
            for student, method in arms if (name, student, method, seed) not in done]
    for seed, name, teacher, student, method in todo[:args.max_runs]:
        work = Path(args.work) / name
        stores = dump_stores(teacher, args, work)
        key = {"teacher": name, "student": student, "method": method, "seed": seed}
        rows.append(run_one(key, teacher, stores, work, args))
        results.parent.mkdir(parents=True, exist_ok=True)
        results.write_text(json.dumps({"rows_trained_on": args.rows, "epochs": args.epochs, "lr": args.lr,
                                       "runs": rows}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher", action="append", required=True, help="NAME=PATH of a fine-tuned SST-2 teacher")
    ap.add_argument("--data-dir", default=os.environ.get("HSK_DATA_DIR", "../shared/data/glue"))
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--arms", default=",".join(f"{m}@{s}" for s, m in ARMS),
                    help="METHOD@STUDENT,... (METHOD: kd, pea, or pea-kept: pea with --set kd_head=kept)")
    ap.add_argument("--max-runs", type=int, default=None, help="stop after N new runs")
    ap.add_argument("--work", default="runs/pea_strength")
    ap.add_argument("--results", default="benchmarks/evidence/results/pea_strength.json")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results = Path(args.results)
    rows = json.loads(results.read_text())["runs"] if results.exists() else []
    run_missing(rows, args, results)
    text = table(rows)
    results.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
