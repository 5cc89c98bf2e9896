"""A streamed Hugging Face dataset as a causal-LM corpus (`--data-file hf:FOLDER`): what keeping its iteration
state costs as it is read, and what a resume reads before its first row, with the recorded state and without.

    python benchmarks/lm/hf_stream_resume.py [--files 16] [--rows 2000] [--words 200] [--rounds 3]

Writes a local folder of `--files` Parquet files (row groups of 100) of `--rows` generated documents each, of
`--words` words (w0 ... w509, one token each with capture_scale.py's word-level tokenizer: tokens per row are the
words), streamed as `datasets.load_dataset(FOLDER, streaming=True)` reads a hub dataset's files. Then:

- `read`: every row through pipelines.dump.hf_corpus.dataset_rows as the dump reads them, with a state kept every
  SNAPSHOT_ROWS rows and with none (the interval past the corpus), alternately for `--rounds` rounds: µs per row
  and per token; and one `IterableDataset.state_dict()` call's cost, alone.
- `resume`: the time to the first row at a quarter, a half and three quarters of the corpus, taken up at the state
  recorded at or before it (what a resumed dump does) against reading from the stream's start (what it did
  before: `IterableDataset.skip`).

Results: benchmarks/lm/results/hf_stream_resume.json (the folder is temporary, removed after).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def write_corpus(folder: Path, files: int, rows: int, words: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    folder.mkdir()
    for f in range(files):
        ids = rng.integers(0, 510, size=(rows, words))
        texts = [" ".join(f"w{i}" for i in doc) for doc in ids]
        pq.write_table(pa.table({"text": texts}), folder / f"part-{f:03d}.parquet", row_group_size=100)


def read_all(spec: str, every: int) -> tuple[float, int]:
    """Seconds to read every row as the dump does, a state kept every `every` rows; the rows read."""
    from pipelines.dump import hf_corpus

    hf_corpus.SNAPSHOT_ROWS = every
    started = time.perf_counter()
    n = sum(1 for _ in hf_corpus.dataset_rows(spec, hf_corpus.STREAMED, ("text",), 0))
    return time.perf_counter() - started, n


def state_dict_cost(spec: str, calls: int = 20000) -> float:
    """µs per IterableDataset.state_dict() call, mid-stream."""
    from pipelines.dump.hf_corpus import _streamed

    dataset = _streamed(spec)
    rows = iter(dataset)
    for _ in range(150):
        next(rows)
    started = time.perf_counter()
    for _ in range(calls):
        dataset.state_dict()
    return (time.perf_counter() - started) / calls * 1e6


def resume_times(spec: str, total: int) -> list[dict]:
    """Seconds to the first row at each resume point: from the state recorded at or before it, and without one."""
    from pipelines.dump import hf_corpus

    hf_corpus.SNAPSHOT_ROWS = 32
    points = [total // 4, total // 2, 3 * total // 4]
    states = {}
    for _, row, state in hf_corpus.dataset_rows(spec, hf_corpus.STREAMED, ("text",), 0):
        if row in points:
            states[row] = state
    out = []
    for point in points:
        timed = {}
        for arm, resume in (("state", states[point]), ("from the start", None)):
            started = time.perf_counter()
            next(hf_corpus.dataset_rows(spec, hf_corpus.STREAMED, ("text",), point, resume))
            timed[arm] = round(time.perf_counter() - started, 3)
        out.append({"row": point, "state_row": states[point].row, "seconds_to_first_row": timed})
        print(out[-1], flush=True)
    return out


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {len(os.sched_getaffinity(0))} cores"
    return platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--words", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=str(ROOT / "benchmarks/lm/results/hf_stream_resume.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "parquet"
        write_corpus(folder, args.files, args.rows, args.words)
        spec = f"hf:{folder}"
        total = args.files * args.rows
        seconds = {"state every 32 rows": [], "no state": []}
        for _ in range(args.rounds):
            for arm, every in (("state every 32 rows", 32), ("no state", 10 * total)):
                took, n = read_all(spec, every)
                assert n == total
                seconds[arm].append(took)
                print(arm, f"{took / total * 1e6:.1f} us/row", flush=True)
        read = {arm: {"us_per_row": round(min(v) / total * 1e6, 2), "us_per_token": round(min(v) / total / args.words
                                                                                           * 1e6, 4)}
                for arm, v in seconds.items()}
        result = {
            "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                     cwd=ROOT).stdout.strip(),
            "machine": _cpu(),
            "corpus": {"files": args.files, "rows": total, "tokens_per_row": args.words},
            "read (best of rounds)": read,
            "state_dict_us_per_call": round(state_dict_cost(spec), 2),
            "resume": resume_times(spec, total),
        }
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
