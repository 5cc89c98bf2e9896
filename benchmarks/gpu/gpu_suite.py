"""The benchmarks that matter on a GPU, in one command, against issues 40's and 35's goals.

    python benchmarks/gpu/gpu_suite.py --device cuda --json gpu.json --data-dir ../shared/data/glue
    python benchmarks/gpu/gpu_suite.py --device cpu --quick --json out.json --data-dir ../shared/data/glue

Training (benchmarks/train/train_throughput.py, the real `hsk train` path): offline (from a store), online
(teacher loaded) and in-memory (targets decoded beforehand) arms alternating round by round, a
BERT-base-sized random teacher and a TinyBERT4-shaped student at length 128 (padded), config 3,8,0.2,
in the run's precision (default auto: bf16 on a GPU that has it); then offline alone at other batch
sizes (the step's fixed cost shows as examples/s that grow with the batch). Dump
(benchmarks/dump/dump_throughput.py): `hsk dump` against the teacher's bare forward, at BERT-base and
MiniLM size, and at MiniLM size again with the shards written by processes (`hsk dump --write-processes`,
a quarter of the host's cores, 2 to 8). Each benchmark runs as its own process, called through its command
line (`_train_arm`, `_dump_ratio`), so that this suite follows the scripts' own options as they change.

--quick runs the same at tiny sizes (a 4-layer d-64 teacher and a 2-layer student, 32 tokens, a few
steps; dump at 16 rows): a smoke test of the whole suite, minutes on a CPU, not a measurement.
The JSON holds the keys of issue 40 (train_offline_ex_per_s, train_offline_over_online,
train_offline_over_in_memory, dump_over_forward_base, dump_over_forward_minilm, dump_ex_per_s_minilm),
dump_over_forward_minilm_write_processes and dump_ex_per_s_minilm_write_processes, the batch-size scaling
and every benchmark's own report.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN_THROUGHPUT = HERE.parent / "train" / "train_throughput.py"
DUMP_THROUGHPUT = HERE.parent / "dump" / "dump_throughput.py"

# The runs: full on a GPU, quick anywhere (a smoke test).
TRAIN = {
    "full": dict(task="qnli", split="dev", teacher_size="base", student="tinybert4", batch_size=64, max_length=128,
                 config="3,8,0.2", steps=40, rounds=4, warmup=3),
    "quick": dict(task="sst2", split="train", teacher_size="tiny", student="bert2", batch_size=8, max_length=32,
                  config="1,4,0.5", steps=4, rounds=2, warmup=1),
}
SCALING = {"full": [16, 256], "quick": [4]}  # offline alone at these batch sizes, beside the main run's
DUMP = {"full": dict(task="qnli", split="dev", limit=2048, max_length=128, batch_size=64, rounds=3),
        "quick": dict(task="sst2", split="train", limit=16, max_length=32, batch_size=8, rounds=1)}

# Issue 40's goals: (JSON key, what, goal, "min" | "max"); None: no goal on this device
GOALS = {
    "cuda": [("train_offline_ex_per_s", "offline examples/s at batch 64 (bf16)", 15000.0),
             ("train_offline_ex_per_s_256", "offline examples/s at batch 256", 25000.0),
             ("train_offline_over_in_memory", "offline / in-memory", 0.97),
             ("train_offline_over_online", "offline / online", 8.0),
             ("dump_over_forward_base", "dump / forward, base", 0.9),  # issue 35's, in fp16
             ("dump_over_forward_minilm", "dump / forward, MiniLM", 0.8),
             ("dump_ex_per_s_minilm", "dump examples/s, MiniLM", 20000.0)],
    "cpu": [("train_offline_over_in_memory", "offline / in-memory", 0.95)],
}
SHOWN = [("train_offline_ex_per_s", "offline examples/s"), ("train_offline_over_online", "offline / online"),
         ("train_offline_over_in_memory", "offline / in-memory"), ("dump_over_forward_base", "dump / forward, base"),
         ("dump_over_forward_minilm", "dump / forward, MiniLM"), ("dump_ex_per_s_minilm", "dump examples/s, MiniLM"),
         ("dump_ex_per_s_minilm_write_processes", "the same, write processes")]


def _env() -> dict[str, str]:
    """This checkout's hsk first on the path (not another install of it)."""
    path = os.pathsep.join(p for p in (str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def _run(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=_env())
    if done.returncode:
        raise SystemExit(f"{' '.join(argv[:1])} failed ({done.returncode}):\n{done.stderr[-4000:]}")


def _train_arm(work: Path, data_dir: str, device: str, precision: str, compile_mode: str | None, arms: str,
               **run) -> dict:
    """benchmarks/train/train_throughput.py with these settings: its JSON report."""
    out = work / f"train-{arms.replace(',', '-')}-{run['batch_size']}.json"
    argv = [str(TRAIN_THROUGHPUT), "--data-dir", data_dir, "--device", device, "--precision", precision,
            "--arms", arms, "--out", str(out)]
    argv += [f"--{key.replace('_', '-')}={value}" for key, value in run.items()]
    if compile_mode:
        argv += ["--compile", compile_mode]
    _run(argv)
    return json.loads(out.read_text())


def _dump_options() -> str:
    done = subprocess.run([sys.executable, str(DUMP_THROUGHPUT), "--help"], capture_output=True,
                          text=True, env=_env())
    return done.stdout


def _dump_ratio(work: Path, data_dir: str, device: str, size: str, precision: str, help_text: str, **run) -> dict:
    """benchmarks/dump/dump_throughput.py at one teacher size (its --precision when it has one): its JSON report."""
    out = work / f"dump-{size}.json"
    argv = [str(DUMP_THROUGHPUT), "--data-dir", data_dir, "--device", device, "--size", size,
            "--out", str(out)]
    argv += [f"--{key.replace('_', '-')}={value}" for key, value in run.items()]
    if "--precision" in help_text:
        argv += ["--precision", precision]
    _run(argv)
    return json.loads(out.read_text())


def _write_processes() -> int:
    """The write processes of the suite's third dump: a quarter of the host's cores, 2 to 8."""
    return max(2, min(8, len(os.sched_getaffinity(0)) // 4))


def measure(device: str, data_dir: str, quick: bool, precision: str, compile_mode: str | None) -> dict:
    kind = "quick" if quick else "full"
    with tempfile.TemporaryDirectory(prefix="hsk-gpu-suite-") as tmp:
        work = Path(tmp)
        train = _train_arm(work, data_dir, device, precision, compile_mode, "offline,online,in_memory", **TRAIN[kind])
        scaling = {TRAIN[kind]["batch_size"]: train["offline"]["examples_per_s"]}
        for batch in SCALING[kind]:
            run = {**TRAIN[kind], "batch_size": batch, "steps": max(2, TRAIN[kind]["steps"] // 2), "rounds": 1}
            scaling[batch] = _train_arm(work, data_dir, device, precision, compile_mode, "offline",
                                        **run)["offline"]["examples_per_s"]
        help_text = _dump_options()
        dumps = {size: _dump_ratio(work, data_dir, device, size, precision, help_text, **DUMP[kind])
                 for size in ("base", "minilm")}
        if "--write-processes" in help_text:
            dumps["minilm-write-processes"] = _dump_ratio(work, data_dir, device, "minilm", precision, help_text,
                                                          write_processes=_write_processes(), **DUMP[kind])
    result = {
        "device": device, "quick": quick, "precision": train.get("precision"), "compile": compile_mode,
        "train_offline_ex_per_s": train["offline"]["examples_per_s"],
        "train_offline_over_online": train["ratio_offline_over_online"],
        "train_offline_over_in_memory": train["ratio_offline_over_in_memory"],
        "train_batch_scaling_ex_per_s": {str(k): v for k, v in sorted(scaling.items())},
        "dump_over_forward_base": dumps["base"]["median_ratio"],
        "dump_over_forward_minilm": dumps["minilm"]["median_ratio"],
        "dump_ex_per_s_minilm": dumps["minilm"]["dump_ex_per_s"],  # the median over rounds
        **({"dump_over_forward_minilm_write_processes": dumps["minilm-write-processes"]["median_ratio"],
            "dump_ex_per_s_minilm_write_processes": dumps["minilm-write-processes"]["dump_ex_per_s"]}
           if "minilm-write-processes" in dumps else {}),
        "reports": {"train": train, "dump": dumps},
    }
    if "256" in result["train_batch_scaling_ex_per_s"]:
        result["train_offline_ex_per_s_256"] = result["train_batch_scaling_ex_per_s"]["256"]
    return result


def table(result: dict) -> str:
    """One table: every figure, with issue 40's goal on this device where it has one."""
    goals = {key: (what, goal) for key, what, goal in GOALS.get(result["device"].split(":")[0], [])}
    rows = [(what, result[key], goals.get(key, (None, None))[1]) for key, what in SHOWN if key in result]
    rows += [(what, result[key], goal) for key, (what, goal) in goals.items() if key not in dict(SHOWN)
             and key in result]
    lines = [f"{'measure':<28} {'value':>12} {'goal':>10}  met", "-" * 58]
    for what, value, goal in rows:
        met = "" if goal is None else ("yes" if value >= goal else "NO")
        lines.append(f"{what:<28} {value:>12.3f} {'' if goal is None else f'>= {goal:g}':>10}  {met}")
    scaling = ", ".join(f"batch {b}: {v:.0f}" for b, v in result["train_batch_scaling_ex_per_s"].items())
    lines.append(f"offline examples/s by batch size: {scaling}")
    if result["quick"]:
        lines.append("--quick: tiny sizes, a smoke test of the suite; not a measurement against the goals")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", required=True, help="where to write the results")
    ap.add_argument("--data-dir", default=str(HERE.parents[2] / "shared" / "data" / "glue"))
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test (minutes on a CPU)")
    ap.add_argument("--precision", default="auto", help="the training runs' --precision (auto: bf16 on a GPU)")
    ap.add_argument("--compile", default=None, help="torch.compile mode of the training step (reduce-overhead)")
    args = ap.parse_args()
    result = measure(args.device, args.data_dir, args.quick, args.precision, args.compile)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(table(result))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
