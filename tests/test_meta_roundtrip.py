"""StoreMeta both ways: every conformance store's metadata parses into the typed record and serialises back to the
same bytes, and the writer, handed that record, records the same zarr.json, card and croissant.json; a store
written afresh from its description gets the writer's bookkeeping as typed fields, in the stored key order."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from hskstore import open_store
from hskstore.format.meta import StoreMeta
from hskstore.io.writer import StoreWriter

VECTORS = Path(__file__).resolve().parent.parent / "docs" / "conformance"
NAMES = sorted(p.name.removesuffix(".hsk.zip") for p in VECTORS.glob("*.hsk.zip"))
ROOT_FILES = ("zarr.json", "README.md", "croissant.json")
# What the writer records itself when it creates and finishes a store (docs/conformance/generate.py's list)
WRITTEN_BY_WRITER = ("checksums", "inputs_hash", "complete", "identity", "created", "software_version",
                     "format_version", "manifest", "stored_bytes")


def _unpacked(name: str, tmp_path: Path) -> Path:
    """The vector as a local store folder named as it was written (the card names its folder)."""
    out = tmp_path / f"{name}.zarr"
    with zipfile.ZipFile(VECTORS / f"{name}.hsk.zip") as z:
        z.extractall(out)
    return out


def _root_bytes(store: Path) -> dict[str, bytes]:
    return {name: (store / name).read_bytes() for name in ROOT_FILES}


def test_every_vector_is_covered():
    assert {"int8", "mlm", "derived", "edges", "clm", "seq2seq"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_parsed_metadata_serialises_to_the_stored_bytes(name, tmp_path):
    """parse then to_dict gives the stored dict back, key for key in order: the same JSON text."""
    meta = json.loads((_unpacked(name, tmp_path) / "zarr.json").read_bytes())["attributes"]["hsk"]
    record = StoreMeta.parse(meta)
    assert json.dumps(record.to_dict()) == json.dumps(meta)
    assert StoreMeta.parse(record.to_dict()) == record  # and the typed fields survive the trip
    assert record.complete is True and record.manifest == meta["manifest"] and record.checksums == meta["checksums"]


@pytest.mark.parametrize("name", NAMES)
def test_the_writer_records_the_same_bytes_from_the_typed_record(name, tmp_path):
    """The writer handed a finished store's typed metadata finalizes it again: the root zarr.json, the card and
    croissant.json come out byte for byte as the vector has them, and finalize returns the record it wrote."""
    store = _unpacked(name, tmp_path)
    before = _root_bytes(store)
    record = StoreMeta.parse(json.loads(before["zarr.json"])["attributes"]["hsk"])
    with StoreWriter(str(store), record) as writer:
        assert writer.complete and writer.n_shards == record.layout.n_shards
        (store / "README.md").unlink()  # rendered again by finalize
        written = writer.finalize()
    assert isinstance(written, StoreMeta) and written == record and written.raw == record.raw
    assert _root_bytes(store) == before


@pytest.mark.parametrize("name", ["int8", "mlm", "derived", "edges", "clm", "seq2seq"])
def test_a_fresh_write_records_the_bookkeeping_in_the_stored_order(name, tmp_path):
    """The description alone handed to the writer as a StoreMeta: creation and finalize set the bookkeeping through
    the record, in the key order the vector has; what does not depend on the run is the vector's."""
    source = open_store(str(VECTORS / f"{name}.hsk.zip"))
    stored = source.meta
    # data_origin recorded after creation was computed by finalize; recorded before, it came with the description
    computed = ("data_origin",) if list(stored).index("data_origin") > list(stored).index("format_version") else ()
    described = StoreMeta.parse({k: v for k, v in stored.items() if k not in (*WRITTEN_BY_WRITER, *computed)})
    assert described.checksums == {} and described.manifest is None and not described.complete
    out = str(tmp_path / f"{name}.zarr")
    with StoreWriter.open(out, described, software_version="0.0-test") as writer:
        begun = writer.metadata
        assert not begun.complete and begun.identity == stored["identity"] and begun.created
        assert writer.meta["complete"] is False  # recorded, False too, from creation on
        for shard in range(source.n_shards):
            writer.write_shard(shard, source.read_shard(shard))
        written = writer.finalize()
    again = open_store(out).meta
    assert list(again) == list(stored)
    run_dependent = {"created", "software_version", "manifest", *computed}  # the data file is not here
    assert {k: v for k, v in again.items() if k not in run_dependent} == {
        k: v for k, v in stored.items() if k not in run_dependent}
    assert written.to_dict() == again and written.software_version == "0.0-test" and written.complete


def test_updated_sets_bookkeeping_through_the_record():
    """A record built by hand (no dict read) serialises its description, then the bookkeeping in the writer's
    order, the manifest last; `updated` keeps the keys read and appends new ones before the manifest."""
    meta = json.loads(zipfile.ZipFile(VECTORS / "int8.hsk.zip").read("zarr.json"))["attributes"]["hsk"]
    record = StoreMeta.parse(meta)
    upgraded = record.updated(upgraded={"from_version": 2})
    assert list(upgraded.to_dict()) == [*meta, "upgraded"][:-2] + ["upgraded", "manifest"]
    assert upgraded.raw == upgraded.to_dict() and upgraded.upgraded == {"from_version": 2}
    fresh = StoreMeta.parse({k: meta[k] for k in ("task", "dataset", "teacher", "tokenizer", "max_length",
                                                   "selection", "layout")})
    assert "complete" not in fresh.to_dict()  # a description: no bookkeeping yet
    begun = fresh.updated(format_version=4, complete=False).updated(created="t", software_version="v", identity="i")
    assert list(begun.to_dict())[-5:] == ["format_version", "complete", "identity", "software_version", "created"]



@pytest.mark.parametrize("name", NAMES)
def test_the_selection_is_its_kinds_typed_record(name, tmp_path):
    """A store's selection parses to the record its kind declares and writes back as stored."""
    from hskstore.format import kinds

    meta = StoreMeta.parse(json.loads((_unpacked(name, tmp_path) / "zarr.json").read_bytes())["attributes"]["hsk"])
    record = meta.selection_record
    assert type(record) is kinds.get(meta.objective).selection_type
    assert record.to_dict() == dict(meta.selection)


def test_every_built_in_kind_has_a_vector():
    from hskstore.format import kinds

    objectives = {json.loads(zipfile.ZipFile(VECTORS / f"{n}.hsk.zip").read("zarr.json"))["attributes"]["hsk"]
                  .get("objective", "task") for n in NAMES}
    assert objectives == set(kinds.names())
