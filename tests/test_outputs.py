"""The one output rule (hskstore.io.outputs): what is refused, what is replaced, and that nothing else is touched."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

import pytest
from conftest import dump_args as shared_dump_args

from hskstore.io.outputs import MARKER, OutputError, claim_output, mark_output, output_kind, staged_replace


def tree_hashes(root: Path) -> dict[str, str]:
    """Every file under root (symlinks not followed) -> sha256 of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@pytest.fixture
def user_folder(tmp_path) -> Path:
    folder = tmp_path / "mine"
    (folder / "sub").mkdir(parents=True)
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "sub" / "data.csv").write_text("a,b\n1,2\n")
    return folder


def test_nothing_there_and_empty_folder_are_new(tmp_path):
    assert output_kind(str(tmp_path / "absent")) is None
    (tmp_path / "empty").mkdir()
    assert claim_output(str(tmp_path / "empty"), "run", overwrite=False) == "new"


def test_foreign_paths_are_refused_untouched(tmp_path, user_folder, monkeypatch):
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "link").symlink_to(user_folder)
    (tmp_path / "group").mkdir()
    (tmp_path / "group" / "zarr.json").write_text(
        json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {"mine": 1}})
    )
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    before = tree_hashes(tmp_path)
    for path, words in [
        (user_folder, "not an hsk output"),
        (tmp_path / "file.txt", "is a file"),
        (tmp_path / "link", "symbolic link"),
        (tmp_path / "group", "not an hsk store"),
        (".", "working directory"),
    ]:
        for overwrite in (False, True):
            with pytest.raises(OutputError, match=words):
                claim_output(str(path), "store", overwrite=overwrite)
    with pytest.raises(OutputError, match="working directory"):
        claim_output(str(tmp_path), "run", overwrite=True)  # an ancestor of the cwd
    assert tree_hashes(tmp_path) == before


def test_marked_output_kinds(tmp_path):
    run = tmp_path / "run"
    mark_output(str(run), "run", command="train")
    assert output_kind(str(run)) == "run"
    assert claim_output(str(run), "run", overwrite=False) == "resume"
    assert claim_output(str(run), "run", overwrite=True) == "replace"
    with pytest.raises(OutputError, match="holds a run, not a store"):
        claim_output(str(run), "store", overwrite=True)
    assert json.loads((run / MARKER).read_text())["command"] == "train"


def test_staged_replace_swaps_only_on_success(tmp_path):
    run = tmp_path / "run"
    mark_output(str(run), "run")
    (run / "result.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with staged_replace(str(run)) as staged:
            mark_output(staged, "run")
            (Path(staged) / "result.txt").write_text("half")
            raise RuntimeError("killed")
    assert (run / "result.txt").read_text() == "old"
    with staged_replace(str(run)) as staged:
        assert Path(staged).parent == tmp_path and Path(staged).name.startswith(".run.")
        assert str(os.getpid()) in Path(staged).name
        mark_output(staged, "run")
        (Path(staged) / "result.txt").write_text("new")
    assert (run / "result.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".run.hsk-old")) == []


def test_fsspec_outputs(tmp_path):
    url = f"memory://hsk-outputs-{os.getpid()}/run"
    assert output_kind(url) is None
    mark_output(url, "run")
    assert output_kind(url) == "run"
    with staged_replace(url) as staged:
        mark_output(staged, "run", version=2)
    import fsspec

    fs = fsspec.filesystem("memory")
    assert json.loads(fs.cat_file(f"/hsk-outputs-{os.getpid()}/run/{MARKER}"))["version"] == 2


# --- the rule applied to stores: `hsk dump --out` and `hsk derive --out` --------------------------------------


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    from conftest import save_tiny_teacher

    return save_tiny_teacher(tmp_path_factory.mktemp("teacher"), tiny_tokenizer, num_layers=2, seed=4)


dump_args = functools.partial(shared_dump_args, rows=16)


@pytest.fixture(scope="module")
def source_store(tmp_path_factory, teacher_dir, glue_dir) -> Path:
    from pipelines.cli import main

    out = tmp_path_factory.mktemp("source") / "big.zarr"
    assert main(dump_args(teacher_dir, glue_dir, out)) == 0
    return out


def foreign_outputs(root: Path, user_folder: Path) -> list[tuple[str, str]]:
    """(--out value, words of the refusal) for everything that is not an hsk store."""
    (root / "file.txt").write_text("precious\n")
    (root / "link").symlink_to(user_folder)
    mark_output(str(root / "run"), "run")
    (root / "run" / "summary.json").write_text("{}")
    return [(str(user_folder), "not an hsk output"), (str(root / "file.txt"), "is a file"),
            (".", "working directory"), (str(root / "link"), "symbolic link"),
            (str(root / "run"), "holds a run, not a store")]


def test_dump_and_derive_never_write_into_foreign_paths(tmp_path, user_folder, teacher_dir, glue_dir, source_store,
                                                        capsys, monkeypatch):
    from pipelines.cli import main

    cases = foreign_outputs(tmp_path, user_folder)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    before = tree_hashes(tmp_path)
    for out, words in cases:
        for extra in ([], ["--overwrite"]):
            assert main(dump_args(teacher_dir, glue_dir, out, *extra)) == 2, out
            err = capsys.readouterr().err
            assert words in err and err.count("\n") == 1 and "Traceback" not in err, err
            assert main(["derive", str(source_store), "--config", "1,2,0.25", "--out", out, "--no-progress",
                         *extra]) == 2
            err = capsys.readouterr().err
            assert words in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert tree_hashes(tmp_path) == before  # every user byte identical
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == []


def test_overwrite_replaces_a_store_with_a_store(tmp_path, source_store, capsys):
    from hskstore import open_store
    from pipelines.cli import main

    out = tmp_path / "small.zarr"
    assert main(["derive", str(source_store), "--config", "1,2,0.25", "--out", str(out), "--no-progress"]) == 0
    assert main(["derive", str(source_store), "--config", "1,2,0.25", "--out", str(out), "--no-progress"]) == 0
    assert "already complete, nothing to do" in capsys.readouterr().out
    assert main(["derive", str(source_store), "--config", "2,2,0.25", "--out", str(out), "--no-progress"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["derive", str(source_store), "--config", "2,2,0.25", "--out", str(out), "--no-progress",
                 "--overwrite"]) == 0
    assert open_store(str(out)).meta["selection"]["config"] == "2,2,0.25"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.zarr"]  # nothing staged is left behind


def test_output_kinds_of_the_commands(tmp_path):
    """pipelines.core.output_kinds: a run resumes; a teacher is built whole, so a rerun needs --overwrite."""
    from pipelines.core.output_kinds import RUN, TEACHER

    mark_output(str(tmp_path / "run"), RUN.name)
    mark_output(str(tmp_path / "teacher"), TEACHER.name)
    assert RUN.claim(str(tmp_path / "run"), overwrite=False) == "resume"
    assert TEACHER.claim(str(tmp_path / "new"), overwrite=False) == "new"
    assert TEACHER.claim(str(tmp_path / "teacher"), overwrite=True) == "replace"
    with pytest.raises(OutputError, match="already holds a teacher: pass --overwrite"):
        TEACHER.claim(str(tmp_path / "teacher"), overwrite=False)
    with pytest.raises(OutputError, match="holds a train-run, not a teacher"):
        TEACHER.claim(str(tmp_path / "run"), overwrite=True)
