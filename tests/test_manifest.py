"""The content address (hskstore/format/manifest.py, canonical.py): from format 4 any writer of the same data reaches
the same manifest, whatever it compresses with and however it spells its JSON; a format-3 store keeps the address it
was written with until `hsk upgrade` brings it to format 4."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import conformance_reader as reader
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, BloscShuffle

from hskstore import open_store
from hskstore.format.canonical import canonical, number
from hskstore.format.manifest import compute_manifest, identity, list_arrays
from hskstore.format.schema import FORMAT_VERSION
from hskstore.io.card import stored_bytes
from hskstore.io.writer import FAULT_EXIT
from pipelines.cli import main

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "docs" / "conformance"
FORMAT3 = ROOT / "tests" / "data" / "format3"  # the int4 vector as format 3 wrote it


def unpacked(bundle: Path, out: Path) -> Path:
    with zipfile.ZipFile(bundle) as zf:
        zf.extractall(out)
    return out


# ECMAScript's Number::toString, as JSON.stringify writes each float64 (ECMA-262 7.1.12.1; RFC 8785 appendix B)
@pytest.mark.parametrize("value, text", [
    (1.0, "1"), (1, "1"), (-0.0, "0"), (0.55, "0.55"), (100.5, "100.5"), (1e-6, "0.000001"), (1e-7, "1e-7"),
    (1.5e-7, "1.5e-7"), (1e20, "100000000000000000000"), (1e21, "1e+21"), (1.5e16, "15000000000000000"),
    (5e-324, "5e-324"), (1.7976931348623157e308, "1.7976931348623157e+308"), (2**53 + 2, "9007199254740994"),
    (2**60, "1152921504606847000"), (10**400, "null"), (float("nan"), "null"), (-float("inf"), "null"),
    (0.1 + 0.2, "0.30000000000000004"), (333333333.33333329, "333333333.3333333"),
], ids=str)
def test_numbers_are_written_as_ecmascript_writes_them(value, text):
    assert number(value) == text
    assert reader.jcs(value) == text  # the reader written from the doc agrees


def test_canonical_json_sorts_by_utf16_and_writes_utf8():
    doc = {"b": [1.0, "é\n\"\u2028"], "a": None, "\U0001f600": True, "\ue000": 2.50}
    expected = '{"a":null,"b":[1,"é\\n\\"\u2028"],"\U0001f600":true,"\ue000":2.5}'
    assert canonical(doc) == expected.encode("utf-8") == reader.jcs(doc).encode("utf-8")


def rewritten(src: Path, out: Path) -> Path:
    """The store at src as another writer would write the same data: every array recompressed (zstd level 9,
    other shuffles), every zarr.json re-indented, its writer notes (creation time, version, bytes) its own."""
    group = zarr.open_group(str(src), mode="r")
    meta = dict(group.attrs["hsk"])
    new = zarr.create_group(str(out), attributes={"hsk": meta})
    for name, array in list_arrays(group).items():
        copy = new.create_array(
            name, shape=array.shape, dtype=array.dtype, chunks=array.chunks, shards=array.shards,
            compressors=BloscCodec(cname="zstd", clevel=9, shuffle=BloscShuffle.noshuffle), fill_value=0,
            dimension_names=array.metadata.dimension_names, attributes=array.attrs.asdict())
        copy[...] = array[...]
    names = [name for name in meta["checksums"]]
    meta.update(created="2031-01-01T00:00:00+00:00", software_version="another-writer 9.9",
                stored_bytes=stored_bytes(new, names))
    new.attrs["hsk"] = meta
    for path in out.rglob("zarr.json"):
        path.write_text(json.dumps(json.loads(path.read_text()), indent=7, sort_keys=True))
    return out


def test_another_writer_of_the_same_data_reaches_the_same_address(tmp_path):
    first = unpacked(VECTORS / "derived.hsk.zip", tmp_path / "a.zarr")
    second = rewritten(first, tmp_path / "b.zarr")
    a, b = open_store(str(first)), open_store(str(second))  # both open: each manifest matches its store
    assert a.meta["format_version"] == b.meta["format_version"] == FORMAT_VERSION
    assert a.content_address == b.content_address and b.verify() == []
    assert a.meta["stored_bytes"] != b.meta["stored_bytes"]  # the bytes on storage did change
    chunk = "layers/0/values/c/0/0/0"
    assert (first / chunk).read_bytes() != (second / chunk).read_bytes()
    # format 3's rule covered the codecs and every attribute: the same rewrite moved its address
    legacy = {**a.meta, "format_version": 3}
    assert compute_manifest(legacy, list_arrays(a.group)) != compute_manifest(
        {**b.meta, "format_version": 3}, list_arrays(b.group))


def test_editing_what_the_address_covers_is_refused(tmp_path, capsys):
    """The writer notes are outside the address; everything else still is (a rewrite with another label is not
    the same store)."""
    store = unpacked(VECTORS / "derived.hsk.zip", tmp_path / "s.zarr")
    root = store / "zarr.json"
    doc = json.loads(root.read_text())
    doc["attributes"]["hsk"]["task"]["labels"] = ["yes", "no"]
    root.write_text(json.dumps(doc))
    assert main(["verify", str(store)]) == 2
    assert "does not match its manifest" in capsys.readouterr().err


def test_a_format_3_store_keeps_its_address_until_upgraded(tmp_path, capsys):
    old = json.loads((FORMAT3 / "int4.json").read_text())
    bundle = reader.Bundle.open(FORMAT3 / "int4.hsk.zip")
    assert bundle.meta["format_version"] == 3 and reader.manifest(bundle) == old["manifest"]
    store = unpacked(FORMAT3 / "int4.hsk.zip", tmp_path / "old.zarr")
    before = open_store(str(store))
    assert before.content_address == old["manifest"] and before.verify() == []
    data = {p: p.read_bytes() for p in store.rglob("*") if p.is_file() and p.name not in
            ("zarr.json", "README.md", "croissant.json")}
    assert main(["upgrade", str(store)]) == 0
    assert "from format 3" in capsys.readouterr().out
    after = open_store(str(store))
    assert after.meta["format_version"] == FORMAT_VERSION and after.meta["upgraded"]["from_version"] == 3
    assert after.content_address != before.content_address and after.meta["checksums"] == old["checksums"]
    assert {p: p.read_bytes() for p in data} == data  # only metadata changed
    assert main(["upgrade", str(store)]) == 0 and "nothing to do" in capsys.readouterr().out
    zipped = tmp_path / "new.hsk.zip"
    with zipfile.ZipFile(zipped, "w") as zf:
        for p in sorted(store.rglob("*")):
            if p.is_file():
                zf.write(p, p.relative_to(store).as_posix())
    assert reader.manifest(reader.Bundle.open(zipped)) == after.content_address
    np.testing.assert_array_equal(after.read_shard(0)["row"], before.read_shard(0)["row"])


def test_upgrading_a_format_3_store_gives_the_address_a_format_4_writer_gives(tmp_path, capsys):
    """The int4 vector as format 3 would have recorded it (its identity and manifest by format 3's rules): it opens
    under that address, and `hsk upgrade` gives it the address the vector has."""
    store = unpacked(VECTORS / "int4.hsk.zip", tmp_path / "s.zarr")
    address = open_store(str(store)).content_address
    group = zarr.open_group(str(store), mode="r+")
    meta = {**group.attrs["hsk"], "format_version": 3}
    meta.update(identity=identity(meta), created="2026-11-26T00:00:00+00:00", software_version="0.0.3")
    meta["manifest"] = compute_manifest(meta, list_arrays(group))
    group.attrs["hsk"] = meta
    old = open_store(str(store))
    assert old.content_address == meta["manifest"] != address
    assert main(["upgrade", str(store)]) == 0 and "from format 3" in capsys.readouterr().out
    assert open_store(str(store)).content_address == address


def test_an_upgrade_from_3_killed_after_its_metadata_is_finished_by_the_rerun(tmp_path, capsys):
    """Format 3 to 4 touches no array: a kill after the root metadata leaves a verifying store whose card still says
    format 3; the rerun renders it again."""
    store = unpacked(FORMAT3 / "int4.hsk.zip", tmp_path / "old.zarr")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HSK_FAULT": "upgrade-after-metadata"}
    done = subprocess.run([sys.executable, "-c", "from pipelines.cli import run; run()", "upgrade", str(store)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == FAULT_EXIT, done.stderr
    assert "format_version: 3" in (store / "README.md").read_text()
    assert main(["upgrade", str(store)]) == 0
    assert "restored README.md and croissant.json" in capsys.readouterr().out
    assert f"format_version: {FORMAT_VERSION}" in (store / "README.md").read_text()
    assert main(["verify", str(store)]) == 0
    assert main(["upgrade", str(store)]) == 0 and "nothing to do" in capsys.readouterr().out
