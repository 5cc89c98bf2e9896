"""Store integrity end to end: the manifest covers every attribute, verify trusts no done flag,
creation is crash-safe, resume leaves no litter, one writer at a time (issue 14)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import dump_args, save_tiny_teacher

from hskstore import StoreError, open_store
from hskstore.io.lease import Lease
from hskstore.io.writer import FAULT_EXIT
from pipelines.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher"), tiny_tokenizer, num_layers=2, seed=3)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, teacher_dir, glue_dir) -> Path:
    """An uninterrupted dump: what every interrupted, resumed or contested dump must equal."""
    out = tmp_path_factory.mktemp("ref") / "s.zarr"
    assert main(dump_args(teacher_dir, glue_dir, out)) == 0
    return out


def copy_store(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def data_files(store: Path) -> dict[str, bytes]:
    """Every file of a store but the root zarr.json, the card README.md and croissant.json (their creation
    time differs between two dumps)."""
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*"))
            if p.is_file() and p.relative_to(store) not in (Path("zarr.json"), Path("README.md"),
                                                            Path("croissant.json"))}


def assert_same_store(a: Path, b: Path) -> None:
    assert data_files(a) == data_files(b)
    ma, mb = open_store(str(a)).meta, open_store(str(b)).meta
    for key in ("checksums", "identity", "selection", "layout", "task", "teacher"):
        assert ma[key] == mb[key]


def edit_attrs(store: Path, edit) -> None:
    doc = json.loads((store / "zarr.json").read_text())
    edit(doc["attributes"]["hsk"])
    (store / "zarr.json").write_text(json.dumps(doc))


def edit_array(store: Path, name: str, edit) -> None:
    path = store / name / "zarr.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _set(*keys, value):
    def edit(meta):
        for key in keys[:-1]:
            meta = meta[key]
        meta[keys[-1]] = value(meta[keys[-1]]) if callable(value) else value
    return edit


ATTRIBUTE_EDITS = {
    "labels swapped": _set("task", "labels", value=lambda v: v[::-1]),
    "task renamed": _set("task", "name", value="cola"),
    "regression flipped": _set("task", "regression", value=lambda v: not v),
    "teacher layers": _set("selection", "teacher_layers", value=lambda v: [x + 1 for x in v]),
    "max_length": _set("max_length", value=64),
    "config": _set("selection", "config", value="2,4,0.5"),
    "checksums removed": lambda meta: meta.pop("checksums"),
    "identity": _set("identity", value="sha256:" + "0" * 64),
    "teacher name": _set("teacher", "name", value="bert-base-uncased"),
    "n_rows": _set("layout", "n_rows", value=16),
    "n_rows huge": _set("layout", "n_rows", value=10**12),
    "shard_rows zero": _set("layout", "shard_rows", value=0),
    "shard_rows negative": _set("layout", "shard_rows", value=-100),
    "selection missing": lambda meta: meta.pop("selection"),
    "layout missing": lambda meta: meta.pop("layout"),
    "manifest missing": lambda meta: meta.pop("manifest"),
}


def test_codec_edits_are_caught_by_what_they_decode_to(reference, tmp_path, capsys):
    """The manifest leaves codecs out (format 4: how a writer compressed is not what it wrote): a compression level
    edited decodes the same and verifies; a codec edited into reading other values is caught by the shard digests."""
    store = copy_store(reference, tmp_path / "s.zarr")
    inner = ["codecs", 0, "configuration", "codecs"]

    def config(doc, i):
        for key in inner:
            doc = doc[key]
        return doc[i]

    edit_array(store, "layers/0/values", lambda doc: config(doc, 1)["configuration"].update(clevel=9))
    assert main(["verify", str(store)]) == 0
    capsys.readouterr()
    edit_array(store, "logits", lambda doc: config(doc, 0).update(configuration={"endian": "big"}))
    open_store(str(store))  # the metadata is as described...
    assert main(["verify", str(store)]) == 1  # ...but the values it now reads are not the ones written
    err = capsys.readouterr().err
    assert "logits" in err and "do not match their checksum" in err and "Traceback" not in err


@pytest.mark.parametrize("what", list(ATTRIBUTE_EDITS))
def test_every_attribute_edit_is_refused(reference, tmp_path, capsys, what):
    store = copy_store(reference, tmp_path / "s.zarr")
    edit_attrs(store, ATTRIBUTE_EDITS[what])
    assert main(["verify", str(store)]) == 2
    assert main(["info", str(store)]) == 2
    err = capsys.readouterr().err
    assert err.count("hsk: error:") == 2 and len(err.strip().splitlines()) == 2 and "Traceback" not in err
    with pytest.raises(StoreError):
        open_store(str(store))


@pytest.mark.parametrize("what", ["shape", "fill_value"])
def test_array_metadata_edits_are_refused(reference, tmp_path, capsys, what):
    store = copy_store(reference, tmp_path / "s.zarr")
    if what == "shape":
        edit_array(store, "logits", _set("shape", value=[16, 2]))
    else:
        edit_array(store, "logits", _set("fill_value", value=1.0))
    assert main(["verify", str(store)]) == 2
    err = capsys.readouterr().err
    assert "hsk: error:" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    with pytest.raises(StoreError):
        open_store(str(store))


def test_training_refuses_an_edited_store(reference, tmp_path, tiny_base_dir, capsys):
    store = copy_store(reference, tmp_path / "s.zarr")
    edit_attrs(store, ATTRIBUTE_EDITS["labels swapped"])
    run = tmp_path / "run"
    assert main(["train", "--store", str(store), "--student", str(tiny_base_dir), "--out", str(run),
                 "--stages", "pred", "--max-steps", "1", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "manifest" in err and "Traceback" not in err


def test_content_address_is_stable_and_shown(reference, tmp_path, capsys):
    store = open_store(str(reference))
    assert store.content_address.startswith("sha256:") and len(store.content_address) == 71
    assert copy_store(reference, tmp_path / "moved.zarr") and \
        open_store(str(tmp_path / "moved.zarr")).content_address == store.content_address
    assert main(["info", str(reference)]) == 0
    assert store.content_address in capsys.readouterr().out
    assert main(["verify", str(reference)]) == 0
    assert f"matches the manifest {store.content_address}" in capsys.readouterr().out


def test_version_1_store_is_refused_unless_opted_in(reference, tmp_path, capsys, monkeypatch):
    store = copy_store(reference, tmp_path / "v1.zarr")

    def as_v1(meta):
        meta["format_version"] = 1
        meta.pop("manifest")

    edit_attrs(store, as_v1)
    with pytest.raises(StoreError, match="hsk upgrade"):
        open_store(str(store))
    assert open_store(str(store), allow_unverified=True).content_address is None
    assert main(["verify", str(store)]) == 2
    assert "no manifest covers" in capsys.readouterr().err
    monkeypatch.setenv("HSK_ALLOW_UNVERIFIED", "1")
    assert main(["verify", str(store)]) == 0
    assert "no manifest covers" in capsys.readouterr().out
    edit_attrs(store, _set("layout", "n_rows", value=16))  # no manifest: the arrays still contradict it
    assert main(["verify", str(store)]) == 2
    assert "array row is int64 [24]" in capsys.readouterr().err


def test_verify_does_not_trust_done_flags(reference, tmp_path, capsys):
    store = copy_store(reference, tmp_path / "s.zarr")
    shutil.rmtree(store / "_progress" / "done" / "c")  # every shard now reads as "not written"
    victim = next(p for p in (store / "logits" / "c").rglob("*") if p.is_file())
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert main(["verify", str(store)]) == 1
    err = capsys.readouterr().err
    assert "disagree with complete" in err and "logits" in err and "Traceback" not in err


def test_flipped_done_chunk_is_a_problem_not_a_traceback(reference, tmp_path, capsys):
    store = copy_store(reference, tmp_path / "s.zarr")
    for chunk in (store / "_progress" / "done" / "c").rglob("*"):
        if chunk.is_file():
            chunk.write_bytes(b"\xff" * 3)
    assert main(["verify", str(store)]) == 1
    err = capsys.readouterr().err
    assert "progress records" in err and "Traceback" not in err


def test_zarr_v2_group_is_refused(tmp_path, capsys):
    group = zarr.open_group(str(tmp_path / "v2.zarr"), mode="w", zarr_format=2)
    group.attrs["hsk"] = {"format_version": 2}
    assert main(["info", str(tmp_path / "v2.zarr")]) == 2
    assert "Zarr v2" in capsys.readouterr().err


# --- processes: kills timed into creation, concurrent writers ------------------------------------------------


def hsk(*args: str, fault: str | None = None, wait: bool = True):
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("HSK_FAULT", None)
    if fault:
        env["HSK_FAULT"] = fault
    cmd = [sys.executable, "-c", "from pipelines.cli import run; run()", *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


@pytest.mark.parametrize("point", ["after-lease", "after-group-created", "after-array-created"])
def test_dump_killed_during_creation_resumes_identically(reference, teacher_dir, glue_dir, tmp_path, capsys, point):
    out = tmp_path / "s.zarr"
    code, _, err = hsk(*dump_args(teacher_dir, glue_dir, out), fault=point)
    assert code == FAULT_EXIT, err
    assert out.exists()
    assert main(dump_args(teacher_dir, glue_dir, out)) == 0  # the same command finishes it, never refuses
    said = capsys.readouterr().out
    assert "taking over the lease" in said and "process is gone" in said
    assert_same_store(out, reference)
    assert not (out / ".hsk-lease.json").exists()


def test_resume_removes_partial_files_only(reference, teacher_dir, glue_dir, tmp_path, capsys):
    out = tmp_path / "s.zarr"
    code, _, err = hsk(*dump_args(teacher_dir, glue_dir, out), fault="after-shard-written")
    assert code == FAULT_EXIT, err
    litter = out / "logits" / "c" / f"1.{'ab' * 16}.partial"  # what a write killed before its rename leaves
    litter.parent.mkdir(parents=True, exist_ok=True)
    litter.write_bytes(b"half")
    assert main(dump_args(teacher_dir, glue_dir, out)) == 0
    assert not list(out.rglob("*.partial"))
    assert_same_store(out, reference)


def test_killed_overwrite_keeps_the_old_store(reference, teacher_dir, glue_dir, tmp_path, capsys):
    out = copy_store(reference, tmp_path / "s.zarr")
    old = data_files(out)
    code, _, err = hsk(*dump_args(teacher_dir, glue_dir, out, "--overwrite", config="1,2,0.5"),
                       fault="after-shard-written")
    assert code == FAULT_EXIT, err
    assert {k: v for k, v in data_files(out).items() if not k.startswith(".hsk-lease")} == old
    staged = [p.name for p in tmp_path.iterdir() if p.name.startswith(".s.zarr.hsk-staged-")]
    assert len(staged) == 1  # the half-built new store, hidden beside the old one
    assert main(["verify", str(out)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["s.zarr"]  # the next command on s.zarr removed it (issue 34)
    assert "removed" in capsys.readouterr().err
    assert main(dump_args(teacher_dir, glue_dir, out, "--overwrite", config="1,2,0.5")) == 0
    assert open_store(str(out)).meta["selection"]["config"] == "1,2,0.5"
    assert [p.name for p in tmp_path.iterdir()] == ["s.zarr"]  # the dead run's staged store is cleaned up


def wait_for(path: Path, proc: subprocess.Popen) -> None:
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("first_overwrite, second_overwrite, second_config",
                         [(False, False, "2,4,0.25"), (False, False, "1,2,0.5"), (True, True, "1,2,0.5")])
def test_second_writer_is_refused_with_the_lease_holder(reference, teacher_dir, glue_dir, tmp_path, capsys,
                                                        first_overwrite, second_overwrite, second_config):
    out = tmp_path / "s.zarr"
    if first_overwrite:
        copy_store(reference, out)
        assert main(dump_args(teacher_dir, glue_dir, out, "--overwrite", config="1,2,0.5")) == 0
    flag = tmp_path / "go"
    first = hsk(*dump_args(teacher_dir, glue_dir, out, *(["--overwrite"] if first_overwrite else [])),
                fault=f"wait-after-lease:{flag}", wait=False)
    try:
        wait_for(out / ".hsk-lease.json", first)
        before = data_files(out)
        extra = ["--overwrite"] if second_overwrite else []
        assert main(dump_args(teacher_dir, glue_dir, out, *extra, config=second_config)) == 2
        err = capsys.readouterr().err
        assert f"is being written by pid {first.pid}" in err and "since" in err and "Traceback" not in err
        assert data_files(out) == before
    finally:
        flag.touch()
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert main(["verify", str(out)]) == 0
    assert_same_store(out, reference)


@pytest.mark.slow
def test_two_real_dump_processes(reference, teacher_dir, glue_dir, tmp_path):
    out = tmp_path / "s.zarr"
    flag = tmp_path / "go"
    first = hsk(*dump_args(teacher_dir, glue_dir, out), fault=f"wait-after-lease:{flag}", wait=False)
    try:
        wait_for(out / ".hsk-lease.json", first)
        code, _, err = hsk(*dump_args(teacher_dir, glue_dir, out, "--overwrite", config="1,2,0.5"))
        assert code == 2 and f"is being written by pid {first.pid}" in err and "Traceback" not in err
    finally:
        flag.touch()
    assert first.wait(timeout=300) == 0
    assert_same_store(out, reference)


def test_stale_lease_of_a_frozen_writer_is_taken_over(reference, teacher_dir, glue_dir, tmp_path, capsys,
                                                       monkeypatch):
    out = tmp_path / "s.zarr"
    lease = Lease(str(out)).acquire()  # a live holder in this very process...
    lease._stop.set()  # ...that stopped refreshing
    assert main(dump_args(teacher_dir, glue_dir, out)) == 2
    assert "is being written by" in capsys.readouterr().err
    doc = json.loads((out / ".hsk-lease.json").read_text())
    doc["refreshed_at"] -= 10_000
    (out / ".hsk-lease.json").write_text(json.dumps(doc))
    assert main(dump_args(teacher_dir, glue_dir, out)) == 0
    assert "not refreshed" in capsys.readouterr().out
    assert_same_store(out, reference)
    np.testing.assert_array_equal(open_store(str(out)).read_shard(0)["row"], np.arange(8))
