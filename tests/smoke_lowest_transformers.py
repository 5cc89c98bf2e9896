"""Smoke test for the lowest transformers version pyproject.toml declares (.ci/run runs it in its own venv).

`python tests/smoke_lowest_transformers.py WORKDIR` (tests/smoke_lowest_transformers.sh makes the venv): tiny
BERT and ModernBERT teachers are dumped, verified and read by `hsk info`; a bert2 and an sps2 student
(pipelines/train/students/sps.py) train one step from the BERT store, a bert2 from the ModernBERT one, on the GLUE rows
the tests use (skipped where they are absent, as the tests are). Exits non-zero on the first failure. Not
collected by pytest.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import transformers  # noqa: E402
from conftest import GLUE_DIR, build_tiny_tokenizer, save_tiny_teacher  # noqa: E402
from test_architectures import save_teacher  # noqa: E402

from pipelines.cli import main  # noqa: E402


def run(*args: str) -> None:
    print("hsk", " ".join(args), flush=True)
    code = main(list(args))
    if code != 0:
        raise SystemExit(f"smoke test failed (exit {code}): hsk {' '.join(args)}")


def smoke(work: Path, glue: str) -> None:
    tokenizer = build_tiny_tokenizer(work / "tokenizer")
    teachers = {"bert": save_tiny_teacher(work / "bert-sst2", tokenizer, num_layers=4),
                "modernbert": save_teacher("modernbert", work / "modernbert-sst2", tokenizer)}
    for name, teacher in teachers.items():
        store = str(work / f"{name}.zarr")
        run("dump", "--task", "sst2", "--teacher", str(teacher), "--config", "2,8,0.2", "--student-layers", "2",
            "--data-dir", glue, "--limit", "32", "--shard-rows", "16", "--no-progress", "--out", store)
        run("verify", store)
        run("info", store)
        students = ("bert2", "sps2") if name == "bert" else ("bert2",)
        for student in students:
            run("train", "--store", store, "--student", student, "--out", str(work / f"{name}-{student}"),
                "--data-dir", glue, "--max-steps", "1", "--eval-limit", "8", "--no-progress")


if __name__ == "__main__":
    print(f"transformers {transformers.__version__}", flush=True)
    if not GLUE_DIR.is_dir():
        print(f"smoke test skipped: no GLUE data at {GLUE_DIR}")
        raise SystemExit(0)
    smoke(Path(sys.argv[1]), str(GLUE_DIR))
    print("smoke test passed")
