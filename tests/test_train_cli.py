"""`hsk train` / `hsk sweep` as a user meets them: dev data found like the dump
found its data, a moved teacher given back with --teacher (its weights checked), --expect-store, options
refused rather than replaced, a full disk, and the output rule on --out / --work-dir."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from conftest import save_tiny_teacher

from hskstore.format.config import HSKConfig
from hskstore.io.reader import open_store
from pipelines.cli import main
from pipelines.dump.stage import DumpOptions, dump

OPTS = DumpOptions(config=HSKConfig.parse("2,4,0.5"), ref_student_layers=2, shard_rows=16, batch_size=16,
                   progress=False)
FAST = ["--max-steps", "1", "--batch-size", "8", "--eval-limit", "8", "--no-progress", "--workers", "1"]


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher"), tiny_tokenizer, num_layers=4, seed=1, confident=True)


def _dump(out: Path, teacher: Path, data_dir: Path, split: str = "train") -> str:
    dump("sst2", OPTS, teacher=str(teacher), out=str(out), data_dir=str(data_dir), split=split, limit=32,
         log=lambda *_: None)
    return str(out)


@pytest.fixture(scope="module")
def store(tmp_path_factory, teacher_dir, glue_dir) -> str:
    return _dump(tmp_path_factory.mktemp("s") / "sst2.zarr", teacher_dir, glue_dir)


def _train(store: str, out: Path, *args: str) -> int:
    return main(["train", "--store", store, "--student", "bert2", "--out", str(out), *FAST, *args])


def _one_error(err: str) -> str:
    """The single `hsk: error:` line of stderr (weight-loading bars may be there too), no traceback."""
    lines = [line for line in err.splitlines() if line.startswith("hsk: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_dev_data_comes_from_where_the_store_was_dumped(store, tmp_path, glue_dir, monkeypatch):
    monkeypatch.delenv("HSK_DATA_DIR", raising=False)
    assert _train(store, tmp_path / "r", "--method", "kd") == 0  # no --data-dir
    summary = _summary(tmp_path / "r")
    assert summary["dev_data"]["source"] == f"glue_data:{glue_dir / 'SST-2' / 'dev.tsv'}"
    assert summary["dev_data"]["splits"] == {"dev": 8} and summary["score"] is not None
    assert summary["eval_on_training_split"] is False


def test_no_dev_data_stops_before_training_unless_no_eval(teacher_dir, glue_dir, tmp_path, monkeypatch, capsys):
    mine = tmp_path / "mine" / "SST-2"
    mine.mkdir(parents=True)
    shutil.copy(glue_dir / "SST-2" / "train.tsv", mine / "train.tsv")  # a folder without dev.tsv
    store = _dump(tmp_path / "s.zarr", teacher_dir, tmp_path / "mine")
    monkeypatch.delenv("HSK_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "r"
    assert _train(store, out, "--method", "kd") == 2
    err = _one_error(capsys.readouterr().err)
    assert err.startswith("hsk: error: no dev data for sst2") and "--no-eval" in err
    assert not out.exists()
    assert _train(store, out, "--method", "kd", "--no-eval") == 0
    summary = _summary(out)
    assert summary["score"] is None and summary["dev_data"]["splits"] == {}
    assert any("--no-eval" in w for w in summary["warnings"]) and (out / "best" / "config.json").exists()


def test_evaluating_on_the_training_split_warns_and_is_recorded(teacher_dir, glue_dir, tmp_path):
    store = _dump(tmp_path / "dev.zarr", teacher_dir, glue_dir, split="dev")
    assert _train(store, tmp_path / "r", "--method", "kd", "--data-dir", str(glue_dir)) == 0
    summary = _summary(tmp_path / "r")
    assert summary["eval_on_training_split"] is True
    assert any("the split the store was dumped from" in w for w in summary["warnings"])


def test_teacher_override_is_checked_against_the_store(store, teacher_dir, tiny_tokenizer, glue_dir, tmp_path,
                                                        capsys):
    moved = tmp_path / "moved-teacher"
    shutil.copytree(teacher_dir, moved)
    assert _train(store, tmp_path / "ok", "--teacher", str(moved), "--data-dir", str(glue_dir)) == 0
    assert _summary(tmp_path / "ok")["student"]["source"] == str(moved)
    other = save_tiny_teacher(tmp_path / "other", tiny_tokenizer, num_layers=4, seed=2)
    out = tmp_path / "bad"
    assert _train(store, out, "--teacher", str(other), "--data-dir", str(glue_dir)) == 2
    err = _one_error(capsys.readouterr().err)
    expected = open_store(store).meta["teacher"]["weights_hash"]
    assert "is not the store's teacher" in err and expected in err
    assert not out.exists()


def test_expect_store(store, tmp_path, glue_dir, capsys):
    address = getattr(open_store(store), "content_address", None)
    if address is None:
        pytest.skip("this hskstore has no content address")
    assert _train(store, tmp_path / "x", "--expect-store", "sha256:" + "0" * 64, "--data-dir", str(glue_dir)) == 2
    assert "--expect-store" in _one_error(capsys.readouterr().err) and not (tmp_path / "x").exists()
    assert _train(store, tmp_path / "y", "--expect-store", address, "--data-dir", str(glue_dir), "--method", "kd") == 0
    assert _summary(tmp_path / "y")["store_content_address"] == address


@pytest.mark.parametrize("bad", [["--batch-size", "0"], ["--max-steps", "0"], ["--eval-every", "-1"],
                                 ["--method", "kd", "--alpha", "2"], ["--method", "mud", "--lr-hsk", "0"]])
def test_bad_values_are_refused_not_replaced(store, tmp_path, bad, capsys):
    out = tmp_path / "r"
    assert main(["train", "--store", store, "--student", "bert2", "--out", str(out), *bad]) == 2
    _one_error(capsys.readouterr().err)
    assert not out.exists()


def test_full_disk_one_line_and_no_temporary_file(store, tmp_path, glue_dir, monkeypatch, capsys):
    import pipelines.core.run_state as run_state

    def full(obj, path):
        Path(path).write_bytes(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file "
                           "data/3: file write failed")

    monkeypatch.setattr(run_state.torch, "save", full)
    out = tmp_path / "r"
    assert _train(store, out, "--method", "kd", "--data-dir", str(glue_dir)) == 2
    assert _one_error(capsys.readouterr().err).startswith("hsk: error: disk full")
    assert not list(out.rglob("*.tmp"))


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_out_that_is_not_a_run_is_refused_untouched(store, tmp_path, glue_dir, capsys):
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("keep me")
    (mine / "sub" / "data.csv").write_text("a,b\n1,2\n")
    before = _digest(mine)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for target in (mine, a_file, Path(store)):
        assert _train(store, target, "--data-dir", str(glue_dir)) == 2
        _one_error(capsys.readouterr().err)
    assert _digest(mine) == before and a_file.read_text() == "x"
    # a sweep's work dir follows the same rule
    code = main(["sweep", "--source", store, "--configs", "pred-only", "--work-dir", str(mine), "--max-steps", "1",
                 "--data-dir", str(glue_dir)])
    assert code == 2 and _digest(mine) == before


def test_a_run_folder_is_marked_and_reruns_resume(store, tmp_path, glue_dir):
    from hskstore.io.outputs import output_kind

    out = tmp_path / "r"
    assert _train(store, out, "--method", "kd", "--data-dir", str(glue_dir)) == 0
    assert output_kind(str(out)) == "train-run"
    assert _train(store, out, "--method", "kd", "--data-dir", str(glue_dir)) == 0  # finished: says so



def test_online_mode_from_the_command_line_computes_the_targets_it_is_given(teacher_dir, glue_dir, tmp_path):
    """--teacher without --store: the task kind's own flags (--task, --config, --limit, --shard-rows, ...) reach the
    live teacher; the run's identity is recorded in its summary."""
    out = tmp_path / "online"
    assert main(["train", "--teacher", str(teacher_dir), "--task", "sst2", "--config", "2,4,0.5", "--student-layers",
                 "2", "--limit", "16", "--shard-rows", "8", "--student", "bert2", "--out", str(out),
                 "--data-dir", str(glue_dir), *FAST]) == 0
    summary = _summary(out)
    assert (summary["mode"], summary["config"], summary["steps"]) == ("online", "2,4,0.5", 2)  # mud: 2 stages
    assert summary["identity"]["mode"] == "online" and summary["identity"]["options"]["train_limit"] == 16
