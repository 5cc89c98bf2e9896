"""Tampered, damaged and half-written stores, each through the real CLI: metadata
downgrade, forged shards, unpack over a live dump, a teacher retrained in place, tracebacks, memory://,
resume arguments, a missing card, terminal escapes in the card, and leftovers of killed writers."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from conftest import dump_args as shared_dump_args
from conftest import hsk, save_tiny_teacher

from hskstore import open_store
from hskstore.format.digest import shard_digest
from hskstore.format.schema import FORMAT_VERSION
from hskstore.io.lease import STALE_AFTER_S, Lease
from hskstore.io.writer import FAULT_EXIT
from pipelines.cli import main

REPO = Path(__file__).resolve().parents[1]
ROWS = 24

DERIVED_FILES = ("zarr.json", "README.md", "croissant.json")  # metadata and what is rendered from it
PACKED = ["s.croissant.json", "s.hsk.zip", "s.zarr"]  # a bundle, its Croissant sibling and the store


dump_args = functools.partial(shared_dump_args, rows=ROWS)


def train_args(store: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--store", str(store), "--student", "bert1", "--out", str(out), "--max-steps", "1",
            "--batch-size", "8", "--eval-limit", "8", "--no-progress", "--workers", "1", "--device", "cpu",
            "--method", "kd", *extra]


def tree_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under root, by relative path (the writer lease left out: it is no data)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".hsk-lease.json"}


def data_hashes(store: Path) -> dict[str, str]:
    """tree_hashes without the root zarr.json and the card (their creation time differs between dumps)."""
    return {k: v for k, v in tree_hashes(store).items() if k not in DERIVED_FILES}


def one_error(capsys, code: int, *words: str) -> str:
    captured = capsys.readouterr()
    assert code == 2, captured.err
    return _one_line(captured.out + captured.err, *words)


def _one_line(text: str, *words: str) -> str:
    assert "Traceback" not in text, text
    lines = [ln for ln in text.splitlines() if ln.startswith("hsk: error: ")]
    assert len(lines) == 1, text
    for word in words:
        assert word in lines[0], lines[0]
    assert "None" not in lines[0], lines[0]
    return lines[0]


def edit_meta(store: Path, edit) -> None:
    doc = json.loads((store / "zarr.json").read_text())
    edit(doc["attributes"]["hsk"])
    (store / "zarr.json").write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, tiny_tokenizer) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher") / "t", tiny_tokenizer, num_layers=2, seed=3)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, teacher, glue_dir) -> Path:
    out = tmp_path_factory.mktemp("ref") / "s.zarr"
    assert main(dump_args(teacher, glue_dir, out)) == 0
    return out


@pytest.fixture
def store(reference, tmp_path) -> Path:
    return Path(shutil.copytree(reference, tmp_path / "s.zarr"))


# 1 -------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("downgrade", ["format 1", "manifest deleted"])
def test_unmanifested_store_is_refused_until_upgraded(store, tmp_path, glue_dir, capsys, monkeypatch, downgrade):
    def edit(meta):
        if downgrade == "format 1":
            meta["format_version"] = 1
        del meta["manifest"]
        meta["task"]["labels"] = meta["task"]["labels"][::-1]  # the edit nothing would notice

    edit_meta(store, edit)
    before = tree_hashes(store)
    assert main(["verify", str(store)]) == 2
    one_error(capsys, 2, "no manifest covers its metadata", f"hsk upgrade {store}")
    one_error(capsys, main(["info", str(store)]), "hsk upgrade")
    one_error(capsys, main(train_args(store, tmp_path / "run", "--data-dir", str(glue_dir))), "hsk upgrade")
    assert not (tmp_path / "run").exists()
    assert tree_hashes(store) == before  # refusing reads nothing into the store

    monkeypatch.setenv("HSK_ALLOW_UNVERIFIED", "1")  # the explicit opt-in
    assert main(["verify", str(store)]) == 0
    assert "no manifest covers" in capsys.readouterr().out
    monkeypatch.delenv("HSK_ALLOW_UNVERIFIED")

    assert main(["upgrade", str(store)]) == 0
    said = capsys.readouterr().out
    assert "upgraded" in said and "covered by the manifest sha256:" in said and "hsk info" in said
    assert data_hashes(store) == {k: v for k, v in before.items() if k not in DERIVED_FILES}
    meta = open_store(str(store)).meta
    assert meta["format_version"] == FORMAT_VERSION
    assert meta["upgraded"]["from_version"] == (1 if downgrade == "format 1" else FORMAT_VERSION)
    assert main(["verify", str(store)]) == 0
    assert f"matches the manifest {meta['manifest']}" in capsys.readouterr().out
    edit_meta(store, lambda m: m["task"].update(labels=m["task"]["labels"][::-1]))  # now an edit is caught
    one_error(capsys, main(["verify", str(store)]), "does not match its manifest")


def test_upgrade_refuses_damaged_data(store, capsys):
    edit_meta(store, lambda m: (m.update(format_version=1), m.pop("manifest")))
    victim = store / "logits" / "c" / "1" / "0"
    data = bytearray(victim.read_bytes())
    data[-40] ^= 0xFF  # in the shard index: the chunk reads wrong or not at all
    victim.write_bytes(bytes(data))
    before = tree_hashes(store)
    one_error(capsys, main(["upgrade", str(store)]), "is not upgraded")
    assert tree_hashes(store) == before


# 2 -------------------------------------------------------------------------------------------------------------


def test_forged_shards_with_rewritten_digests_are_refused_on_open(store, reference, tmp_path, glue_dir, capsys):
    address = open_store(str(reference)).content_address
    group = zarr.open_group(str(store), mode="r+")
    logits, digests = group["logits"], group["_progress/digests"]
    names = list(open_store(str(store)).specs)
    for shard in range(3):
        rows = slice(8 * shard, 8 * shard + 8)
        forged = -np.asarray(logits[rows])  # every prediction flipped
        logits[rows] = forged
        record = np.asarray(digests[shard])
        record[names.index("logits")] = np.frombuffer(shard_digest(forged), dtype=np.uint8)
        digests[shard] = record  # the per-shard digests agree with the forged chunks
    assert json.loads((store / "zarr.json").read_text()) == json.loads((reference / "zarr.json").read_text())
    one_error(capsys, main(["verify", str(store)]), "logits", "do not add up to the recorded checksum")
    one_error(capsys, main(["info", str(store)]), "do not add up")
    code = main(train_args(store, tmp_path / "run", "--data-dir", str(glue_dir), "--expect-store", address))
    one_error(capsys, code, "do not add up")
    assert not (tmp_path / "run").exists()


# 3 -------------------------------------------------------------------------------------------------------------


def test_unpack_overwrite_refuses_a_store_being_written(store, reference, tmp_path, capsys):
    bundle = tmp_path / "s.hsk.zip"
    assert main(["pack", "--no-progress", str(reference), str(bundle)]) == 0
    holder = Lease(str(store)).acquire()  # a dump at work on the store
    try:
        before = tree_hashes(store)
        one_error(capsys, main(["unpack", "--overwrite", str(bundle), str(store)]), "is being written by pid")
        assert tree_hashes(store) == before
        assert sorted(p.name for p in tmp_path.iterdir()) == PACKED  # no staged leftover
    finally:
        holder.release()
    assert main(["unpack", "--overwrite", str(bundle), str(store)]) == 0  # no writer: replaced
    assert data_hashes(store) == data_hashes(reference)
    assert sorted(p.name for p in tmp_path.iterdir()) == PACKED


# 4 -------------------------------------------------------------------------------------------------------------


def test_teacher_retrained_in_place_is_refused_when_found_through_the_store(tiny_tokenizer, glue_dir, tmp_path,
                                                                            capsys):
    teacher = save_tiny_teacher(tmp_path / "teacher", tiny_tokenizer, num_layers=2, seed=3)
    out = tmp_path / "s.zarr"
    assert main(dump_args(teacher, glue_dir, out)) == 0
    recorded = open_store(str(out)).meta["teacher"]
    assert recorded["path"] == str(teacher.resolve())
    save_tiny_teacher(teacher, tiny_tokenizer, num_layers=2, seed=4)  # retrained in place
    capsys.readouterr()
    code = main(train_args(out, tmp_path / "run", "--data-dir", str(glue_dir)))
    one_error(capsys, code, "is not the store's teacher", recorded["weights_hash"], "--teacher")
    assert not (tmp_path / "run" / "best").exists()


# 5 -------------------------------------------------------------------------------------------------------------


def test_damaged_chunk_is_one_line_for_info(store, capsys):
    victim = store / "layers" / "0" / "positions" / "c" / "0" / "0"
    data = bytearray(victim.read_bytes())
    data[:16] = bytes(range(16))  # the blosc header of the first chunk
    victim.write_bytes(bytes(data))
    one_error(capsys, main(["info", str(store)]), "layers/0/positions", "damaged")


def test_bundle_with_a_bad_crc_is_one_line_and_unpacks_nothing(reference, tmp_path, capsys):
    import zipfile

    bundle = tmp_path / "s.hsk.zip"
    assert main(["pack", "--no-progress", str(reference), str(bundle)]) == 0
    with zipfile.ZipFile(bundle) as zf:
        member = zf.getinfo("layers/0/positions/c/0/0")
    data = bytearray(bundle.read_bytes())
    name_len, extra_len = int.from_bytes(data[member.header_offset + 26:member.header_offset + 28], "little"), \
        int.from_bytes(data[member.header_offset + 28:member.header_offset + 30], "little")
    data[member.header_offset + 30 + name_len + extra_len + 50] ^= 0xFF
    bundle.write_bytes(bytes(data))
    before = tree_hashes(tmp_path)
    one_error(capsys, main(["info", str(bundle)]), "Bad CRC-32", "damaged")
    one_error(capsys, main(["unpack", str(bundle), str(tmp_path / "u.zarr")]), "Bad CRC-32", "not unpacked")
    assert tree_hashes(tmp_path) == before and not (tmp_path / "u.zarr").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.croissant.json", "s.hsk.zip"]


def test_name_too_long_is_one_line(teacher, glue_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_error(capsys, main(dump_args(teacher, glue_dir, "x" * 300)), "too long", "(300 characters)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_s3_without_credentials_is_one_line(teacher, glue_dir, tmp_path):
    env = {"AWS_EC2_METADATA_DISABLED": "true", "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
           "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None,
           "AWS_SESSION_TOKEN": None, "AWS_PROFILE": None, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    code, out, err = hsk(*dump_args(teacher, glue_dir, "s3://bucket/s.zarr"), timeout=300, **env)
    assert code == 2, err
    _one_line(out + err, "credentials", "AWS_ACCESS_KEY_ID")


def test_lease_that_is_a_folder_is_one_line(store, teacher, glue_dir, capsys):
    (store / ".hsk-lease.json").mkdir()
    before = tree_hashes(store)
    one_error(capsys, main(dump_args(teacher, glue_dir, store)), ".hsk-lease.json is a folder")
    assert tree_hashes(store) == before and (store / ".hsk-lease.json").is_dir()


@pytest.mark.parametrize("what", ["checkpoint", "best model"])
def test_train_on_a_full_disk_says_rerun_to_resume(reference, glue_dir, tmp_path, capsys, monkeypatch, what):
    """The failures a real full disk gave (a 3 MiB tmpfs): torch's zip writer fails as it closes the
    checkpoint ("unexpected pos"), safetensors fails saving the best model (SafetensorError, os error 28)."""
    import safetensors
    import transformers.modeling_utils

    import pipelines.core.run_state as run_state

    def full_torch(obj, path):
        Path(path).write_bytes(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    def full_safetensors(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    if what == "checkpoint":
        monkeypatch.setattr(run_state.torch, "save", full_torch)
    else:
        monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full_safetensors)
    code = main(train_args(reference, tmp_path / "run", "--data-dir", str(glue_dir)))
    one_error(capsys, code, "disk full", "rerun the same command to resume")
    assert not list((tmp_path / "run").rglob("*.tmp"))
    monkeypatch.undo()
    assert main(train_args(reference, tmp_path / "run", "--data-dir", str(glue_dir))) == 0  # the rerun finishes
    assert (tmp_path / "run" / "best").is_dir()


# 6 -------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("url, words", [("memory://s.zarr", ["memory://", "gone when it exits"]),
                                        ("foo://bucket/s.zarr", ["unknown URL scheme foo://"]),
                                        ("http://127.0.0.1:9/s.zarr", ["does not write outputs to http://"])])
def test_unsuitable_url_schemes_are_one_line(teacher, glue_dir, tmp_path, capsys, monkeypatch, url, words):
    monkeypatch.chdir(tmp_path)
    one_error(capsys, main(dump_args(teacher, glue_dir, url)), *words)
    assert list(tmp_path.iterdir()) == []  # no local folder named after the URL


# 7 -------------------------------------------------------------------------------------------------------------


def test_resume_refuses_what_changes_the_bytes(reference, teacher, glue_dir, tmp_path, capsys):
    out = tmp_path / "s.zarr"
    threads = torch.get_num_threads()
    code, _, err = hsk(*dump_args(teacher, glue_dir, out), timeout=300, HSK_FAULT="after-shard-written",
                       OMP_NUM_THREADS=str(threads))
    assert code == FAULT_EXIT, err
    assert open_store(str(out), allow_incomplete=True).meta["compute"] == {
        "batch_size": 64, "device": "cpu", "torch_threads": threads}
    before = tree_hashes(out)
    one_error(capsys, main(dump_args(teacher, glue_dir, out, "--batch-size", "8")), "--batch-size 64")
    one_error(capsys, main([*dump_args(teacher, glue_dir, out), "--max-length", "16"]), "--max-length 32")
    one_error(capsys, main(dump_args(teacher, glue_dir, out, "--threads", str(threads + 1))), f"--threads {threads}")
    assert tree_hashes(out) == before
    assert main(dump_args(teacher, glue_dir, out, "--threads", str(threads))) == 0  # the original threads resume it
    assert data_hashes(out) == data_hashes(reference)


# 8 -------------------------------------------------------------------------------------------------------------


def test_rerun_of_a_complete_store_restores_its_card(store, teacher, glue_dir, capsys):
    rendered = {name: (store / name).read_bytes() for name in ("README.md", "croissant.json")}
    for name in rendered:
        (store / name).unlink()  # a kill after the metadata, before the card and croissant.json
    data = tree_hashes(store)
    assert main(dump_args(teacher, glue_dir, store)) == 0
    said = capsys.readouterr().out
    assert "already complete" in said and "restored the card README.md" in said and "restored croissant.json" in said
    assert {name: (store / name).read_bytes() for name in rendered} == rendered
    assert {k: v for k, v in tree_hashes(store).items() if k not in rendered} == data


# 9 -------------------------------------------------------------------------------------------------------------


def test_card_escapes_reach_the_terminal_escaped(store, capsys):
    (store / "README.md").write_text("# s.zarr\n\x1b[2Jcleared\x07\n")
    assert main(["info", "--card", str(store)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b[2Jcleared\\x07\n" in out and out.startswith("# s.zarr\n")


# 10 ------------------------------------------------------------------------------------------------------------


def test_overwrite_killed_between_its_renames_is_rolled_back(store, teacher, glue_dir, tmp_path, capsys):
    old = tree_hashes(store)
    code, _, err = hsk(*dump_args(teacher, glue_dir, store, "--overwrite", config="1,2,0.5"), timeout=300,
                       HSK_FAULT="between-swap-renames")
    assert code == FAULT_EXIT, err
    assert not store.exists()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith(".s.zarr.hsk-old-")]
    assert len(aside) == 1 and tree_hashes(aside[0]) == old
    assert main(["verify", str(store)]) == 0  # the next command on the path puts the old store back
    assert "restored" in capsys.readouterr().err
    assert tree_hashes(store) == old
    assert main(dump_args(teacher, glue_dir, store, "--overwrite", config="1,2,0.5")) == 0
    assert open_store(str(store)).meta["selection"]["config"] == "1,2,0.5"
    assert [p.name for p in tmp_path.iterdir()] == ["s.zarr"]  # the dead run's staged store is gone too


def test_old_store_left_after_a_finished_swap_is_removed(store, reference, teacher, glue_dir, tmp_path, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    shutil.copytree(reference, tmp_path / f".s.zarr.hsk-old-{dead.pid}")
    assert main(dump_args(teacher, glue_dir, store)) == 0
    assert "removed" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["s.zarr"]


@pytest.mark.parametrize("content", ["", "{\"pid\": 12", "\x00\xff garbage"])
def test_unreadable_lease_is_held_until_stale_by_its_file_time(store, teacher, glue_dir, capsys, content):
    lease = store / ".hsk-lease.json"
    lease.write_bytes(content.encode("latin-1"))
    before = tree_hashes(store)
    one_error(capsys, main(dump_args(teacher, glue_dir, store)), "unreadable writer lease", "taken over once")
    assert tree_hashes(store) == before and lease.exists()
    past = time.time() - STALE_AFTER_S - 60
    os.utime(lease, (past, past))
    assert main(dump_args(teacher, glue_dir, store)) == 0
    said = capsys.readouterr().out
    assert "taking over the lease" in said and "cannot be identified" in said and "None" not in said
    assert not lease.exists()
