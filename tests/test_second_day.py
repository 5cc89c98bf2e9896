"""A user's second day: refusals that name the value and come back before torch is imported, a warning for
fp16 on a CPU, a progress line while training, stores that can be shared without local paths, more encoder
families, and hsk inside the Hugging Face Trainer. Each through the real CLI where there is one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import save_tiny_teacher

from pipelines.cli import main

REPO = Path(__file__).resolve().parents[1]


def hsk(*args: str, cwd: Path | None = None, code: str = "from pipelines.cli import run; run()"):
    """`hsk ARGS` as a user runs it, in a new process -> (exit status, stdout, stderr)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("HSK_DEBUG", None)
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def one_line(capsys, code: int, *words: str) -> str:
    """The command's only output line, `hsk: error: ...` with exit status 2, holding every word."""
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code == 2, text
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hsk: error: "), text
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, tiny_tokenizer) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher") / "t", tiny_tokenizer, num_layers=4, seed=5)


def dump_args(teacher: Path, glue_dir: Path, out, *extra: str) -> list[str]:
    return ["dump", "--task", "sst2", "--teacher", str(teacher), "--config", "2,4,0.5", "--student-layers", "2",
            "--data-dir", str(glue_dir), "--limit", "24", "--shard-rows", "8", "--max-length", "32", "--no-progress",
            "--device", "cpu", "--out", str(out), *extra]


@pytest.fixture(scope="module")
def store(tmp_path_factory, teacher, glue_dir) -> Path:
    out = tmp_path_factory.mktemp("store") / "sst2.zarr"
    assert main(dump_args(teacher, glue_dir, out)) == 0
    return out


# -- argument errors: one line naming the value, before torch and transformers are imported ---------------------

# Each refusal in a fresh process that reports, after the CLI returns, whether torch or transformers was imported.
_PROBE = "import sys; from pipelines.cli import main; c = main(sys.argv[1:]); print(c, 'torch' in sys.modules, " \
         "'transformers' in sys.modules)"


@pytest.mark.parametrize("args, words", [
    (["dump", "--task", "sst2", "--teacher", "t", "--config", "1,2,0.1", "--limit", "-5", "--out", "o.zarr"],
     ["--limit must be an integer >= 1, got -5"]),
    (["teacher", "--task", "sst2", "--epochs", "0", "--out", "t"], ["--epochs must be > 0, got 0"]),
    (["teacher", "--task", "sst5", "--out", "t"], ["unknown task 'sst5'", "sst2"]),
    (["train", "--teacher", "t", "--task", "sst5", "--student", "bert3", "--out", "r"], ["unknown task 'sst5'"]),
    (["eval", "m", "--task", "sst5"], ["unknown task 'sst5'"]),
    (["train", "--store", "s.zarr", "--student", "bert3", "--out", "r", "--batch-size", "0"],
     ["--batch-size must be an integer >= 1, got 0"]),
    (["train", "--store", "s.zarr", "--student", "bert3", "--out", "r", "--method", "kd", "--epochs", "0"],
     ["--epochs must be > 0, got 0"]),
    (["train", "--store", "s.zarr", "--student", "bert3", "--out", "r", "--max-steps", "0"],
     ["--max-steps must be an integer >= 1, got 0"]),
    (["eval", "m", "--task", "sst2", "--batch-size", "0"], ["--batch-size must be an integer >= 1, got 0"]),
    (["dump", "--task", "sst2", "--teacher", "t", "--config", "1,2,0.1", "--max-length", "1", "--out", "o.zarr"],
     ["--max-length must be an integer >= 2, got 1"]),
])
def test_argument_errors_are_refused_before_torch_is_imported(tmp_path, args, words):
    code, out, err = hsk(*args, cwd=tmp_path, code=_PROBE)
    assert out.strip() == "2 False False", out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hsk: error: "), err
    for word in words:
        assert word in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_catalog_task_filter_takes_any_store_task(tmp_path, capsys):
    """--task of catalog filters stores (an MLM store's task is "mlm"): it is not checked as a GLUE task."""
    assert main(["catalog", str(tmp_path), "--task", "mlm"]) == 0


# -- fp16 on a CPU: accepted (it is how its numerics are tested), with one warning line -------------------------


def test_fp16_on_a_cpu_is_one_warning_line_and_training_prints_a_heartbeat(store, glue_dir, tmp_path):
    code, out, err = hsk("train", "--store", str(store), "--student", "bert2", "--method", "kd", "--lr", "1e-3",
                         "--batch-size", "8", "--max-steps", "4", "--log-every", "1", "--heartbeat", "0",
                         "--no-eval", "--no-progress", "--device", "cpu", "--precision", "fp16",
                         "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert code == 0, out + err
    warnings = [line for line in err.splitlines() if "fp16" in line]
    assert len(warnings) == 1 and warnings[0].startswith("WARNING: --precision fp16 on cpu"), err
    assert "--precision fp32" in warnings[0]
    beats = [line for line in out.splitlines() if line.startswith("stage kd: step ")]
    # --heartbeat 0: a line at every logged step, with the loss, the rate and the time left
    assert [b.split(",")[0] for b in beats] == [f"stage kd: step {i}/4" for i in (1, 2, 3, 4)], out
    assert "loss " in beats[0] and "examples/s" in beats[0] and beats[-1].endswith("0s left"), beats


def test_the_heartbeat_is_quiet_between_its_seconds(store, glue_dir, tmp_path, capsys):
    """The default heartbeat (60 s): a stage's first logged step and its last, nothing between on a short run."""
    assert main(["train", "--store", str(store), "--student", "bert2", "--method", "kd", "--batch-size", "4",
                 "--max-steps", "5", "--log-every", "1", "--no-eval", "--no-progress", "--device", "cpu",
                 "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    beats = [line.split(",")[0] for line in out.splitlines() if line.startswith("stage kd: step ")]
    assert beats == ["stage kd: step 1/5", "stage kd: step 5/5"], out
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["type"] == "train" for r in records) == 5  # metrics.jsonl still logs every step
