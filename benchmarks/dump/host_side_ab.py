"""The dump's host-side cost (tokenizing; selection + encoding) of two checkouts, run alternately.

    git worktree add ../hsk-old 9eceb0c
    python benchmarks/dump/host_side_ab.py ../hsk-old . --data-dir ../shared/data/glue

Each round runs every checkout's own `benchmarks/dump/dump_throughput.py` host-side measurement in a
fresh process (same random MiniLM-sized teacher shape, QNLI dev, config 3,8,0.2, 3 repeats), so a
difference between rounds is the machine and a difference between checkouts is the code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

# Runs inside the checkout under test: only names that every version of dump_throughput.py has.
PROBE = """
import importlib.util, json, sys, tempfile
from pathlib import Path
tree, data_dir, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, tree)  # this checkout's hskstore and pipelines, whatever else is installed
script = Path(tree, "benchmarks", "dump", "dump_throughput.py")
script = script if script.is_file() else Path(tree, "benchmarks", "dump_throughput.py")  # an older checkout
spec = importlib.util.spec_from_file_location("bench", script)
b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b)
task = b.get_task("qnli")
teacher = b.make_teacher("minilm", task.num_labels, Path(tempfile.mkdtemp()) / "teacher")
model = b.BertForSequenceClassification.from_pretrained(teacher).eval()
texts = b.load_examples(task, "dev", data_dir=data_dir, limit=limit).texts
tok = b.BertTokenizerFast.from_pretrained(teacher)
opts = b.DumpOptions(config=b.HSKConfig.parse("3,8,0.2"), max_length=128, batch_size=32, device="cpu",
                     progress=False, overwrite=True)
print(json.dumps([b.host_side_ms_per_example(model, tok, texts, opts) for _ in range(3)]))
"""


def measure(tree: Path, data_dir: str, limit: int) -> list[dict]:
    env_path = str(tree.resolve())
    env = {**os.environ, "PYTHONPATH": env_path, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([sys.executable, "-c", PROBE, env_path, data_dir, str(limit)], check=True,
                         capture_output=True, text=True, env=env, cwd=env_path)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs=2, type=Path, help="two checkouts of hsk (A, then B)")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--limit", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/dump/results/host_side_ab.json")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {str(t): [] for t in args.trees}
    for r in range(args.rounds):
        for tree in args.trees:
            found = measure(tree, str(Path(args.data_dir).resolve()), args.limit)
            runs[str(tree)] += found
            print(f"round {r} {tree}: tokenize " + ", ".join(f"{x['tokenize_ms']:.3f}" for x in found)
                  + " ms/ex; selection + encoding " + ", ".join(f"{x['select_encode_ms']:.3f}" for x in found))
    Path(args.out).write_text(json.dumps({"limit": args.limit, "config": "3,8,0.2", "runs": runs}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
