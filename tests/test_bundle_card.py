"""Sharing a store: its card (README.md at the root) and its bundle (`hsk pack` / `hsk unpack`).

One tiny 4-layer teacher dumped over 24 SST-2 rows (3 shards of 8) at config 2,4,0.5.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import dump_args as shared_dump_args

from hskstore import open_store
from hskstore.io.card import CARD_NAME
from hskstore.io.info import storage_report
from pipelines.cli import main

dump_args = functools.partial(shared_dump_args, config="2,4,0.5", student_layers=2, batch_size=8)


@pytest.fixture(scope="module")
def store(tmp_path_factory, teacher_dir, glue_dir) -> Path:
    out = tmp_path_factory.mktemp("store") / "sst2.zarr"
    assert main(dump_args(teacher_dir, glue_dir, out)) == 0
    return out


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, store) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "sst2.hsk.zip"
    assert main(["pack", str(store), str(out), "--no-progress"]) == 0
    return out


def card_parts(text: str) -> tuple[dict, str]:
    assert text.startswith("---\n")
    front, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(front), body


def test_card_describes_the_store(store, teacher_dir):
    meta = open_store(str(store)).meta
    fields, body = card_parts((store / CARD_NAME).read_text())
    assert (fields["task"], fields["split"], fields["rows"]) == ("sst2", "train", 24)
    assert fields["label_names"] == meta["task"]["labels"] and len(fields["label_names"]) == 2
    # the card names a local teacher by its last two path parts, never its absolute path (the hash identifies it)
    assert fields["teacher"]["id"] == "/".join(teacher_dir.parts[-2:])
    assert fields["teacher"]["weights_hash"] == meta["teacher"]["weights_hash"]
    assert fields["tokenizer"]["vocab_hash"] == meta["tokenizer"]["vocab_hash"]
    assert fields["config"] == "2,4,0.5" and fields["value_dtype"] == "float16"
    assert fields["strategies"]["token_strategy"] == "att-nosep" and fields["strategies"]["width_strategy"] == "mag"
    assert fields["strategies"]["teacher_layers"] == meta["selection"]["teacher_layers"]
    chunks = sum(p.stat().st_size for p in store.rglob("*")
                 if p.is_file() and p.name not in ("zarr.json", CARD_NAME) and "_progress" not in p.parts)
    # the same total as `hsk info` (data arrays, their metadata documents included)
    assert fields["bytes"] == storage_report(open_store(str(store)))["total_bytes"] > chunks
    assert fields["created"] == meta["created"] and fields["hsk_version"] == meta["software_version"]
    assert "hskstore" in body and "zarr.open_group" in body
    assert fields["metric"] == meta["task"]["metric"] and fields["regression"] is False


def test_a_causal_lm_card_shows_no_labelled_task_fields(small_clm_store):
    fields, _ = card_parts((small_clm_store / CARD_NAME).read_text())
    assert fields["objective"] == "clm" and fields["task_categories"] == ["text-generation"]
    assert not {"label_names", "regression", "metric"} & set(fields)
    assert fields["rows"] == open_store(str(small_clm_store)).meta["layout"]["n_rows"] > 0


def test_card_code_runs_as_written(store, monkeypatch):
    """The body's two three-line examples, executed from the store's parent folder."""
    _, body = card_parts((store / CARD_NAME).read_text())
    snippets = re.findall(r"```python\n(.*?)```", body, re.S)
    assert len(snippets) == 2 and all(len(s.strip().splitlines()) == 3 for s in snippets)
    monkeypatch.chdir(store.parent)
    scope: dict = {}
    exec(snippets[0], scope)
    assert scope["shard"]["logits"].shape == (8, 2) and scope["shard"]["layers/0/values"].shape[:2] == (8, 4)
    exec(snippets[1], scope)
    assert scope["rows"].shape == (24,) and scope["meta"]["complete"]


def test_info_prints_the_card_for_folder_and_bundle(store, bundle, capsys):
    capsys.readouterr()
    assert main(["info", str(store)]) == 0
    assert "card           README.md in the store" in capsys.readouterr().out
    for where in (store, bundle):
        assert main(["info", "--card", str(where)]) == 0
        assert capsys.readouterr().out == (store / CARD_NAME).read_text()


def test_derived_store_has_its_own_card(store, tmp_path):
    out = tmp_path / "small.zarr"
    assert main(["derive", str(store), "--config", "1,2,0.5", "--out", str(out)]) == 0
    fields, body = card_parts((out / CARD_NAME).read_text())
    assert fields["config"] == "1,2,0.5" and fields["derived_from"]["config"] == "2,4,0.5"
    assert 'open_store("small.zarr")' in body


def test_every_reading_command_opens_a_bundle(store, bundle, tmp_path, glue_dir, capsys):
    assert open_store(str(bundle)).meta == open_store(str(store)).meta
    capsys.readouterr()
    assert main(["verify", str(bundle)]) == 0
    assert main(["info", str(bundle)]) == 0
    assert f"store      {bundle}" in capsys.readouterr().out
    small = tmp_path / "small.zarr"
    assert main(["derive", str(bundle), "--config", "1,2,0.5", "--out", str(small)]) == 0
    assert json.loads(json.dumps(open_store(str(small)).meta["derived_from"]["url"])) == str(bundle)
    run = tmp_path / "run"
    assert main(["train", "--store", str(bundle), "--student", "bert2", "--out", str(run), "--max-steps", "1",
                 "--batch-size", "8", "--data-dir", str(glue_dir), "--eval-limit", "8", "--no-progress",
                 "--workers", "1"]) == 0
    assert json.loads((run / "summary.json").read_text())["source"] == str(bundle)
    sweep = tmp_path / "sweep"
    assert main(["sweep", "--source", str(bundle), "--configs", "1,2,0.5", "--students", "bert2",
                 "--max-steps", "1", "--eval-limit", "8", "--data-dir", str(glue_dir), "--work-dir", str(sweep),
                 "--stages", "pred"]) == 0
    assert (sweep / "results.parquet").is_file()


def test_pack_is_deterministic_checked_and_never_overwrites(store, bundle, tmp_path, capsys):
    again = tmp_path / "again.hsk.zip"
    assert main(["pack", str(store), str(again), "--no-progress"]) == 0
    digest = hashlib.sha256(again.read_bytes()).hexdigest()
    assert digest == hashlib.sha256(bundle.read_bytes()).hexdigest()  # same store -> same bytes
    with zipfile.ZipFile(again) as zf:
        names = zf.namelist()
    assert "zarr.json" in names and CARD_NAME in names and not [n for n in names if n.endswith(".partial")]
    capsys.readouterr()
    assert main(["pack", str(store), str(again), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hsk: error:") and "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert main(["pack", str(store), str(again), "--no-progress", "--overwrite"]) == 0
    assert hashlib.sha256(again.read_bytes()).hexdigest() == digest
    # no temporary left behind; the bundle's Croissant metadata beside it (tests/test_share.py)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.croissant.json", "again.hsk.zip"]

    # --overwrite replaces a bundle only: a user's zip (or folder) of that name is never touched
    mine = tmp_path / "mine.hsk.zip"
    with zipfile.ZipFile(mine, "w") as zf:
        zf.writestr("zarr.json", '{"zarr_format": 3, "node_type": "group", "attributes": {}}')
        zf.writestr("thesis.tex", "my thesis")
    (tmp_path / "dir.hsk.zip").mkdir()
    (tmp_path / "dir.hsk.zip" / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in [mine, tmp_path / "dir.hsk.zip" / "notes.txt"]}
    for target in (mine, tmp_path / "dir.hsk.zip"):
        assert main(["pack", str(store), str(target), "--no-progress", "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert "not an hsk bundle" in err and len(err.strip().splitlines()) == 1, err
    assert {p.name: p.read_bytes() for p in [mine, tmp_path / "dir.hsk.zip" / "notes.txt"]} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.croissant.json", "again.hsk.zip", "dir.hsk.zip",
                                                          "mine.hsk.zip"]


def test_pack_refuses_incomplete_and_damaged_stores(teacher_dir, glue_dir, store, tmp_path, capsys):
    import shutil

    import zarr

    from hskstore.format.schema import META_KEY

    half = tmp_path / "half.zarr"
    shutil.copytree(store, half)
    group = zarr.open_group(str(half), mode="r+")
    group.attrs[META_KEY] = dict(group.attrs[META_KEY], complete=False)
    capsys.readouterr()
    assert main(["pack", str(half), str(tmp_path / "half.hsk.zip"), "--no-progress"]) == 2
    assert "incomplete" in capsys.readouterr().err
    bad = tmp_path / "bad.zarr"
    shutil.copytree(store, bad)
    chunk = next(p for p in sorted((bad / "logits").rglob("*")) if p.is_file() and p.name != "zarr.json")
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    assert main(["pack", str(bad), str(tmp_path / "bad.hsk.zip"), "--no-progress"]) == 2
    assert "damaged" in capsys.readouterr().err
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".zip")]


def test_unpack_round_trip_and_refusals(store, bundle, tmp_path, capsys):
    out = tmp_path / "copy.zarr"
    assert main(["unpack", str(bundle), str(out)]) == 0
    assert open_store(str(out)).meta == open_store(str(store)).meta
    assert main(["verify", str(out)]) == 0
    capsys.readouterr()
    assert main(["unpack", str(bundle), str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["unpack", str(bundle), str(out), "--overwrite"]) == 0
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    assert main(["unpack", str(bundle), str(other), "--overwrite"]) == 2
    assert (other / "notes.txt").read_text() == "keep me"


def test_a_bundle_is_never_written_by_a_dump(teacher_dir, glue_dir, tmp_path, capsys):
    capsys.readouterr()
    assert main(dump_args(teacher_dir, glue_dir, tmp_path / "x.hsk.zip")) == 2
    assert "read-only" in capsys.readouterr().err and not (tmp_path / "x.hsk.zip").exists()
