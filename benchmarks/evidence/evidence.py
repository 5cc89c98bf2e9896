"""Evidence on four GLUE tasks (issue 25): marginal-utility curves, methods at equal budgets, offline = online.

One command per table; every command resumes (finished teachers, dumps and runs are skipped, a run
interrupted mid-training resumes from its checkpoint), so rerun the same command after a stop:

    python benchmarks/evidence/evidence.py all      # the whole queue below, in order (hours of CPU)
    python benchmarks/evidence/evidence.py teachers # step 1: one fine-tuned MiniLM teacher per task
    python benchmarks/evidence/evidence.py curve --tasks mrpc,stsb,cola,sst2  # marginal-utility curves (+teacher, dump)
    python benchmarks/evidence/evidence.py online   # MRPC: the 3,8,0.2 seed-0 student with the teacher loaded
    python benchmarks/evidence/evidence.py methods  # SST-2 and MRPC, every method at an equal prediction budget
    python benchmarks/evidence/evidence.py report   # tables, prediction shares and the four-task figure so far

Common flags: --data-dir (../shared/data/glue), --work (runs/evidence: teachers, stores, run
folders; large, not committed), --out (benchmarks/evidence: results tables, reports; small).

The queue (`all`): the MRPC teacher, dump and seed-0 curve (an early check of the whole pipeline
on real data, the majority-class question included); the other teachers (STS-B, CoLA, SST-2); then
per task, MRPC first (smallest), then STS-B, CoLA, SST-2: one dump, one sweep, its report; the MRPC
offline = online pair right after the MRPC curve; then the methods table without `pea`, then `pea`
and its control, `kd` on `pea`'s student `sps3`
(last, so that a fix to it can land before it runs).

Teachers (`hsk teacher --base minilm`, batch 32, seed 0, the best epoch-end dev evaluation kept):
MRPC all 3,668 pairs, 3 epochs, lr 8e-5; STS-B all 5,749 pairs and CoLA all 8,551 sentences, 3 epochs,
lr 5e-5; SST-2 the first 8,000 sentences, 2 epochs, lr 5e-5. No dev tuning.

Curves, per task: one dump of the first TRAIN_ROWS (4,000) training rows (MRPC: all 3,668) at
4,MAXLEN,1 float16 for a 3-layer reference student (N^D = 4: the embeddings and the 3 layers bert3
learns from; every token but [SEP], up to the task's max length 64/128; full width), then
`hsk sweep` over stores derived from it: prediction-only KD (0,0,0), 1,9,0.1, 3,8,0.2 (float16 and
int4), 1,16,0.5 and the source itself (full). One schedule for every task and arm: student bert3
(the teacher's first 3 layers), seeds 0,1,2, 1 HSK epoch (HSK arms only) then 3 prediction epochs,
lr 1e-4 both stages (HSK constant, prediction linear decay), batch 32, the best epoch-end dev
evaluation on the whole dev set, one torch thread.

Prediction shares: each finished run's saved best student is run over the dev set once more and
the share of each predicted class recorded (predictions.json), so a student at the majority class
shows; its primary metric recomputed there must equal the sweep's.

Not run by the tests (hours of CPU). Needs the venv's `hsk` on PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

TASKS = ("mrpc", "stsb", "cola", "sst2")  # the queue's order: smallest first
CONFIGS = "pred-only;1,9,0.1;3,8,0.2@float16+int4;1,16,0.5;full"
METHODS_NO_PEA = "finetune@mud,kd@mud,pkd-skip@cls,pkd-last@cls,mud@mud,tinybert-att@att"
METHODS_PEA = "pea@cls:sps3,kd@mud:sps3"  # kd on sps3: the control that tells the SPS student from PTP
METHOD_TASKS = ("sst2", "mrpc")
ONLINE_TASK = "mrpc"


@dataclass(frozen=True)
class TaskPlan:
    task: str
    teacher_flags: tuple[str, ...]  # `hsk teacher` schedule
    max_length: int  # the task's max tokens: N^L of the source store (every token but [SEP])


PLANS = {
    "mrpc": TaskPlan("mrpc", ("--epochs", "3", "--lr", "8e-5"), 128),
    "stsb": TaskPlan("stsb", ("--epochs", "3", "--lr", "5e-5"), 128),
    "cola": TaskPlan("cola", ("--epochs", "3", "--lr", "5e-5"), 64),
    "sst2": TaskPlan("sst2", ("--epochs", "2", "--lr", "5e-5", "--train-limit", "8000"), 64),
}


@dataclass(frozen=True)
class Schedule:
    """One student schedule for every task and arm (stated once on the Evidence page, docs/evidence.md)."""

    train_rows: int = 4000
    student: str = "bert3"
    student_layers: int = 3
    seeds: str = "0,1,2"
    epochs_hsk: float = 1.0
    epochs_pred: float = 3.0
    lr: float = 1e-4
    batch_size: int = 32

    def sweep_flags(self) -> list[str]:
        return ["--students", self.student, "--seeds", self.seeds, "--epochs-hsk", str(self.epochs_hsk),
                "--epochs-pred", str(self.epochs_pred), "--lr-hsk", str(self.lr), "--lr-pred", str(self.lr),
                "--batch-size", str(self.batch_size), "--workers", "1"]


SCHEDULE = Schedule()


@dataclass(frozen=True)
class Layout:
    """Where everything goes: `work` (large, not committed) and `out` (small, committed)."""

    work: Path
    out: Path
    data_dir: str

    def teacher(self, task: str) -> Path:
        return self.work / "teachers" / task

    def source(self, task: str) -> Path:
        return self.work / task / f"source-4_{PLANS[task].max_length}_1.zarr"

    def sweep_dir(self, task: str) -> Path:
        return self.work / task / "sweep"

    def results(self, task: str) -> Path:
        return self.out / "curves" / task / "results.parquet"


def log(msg: str) -> None:
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load {load}] {msg}", flush=True)


def sh(*args: str, check: bool = True) -> int:
    log("+ " + " ".join(args))
    code = subprocess.run(args).returncode
    if code and check:
        raise SystemExit(f"failed ({code}): {' '.join(args)}")
    if code:
        log(f"exit {code} (going on; rerun to retry)")
    return code


# --------------------------------------------------------------------------------------------------
# Steps


def ensure_teacher(lay: Layout, task: str) -> None:
    if (lay.teacher(task) / "config.json").exists():
        return
    sh("hsk", "teacher", "--task", task, "--base", "minilm", "--data-dir", lay.data_dir, "--batch-size", "32",
       "--seed", "0", "--no-progress", *PLANS[task].teacher_flags, "--out", str(lay.teacher(task)))


def ensure_source(lay: Layout, task: str) -> None:
    source = lay.source(task)
    if subprocess.run(["hsk", "verify", str(source)], capture_output=True).returncode == 0:
        return
    source.parent.mkdir(parents=True, exist_ok=True)
    sh("hsk", "dump", "--task", task, "--teacher", str(lay.teacher(task)), "--data-dir", lay.data_dir,
       "--limit", str(SCHEDULE.train_rows), "--student-layers", str(SCHEDULE.student_layers),
       "--config", f"4,{PLANS[task].max_length},1.0", "--values", "float16", "--no-progress", "--out", str(source))


def curve(lay: Layout, task: str, seeds: str | None = None) -> None:
    """One task's sweep; `seeds` runs a subset first (run ids do not depend on the other seeds of a sweep)."""
    ensure_teacher(lay, task)
    ensure_source(lay, task)
    lay.results(task).parent.mkdir(parents=True, exist_ok=True)
    flags = SCHEDULE.sweep_flags()
    if seeds:
        flags[flags.index("--seeds") + 1] = seeds
    sh("hsk", "sweep", "--source", str(lay.source(task)), "--configs", CONFIGS, "--values", "float16",
       *flags, "--data-dir", lay.data_dir, "--work-dir", str(lay.sweep_dir(task)),
       "--results", str(lay.results(task)), check=False)
    report(lay)


def online(lay: Layout, task: str = ONLINE_TASK) -> None:
    """The sweep's 3,8,0.2 seed-0 student, trained with the teacher loaded: same rows, shards, seed, order."""
    out = lay.work / task / "online-3_8_0.2-seed0"
    s = SCHEDULE
    sh("hsk", "train", "--teacher", str(lay.teacher(task)), "--task", task, "--config", "3,8,0.2",
       "--student-layers", str(s.student_layers),
       "--train-limit", str(s.train_rows), "--shard-rows", "1024", "--student", s.student, "--seed", "0",
       "--epochs-hsk", str(s.epochs_hsk), "--epochs-pred", str(s.epochs_pred), "--lr-hsk", str(s.lr),
       "--lr-pred", str(s.lr), "--batch-size", str(s.batch_size), "--data-dir", lay.data_dir, "--no-progress",
       "--out", str(out), check=False)
    report(lay)


def methods(lay: Layout, names: str) -> None:
    s = SCHEDULE
    flags = ["--protocol", "equal-pred", "--epochs", str(s.epochs_pred), "--extra-epochs", str(s.epochs_hsk),
             "--lr", str(s.lr), "--seeds", s.seeds, "--train-rows", str(s.train_rows), "--data-dir", lay.data_dir,
             "--teachers", str(lay.work / "teachers"), "--work", str(lay.work / "methods"),
             "--out", str(lay.out / "methods"), "--tasks", ",".join(METHOD_TASKS), "--methods", names]
    for task in METHOD_TASKS:  # mud trains from the curve's source: its 3,8,0.2 runs are the curve's
        flags += ["--mud-store", f"{task}={lay.source(task)}", "--reuse", str(lay.results(task))]
    sh(sys.executable, str(Path(__file__).with_name("methods_table") / "methods_table.py"), *flags, check=False)
    report(lay)


# --------------------------------------------------------------------------------------------------
# Prediction shares and the tables


def _run_dirs(work: Path) -> dict[str, Path]:
    """run_id prefix (10 hex) -> run folder, for every sweep under work."""
    found = {}
    for best in work.glob("**/runs/*/best"):
        found[best.parent.name.rsplit("-", 1)[-1]] = best.parent
    return found


def _dev_encoded(lay: Layout, task) -> tuple:
    """The task's whole dev split, tokenized with its teacher's tokenizer (bert3 and sps3 share it)."""
    from pipelines.core.data import load_examples
    from pipelines.core.models import load_tokenizer
    from pipelines.core.tokenize import encode

    dev = load_examples(task, "dev", data_dir=lay.data_dir)
    return encode(load_tokenizer(str(lay.teacher(task.name))), dev.texts, task.max_length), dev.labels


def _shares_of(folder: Path, task, enc, labels) -> dict:
    """Run a saved best student over the dev rows: its metric again, and what it predicts."""
    import numpy as np

    from pipelines.core.metrics import compute_metrics
    from pipelines.core.models import load_classifier
    from pipelines.train.run.evaluate import predict
    from pipelines.train.students import sps

    assert sps.SPS_MODEL_TYPE  # imported for its side effect: PEA-KD's SPS students load with transformers
    logits = predict(load_classifier(str(folder / "best"), require_head=True), enc)
    entry = {"metric": compute_metrics(task, logits, labels)[task.metric]}
    if task.is_regression:
        return {**entry, "shares": None, "mean": float(logits[:, 0].mean()), "std": float(logits[:, 0].std())}
    counts = np.bincount(logits.argmax(axis=1), minlength=task.num_labels)
    return {**entry, "shares": [round(float(c) / len(logits), 4) for c in counts]}


def prediction_shares(lay: Layout, results: Path, cache: Path) -> dict[str, dict]:
    """run_id -> {"shares": [share of each predicted class] or None, "mean"/"std" (regression), metric}."""
    from transformers.utils import logging as hf_logging

    from pipelines.core.tasks import get_task
    from pipelines.sweep.results import read_results

    hf_logging.disable_progress_bar()  # one load per run: no bars in the driver's log
    done = json.loads(cache.read_text()) if cache.exists() else {}
    rows = [r for r in read_results(results).to_pylist() if r["run_id"] not in done and r["metric"] is not None]
    dirs = _run_dirs(lay.work) if rows else {}
    encoded: dict[str, tuple] = {}
    for r in rows:
        folder = dirs.get(r["run_id"][:10])
        if folder is None or not (folder / "best").exists():
            continue
        task = get_task(json.loads((folder / "summary.json").read_text())["task"])
        if task.name not in encoded:
            encoded[task.name] = _dev_encoded(lay, task)
        done[r["run_id"]] = _shares_of(folder, task, *encoded[task.name])
        cache.write_text(json.dumps(done, indent=1, sort_keys=True))
    return done


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.2f} ± {std:.2f}"


def recompute_mismatches(results: Path, shares: dict[str, dict]) -> list[str]:
    """Runs whose saved best student, evaluated again, does not give the sweep's metric (should be none)."""
    from pipelines.sweep.results import read_results

    return [r["run_id"] for r in read_results(results).to_pylist()
            if r["run_id"] in shares and abs(shares[r["run_id"]]["metric"] - r["metric"]) > 1e-6]


def _shares_cell(entries: list[dict]) -> str:
    """Share of the last class (the 'positive' one: acceptable, paraphrase, positive), min-max over seeds."""
    shares = [e["shares"][-1] * 100 for e in entries if e and e.get("shares")]
    if not shares:
        sds = [e["std"] for e in entries if e and e.get("std") is not None]
        return f"pred. std {min(sds):.2f}-{max(sds):.2f}" if sds else "-"
    flag = " **majority**" if any(s > 97 or s < 3 for s in shares) else ""
    return f"{min(shares):.1f}-{max(shares):.1f}%{flag}"


ARM_ORDER = {"pred_only": 0, "hsk": 1, "full": 2}


def _row_cells(runs: list[dict], second: str | None, shares: dict[str, dict]) -> str:
    """dev metric | second metric | seeds | predicted positive share | train s, over one group's runs."""
    main = [100 * r["metric"] for r in runs]
    extra = [100 * json.loads(r["metrics_json"] or "{}").get("dev", {}).get(second, float("nan")) for r in runs]
    secs = statistics.fmean(r["train_seconds"] or 0 for r in runs)
    seeds = ",".join(str(r["seed"]) for r in sorted(runs, key=lambda r: r["seed"]))
    return (f"{_mean_std(main)} | {_mean_std(extra) if second else ''} | {len(runs)} ({seeds}) | "
            f"{_shares_cell([shares.get(r['run_id']) for r in runs])} | {secs:.0f} |")


def _head(task, first: str) -> list[str]:
    second = task.metrics[1] if len(task.metrics) > 1 else ""
    share = "predictions" if task.is_regression else "predicted positive (min-max)"
    return [f"| {first} | bytes/example | dev {task.metric} | {second} | seeds | {share} | train s (mean) |",
            "|---|---:|---:|---:|---:|---|---:|"]


def curve_markdown(task: str, results: Path, shares: dict[str, dict]) -> str:
    """One task's curve: a row per (arm, config, value dtype), cheapest first within each arm."""
    from pipelines.core.tasks import get_task
    from pipelines.sweep.results import read_results

    t = get_task(task)
    groups: dict[tuple, list[dict]] = {}
    for r in read_results(results).to_pylist():
        if r["metric"] is not None:
            groups.setdefault((r["kind"], r["config"], r["value_dtype"] or "-"), []).append(r)
    lines = _head(t, "arm, config, values")
    order = sorted(groups.items(), key=lambda kv: (ARM_ORDER.get(kv[0][0], 3), kv[1][0]["bytes_per_example"] or 0))
    second = t.metrics[1] if len(t.metrics) > 1 else None
    for (kind, config, dtype), runs in order:
        lines.append(f"| {kind} {config} {dtype} | {runs[0]['bytes_per_example']:,.0f} | "
                     + _row_cells(runs, second, shares))
    return "\n".join(lines) + "\n"


def methods_markdown(results: Path, shares: dict[str, dict]) -> str:
    """The methods table per task (a task's rows come from stores under WORK/.../<task>/...)."""
    from pipelines.core.tasks import get_task
    from pipelines.sweep.results import read_results

    out = []
    rows = [r for r in read_results(results).to_pylist() if r["metric"] is not None]
    for task in METHOD_TASKS:
        t = get_task(task)
        groups: dict[tuple, list[dict]] = {}
        for r in rows:
            if task in Path(r["source_store"]).parts:
                label = f"{r['method']} {r['config']}" if r["method"] == "mud" else r["method"]
                groups.setdefault((label, r["student"]), []).append(r)
        if not groups:
            continue
        out += [f"### {task}\n"] + _head(t, "method (student)")
        second = t.metrics[1] if len(t.metrics) > 1 else None
        for (label, student), runs in sorted(groups.items()):
            out.append(f"| {label} ({student}) | {runs[0]['bytes_per_example']:,.0f} | "
                       + _row_cells(runs, second, shares))
        out.append("")
    return "\n".join(out) + "\n"


def teacher_line(lay: Layout, task: str) -> str:
    path = lay.teacher(task) / "hsk_teacher.json"
    if not path.exists():
        return f"- {task}: not trained yet"
    info = json.loads(path.read_text())
    dev = info.get("dev_metrics") or {}
    dev = dev.get("dev", dev)
    metrics = ", ".join(f"{k} {100 * v:.2f}" for k, v in dev.items() if isinstance(v, float))
    return f"- {task}: {metrics} (train rows {info.get('train_examples', '?')})"


def online_line(lay: Layout) -> str:
    summary = lay.work / ONLINE_TASK / "online-3_8_0.2-seed0" / "summary.json"
    results = lay.results(ONLINE_TASK)
    if not summary.exists() or not results.exists():
        return "- offline = online (MRPC): not run yet"
    from pipelines.sweep.results import read_results

    online_dev = (json.loads(summary.read_text()).get("dev") or {}).get("dev", {})
    offline = [json.loads(r["metrics_json"] or "{}").get("dev", {}) for r in read_results(results).to_pylist()
               if r["config"] == "3,8,0.2" and r["value_dtype"] == "float16" and r["seed"] == 0]
    if not offline:
        return "- offline = online (MRPC): the offline run has not finished yet"

    same = "equal" if _rounded(offline[0]) == _rounded(online_dev) else "**different**"
    return (f"- offline = online (MRPC, 3,8,0.2, seed 0): offline {_fmt_dev(offline[0])}; "
            f"online {_fmt_dev(online_dev)}: {same}")


def _rounded(dev: dict) -> dict:
    return {k: round(v, 6) for k, v in dev.items()}


def _fmt_dev(dev: dict) -> str:
    return ", ".join(f"{k} {100 * v:.2f}" for k, v in sorted(dev.items()) if k != "n")


def report(lay: Layout) -> None:
    """The report, whose failure never stops the queue (the runs are what take hours)."""
    try:
        write_report(lay)
    except Exception as exc:  # noqa: BLE001  (logged; `evidence.py report` retries it alone)
        log(f"report failed: {type(exc).__name__}: {exc}")


def write_report(lay: Layout) -> None:
    """Everything the Evidence page (docs/evidence.md) shows, from whatever has finished: out/evidence.md and the
    four-task figure."""
    parts = ["# Evidence: four GLUE tasks (generated by benchmarks/evidence/evidence.py report)\n", "## Teachers\n"]
    parts += [teacher_line(lay, t) for t in TASKS] + ["", "## Curves\n"]
    tables = []
    for task in TASKS:
        results = lay.results(task)
        if not results.exists():
            parts.append(f"### {task}: not run yet\n")
            continue
        tables.append(str(results))
        shares = prediction_shares(lay, results, results.with_name("predictions.json"))
        bad = recompute_mismatches(results, shares)
        parts += [f"### {task}\n", curve_markdown(task, results, shares),
                  f"Best students re-evaluated: {len(shares)}; metric differs from the sweep's for: {bad or 'none'}\n"]
    parts += ["## Offline = online\n", online_line(lay), ""]
    methods_md = lay.out / "methods" / "methods_table.md"
    methods_results = lay.out / "methods" / "results.parquet"
    parts.append("## Methods at equal prediction budgets\n")
    if methods_results.exists():
        shares = prediction_shares(lay, methods_results, methods_results.with_name("predictions.json"))
        protocol = methods_md.read_text().split("\n\n")[0] if methods_md.exists() else ""
        parts += [protocol + "\n", methods_markdown(methods_results, shares)]
    else:
        parts.append("not run yet\n")
    lay.out.mkdir(parents=True, exist_ok=True)
    (lay.out / "evidence.md").write_text("\n".join(parts))
    if tables:
        sh("hsk", "report", *tables, "--out", str(lay.out / "figure"), "--overwrite", check=False)
    log(f"report: {lay.out / 'evidence.md'}")


# --------------------------------------------------------------------------------------------------


def run_all(lay: Layout) -> None:
    """The queue (module docstring): the first task's seed-0 curve before the other teachers checks the
    real pipeline, the majority-class question included, early."""
    curve(lay, TASKS[0], seeds="0")
    teachers(lay)
    for task in TASKS:
        curve(lay, task)
        if task == ONLINE_TASK:
            online(lay)
    methods(lay, METHODS_NO_PEA)
    methods(lay, METHODS_PEA)


def teachers(lay: Layout) -> None:
    for task in TASKS:
        ensure_teacher(lay, task)
    report(lay)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=("all", "teachers", "curve", "online", "methods", "report"))
    ap.add_argument("--tasks", default=",".join(TASKS), help="curve: tasks, in order")
    ap.add_argument("--data-dir", default=os.environ.get("HSK_DATA_DIR", "../shared/data/glue"))
    ap.add_argument("--work", default="runs/evidence")
    ap.add_argument("--out", default="benchmarks/evidence")
    ap.add_argument("--methods", default=f"{METHODS_NO_PEA},{METHODS_PEA}", help="methods: NAME@STORE list")
    ap.add_argument("--smoke", action="store_true", help="a check of the driver: 64 rows, seeds 0,1, 1 + 1 epochs")
    args = ap.parse_args()
    if args.smoke:
        global SCHEDULE
        SCHEDULE = Schedule(train_rows=64, seeds="0,1", epochs_pred=1.0)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    lay = Layout(Path(args.work), Path(args.out), args.data_dir)
    log(f"evidence {args.step}: work {lay.work}, out {lay.out}, code {_commit()}")
    steps = {
        "all": lambda: run_all(lay),
        "teachers": lambda: teachers(lay),
        "curve": lambda: [curve(lay, task) for task in args.tasks.split(",")],
        "online": lambda: online(lay),
        "methods": lambda: methods(lay, args.methods),
        "report": lambda: report(lay),
    }
    steps[args.step]()


def _commit() -> str:
    here = Path(__file__).resolve().parent
    run = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return run.stdout.strip() or "?"


if __name__ == "__main__":
    main()
