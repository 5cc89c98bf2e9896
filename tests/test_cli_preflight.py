"""What the CLI checks before any work starts, through the real CLI: sweeps that check every run before they
start, a finished run kept unless --overwrite, advice computed for this teacher and student, the data
folder recorded absolute, and quiet, quick edges (no bars in logs, no torch for a typo)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import save_tiny_teacher

from pipelines.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                HF_HUB_OFFLINE="1")


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, tiny_tokenizer) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher") / "teacher-sst2", tiny_tokenizer, num_layers=4)


def _dump(teacher: Path, out: Path, glue: Path, *extra: str) -> Path:
    args = ["dump", "--task", "sst2", "--teacher", str(teacher), "--config", "3,8,0.2", "--data-dir", str(glue),
            "--limit", "48", "--shard-rows", "16", "--no-progress", "--out", str(out), *extra]
    assert main(args) == 0
    return out


@pytest.fixture(scope="module")
def store4(tmp_path_factory, teacher, glue_dir) -> Path:
    """A store at the dump's default layer map: a 4-layer reference student."""
    return _dump(teacher, tmp_path_factory.mktemp("s4") / "sst2.zarr", glue_dir)


@pytest.fixture(scope="module")
def store2(tmp_path_factory, teacher, glue_dir) -> Path:
    return _dump(teacher, tmp_path_factory.mktemp("s2") / "sst2.zarr", glue_dir, "--student-layers", "2")


def _train(store: Path, out: Path, glue: Path, *extra: str) -> int:
    return main(["train", "--store", str(store), "--out", str(out), "--data-dir", str(glue), "--max-steps", "1",
                 "--eval-limit", "16", "--no-progress", *extra])


# -- 1. a sweep checks every planned run against its store before it runs --------------------------


def test_sweep_dry_run_names_the_runs_that_cannot_run(store4, tmp_path, capsys):
    work = tmp_path / "sweep"
    code = main(["sweep", "--source", str(store4), "--configs", "3,8,0.2;1,8,0.1", "--students", "bert2,bert4",
                 "--work-dir", str(work), "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and not work.exists()
    rows = [line for line in out.splitlines() if line.strip().endswith(("pending", "CANNOT RUN"))]
    bad = [line for line in rows if line.endswith("CANNOT RUN")]
    assert len(rows) == 4 and len(bad) == 1 and "3,8,0.2" in bad[0] and "bert2" in bad[0]
    assert "1 of 4 runs cannot run" in out and "--student-layers 2" in out


def test_sweep_refuses_before_its_first_run(store4, tmp_path, capsys):
    work = tmp_path / "sweep"
    code = main(["sweep", "--source", str(store4), "--configs", "3,8,0.2", "--students", "bert2,bert3",
                 "--seeds", "0,1", "--work-dir", str(work), "--max-steps", "1"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hsk: error:")]
    assert code == 2 and not work.exists()  # nothing claimed, nothing run
    assert len(err) == 5 and all(line.startswith("hsk: error: run ") for line in err[:4])
    assert "--student-layers 2" in err[0] and "4 of 4 planned runs cannot run" in err[4]


# -- 4. a finished run is an output --------------------------------------------------------------


def test_no_resume_never_replaces_a_finished_run(store2, tmp_path, glue_dir, capsys):
    out = tmp_path / "run"
    assert _train(store2, out, glue_dir, "--student", "bert2") == 0
    before = (out / "summary.json").read_bytes()
    capsys.readouterr()
    for flags in (["--method", "kd", "--no-resume"], ["--method", "kd"], ["--no-resume"]):
        assert _train(store2, out, glue_dir, "--student", "bert2", *flags) == 2, flags
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("hsk: error:")]
        assert len(errors) == 1 and "--overwrite" in errors[0], (flags, err)
        assert (out / "summary.json").read_bytes() == before
    assert _train(store2, out, glue_dir, "--student", "bert2", "--method", "kd", "--overwrite") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "kd" and summary["model_dir"] == str(out / "best")
    assert (out / "best" / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # the staged sibling was swapped in


# -- 5. advice computed for this teacher and student -------------------------------------------------


def test_store_problems_come_in_one_round(store4, tmp_path, glue_dir, capsys):
    assert _train(store4, tmp_path / "r", glue_dir, "--student", "bert3", "--method", "tinybert-att") == 2
    err = capsys.readouterr().err
    assert len([line for line in err.splitlines() if line.startswith("hsk: error:")]) == 1 and "2 problems" in err
    assert "--attention-rows" in err and "--student-layers 3" in err
    assert not (tmp_path / "r").exists()


def test_pkd_advice_is_for_this_teacher_and_student(store4, tmp_path, glue_dir, capsys):
    assert _train(store4, tmp_path / "r", glue_dir, "--student", "bert3", "--method", "pkd-skip") == 2
    err = capsys.readouterr().err
    # Patient KD Skip, 4-layer teacher, 3-layer student: I_pt = floor(k * 4 / 3), k = 1, 2.
    assert "--layers 1,2 --config 2,1,1" in err and "4-layer teacher" in err and "12-layer" not in err
    assert _train(store4, tmp_path / "r", glue_dir, "--student", "sps2", "--method", "pea") == 2
    err = capsys.readouterr().err
    assert "--layers 1,2,3 --config 3,1,1" in err and "--beta 0" in err  # sps2: 4 effective layers


def test_pea_with_a_plain_student_warns_that_the_paper_uses_sps(store2, tmp_path, glue_dir, capsys):
    out = tmp_path / "pea"
    assert _train(store2, out, glue_dir, "--student", "bert2", "--method", "pea", "--beta", "0") == 0
    warnings = json.loads((out / "summary.json").read_text())["warnings"]
    assert any("SPS" in w and "sps<k>" in w for w in warnings)
    assert "SPS students" in capsys.readouterr().out


def test_too_deep_config_names_the_flags(teacher, tmp_path, glue_dir, capsys):
    assert main(["dump", "--task", "sst2", "--teacher", str(teacher), "--config", "8,8,0.2", "--data-dir",
                 str(glue_dir), "--out", str(tmp_path / "s.zarr")]) == 2
    err = capsys.readouterr().err
    assert "--student-layers" in err and "--layers" in err and not (tmp_path / "s.zarr").exists()


def test_a_moved_teacher_is_named_with_the_flag_to_pass(tiny_tokenizer, tmp_path, glue_dir, capsys):
    teacher = save_tiny_teacher(tmp_path / "teacher", tiny_tokenizer, num_layers=4)
    store = _dump(teacher, tmp_path / "s.zarr", glue_dir)
    teacher.rename(tmp_path / "moved")
    capsys.readouterr()
    assert _train(store, tmp_path / "r", glue_dir, "--student", "bert4") == 2
    err = capsys.readouterr().err
    assert "--teacher" in err and str(teacher) in err
    assert _train(store, tmp_path / "r", glue_dir, "--student", "bert4", "--teacher", str(tmp_path / "moved")) == 0


# -- 6. the data folder is recorded absolute ------------------------------------------------------------


def test_a_moved_store_finds_its_data_and_says_where_it_looked(teacher, tmp_path, glue_dir, monkeypatch, capsys):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "glue").symlink_to(glue_dir)
    monkeypatch.chdir(tmp_path / "data")
    store = _dump(teacher, tmp_path / "s.zarr", Path("glue"))  # relative, as a user types it
    meta = json.loads((store / "zarr.json").read_text())["attributes"]["hsk"]
    assert meta["dataset"]["source"] == f"glue_data:{tmp_path / 'data' / 'glue' / 'SST-2' / 'train.tsv'}"
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    shutil.move(str(store), moved / "s.zarr")
    monkeypatch.chdir(moved)
    monkeypatch.delenv("HSK_DATA_DIR", raising=False)
    args = ["train", "--store", "s.zarr", "--student", "bert4", "--max-steps", "1", "--eval-limit", "8",
            "--no-progress"]
    assert main([*args, "--out", "run"]) == 0  # no --data-dir: the recorded folder, from another cwd
    (tmp_path / "data" / "glue").unlink()
    capsys.readouterr()
    assert main([*args, "--out", "run2"]) == 2
    err = capsys.readouterr().err
    assert f"the folder the store was dumped from, {tmp_path / 'data' / 'glue'}" in err and "--data-dir" in err


# -- 7. quiet, quick edges ------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    "['dump', '--task', 'sst2', '--config', '3-8-0.2', '--out', 'x.zarr']",
    "['train', '--teacher', 't', '--task', 'sst2', '--config', '3-8-0.2', '--student', 'bert2', '--out', 'x.zarr']",
], ids=["dump", "train"])
def test_a_bad_config_is_refused_before_torch_is_imported(tmp_path, argv):
    code = f"import sys; from pipelines.cli import main; rc = main({argv}); print('torch' in sys.modules); sys.exit(rc)"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and done.stdout.strip() == "False"
    assert done.stderr.startswith("hsk: error: --config must be 'ND,NL,W'") and not (tmp_path / "x.zarr").exists()


def test_no_progress_bars_in_a_log(teacher, tmp_path, glue_dir):
    """stderr to a file or pipe: no bar redraws, though --progress is the default."""
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "dump", "--task", "sst2", "--teacher", str(teacher),
                           "--config", "1,4,0.1", "--data-dir", str(glue_dir), "--limit", "32", "--out",
                           str(tmp_path / "s.zarr")], env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr and "ex/s]" not in done.stderr and "it/s]" not in done.stderr


def test_identity_derive_says_same_size(store2, tmp_path, capsys):
    assert main(["derive", str(store2), "--config", "3,8,0.2", "--out", str(tmp_path / "d.zarr"),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "the same size" in out and "1.0x" not in out


def test_help_examples_are_not_wrapped_and_use_the_readme_data_folder(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    for command in (["dump"], ["train"], ["eval"], ["teacher"], ["derive"], ["sweep"], ["student", "build"]):
        assert main([*command, "--help"]) == 0
        out = capsys.readouterr().out
        assert "--data-\n" not in out and "../glue_data" not in out, command
        assert "1,9,0.1 --out" not in out or command != ["derive"]


def test_one_wording_for_a_saved_teacher(tiny_base_dir, tmp_path, glue_dir, capsys):
    assert main(["teacher", "--task", "sst2", "--base", str(tiny_base_dir), "--data-dir", str(glue_dir),
                 "--train-limit", "32", "--eval-limit", "16", "--epochs", "1", "--no-progress",
                 "--out", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert out.count("teacher saved to") == 1 and "saved teacher" not in out


def test_a_finished_run_is_not_mistaken_for_a_rerun_with_another_schedule(store2, tmp_path, glue_dir, capsys):
    out = tmp_path / "run"
    assert _train(store2, out, glue_dir, "--student", "bert2") == 0
    before = (out / "summary.json").read_bytes()
    capsys.readouterr()
    assert _train(store2, out, glue_dir, "--student", "bert2") == 0  # the same command: the same run
    assert "already finished" in capsys.readouterr().out
    for flags in (["--max-steps", "2"], ["--eval-limit", "8"]):  # a longer run, another evaluation: not it
        assert _train(store2, out, glue_dir, "--student", "bert2", *flags) == 2, flags
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hsk: error:")]
        assert len(errors) == 1 and "--overwrite" in errors[0], flags
        assert (out / "summary.json").read_bytes() == before
    shutil.rmtree(out / "checkpoint")  # as a sweep leaves it: only the summary tells which run it was
    assert _train(store2, out, glue_dir, "--student", "bert2", "--max-steps", "2") == 2
    assert _train(store2, out, glue_dir, "--student", "bert2") == 0
    assert json.loads(before)["options"]["max_steps"] == 1
