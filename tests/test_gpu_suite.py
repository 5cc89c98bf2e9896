"""benchmarks/gpu/gpu_suite.py (issues 40 and 35): `--device cpu --quick` runs the whole suite at tiny sizes and writes
the keys the issue names (a smoke test of the suite, not a measurement)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
KEYS = ["train_offline_ex_per_s", "train_offline_over_online", "train_offline_over_in_memory",
        "dump_over_forward_base", "dump_over_forward_minilm", "dump_ex_per_s_minilm",
        "dump_over_forward_minilm_write_processes", "dump_ex_per_s_minilm_write_processes"]


@pytest.mark.slow
def test_the_quick_suite_writes_every_key(glue_dir, tmp_path):
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    suite = REPO / "benchmarks" / "gpu" / "gpu_suite.py"
    done = subprocess.run([sys.executable, str(suite), "--device", "cpu", "--quick", "--json", str(out), "--data-dir",
                           str(glue_dir)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert all(isinstance(result[k], float) and math.isfinite(result[k]) and result[k] > 0 for k in KEYS), result
    assert result["precision"] == "fp32" and set(result["train_batch_scaling_ex_per_s"]) == {"4", "8"}
    assert "offline / in-memory" in done.stdout and "smoke test" in done.stdout
