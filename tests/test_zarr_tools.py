"""Stores that generic Zarr tools understand (issue 37): every array of every store kind has dimension names and
attributes, xarray opens every kind (a folder, and a bundle through zarr's ZipStore), `hsk upgrade` adds the names
to an older store whose content address stays as it was until then, and the decoded view matches `dense`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import conformance_reader as reader
import numpy as np
import pytest
import zarr

from hskstore import open_store
from hskstore.format import clm, clm_layers, codec, mlm, schema, seq2seq
from hskstore.format.manifest import list_arrays
from hskstore.format.schema import FORMAT_VERSION, PROGRESS_DESCRIBED, array_specs
from hskstore.io.view import DIMS, dense_dataset, dense_view
from pipelines.cli import main

xr = pytest.importorskip("xarray")

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "docs" / "conformance"
OLD3 = ROOT / "tests" / "data" / "format3"  # format-3 stores: the float16 vector as it was before the exact teachers
OLD = ROOT / "tests" / "data" / "format2"  # the derived vector as format 2 wrote it (before dimension names)
KINDS = {"task": "int4", "float16 task": "float16", "attention rows": "attention", "derived": "derived",
         "masked-LM": "mlm", "inner chunks, d = 60": "edges"}
SPEC = (ROOT / "docs" / "STORE_FORMAT.md").read_text(encoding="utf-8")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings, as mkdocs makes them (python-markdown's toc slugify)."""
    titles = [line.lstrip("#") for line in text.splitlines() if line.startswith("#")]
    return {re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", t).strip().lower()) for t in titles}


def unpacked(name: str, tmp_path: Path, source: Path = VECTORS) -> Path:
    out = tmp_path / f"{name}.zarr"
    with zipfile.ZipFile(source / f"{name}.hsk.zip") as zf:
        zf.extractall(out)
    return out


def zip_store(path: Path):
    return zarr.storage.ZipStore(path, mode="r", read_only=True)


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_array_has_dimension_names_and_attributes(kind):
    bundle = reader.Bundle.open(VECTORS / f"{KINDS[kind]}.hsk.zip")
    meta = bundle.meta
    assert meta["format_version"] == FORMAT_VERSION
    specs = {spec.name: spec for spec in array_specs(meta)}
    documented = anchors(SPEC)
    for path, node in bundle.nodes.items():
        names, attrs = node["dimension_names"], node["attributes"]
        assert len(names) == len(node["shape"]) and None not in names, path
        assert names[0] == ("shards" if path.startswith("_progress") else "rows"), path
        assert attrs["description"] and attrs["spec"].split("#")[1] in documented, path
        expected = specs.get(path)
        if expected is None:
            assert (tuple(names), attrs) == PROGRESS_DESCRIBED[path]
            continue
        assert (tuple(names), attrs) == (expected.dims, expected.attributes)
        if path.endswith(("/values", "/scale")):
            assert attrs["codec"] == meta["selection"]["value_dtype"]
    if kind != "masked-LM":  # a packed codec's last axis is bytes, not kept values
        values = bundle.nodes["layers/0/values"]
        packed = meta["selection"]["value_dtype"] not in ("float16", "int8")
        assert values["dimension_names"][-1] == ("value_bytes" if packed else "kept_width")
        assert bundle.nodes["layers/0/masks"]["attributes"]["hidden_size"] == meta["selection"]["hidden_size"]


def check_tree(tree, group: zarr.Group) -> None:
    """Every array of the zarr group is a variable of xarray's tree, with its dimension names and exact values."""
    arrays = list_arrays(group)
    assert arrays
    for path, array in arrays.items():
        parent, _, name = path.rpartition("/")
        var = tree[parent][name] if parent else tree[name]
        assert list(var.dims) == list(array.metadata.dimension_names), path
        assert not any(str(d).startswith("dim_") for d in var.dims), path
        np.testing.assert_array_equal(var.values, array[...], err_msg=path)
        assert var.dtype == array.dtype, path  # fill value 0 is not read as missing
        assert var.attrs["description"] == array.attrs["description"], path


@pytest.mark.parametrize("kind", list(KINDS))
def test_xarray_opens_every_store_kind_as_a_bundle_and_as_a_folder(kind, tmp_path):
    name = KINDS[kind]
    folder = unpacked(name, tmp_path)
    for store in (zip_store(VECTORS / f"{name}.hsk.zip"), str(folder)):
        root = xr.open_zarr(store, consolidated=False)
        assert root.sizes["rows"] == open_store(str(folder)).meta["layout"]["n_rows"]
        assert set(root.data_vars) >= {"row", "text_hash", "input_ids", "token_type_ids", "length"}
        tree = xr.open_datatree(store, engine="zarr", consolidated=False)
        check_tree(tree, zarr.open_group(store, mode="r"))


def test_format_2_store_still_verifies_and_keeps_its_content_address():
    """A store written before dimension names: read by hsk and by the reader of the spec, address unchanged."""
    old = json.loads((OLD / "derived.json").read_text())
    store = open_store(str(OLD / "derived.hsk.zip"))
    assert store.meta["format_version"] == 2 and store.content_address == old["manifest"]
    assert store.verify() == []
    bundle = reader.Bundle.open(OLD / "derived.hsk.zip")
    assert reader.manifest(bundle) == old["manifest"]
    assert all("dimension_names" not in node for node in bundle.nodes.values())
    arrays = reader.read_verified(bundle)
    for name, entry in old["arrays"].items():
        np.testing.assert_array_equal(arrays[name], np.array(entry["data"], dtype=entry["dtype"]).reshape(
            entry["shape"]))


def data_files(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*"))
            if p.is_file() and p.name not in ("zarr.json", "README.md", "croissant.json")
            and not p.name.startswith(".")}


def test_upgrade_adds_dimension_names_to_a_format_2_store(tmp_path, capsys):
    store = unpacked("derived", tmp_path, OLD)
    old = open_store(str(store))
    data = data_files(store)
    assert main(["upgrade", str(store)]) == 0
    assert "from format 2" in capsys.readouterr().out
    new = open_store(str(store))
    assert new.meta["format_version"] == FORMAT_VERSION and new.meta["upgraded"]["from_version"] == 2
    assert new.content_address != old.content_address and new.meta["checksums"] == old.meta["checksums"]
    assert data_files(store) == data  # only metadata changed
    fresh = reader.Bundle.open(VECTORS / "derived.hsk.zip")  # the same store written by this hsk
    group = zarr.open_group(str(store), mode="r")
    for path, array in list_arrays(group).items():
        assert list(array.metadata.dimension_names) == fresh.nodes[path]["dimension_names"], path
        assert array.attrs.asdict() == fresh.nodes[path]["attributes"], path
    assert new.verify() == []
    check_tree(xr.open_datatree(str(store), engine="zarr", consolidated=False), group)
    assert main(["upgrade", str(store)]) == 0 and "nothing to do" in capsys.readouterr().out


def test_upgrade_killed_before_the_arrays_is_finished_by_the_rerun(tmp_path, capsys):
    store = unpacked("derived", tmp_path, OLD)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HSK_FAULT": "upgrade-after-metadata"}
    done = subprocess.run([sys.executable, "-c", "from pipelines.cli import run; run()", "upgrade", str(store)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 86, done.stderr
    assert main(["verify", str(store)]) == 2  # root metadata says the new format, the arrays do not yet
    assert f"rerun `hsk upgrade {store}`" in capsys.readouterr().err
    assert main(["upgrade", str(store)]) == 0
    assert "upgraded" in capsys.readouterr().out
    assert main(["verify", str(store)]) == 0
    assert f"format_version: {FORMAT_VERSION}" in (store / "README.md").read_text()  # the card follows
    group = zarr.open_group(str(store), mode="r")
    assert all(a.metadata.dimension_names for a in list_arrays(group).values())


@pytest.mark.parametrize("name", ["int4", "attention", "derived", "float16", "edges"])
def test_dense_view_matches_the_dense_decode(name):
    store = open_store(str(VECTORS / f"{name}.hsk.zip"))
    view = dense_view(store)
    assert view.hidden.shape == (len(store), len(store.layers), store.config.n_tokens, store.hidden_size)
    shards = [store.read_shard(s) for s in range(store.n_shards)]
    data = {k: np.concatenate([s[k] for s in shards]) for k in shards[0]}
    for k, layer in enumerate(store.layers):
        np.testing.assert_array_equal(view.hidden[:, k], store.dense(data, layer))
        np.testing.assert_array_equal(view.hidden[:, k], codec.dense(
            store.selection.value_dtype, data[f"{layer.name}/values"], data[f"{layer.name}/masks"],
            store.hidden_size, data.get(f"{layer.name}/scale")))
        np.testing.assert_array_equal(view.positions[:, k], data[f"{layer.name}/positions"])
    assert (view.hidden[view.positions < 0] == 0).all()
    np.testing.assert_array_equal(view.row, data["row"])
    some = dense_view(store, [2, 0])  # rows of two shards, in any order: read in store order
    np.testing.assert_array_equal(some.hidden, view.hidden[[0, 2]])
    ds = dense_dataset(store, slice(1, 3))
    assert ds["hidden"].dims == DIMS and list(ds["layer"].values) == list(view.teacher_layers)
    np.testing.assert_array_equal(ds["hidden"].values, view.hidden[1:3])
    np.testing.assert_array_equal(ds["row"].values, view.row[1:3])
    assert ds.attrs["content_address"] == store.content_address


def test_dense_view_refuses_a_masked_lm_store():
    from hskstore import ConfigError

    with pytest.raises(ConfigError, match="keeps no hidden-state vectors"):
        dense_view(open_store(str(VECTORS / "mlm.hsk.zip")))


def test_rewriting_a_format_2_store_points_to_upgrade(tmp_path, capsys):
    """The same command over the same store written by the previous format: one line naming `hsk upgrade`."""
    source = unpacked("float16", tmp_path, OLD3)  # the float16 vector as format 3 kept it (its random teacher)
    old = unpacked("derived", tmp_path, OLD)  # derived from that float16 store, by a format-2 hsk
    before = data_files(old) | {"zarr.json": (old / "zarr.json").read_bytes()}
    code = main(["derive", str(source), "--config", "2,3,0.3", "--values", "int4", "--out", str(old),
                 "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and f"run `hsk upgrade {old}`" in err and "format 2" in err, err
    assert data_files(old) | {"zarr.json": (old / "zarr.json").read_bytes()} == before


# What docs/guide/zarr-tools.md tells a user to filter: the two descriptions at a store's root, nothing else.
CARD_FILTER = r"Object at (README\.md|croissant\.json) is not recognized"


def _zarr_warnings(action) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        action()
    return sorted(str(w.message) for w in caught if issubclass(w.category, zarr.errors.ZarrUserWarning))


def test_plain_zarr_warns_about_the_card_and_croissant_only_when_listing(tmp_path):
    """zarr-python lists a group's members by the objects under it and warns about each that is no Zarr node: in a
    store, README.md and croissant.json at the root (descriptions the format keeps outside the manifest, so
    neither can become a node). Opening the group and reading arrays say nothing; the guide's filter silences
    the listing, and another stray object would still be named."""
    store = unpacked("int4", tmp_path)
    group = zarr.open_group(store, mode="r")
    assert _zarr_warnings(lambda: (zarr.open_group(store, mode="r"), group["layers/0/values"][:1])) == []
    listed = _zarr_warnings(lambda: dict(group.members(max_depth=None)))
    assert listed == [f"Object at {name} is not recognized as a component of a Zarr hierarchy."
                      for name in ("README.md", "croissant.json")]

    def filtered():
        warnings.filterwarnings("ignore", message=CARD_FILTER)
        xr.open_datatree(store, engine="zarr", consolidated=False)
        dict(group.members(max_depth=None))

    assert _zarr_warnings(filtered) == []
    (store / "notes.txt").write_text("a user's file")
    assert _zarr_warnings(lambda: (warnings.filterwarnings("ignore", message=CARD_FILTER), list(group.keys()))) == [
        "Object at notes.txt is not recognized as a component of a Zarr hierarchy."]


def documented_texts() -> dict:
    """The JSON block of STORE_FORMAT.md's "Attribute texts, verbatim" (after its marker comment)."""
    block = SPEC.split("<!-- attribute-texts -->\n```json\n", 1)[1].split("```", 1)[0]
    return json.loads(block)


def _texts(text: str, section: str, units: str | None) -> dict:
    return {"description": text, "spec": section, **({"units": units} if units else {})}


def lm_texts(kind, group: str, positions: str, hidden: bool = False) -> dict:
    """A causal-LM or seq2seq kind's texts: its row arrays', then its support's (clm.SUPPORT_DESCRIBED) in `group`
    (the hidden-state leaves and the head: a causal-LM store's only)."""
    rows = {name: _texts(text, kind._SECTION, units) for name, (_, text, units) in kind._DESCRIBED.items()}
    support = {f"{group}/{leaf}": _texts(text.format(positions=positions), kind._SECTION, units)
               for leaf, (_, text, units) in clm.SUPPORT_DESCRIBED.items() if hidden or not leaf.startswith("hidden")}
    head = {name: _texts(text, kind._SECTION, None) for name, (_, text) in clm.HEAD_DESCRIBED.items()} if hidden else {}
    return {**rows, **support, **head}


def test_the_documented_attribute_texts_are_the_codes():
    """A second writer copies the texts from the page: each one must be what the code writes, and none missing."""
    layer = [f"layers/<i>/{leaf}" for leaf in ("positions", "scores", "values", "scale", "masks", "attention")]

    def of_kind(entry, names: list[str]) -> dict:
        entries = {name: entry(name.removeprefix("layers/<i>/")) for name in names}
        return {name: _texts(text, schema.SPEC_DOC + section, units)
                for name, (_, text, section, units) in entries.items()}

    code = {
        "integrity": schema.INTEGRITY,
        "task": of_kind(schema.task_entry, [*schema.TASK_ROW_ARRAYS, *layer]),
        "mlm": of_kind(mlm.entry, list(mlm._DESCRIBED)),
        "clm": {**lm_texts(clm, clm.GROUP, "the block", hidden=True),
                **{name: _texts(text, clm._SECTION, units) for name, (_, text, units) in clm.TEXT_DESCRIBED.items()},
                **{name: _texts(text, clm_layers.LAYERS_SECTION, None)
                   for name, (_, text) in clm_layers.LAYER_DESCRIBED.items()}},
        # the page writes the target the support sits on as <supports_on>: a store names it (reference, teacher)
        "seq2seq": lm_texts(seq2seq, seq2seq.GROUP, "the <supports_on> target's positions"),
        "progress": {name: attrs for name, (_, attrs) in PROGRESS_DESCRIBED.items()},
    }
    assert documented_texts() == code
    documented = anchors(SPEC)
    for kind in ("task", "mlm", "clm", "seq2seq", "progress"):  # every spec attribute names a section of the page
        assert all(entry["spec"].split("#")[1] in documented for entry in code[kind].values()), kind


@pytest.mark.parametrize("bundle", sorted(VECTORS.glob("*.hsk.zip")), ids=lambda p: p.name.split(".")[0])
def test_every_conformance_array_carries_the_documented_texts(bundle):
    """What the stores hold, array by array, is the page's text (and the integrity line on data arrays only)."""
    texts = documented_texts()
    opened = reader.Bundle.open(bundle)
    kind = opened.meta.get("objective") or "task"
    on = opened.meta["selection"].get("supports_on") or ""  # seq2seq: the target named in s2s/kept's text
    for path, node in opened.nodes.items():
        attrs = dict(node["attributes"])
        if path.startswith("_progress/"):
            assert attrs == texts["progress"][path], path
            continue
        assert attrs.pop("integrity") == texts["integrity"], path
        expected = dict(texts[kind][re.sub(r"^layers/\d+/", "layers/<i>/", path)])
        expected["description"] = expected["description"].replace("<supports_on>", on)
        assert {key: attrs[key] for key in ("description", "spec", "units") if key in attrs} == expected, path
