"""pipelines/core/threads.py through the commands: the default thread count leaves the pipeline its cores, a dump
records its threads and a resume must match them, a CPU training run records its own."""

from __future__ import annotations

import os

from hskstore import open_store
from pipelines.cli import main


def test_the_default_threads_leave_the_pipeline_its_cores(monkeypatch):
    from pipelines.core.threads import BUSY, default_threads, physical_cores

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert physical_cores() <= (os.cpu_count() or 1)
    for command, busy in BUSY.items():
        assert default_threads(command) == max(1, physical_cores() - busy)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun's ranks on this host share its cores
    assert default_threads("teacher") == max(1, physical_cores() // 2)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own choice wins over the default
    assert default_threads("dump") == 3


def test_a_dump_records_its_threads_and_a_resume_must_match(teacher_dir, glue_dir, tmp_path, capsys):
    out = tmp_path / "s.zarr"
    args = ["dump", "--task", "sst2", "--teacher", str(teacher_dir), "--config", "2,4,0.5", "--student-layers", "2",
            "--data-dir", str(glue_dir), "--limit", "16", "--shard-rows", "8", "--max-length", "32",
            "--device", "cpu", "--no-progress", "--out", str(out)]
    assert main([*args, "--threads", "1"]) == 0
    assert open_store(str(out)).meta["compute"]["torch_threads"] == 1
    assert main([*args, "--threads", "0"]) == 2
    assert "--threads must be an integer >= 1" in capsys.readouterr().err


def test_a_cpu_training_run_records_its_threads(sst2_store, glue_dir, tmp_path):
    """Recorded in the summary, as the rank count is, and for the same reason not part of the run's identity:
    a run resumes elastically under another count (tests/test_order.py), with results equal to rounding."""
    import json

    out = tmp_path / "run"
    args = ["train", "--store", str(sst2_store / "sst2.zarr"), "--student", "bert2", "--method", "kd", "--out",
            str(out), "--max-steps", "1", "--batch-size", "8", "--eval-limit", "8", "--data-dir", str(glue_dir),
            "--device", "cpu", "--no-progress"]
    assert main([*args, "--threads", "1"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["torch_threads"] == 1 and "threads" not in summary["options"]
    assert main([*args, "--threads", "2"]) == 0  # the same run: already finished, its summary kept
    assert json.loads((out / "summary.json").read_text()) == summary
