"""`hsk dump` (and info/verify on its store): bad input gets one clear line and exit status 2, and loses nothing."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest
from conftest import dump_args, save_tiny_teacher

from hskstore.errors import UserError
from hskstore.io.writer import StoreWriter
from pipelines.cli import main


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher"), tiny_tokenizer, num_layers=2, seed=2)


def test_help_teaches(capsys):
    assert main(["dump", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--config" in text and "Examples" in text and "resumes" in text


@pytest.mark.parametrize(
    "config, message",
    [
        ("3,8", "ND,NL,W"),
        ("3,8,2", "width ratio"),
        ("x,8,0.2", "integers"),
        ("3,0,0.2", "all of ND, NL, W"),
        ("6,8,0.2", "only 3 hidden states"),
    ],
)
def test_bad_config_strings(teacher_dir, glue_dir, tmp_path, capsys, config, message):
    assert main(dump_args(teacher_dir, glue_dir, tmp_path / "s.zarr", config=config)) == 2
    err = capsys.readouterr().err
    assert "hsk: error:" in err and message in err and "Traceback" not in err
    assert not (tmp_path / "s.zarr").exists()


def test_unknown_task_missing_data_bad_teacher(teacher_dir, glue_dir, tmp_path, capsys, monkeypatch):
    assert main(dump_args(teacher_dir, glue_dir, tmp_path / "s.zarr", task="sst3")) == 2
    assert "sst2" in capsys.readouterr().err  # lists the known tasks
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(dump_args(teacher_dir, tmp_path / "nowhere", tmp_path / "s.zarr")) == 2
    assert "--data-dir" in capsys.readouterr().err
    (tmp_path / "junk").mkdir()
    assert main(dump_args(tmp_path / "junk", glue_dir, tmp_path / "s.zarr")) == 2
    assert "config.json" in capsys.readouterr().err
    # a 2-label teacher for a regression task
    assert main(dump_args(teacher_dir, glue_dir, tmp_path / "s.zarr", task="stsb")) == 2
    assert "fine-tuned on stsb" in capsys.readouterr().err


def test_existing_output_needs_overwrite_and_other_config_is_refused(teacher_dir, glue_dir, tmp_path, capsys):
    out = tmp_path / "s.zarr"
    assert main(dump_args(teacher_dir, glue_dir, out)) == 0
    before = sorted(p.name for p in out.rglob("*"))
    capsys.readouterr()
    assert main(dump_args(teacher_dir, glue_dir, out)) == 0  # the same dump again: nothing to do
    assert "already complete, nothing to do" in capsys.readouterr().out
    assert main(dump_args(teacher_dir, glue_dir, out, config="1,2,0.5")) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert sorted(p.name for p in out.rglob("*")) == before
    assert main(dump_args(teacher_dir, glue_dir, out, "--overwrite", config="1,2,0.5")) == 0
    assert main(["info", str(out)]) == 0
    assert "1,2,0.5" in capsys.readouterr().out


def test_full_disk_is_reported_and_resumable(teacher_dir, glue_dir, tmp_path, capsys, monkeypatch):
    original = StoreWriter.write_shard

    def full(self, shard, arrays):
        if shard == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, shard, arrays)

    monkeypatch.setattr(StoreWriter, "write_shard", full)
    out = tmp_path / "s.zarr"
    assert main(dump_args(teacher_dir, glue_dir, out)) == 2
    err = capsys.readouterr().err
    assert "disk full" in err and "rerun the same command" in err
    monkeypatch.setattr(StoreWriter, "write_shard", original)
    assert main(["verify", str(out)]) == 1
    assert main(dump_args(teacher_dir, glue_dir, out)) == 0
    assert main(["verify", str(out)]) == 0


def test_truncated_store_is_refused_by_verify_and_info(teacher_dir, glue_dir, tmp_path, capsys):
    out = tmp_path / "s.zarr"
    assert main(dump_args(teacher_dir, glue_dir, out)) == 0
    shutil.rmtree(out / "layers" / "1" / "values" / "c")  # lost chunks read as zeros: checksums catch it
    assert main(["verify", str(out)]) == 1
    assert "layers/1/values" in capsys.readouterr().err
    shutil.rmtree(out / "layers" / "1")
    assert main(["verify", str(out)]) == 2
    assert "truncated" in capsys.readouterr().err


def test_dump_without_teacher_points_to_hsk_teacher(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["dump", "--task", "QNLI", "--config", "3,8,0.2"]) == 2
    err = capsys.readouterr().err
    assert "runs/teacher-qnli" in err and "hsk teacher --task qnli" in err
    assert not (tmp_path / "qnli.zarr").exists()


def test_user_mistake_is_one_line_but_a_bug_keeps_its_traceback(capsys, monkeypatch):
    # A user mistake: one line, exit 2 (no torch is needed to refuse it).
    assert main(["dump", "--task", "sst2", "--config", "3,8,0.2", "--tokens", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hsk: error: unknown --tokens 'nope'") and len(err.splitlines()) == 1
    monkeypatch.setenv("HSK_DEBUG", "1")  # HSK_DEBUG=1 shows the traceback of a user mistake too
    with pytest.raises(UserError, match="unknown --tokens 'nope'"):
        main(["dump", "--task", "sst2", "--config", "3,8,0.2", "--tokens", "nope"])
    monkeypatch.delenv("HSK_DEBUG")
    # A ValueError from hsk's own code is a bug, not a user mistake: it reaches the caller, traceback and all.
    from pipelines.kinds.task import TaskDumpOptions

    def broken(options):
        raise ValueError("an internal invariant broke")

    monkeypatch.setattr(TaskDumpOptions, "layer_list", broken)
    with pytest.raises(ValueError, match="an internal invariant broke"):
        main(["dump", "--task", "sst2", "--config", "3,8,0.2"])
    assert "hsk: error" not in capsys.readouterr().err


def test_a_bug_exits_1_with_a_traceback_from_the_real_command(tmp_path):
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from pipelines.cli import run\n"
        "from pipelines.kinds.task import TaskDumpOptions\n"
        "def broken(options):\n"
        "    raise ValueError('an internal invariant broke')\n"
        "TaskDumpOptions.layer_list = broken\n"
        "sys.argv = ['hsk', 'dump', '--task', 'sst2', '--config', '3,8,0.2', '--out', sys.argv[1]]\n"
        "run()\n"
    )
    out = tmp_path / "s.zarr"
    done = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "Traceback" in done.stderr and "an internal invariant broke" in done.stderr
    assert "hsk: error" not in done.stderr and not out.exists()


def test_student_build_refuses_a_bad_batch_size_in_one_line(tmp_path, capsys):
    out = tmp_path / "student"
    args = ["student", "build", "rosita", "--teacher", str(tmp_path / "no-teacher"), "--task", "sst2", "--layers", "1",
            "--heads", "1", "--ffn", "8", "--emb-rank", "0", "--out", str(out), "--batch-size", "0"]
    assert main(args) == 2
    assert capsys.readouterr().err.strip() == "hsk: error: --batch-size must be an integer >= 1, got 0"
    assert not out.exists()


def test_a_damaged_results_table_is_one_line(tmp_path, capsys):
    damaged = tmp_path / "results.parquet"
    damaged.write_bytes(b"not parquet")
    assert main(["report", str(damaged), "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hsk: error: {damaged} is not a readable results table") and len(err.splitlines()) == 1
    assert damaged.read_bytes() == b"not parquet"


@pytest.mark.parametrize("args, message", [
    (["sweep", "--source", "s.zarr", "--seeds", "a,b", "--configs", "3,8,0.2", "--students", "bert3"],
     "--seeds takes comma-separated integers like '0,1,2', got 'a,b'"),
    (["train", "--store", "s.zarr", "--student", "bert3", "--set", "lr", "--out", "run"],
     "--set takes NAME=VALUE, got 'lr'"),
    (["report", "missing.parquet", "--out", "figure"], "no results table at missing.parquet: run `hsk sweep` first"),
    (["dump", "--task", "sst2", "--layers", "4,x", "--out", "s.zarr"],
     "--layers takes comma-separated layer numbers like '4,8,12', got '4,x'"),
])
def test_bad_option_values_are_one_line(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("the user's file")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"hsk: error: {message}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]  # nothing written
