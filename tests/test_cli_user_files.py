"""Trust, driven through the real CLI: never touch a user's files, refuse a teacher that does not fit,
check every option before anything on disk changes, and let a store travel between folders."""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import dump_args as shared_dump_args
from conftest import make_tiny_bert, save_tiny_teacher, tree_hashes

from hskstore.io.writer import StoreWriter
from pipelines.cli import main

DATA_ROWS = 24


def user_folder(root: Path) -> Path:
    """A folder as a user has them: notes and data, nothing hsk made."""
    (root / "sub").mkdir(parents=True)
    (root / "notes.txt").write_text("my notes\n")
    (root / "sub" / "data.csv").write_text("a,b\n1,2\n")
    return root


def labelled_teacher(out: Path, tokenizer_dir: Path, labels: list[str] | None, *, seed: int = 1) -> Path:
    """A tiny 'fine-tuned' teacher whose config names its labels (None: transformers' generic LABEL_i)."""
    from transformers import AutoTokenizer

    model = make_tiny_bert(num_layers=2, seed=seed, num_labels=len(labels) if labels else 2)
    if labels:
        model.config.id2label = dict(enumerate(labels))
        model.config.label2id = {name: i for i, name in enumerate(labels)}
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    return out


dump_args = functools.partial(shared_dump_args, rows=DATA_ROWS, split="train")


def refused(capsys, code: int, *words: str) -> str:
    captured = capsys.readouterr()
    err = captured.err
    assert code == 2, err
    assert "hsk: error:" in err and "Traceback" not in err + captured.out, err
    # one message line; progress bars (loading weights, dump) are not messages
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip() and "%|" not in ln]
    assert len(lines) == 1, err
    for word in words:
        assert word in err, err
    return err


@pytest.fixture(scope="module")
def sst2_teacher(tmp_path_factory, tiny_tokenizer) -> Path:
    return labelled_teacher(tmp_path_factory.mktemp("t") / "sst2-teacher", tiny_tokenizer, ["negative", "positive"])


@pytest.fixture(scope="module")
def store(tmp_path_factory, sst2_teacher, glue_dir) -> Path:
    out = tmp_path_factory.mktemp("s") / "sst2.zarr"
    assert main(dump_args(sst2_teacher, glue_dir, out)) == 0
    return out


# --------------------------------------------------------------------------------------------------
# The output rule for hsk teacher, hsk quickstart and hsk report


def _occupied(kind: str, tmp_path: Path, store: Path) -> tuple[Path, Path]:
    """(path to pass as --out, folder whose bytes must not change)."""
    if kind == "folder":
        return user_folder(tmp_path / "mine"), tmp_path / "mine"
    if kind == "file":
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "out").write_text("precious\n")
        return tmp_path / "mine" / "out", tmp_path / "mine"
    if kind == "cwd":
        user_folder(tmp_path / "mine")
        os.chdir(tmp_path / "mine")
        return Path("."), tmp_path / "mine"
    if kind == "symlink":
        user_folder(tmp_path / "mine" / "real")
        (tmp_path / "mine" / "link").symlink_to(tmp_path / "mine" / "real", target_is_directory=True)
        return tmp_path / "mine" / "link", tmp_path / "mine"
    assert kind == "store"  # another kind of hsk output
    shutil.copytree(store, tmp_path / "mine" / "s.zarr")
    return tmp_path / "mine" / "s.zarr", tmp_path / "mine"


def _results_table(path: Path) -> Path:
    from pipelines.sweep.results import append_results

    rows = [
        {"run_id": f"{c}-s{s}", "config": c, "kind": "hsk", "amount_hsk": a, "value_dtype": "float16",
         "student": "bert2", "seed": s, "metric_name": "accuracy", "metric": 0.7 + a / 100 + s / 100}
        for c, a in (("1,9,0.1", 0.9), ("3,8,0.2", 4.8)) for s in (0, 1)
    ]
    append_results(path, rows)
    return path


WRITERS = {
    "teacher": lambda out, d: ["teacher", "--task", "sst2", "--base", str(d["base"]), "--data-dir", str(d["glue"]),
                               "--train-limit", "16", "--eval-limit", "8", "--epochs", "1", "--out", str(out)],
    "teacher-mlm": lambda out, d: ["teacher", "--objective", "mlm", "--base", str(d["base"]), "--text-file",
                                   str(d["corpus"]), "--epochs", "1", "--max-length", "32", "--out", str(out)],
    "quickstart": lambda out, d: ["quickstart", "--data-dir", str(d["glue"]), "--out", str(out)],
    "student-build": lambda out, d: ["student", "build", "rosita", "--teacher", str(d["teacher"]), "--task", "sst2",
                                     "--layers", "1", "--heads", "2", "--ffn", "16", "--emb-rank", "8", "--data-dir",
                                     str(d["glue"]), "--train-limit", "16", "--device", "cpu", "--out", str(out)],
    "report": lambda out, d: ["report", str(d["results"]), "--out", str(out)],
}


@pytest.mark.parametrize("command", sorted(WRITERS))
@pytest.mark.parametrize("kind", ["folder", "file", "cwd", "symlink", "store"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_writers_refuse_what_is_not_theirs(command, kind, overwrite, tmp_path, store, tiny_base_dir, glue_dir,
                                           sst2_teacher, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a first sentence\nand a second one\n")
    deps = {"base": tiny_base_dir, "glue": glue_dir, "results": _results_table(tmp_path / "r.parquet"),
            "corpus": corpus, "teacher": sst2_teacher}
    out, guarded = _occupied(kind, tmp_path, store)
    before = tree_hashes(guarded)
    args = WRITERS[command](out, deps) + (["--overwrite"] if overwrite else [])
    refused(capsys, main(args), "choose another --out" if kind != "symlink" else "symbolic link")
    assert tree_hashes(guarded) == before
    assert not [p for p in guarded.parent.iterdir() if ".hsk-" in p.name]  # no staged leftovers


def test_teacher_overwrite_replaces_only_a_teacher(tmp_path, tiny_base_dir, glue_dir, capsys):
    out = tmp_path / "teacher"
    args = WRITERS["teacher"](out, {"base": tiny_base_dir, "glue": glue_dir})
    assert main(args) == 0
    first = json.loads((out / "hsk_teacher.json").read_text())
    assert json.loads((out / ".hsk-output.json").read_text())["kind"] == "teacher"
    capsys.readouterr()
    refused(capsys, main(args), "already holds a teacher", "--overwrite")
    assert main([*args, "--overwrite", "--seed", "3"]) == 0
    second = json.loads((out / "hsk_teacher.json").read_text())
    assert second["seed"] == 3 and second["weights_hash"] != first["weights_hash"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["teacher"]  # the staged copy was swapped in


def test_mlm_teacher_follows_the_teacher_rule(tmp_path, tiny_base_dir, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"sentence number {i} of the corpus\n" for i in range(24)))
    out = tmp_path / "mlm"
    args = WRITERS["teacher-mlm"](out, {"base": tiny_base_dir, "corpus": corpus}) + ["--no-progress"]
    assert main(args) == 0
    first = json.loads((out / "hsk_teacher.json").read_text())
    assert json.loads((out / ".hsk-output.json").read_text()) == {**json.loads((out / ".hsk-output.json").read_text()),
                                                                  "kind": "teacher", "objective": "mlm"}
    capsys.readouterr()
    refused(capsys, main(args), "already holds a teacher", "--overwrite")
    assert json.loads((out / "hsk_teacher.json").read_text()) == first  # untouched by the refusal
    assert main([*args, "--overwrite", "--seed", "3"]) == 0
    second = json.loads((out / "hsk_teacher.json").read_text())
    assert second["seed"] == 3 and second["weights_hash"] != first["weights_hash"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "mlm"]  # no work or staged folder left


def test_report_overwrite_replaces_only_a_report(tmp_path, capsys):
    results = _results_table(tmp_path / "r.parquet")
    out = tmp_path / "rep"
    assert main(["report", str(results), "--out", str(out)]) == 0
    assert (out / "marginal_utility.png").stat().st_size > 1000
    capsys.readouterr()
    refused(capsys, main(["report", str(results), "--out", str(out)]), "already holds a report")
    (out / "marginal_utility.md").write_text("stale")
    assert main(["report", str(results), "--out", str(out), "--overwrite"]) == 0
    assert "Marginal utility" in (out / "marginal_utility.md").read_text()
    assert oct(results.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # not owner-only


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --------------------------------------------------------------------------------------------------
# Validate before touching: a complete store survives every bad value given with --overwrite


@pytest.mark.parametrize(
    "option, value, words",
    [
        ("--batch-size", "0", ["--batch-size", ">= 1"]),
        ("--width-seed", "-1", ["--width-seed"]),
        ("--max-length", "1000", ["128 positions"]),
        ("--max-length", "0", ["--max-length"]),
        ("--shard-rows", "0", ["--shard-rows"]),
        ("--shard-rows", "-1", ["--shard-rows"]),
        ("--limit", "0", ["--limit"]),
        ("--device", "bogus", ["not a torch device"]),
        ("--tokens", "middle", ["--tokens"]),
    ],
)
def test_bad_values_never_touch_an_existing_store(option, value, words, store, sst2_teacher, glue_dir, tmp_path,
                                                  capsys):
    copy = tmp_path / "s.zarr"
    shutil.copytree(store, copy)
    before = tree_hashes(copy)
    args = dump_args(sst2_teacher, glue_dir, copy, "--overwrite")
    i = args.index(option) if option in args else None
    if i is None:
        args += [option, value]
    else:
        args[i + 1] = value
    refused(capsys, main(args), *words)
    assert tree_hashes(copy) == before
    assert main(["verify", str(copy)]) == 0


def test_empty_inputs_are_refused(sst2_teacher, tmp_path, capsys):
    data = tmp_path / "empty.tsv"
    data.write_text("sentence\tlabel\n")
    args = ["dump", "--task", "sst2", "--teacher", str(sst2_teacher), "--config", "1,2,0.5", "--data-file",
            str(data), "--no-progress", "--out", str(tmp_path / "s.zarr")]
    refused(capsys, main(args), "no examples")
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize(
    "name, payload, where",
    [
        ("bad.tsv", b"sentence\tlabel\ngood\t1\nbad \xff\xfe\t0\n", "bad.tsv:3"),
        ("bad.csv", b"sentence,label\ngood,1\nfine,0\nbad \xe9,1\n", "bad.csv:4"),
        ("bad.jsonl", b'{"sentence": "a", "label": 1}\n\n{"sentence": "b", "label": }\n', "bad.jsonl:3"),
        ("bad.json", b'[{"sentence": "a",\n "label": 1},\n {"sentence" "b"}]', "bad.json:3"),
    ],
)
def test_data_file_errors_name_the_file_and_line(name, payload, where, sst2_teacher, tmp_path, capsys):
    data = tmp_path / name
    data.write_bytes(payload)
    args = ["dump", "--task", "sst2", "--teacher", str(sst2_teacher), "--config", "1,2,0.5", "--data-file",
            str(data), "--no-progress", "--out", str(tmp_path / "s.zarr")]
    refused(capsys, main(args), where)
    assert not (tmp_path / "s.zarr").exists()


# --------------------------------------------------------------------------------------------------
# Teachers that do not fit


def test_base_encoder_and_teacher_without_tokenizer_are_refused(tiny_base_dir, tiny_tokenizer, glue_dir, tmp_path,
                                                                capsys):
    refused(capsys, main(dump_args(tiny_base_dir, glue_dir, tmp_path / "a.zarr")), "no trained classification head",
            "hsk teacher")
    bare = tmp_path / "no-tokenizer"
    make_tiny_bert(num_layers=2).save_pretrained(bare)
    refused(capsys, main(dump_args(bare, glue_dir, tmp_path / "b.zarr")), "has no tokenizer")
    assert not (tmp_path / "a.zarr").exists() and not (tmp_path / "b.zarr").exists()


def test_wrong_task_teacher_is_refused_on_dump_and_eval_unless_allowed(sst2_teacher, tiny_tokenizer, glue_dir,
                                                                       tmp_path, capsys):
    out = tmp_path / "q.zarr"
    qnli = ["--task", "qnli", "--split", "dev"]
    args = dump_args(sst2_teacher, glue_dir, out, task="qnli", split="dev")
    refused(capsys, main(args), "does not fit task qnli", "negative", "--allow-task-mismatch")
    assert not out.exists()
    eval_args = ["eval", str(sst2_teacher), *qnli, "--data-dir", str(glue_dir), "--limit", "8"]
    refused(capsys, main(eval_args), "does not fit task qnli")

    assert main([*args, "--allow-task-mismatch"]) == 0
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    assert "ANOTHER TASK'S TEACHER" in capsys.readouterr().out
    assert main(["info", str(out), "--json"]) == 0
    teacher = json.loads(capsys.readouterr().out)["meta"]["teacher"]
    assert teacher["task_fit"] == "mismatch allowed" and teacher["labels"] == ["negative", "positive"]
    assert main([*eval_args, "--allow-task-mismatch"]) == 0
    capsys.readouterr()

    # a different number of outputs cannot line up with the task's labels, allowed or not
    three = labelled_teacher(tmp_path / "mnli-teacher", tiny_tokenizer, ["entailment", "neutral", "contradiction"])
    refused(capsys, main(dump_args(three, glue_dir, out, "--allow-task-mismatch", "--overwrite")), "3 output(s)")
    refused(capsys, main(["eval", str(three), "--task", "sst2", "--data-dir", str(glue_dir)]), "3 output(s)")


def test_generic_labels_are_unknown_not_a_mismatch_and_the_task_is_recorded(tiny_tokenizer, glue_dir, tmp_path,
                                                                            capsys):
    generic = save_tiny_teacher(tmp_path / "generic", tiny_tokenizer, num_layers=2)
    assert main(dump_args(generic, glue_dir, tmp_path / "g.zarr", task="qnli", split="dev")) == 0
    capsys.readouterr()
    assert main(["info", str(tmp_path / "g.zarr")]) == 0
    assert "fit unknown" in capsys.readouterr().out
    # hsk_teacher.json (what `hsk teacher` writes) names the task even where the labels do not
    (generic / "hsk_teacher.json").write_text(json.dumps({"task": "mrpc"}))
    refused(capsys, main(dump_args(generic, glue_dir, tmp_path / "h.zarr")), "fine-tuned on mrpc")


# --------------------------------------------------------------------------------------------------
# Portable references: a store made with a relative teacher path, moved, used from a third folder


def test_moved_store_finds_its_teacher_from_anywhere(sst2_teacher, tiny_tokenizer, glue_dir, tmp_path, capsys,
                                                     monkeypatch):
    from hskstore.io.reader import open_store
    from pipelines.core.models import ModelLoadError, check_weights, resolve_teacher

    work = tmp_path / "work"
    shutil.copytree(sst2_teacher, work / "runs" / "teacher")
    monkeypatch.chdir(work)
    assert main(dump_args("runs/teacher", glue_dir, "s.zarr")) == 0
    shutil.move(work / "s.zarr", tmp_path / "elsewhere.zarr")
    (tmp_path / "third").mkdir()
    monkeypatch.chdir(tmp_path / "third")
    moved = str(tmp_path / "elsewhere.zarr")
    for args in (["info", moved], ["verify", moved], ["derive", moved, "--config", "1,2,0.25", "--out", "d.zarr"]):
        assert main(args) == 0, capsys.readouterr().err
    meta = open_store(moved).meta["teacher"]
    assert meta["path"] == str((work / "runs" / "teacher").resolve()) and meta["hub_id"] is None
    assert resolve_teacher(meta) == meta["path"]
    assert check_weights(resolve_teacher(meta), meta["weights_hash"], "teacher") == meta["weights_hash"]
    assert open_store(moved).meta["tokenizer"]["path"] == meta["path"]

    shutil.move(work / "runs" / "teacher", tmp_path / "moved-teacher")  # the teacher moves too
    with pytest.raises(ModelLoadError, match="--student-base") as exc:
        resolve_teacher(meta, flag="--student-base")
    assert meta["weights_hash"] in str(exc.value)
    assert resolve_teacher(meta, str(tmp_path / "moved-teacher")) == str(tmp_path / "moved-teacher")
    other = labelled_teacher(tmp_path / "other", tiny_tokenizer, ["negative", "positive"], seed=7)
    with pytest.raises(ModelLoadError, match=meta["weights_hash"]):
        check_weights(str(other), meta["weights_hash"], str(other))


# --------------------------------------------------------------------------------------------------
# Small things


def test_version_and_verify_help(capsys):
    from hskstore import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"hsk {__version__}"
    assert main(["verify", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "1 it is incomplete or damaged" in text and "2 there is no readable hsk store" in text
    assert main(["verify", "/no/such/store.zarr"]) == 2


def _dump_cut_by_ctrl_c(teacher: Path, glue_dir: Path, out: Path, monkeypatch) -> int:
    """Run `hsk dump` with Ctrl-C arriving as shard 1 is written (shard 0 is on disk); its exit code."""
    original = StoreWriter.write_shard

    def interrupted(self, shard, arrays):
        if shard == 1:
            raise KeyboardInterrupt
        return original(self, shard, arrays)

    monkeypatch.setattr(StoreWriter, "write_shard", interrupted)
    try:
        return main(dump_args(teacher, glue_dir, out))
    finally:
        monkeypatch.setattr(StoreWriter, "write_shard", original)


def test_ctrl_c_says_how_to_resume_and_the_rerun_finishes(sst2_teacher, glue_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "s.zarr"
    assert _dump_cut_by_ctrl_c(sst2_teacher, glue_dir, out, monkeypatch) == 130
    err = capsys.readouterr().err
    assert "interrupted: rerun the same command to resume" in err and "Traceback" not in err
    assert main(dump_args(sst2_teacher, glue_dir, out)) == 0
    assert "resuming" in capsys.readouterr().out
    assert main(["verify", str(out)]) == 0


def test_a_dump_resumes_after_its_teacher_folder_moved(sst2_teacher, tiny_tokenizer, glue_dir, tmp_path, capsys,
                                                       monkeypatch):
    """The store knows its teacher by its weights hash: the same weights at a new path resume the dump to
    the bytes of an uninterrupted one; other weights at that path are refused."""
    from test_dump import chunk_bytes

    from hskstore import open_store

    whole = tmp_path / "whole.zarr"
    assert main(dump_args(sst2_teacher, glue_dir, whole)) == 0
    teacher = tmp_path / "teacher"
    shutil.copytree(sst2_teacher, teacher)
    out = tmp_path / "s.zarr"
    assert _dump_cut_by_ctrl_c(teacher, glue_dir, out, monkeypatch) == 130
    shutil.move(teacher, tmp_path / "elsewhere")
    other = labelled_teacher(tmp_path / "other", tiny_tokenizer, ["negative", "positive"], seed=7)
    capsys.readouterr()
    refused(capsys, main(dump_args(other, glue_dir, out)), "different teacher")
    assert main(dump_args(tmp_path / "elsewhere", glue_dir, out)) == 0
    shown = capsys.readouterr().out
    assert "resuming" in shown and "the teacher is now loaded from" in shown
    assert chunk_bytes(out) == chunk_bytes(whole)
    store = open_store(str(out))
    assert store.meta["teacher"]["path"] == str(teacher.resolve())  # where it was first found
    assert store.meta["checksums"] == open_store(str(whole)).meta["checksums"]
    assert main(["verify", str(out)]) == 0


def test_control_characters_never_reach_the_terminal(sst2_teacher, glue_dir, tmp_path, capsys):
    evil = tmp_path / "t\x1b[31mred\x07"
    shutil.copytree(sst2_teacher, evil)
    out = tmp_path / "s.zarr"
    assert main(dump_args(evil, glue_dir, out)) == 0
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "\x07" not in shown and "t\\x1b[31mred\\x07" in shown
    refused(capsys, main(dump_args(evil, glue_dir, tmp_path / "q.zarr", task="qnli", split="dev")), "\\x1b")


def test_student_layer_advice_works():
    from hskstore.format.config import ConfigError
    from hskstore.method.layermap import student_to_store_layers

    with pytest.raises(ConfigError, match="derive at most 1 layer ") as exc:
        student_to_store_layers(2, [2, 3, 4], 4)
    assert "--student-layers 2" in str(exc.value)
    assert student_to_store_layers(2, [4], 4) == {4: 2}  # what the advice says works does work


def test_full_disk_message_is_one_line(sst2_teacher, glue_dir, tmp_path, capsys, monkeypatch):
    def full(self, shard, arrays):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(StoreWriter, "write_shard", full)
    refused(capsys, main(dump_args(sst2_teacher, glue_dir, tmp_path / "s.zarr")), "disk full")
