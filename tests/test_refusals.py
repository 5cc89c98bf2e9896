"""Issue 34 items 9, 10, 12, 14 and issue 39 item 5: numbers out of range, tracebacks where a user typed
something plausible, object store errors, `hsk upgrade` killed midway, and hints that must work when
followed. Each through the real CLI, with the user's folder hashed before and after."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from conftest import save_tiny_teacher

from pipelines.cli import main


def folder_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under root by relative path, and every folder (None): what the user has."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            for p in sorted(root.rglob("*"))}


def one_line(capsys, code: int, *words: str) -> str:
    """The command's only output line, `hsk: error: ...` with exit status 2, holding every word."""
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code == 2, text
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hsk: error: "), text
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, tiny_tokenizer) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher") / "t", tiny_tokenizer, num_layers=4, seed=5)


def dump_args(teacher: Path, glue_dir: Path, out, *extra: str, config: str = "3,4,0.25") -> list[str]:
    return ["dump", "--task", "sst2", "--teacher", str(teacher), "--config", config, "--data-dir", str(glue_dir),
            "--limit", "16", "--shard-rows", "8", "--max-length", "32", "--no-progress", "--device", "cpu",
            "--out", str(out), *extra]


@pytest.fixture(scope="module")
def store(tmp_path_factory, teacher, glue_dir) -> Path:
    out = tmp_path_factory.mktemp("store") / "s.zarr"
    assert main(dump_args(teacher, glue_dir, out)) == 0
    return out


# -- issue 34 item 9: numbers out of range are refused as the arguments are read ----------------------------


@pytest.mark.parametrize("args, words", [
    (["train", "--lr-hsk", "inf"], ["--lr-hsk takes a finite number, got inf"]),
    (["train", "--lr-hsk", "nan"], ["--lr-hsk takes a finite number, got nan"]),
    (["train", "--temperature", "nan"], ["--temperature takes a finite number, got nan"]),
    (["train", "--lr", "1e999"], ["--lr takes a finite number"]),
    (["train", "--set", "lr_hsk=inf"], ["option lr_hsk takes a finite number, got inf"]),
    (["train", "--seed", "-1"], ["--seed takes a seed in 0..4294967295, got -1"]),
    (["train", "--seed", "18446744073709551616"], ["--seed", "got 18446744073709551616"]),
    (["teacher", "--task", "sst2", "--epochs", "inf"], ["--epochs takes a finite number"]),
    (["teacher", "--task", "sst2", "--seed", "-1"], ["--seed takes a seed"]),
    (["sweep", "--source", "s.zarr", "--configs", "1,2,0.1", "--students", "bert3", "--seeds", "0,-1"],
     ["--seeds takes a seed", "got -1"]),
])
def test_out_of_range_numbers_are_one_line(store, tmp_path, capsys, monkeypatch, args, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("the user's file")
    if args[0] == "train":
        args = [*args, "--store", str(store), "--student", "bert3", "--out", "run", "--device", "cpu"]
    else:
        args = [*args, "--out", "out"] if args[0] == "teacher" else args
    before, store_before = folder_hashes(tmp_path), folder_hashes(store)
    one_line(capsys, main(args), *words)
    assert folder_hashes(tmp_path) == before and folder_hashes(store) == store_before


def test_a_reference_student_deeper_than_the_teacher_is_refused_and_the_advice_works(teacher, glue_dir, tmp_path,
                                                                                   capsys):
    before = folder_hashes(tmp_path)
    line = one_line(capsys, main(dump_args(teacher, glue_dir, tmp_path / "s.zarr", "--student-layers", "1000")),
                    "--student-layers 1000 is deeper than the teacher's 4 layers", "[3, 3, 3]")
    assert folder_hashes(tmp_path) == before
    advised = line.rsplit("pass --student-layers ", 1)[1]
    assert main(dump_args(teacher, glue_dir, tmp_path / "s.zarr", "--student-layers", advised)) == 0
    capsys.readouterr()
    assert main(["info", str(tmp_path / "s.zarr")]) == 0
    assert "teacher [1, 2, 3]" in capsys.readouterr().out  # three distinct teacher layers
