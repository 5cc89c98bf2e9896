"""The CLI's refusals and their advice: numbers out of range, tracebacks where a user typed
something plausible, object store errors, `hsk upgrade` killed midway, and hints that must work when
followed. Each through the real CLI, with the user's folder hashed before and after."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest
from conftest import dump_args as shared_dump_args
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


dump_args = functools.partial(shared_dump_args, config="3,4,0.25", rows=16)


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
    (["train", "--seed", "-1"], ["--seed must be an integer >= 0, got -1"]),
    (["train", "--seed", "18446744073709551616"], ["--seed must be at most 4294967295", "got 18446744073709551616"]),
    (["teacher", "--task", "sst2", "--epochs", "inf"], ["--epochs takes a finite number"]),
    (["teacher", "--task", "sst2", "--seed", "-1"], ["--seed must be an integer >= 0"]),
    (["sweep", "--source", "s.zarr", "--configs", "1,2,0.1", "--students", "bert3", "--seeds", "0,-1"],
     ["--seeds must be an integer >= 0, got -1"]),
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


# -- issue 34 item 10: one line, nothing left behind ----------------------------------------------------------


REPO = Path(__file__).resolve().parents[1]


def hsk(*args: str, env: dict | None = None, cwd: Path | None = None) -> tuple[int, str]:
    """`hsk ARGS` as a user runs it (a new process: what Python prints at exit is seen too); env values None
    are unset. Returns (exit status, stdout + stderr)."""
    full = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    full.update({k: v for k, v in (env or {}).items() if v is not None})
    for key in [k for k, v in (env or {}).items() if v is None] + ["HSK_DEBUG"]:
        full.pop(key, None)
    proc = subprocess.run([sys.executable, "-c", "from pipelines.cli import run; run()", *args], env=full, cwd=cwd,
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def only_line(code: int, text: str, *words: str) -> str:
    assert code == 2, text
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hsk: error: "), text
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_file_urls_are_written_as_the_local_path(store, teacher, glue_dir, tmp_path, capsys):
    out, derived = tmp_path / "f.zarr", tmp_path / "d.zarr"
    assert main(dump_args(teacher, glue_dir, f"file://{out}")) == 0
    assert main(["derive", f"file://{out}", "--config", "1,4,0.25", "--out", f"file://{derived}"]) == 0
    assert main(["verify", str(derived)]) == 0 and main(["verify", f"file://{out}"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.zarr", "f.zarr"]


@pytest.mark.parametrize("extra, words", [
    (["--out", "ftp://nonexistent.invalid/s.zarr"], ["storage host is unknown", "host name"]),
    (["--device", "meta", "--out", "o.zarr"], ["--device meta", "cpu, cuda"]),
    (["--scheduler", "bogus://x", "--out", "o.zarr"], ["--scheduler 'bogus://x' is not a dask scheduler address"]),
    (["--out", ""], ["--out needs a value"]),
])
def test_plausible_dump_mistakes_are_one_line_and_leave_nothing(teacher, glue_dir, tmp_path, extra, words):
    (tmp_path / "keep.txt").write_text("the user's file")
    before = folder_hashes(tmp_path)
    args = [a for a in dump_args(teacher, glue_dir, "unused") if a not in ("--out", "unused")]
    only_line(*hsk(*args, *extra, cwd=tmp_path), *words)
    assert folder_hashes(tmp_path) == before


@pytest.mark.parametrize("student, words", [("sps0", ["student sps0", "at least one layer", "sps3"]),
                                            ("bert0", ["student bert0", "bert3"]),
                                            ("bert9", ["bert9 needs 1..4 layers"])])
def test_a_student_of_no_layers_or_too_many_is_one_line_without_a_wrong_hint(store, glue_dir, tmp_path, capsys,
                                                                               student, words):
    before = folder_hashes(tmp_path)
    line = one_line(capsys, main(["train", "--store", str(store), "--student", student, "--out",
                                  str(tmp_path / "run"), "--device", "cpu", "--data-dir", str(glue_dir)]), *words)
    assert "moved" not in line  # the teacher is where the store says: nothing moved
    assert folder_hashes(tmp_path) == before


def test_pack_to_an_empty_name_and_a_catalog_of_an_unknown_scheme_are_one_line(store, tmp_path, capsys,
                                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    before, store_before = folder_hashes(tmp_path), folder_hashes(store)
    one_line(capsys, main(["pack", str(store), ""]), "OUT needs a value")
    one_line(capsys, main(["catalog", "bogus://x"]), "unknown URL scheme bogus://")
    assert folder_hashes(tmp_path) == before and folder_hashes(store) == store_before


def test_a_croissant_that_is_not_json_is_rendered_again_by_the_rerun(store, teacher, glue_dir, tmp_path, capsys):
    copy = Path(shutil.copytree(store, tmp_path / "s.zarr"))
    (copy / "croissant.json").write_text("not json {")
    assert main(dump_args(teacher, glue_dir, copy)) == 0
    assert "restored croissant.json" in capsys.readouterr().out
    assert json.loads((copy / "croissant.json").read_text()) == json.loads((store / "croissant.json").read_text())
    assert main(["verify", str(copy)]) == 0


def test_a_bundle_with_names_zarr_rejects_is_one_line_and_nothing_after_it(store, tmp_path):
    bundle = tmp_path / "s.hsk.zip"
    assert main(["pack", str(store), str(bundle)]) == 0
    with zipfile.ZipFile(bundle, "a") as zf:
        for name in ("/abs/zarr.json", "../up/zarr.json"):
            zf.writestr(name, '{"zarr_format": 3, "node_type": "group", "attributes": {}}')
    before = folder_hashes(tmp_path)
    for command in (["info", str(bundle)], ["verify", str(bundle)], ["unpack", str(bundle), str(tmp_path / "u")]):
        only_line(*hsk(*command), "not a trustworthy bundle", "not a plain relative name")  # no asyncio noise after
    assert folder_hashes(tmp_path) == before


# -- issue 34 item 12: object store errors say what is wrong ---------------------------------------------------


@pytest.mark.slow
def test_wrong_secret_and_unreachable_endpoint_are_named_and_the_store_is_not_called_damaged(
        s3, teacher, glue_dir, tmp_path, capsys):
    from s3_server import BUCKET

    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/s.zarr"
    assert main(dump_args(teacher, glue_dir, url)) == 0
    capsys.readouterr()
    (tmp_path / "keep.txt").write_text("the user's file")
    before = folder_hashes(tmp_path)
    commands = [["info", url], ["verify", url], ["catalog", url.rsplit("/", 1)[0]], ["export", url, "x.parquet"],
                ["derive", url, "--config", "1,4,0.25", "--out", url + "-d"],
                [*dump_args(teacher, glue_dir, url + "-2")],
                ["train", "--store", url, "--student", "bert3", "--out", "run", "--no-eval", "--device", "cpu"]]
    for env, words in (({"AWS_SECRET_ACCESS_KEY": "wrong"}, ["refused access (HTTP 403", "AWS_SECRET_ACCESS_KEY"]),
                       # one attempt: botocore's retries of a refused connection (~20 s of backoff) are not tested
                       ({"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"},
                        ["cannot be reached", "AWS_ENDPOINT_URL"])):
        for command in commands:
            line = only_line(*hsk(*command, env={**s3.env, **env, "AWS_PROFILE": None}, cwd=tmp_path), *words)
            assert "damaged" not in line
    assert folder_hashes(tmp_path) == before
    assert main(["verify", url]) == 0  # with the right secret the store is, as it was, complete and intact


# -- issue 34 item 14: `hsk upgrade` killed midway, croissant.json, and `hsk info` -------------------------------


def test_upgrade_killed_after_its_metadata_is_finished_by_the_rerun(store, tmp_path, capsys):
    old = Path(shutil.copytree(store, tmp_path / "s.zarr"))
    doc = json.loads((old / "zarr.json").read_text())
    meta = doc["attributes"]["hsk"]
    meta["format_version"] = 1
    del meta["manifest"]
    (old / "zarr.json").write_text(json.dumps(doc))
    for name in ("README.md", "croissant.json"):  # a format-1 store from before cards and Croissant
        (old / name).unlink()
    data = {k: v for k, v in folder_hashes(old).items() if not k.startswith(".") and k != "zarr.json"}

    code, text = hsk("upgrade", str(old), env={"HSK_FAULT": "upgrade-after-metadata"})
    assert code == 86, text  # killed between the metadata and the card
    assert not (old / "README.md").exists() and not (old / "croissant.json").exists()
    assert main(["upgrade", str(old)]) == 0
    said = capsys.readouterr().out
    assert "restored README.md and croissant.json" in said and "nothing to do" not in said
    croissant = json.loads((old / "croissant.json").read_text())
    assert croissant["@type"] == "sc:Dataset" and croissant["name"]
    assert main(["upgrade", str(old)]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert main(["info", str(old)]) == 0
    assert "upgraded   from format v1 by hsk" in capsys.readouterr().out
    assert main(["verify", str(old)]) == 0
    after = {k: v for k, v in folder_hashes(old).items() if not k.startswith(".") and k not in
             ("zarr.json", "README.md", "croissant.json")}
    assert after == data  # the data is untouched


def test_an_upgrade_writes_croissant_json(store, tmp_path, capsys):
    old = Path(shutil.copytree(store, tmp_path / "s.zarr"))
    doc = json.loads((old / "zarr.json").read_text())
    del doc["attributes"]["hsk"]["manifest"]
    (old / "zarr.json").write_text(json.dumps(doc))
    (old / "croissant.json").unlink()
    assert main(["upgrade", str(old)]) == 0
    assert json.loads((old / "croissant.json").read_text())["name"]


# -- issue 39 item 5: every hint hsk prints works when followed ---------------------------------------------------
# The hints of the errors a newcomer meets first, each followed as written (placeholders filled in): the command
# it names then runs. Hints elsewhere: test_dump_cli (--overwrite on a dump), test_cli_preflight (a moved teacher,
# --attention-rows), test_store_tampering (hsk upgrade).


def train_args(store, out: Path, glue_dir: Path, student: str, *extra: str) -> list[str]:
    return ["train", "--store", str(store), "--student", student, "--out", str(out), "--max-steps", "1",
            "--batch-size", "8", "--eval-limit", "8", "--no-progress", "--workers", "1", "--device", "cpu",
            "--data-dir", str(glue_dir), *extra]


def test_a_base_encoder_as_teacher_the_advice_makes_a_teacher(tiny_base_dir, glue_dir, tmp_path, capsys):
    line = one_line(capsys, main(dump_args(tiny_base_dir, glue_dir, tmp_path / "s.zarr")), "not a fine-tuned")
    advised = line.split("Fine-tune it first: ", 1)[1].split()
    assert advised[:2] == ["hsk", "teacher"] and "minilm" not in line  # no base encoder offered as a teacher
    teacher = tmp_path / "t"
    args = [a if a != "TASK" else "sst2" for a in advised[1:]]
    assert main([*args, "--data-dir", str(glue_dir), "--train-limit", "16", "--eval-limit", "8", "--epochs", "1",
                 "--no-progress", "--device", "cpu", "--out", str(teacher)]) == 0
    assert main(dump_args(teacher, glue_dir, tmp_path / "s.zarr", config="1,4,0.25")) == 0


def test_a_missing_teacher_folder_is_shown_absolute_and_not_offered_minilm(glue_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = one_line(capsys, main(dump_args("./nothere/t", glue_dir, "s.zarr")), "hsk teacher --task TASK")
    assert f"no such folder: {tmp_path / 'nothere' / 't'}." in line and "'minilm' for" not in line
    line = one_line(capsys, main(dump_args("nothere/t", glue_dir, "s.zarr")), "hsk teacher --task TASK")
    assert f"not a local folder (no {tmp_path / 'nothere' / 't'})" in line  # a hub id, or a relative folder
    assert list(tmp_path.iterdir()) == []


def test_a_student_too_shallow_for_the_store_both_advices_work(store, glue_dir, tmp_path, teacher, capsys):
    line = one_line(capsys, main(train_args(store, tmp_path / "r", glue_dir, "bert1")), "one to one")
    derive = line.split("(hsk derive STORE --config ", 1)[1].split(")", 1)[0]  # N,NL,W
    layers = derive.split(",")[0]
    assert main(["derive", str(store), "--config", f"{layers},4,0.25", "--out", str(tmp_path / "d.zarr")]) == 0
    assert main(train_args(tmp_path / "d.zarr", tmp_path / "r1", glue_dir, "bert1")) == 0
    depth = line.rsplit("--student-layers ", 1)[1].strip()
    assert main(dump_args(teacher, glue_dir, tmp_path / "s1.zarr", "--student-layers", depth, config="2,4,0.25")) == 0
    assert main(train_args(tmp_path / "s1.zarr", tmp_path / "r2", glue_dir, "bert1")) == 0


def test_too_many_layers_for_the_teacher_the_advice_works(teacher, glue_dir, tmp_path, capsys):
    line = one_line(capsys, main(dump_args(teacher, glue_dir, tmp_path / "s.zarr", config="7,4,0.25")),
                    "only 5 hidden states")
    keep = line.split("keep at most N^D=", 1)[1].split()[0]
    depth = line.split("with --student-layers ", 1)[1].split(",")[0]
    assert main(dump_args(teacher, glue_dir, tmp_path / "s.zarr", "--student-layers", depth,
                          config=f"{keep},4,0.25")) == 0


@pytest.mark.parametrize("command", ["pack", "export"])
def test_an_existing_output_the_overwrite_advice_works(store, tmp_path, capsys, command):
    out = tmp_path / ("s.hsk.zip" if command == "pack" else "s.parquet")
    assert main([command, str(store), str(out)]) == 0
    capsys.readouterr()
    line = one_line(capsys, main([command, str(store), str(out)]), "--overwrite")
    assert str(tmp_path) in line  # the path in full
    assert main([command, str(store), str(out), "--overwrite"]) == 0


@pytest.mark.parametrize("foreign", ["s.hsk.zip", "s.croissant.json", "u"])
def test_a_foreign_file_is_never_offered_overwrite(store, tmp_path, capsys, foreign):
    (tmp_path / foreign).write_text("the user's file")
    before = folder_hashes(tmp_path)
    command = ["unpack", str(tmp_path / "s.hsk.zip"), str(tmp_path / "u")] if foreign == "u" else \
        ["pack", str(store), str(tmp_path / "s.hsk.zip")]
    if foreign == "u":
        assert main(["pack", str(store), str(tmp_path / "s.hsk.zip")]) == 0
        capsys.readouterr()
        before = folder_hashes(tmp_path)
    line = one_line(capsys, main(command), "never replaced")
    assert "--overwrite" not in line
    one_line(capsys, main([*command, "--overwrite"]), "never replaced")  # as the line said: never
    assert folder_hashes(tmp_path) == before
