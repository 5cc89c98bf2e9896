"""`hsk dump` runs without training code: nothing under pipelines.train is imported (issue 35).

Training code reaches private transformers APIs that some admitted versions lack; a dump must not
depend on them. `python -X importtime` lists every module a process imports, on stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import save_tiny_teacher

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "pipelines.cli", *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    names = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return proc, names


def test_dump_help_imports_no_training_code():
    proc, names = imported_modules("dump", "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "pipelines.cli.store_commands" in names  # the listing is real
    assert not [n for n in names if n == "pipelines.train" or n.startswith("pipelines.train.")]


@pytest.mark.parametrize("engine", ["torch", "numpy"])
def test_a_real_dump_imports_no_training_code(engine, glue_dir, tiny_tokenizer, tmp_path):
    teacher = save_tiny_teacher(tmp_path / "teacher", tiny_tokenizer, num_layers=4)
    out = tmp_path / "s.zarr"
    proc, names = imported_modules(
        "dump", "--task", "sst2", "--teacher", str(teacher), "--config", "3,4,0.25", "--attention-rows",
        "--data-dir", str(glue_dir), "--limit", "24", "--max-length", "32", "--no-progress", "--device", "cpu",
        "--selection-engine", engine, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "pipelines.dump.stage" in names and (out / "zarr.json").exists()
    assert not [n for n in names if n == "pipelines.train" or n.startswith("pipelines.train.")]
