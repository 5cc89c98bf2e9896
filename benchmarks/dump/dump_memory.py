"""Peak memory of `hsk dump` against the number of examples, next to a bare teacher forward loop.

    python benchmarks/dump/dump_memory.py --teacher runs/sweep_sst2/teacher --data-dir ../shared/data/glue
    python benchmarks/dump/dump_memory.py ... --sizes 2000,32000,2000,32000 --same-rows 2000 --no-forward

`--same-rows N` feeds every size the first N SST-2 rows repeated, so a longer dump meets no longer
sentences: its peak then measures what the dump keeps, not the longest batch it met.

Each measurement is a fresh process whose own peak resident set size (ru_maxrss) is read:
- `dump`: the real CLI (`hsk dump`), which holds one shard being computed and at most one being
  written, so nothing it keeps grows with the number of examples;
- `forward`: the same teacher over the same shards and length-bucketed batches, logits only,
  nothing kept: the floor that any CPU job running this model sits on.
Both run twice: with glibc's default allocator, and with `MALLOC_MMAP_THRESHOLD_=131072`.
glibc raises its mmap threshold each time a large block is freed, after which the forward's
variously sized activations come from the heap and fragment it, so the resident set of even the
bare forward loop creeps up with run length. A fixed threshold keeps them on mmap (returned to
the OS when freed) at some CPU throughput cost, which the benchmark also reports. The dump trims the
heap once per shard and leaves the threshold to glibc (it fixed it at 512 KiB from 4acfc85 to 1a01b22;
pipelines/dump/heap.py says why no longer); the bare forward loop runs with glibc's defaults. On a GPU
the activations live on the device, not in this heap.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PINNED = {"MALLOC_MMAP_THRESHOLD_": "131072"}
PEAK = "import resource; print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"


def run_child(code: str, args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(peak RSS in MiB, examples/s) of one fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    )
    text = out.stdout + out.stderr
    peak_kib = int(re.search(r"^PEAK (\d+)", text, re.M).group(1))
    rate = float(re.search(r"\((\d+(?:\.\d+)?) ex/s\)", text).group(1))
    return peak_kib / 1024, rate


DUMP_CHILD = f"import sys; from pipelines.cli import main; rc = main(sys.argv[1:]); {PEAK}; sys.exit(rc)"

# The dump's loop without the dump: same shards, tokenization, batches and model, logits only.
FORWARD_CHILD = f"""
import sys, time
import torch
from pipelines.core.batching import batch_inputs, length_bucketed_batches
from pipelines.core.data import load_examples
from pipelines.dump.stage import DumpOptions
from pipelines.core.models import load_classifier, load_tokenizer
from pipelines.core.tasks import get_task
from pipelines.core.tokenize import encode
teacher, data_dir, n, data_file = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] or None
task = get_task("sst2")
shard_rows, batch_size = DumpOptions.shard_rows, DumpOptions.batch_size  # the dump's defaults
examples = load_examples(task, "train", data_dir=data_dir, data_file=data_file, text_columns="sentence",
                         label_column="label", limit=n) if data_file else load_examples(task, "train",
                                                                                         data_dir=data_dir, limit=n)
model, tokenizer = load_classifier(teacher), load_tokenizer(teacher)
start = time.perf_counter()
with torch.inference_mode():
    for s in range(0, n, shard_rows):
        enc = encode(tokenizer, tuple(col[s : s + shard_rows] for col in examples.texts), task.max_length)
        for batch in length_bucketed_batches(enc["length"], batch_size):
            model(**batch_inputs(enc, batch, "cpu")).logits.numpy()
print(f"({{n / (time.perf_counter() - start):.1f}} ex/s)")
{PEAK}
"""


def repeated_rows(args, work: Path) -> str:
    """A TSV of SST-2's first `same_rows` training rows, repeated up to the largest size."""
    lines = (Path(args.data_dir) / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()
    head, rows = lines[0], lines[1 : args.same_rows + 1]
    largest = max(int(x) for x in args.sizes.split(","))
    path = work / "repeated.tsv"
    path.write_text("\n".join([head, *(rows * -(-largest // len(rows)))]) + "\n", encoding="utf-8")
    return str(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--sizes", default="2000,8000,32000")
    ap.add_argument("--config", default="3,8,0.2")
    ap.add_argument("--out", default="benchmarks/dump/results/dump_memory.json")
    ap.add_argument("--allocators", choices=["both", "default"], default="both",
                    help="default: glibc's default allocator only (the dump's own setting).")
    ap.add_argument("--no-forward", action="store_true", help="Measure the dump only, not the bare forward loop.")
    ap.add_argument("--same-rows", type=int, default=0, metavar="N",
                    help="Feed every size SST-2's first N training rows, repeated: the same lengths at every size "
                         "(a longer slice of SST-2 holds longer sentences, whose batches alone raise the peak).")
    args = ap.parse_args()
    rows = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hsk-mem-") as work:
        data_file = repeated_rows(args, Path(work)) if args.same_rows else ""
        source = ("--data-file", data_file, "--text-columns", "sentence", "--label-column", "label") if data_file \
            else ("--data-dir", args.data_dir)
        allocators = (("glibc default", {}), ("MALLOC_MMAP_THRESHOLD_=131072", PINNED))
        for allocator, env in allocators[: 1 if args.allocators == "default" else 2]:
            for n in [int(x) for x in args.sizes.split(",")]:
                dump_args = [
                    *("dump", "--task", "sst2", "--teacher", args.teacher, "--config", args.config),
                    *source, "--limit", str(n), "--no-progress",
                    *("--out", str(Path(work) / f"s{n}-{len(rows)}.zarr")),
                ]
                dump_peak, dump_rate = run_child(DUMP_CHILD, dump_args, env)
                fwd_peak, fwd_rate = (float("nan"), float("nan")) if args.no_forward else run_child(
                    FORWARD_CHILD, [args.teacher, args.data_dir, str(n), data_file], env)
                rows.append(
                    {
                        "allocator": allocator,
                        "examples": n,
                        "dump_peak_rss_mib": round(dump_peak, 1),
                        "forward_peak_rss_mib": round(fwd_peak, 1),
                        "dump_ex_per_s": dump_rate,
                        "forward_ex_per_s": fwd_rate,
                        "load_average": [round(x, 2) for x in os.getloadavg()],
                    }
                )
                print(
                    f"{allocator:>30} {n:>7} examples: dump peak {dump_peak:4.0f} MiB ({dump_rate:.0f} ex/s), "
                    f"bare forward peak {fwd_peak:4.0f} MiB ({fwd_rate:.0f} ex/s), load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    result = {
        "config": args.config,
        "teacher": args.teacher,
        "cpus": os.cpu_count(),
        "same_rows": args.same_rows,
        "seconds": round(time.perf_counter() - started),
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
