"""Sharing a store: Croissant metadata, lineage, the catalog and exports.

One folder of real stores, made through the CLI from a tiny 4-layer teacher over 24 SST-2 rows:
a float16 task store (with --license), an int4 store derived from it, a store with attention
rows, a masked-LM store, and a bundle of the first one, in nested folders.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import dump_args as shared_dump_args
from conftest import save_tiny_teacher, tiny_bert_config

from hskstore import open_store
from hskstore.io.card import portable
from hskstore.io.croissant import CROISSANT_NAME, sibling_name
from hskstore.io.info import human_bytes
from pipelines.cli import main

mlc = pytest.importorskip("mlcroissant", reason="mlcroissant (the test extra) validates Croissant documents")


dump_args = functools.partial(shared_dump_args, config="2,4,0.5", student_layers=2, batch_size=8)


@pytest.fixture(scope="module")
def shelf(tmp_path_factory, tiny_tokenizer, glue_dir) -> Path:
    """A folder of stores as a team's bucket would hold them (nested folders, a bundle)."""
    from transformers import AutoTokenizer, BertForMaskedLM

    root = tmp_path_factory.mktemp("shelf")
    teacher = save_tiny_teacher(tmp_path_factory.mktemp("teacher"), tiny_tokenizer, num_layers=4, seed=1)
    (root / "team-a").mkdir()
    assert main(dump_args(teacher, glue_dir, root / "team-a" / "sst2.zarr", "--license", "cc-by-4.0",
                          "--creator", "Team A; Ada")) == 0
    assert main(["derive", str(root / "team-a" / "sst2.zarr"), "--config", "1,2,0.5", "--values", "int4",
                 "--out", str(root / "team-a" / "sst2-int4.zarr"), "--no-progress"]) == 0
    assert main(dump_args(teacher, glue_dir, root / "att.zarr", "--attention-rows")) == 0
    mlm_teacher = tmp_path_factory.mktemp("mlm_teacher")
    torch.manual_seed(4)
    BertForMaskedLM(tiny_bert_config(num_layers=3)).save_pretrained(mlm_teacher)
    AutoTokenizer.from_pretrained(tiny_tokenizer).save_pretrained(mlm_teacher)
    corpus = root.parent / "corpus.txt"
    lines = (glue_dir / "SST-2" / "train.tsv").read_text().splitlines()[1:25]
    corpus.write_text("\n".join(line.split("\t")[0] for line in lines) + "\n")
    assert main(["dump", "--objective", "mlm", "--text-file", str(corpus), "--teacher", str(mlm_teacher),
                 "--top-k", "8", "--max-length", "32", "--shard-rows", "8", "--batch-size", "8", "--device", "cpu",
                 "--no-progress", "--out", str(root / "deep" / "er" / "mlm.zarr")]) == 0
    (root / "bundles").mkdir()
    assert main(["pack", str(root / "team-a" / "sst2.zarr"), str(root / "bundles" / "sst2.hsk.zip"),
                 "--no-progress"]) == 0
    return root


STORES = ["team-a/sst2.zarr", "team-a/sst2-int4.zarr", "att.zarr", "deep/er/mlm.zarr"]


def validate(doc: dict) -> None:
    """mlcroissant's validator: raises on any error; warnings are returned in the issues."""
    dataset = mlc.Dataset(jsonld=doc)
    assert not dataset.metadata.ctx.issues.errors, dataset.metadata.ctx.issues.report()


@pytest.mark.parametrize("name", STORES)
def test_croissant_of_every_store_validates(shelf, name):
    store = shelf / name
    doc = json.loads((store / CROISSANT_NAME).read_text())
    validate(doc)
    s = open_store(str(store))
    assert doc["identifier"] == s.content_address and doc["conformsTo"] == "http://mlcommons.org/croissant/1.1"
    root = next(d for d in doc["distribution"] if d["@id"] == "zarr-root")
    assert root["sha256"] == hashlib.sha256((store / "zarr.json").read_bytes()).hexdigest()
    fields = {f["@id"]: f for rs in doc["recordSet"] for f in rs["field"]}
    assert set(fields) == set(s.specs)  # every array, once
    for name_, spec in s.specs.items():
        assert fields[name_]["dataType"].lower() == f"cr:{spec.dtype}"
        assert fields[name_].get("arrayShape") == (",".join(map(str, spec.shape[1:])) or None)
    assert portable(s.meta["dataset"]["source"]) in doc["rai:dataCollection"]  # no local path in what is shared


def test_croissant_families_licence_and_creators(shelf):
    doc = json.loads((shelf / "team-a" / "sst2.zarr" / CROISSANT_NAME).read_text())
    assert doc["license"] == "cc-by-4.0" and [c["name"] for c in doc["creator"]] == ["Team A", "Ada"]
    assert [rs["@id"] for rs in doc["recordSet"]] == ["examples", "teacher_logits", "layers/0", "layers/1"]
    int4 = json.loads((shelf / "team-a" / "sst2-int4.zarr" / CROISSANT_NAME).read_text())
    assert int4["license"] == "cc-by-4.0"  # inherited from the parent
    scale = next(f for rs in int4["recordSet"] for f in rs["field"] if f["@id"] == "layers/0/scale")
    assert scale["dataType"] == "cr:Float16"
    att = json.loads((shelf / "att.zarr" / CROISSANT_NAME).read_text())
    assert att["license"].startswith("unknown") and "not recorded" in att["creator"][0]["name"]
    rows = next(rs for rs in att["recordSet"] if rs["@id"] == "attention_rows")
    assert [f["@id"] for f in rows["field"]] == ["layers/0/attention", "layers/1/attention"]
    mlm = json.loads((shelf / "deep" / "er" / "mlm.zarr" / CROISSANT_NAME).read_text())
    assert [rs["@id"] for rs in mlm["recordSet"]] == ["examples", "mlm"]
    broken = json.loads(json.dumps(doc))
    del broken["distribution"][0]["sha256"]
    with pytest.raises(mlc.ValidationError):  # the validator does refuse a file without its checksum
        validate(broken)


def test_bundle_croissant_names_the_bundle_by_its_sha256(shelf):
    bundle = shelf / "bundles" / "sst2.hsk.zip"
    sibling = sibling_name(bundle)
    assert sibling.name == "sst2.croissant.json"
    doc = json.loads(sibling.read_text())
    validate(doc)
    file = next(d for d in doc["distribution"] if d["@id"] == "bundle")
    assert file["sha256"] == hashlib.sha256(bundle.read_bytes()).hexdigest() and file["contentUrl"] == bundle.name
    assert all(d.get("containedIn") == {"@id": "bundle"} for d in doc["distribution"] if d["@id"] != "bundle")
    assert doc["identifier"] == open_store(str(bundle)).content_address
    # a second pack: the sibling is refused like the bundle, replaced with --overwrite; a foreign file never
    before = sibling.read_bytes()
    assert main(["pack", str(shelf / "team-a" / "sst2.zarr"), str(bundle), "--no-progress"]) == 2
    assert main(["pack", str(shelf / "team-a" / "sst2.zarr"), str(bundle), "--no-progress", "--overwrite"]) == 0
    assert sibling.read_bytes() == before  # same store, same bytes
    other = shelf.parent / "other"
    other.mkdir(exist_ok=True)
    (other / "x.croissant.json").write_text("my notes")
    assert main(["pack", str(shelf / "team-a" / "sst2.zarr"), str(other / "x.hsk.zip"), "--overwrite"]) == 2
    assert (other / "x.croissant.json").read_text() == "my notes" and not (other / "x.hsk.zip").exists()


def test_lineage_parent_data_and_info_chain(shelf, tmp_path, capsys):
    parent, child = shelf / "team-a" / "sst2.zarr", shelf / "team-a" / "sst2-int4.zarr"
    meta, parent_meta = open_store(str(child)).meta, open_store(str(parent)).meta
    assert meta["derived_from"]["content_address"] == open_store(str(parent)).content_address
    assert meta["derived_from"]["options"] == {"config": "1,2,0.5", "value_dtype": "int4", "attention_rows": None}
    source = parent_meta["dataset"]["source"].split(":", 1)[1]
    files = parent_meta["data_origin"]["files"]
    assert files[0]["sha256"] == hashlib.sha256(Path(source).read_bytes()).hexdigest()
    assert meta["data_origin"] == parent_meta["data_origin"]
    # a grandchild, then `hsk info` shows the chain while the ancestors are reachable...
    grandchild = tmp_path / "g.zarr"
    assert main(["derive", str(child), "--config", "1,1,0.5", "--out", str(grandchild), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["info", str(grandchild)]) == 0
    out = capsys.readouterr().out
    assert f"parent       {open_store(str(child)).content_address}" in out and f"at {child}" in out
    assert f"grandparent  {open_store(str(parent)).content_address}" in out and f"at {parent}" in out
    # ...and, moved elsewhere, the parent is found beside the store by name, else only its address is shown
    shutil.copytree(parent, tmp_path / "src" / "p.zarr")
    assert main(["derive", str(tmp_path / "src" / "p.zarr"), "--config", "1,2,0.5", "--out",
                 str(tmp_path / "src" / "c.zarr"), "--no-progress"]) == 0
    (tmp_path / "src").rename(tmp_path / "moved")
    capsys.readouterr()
    assert main(["info", str(tmp_path / "moved" / "c.zarr")]) == 0
    assert f"at {tmp_path}/moved/p.zarr" in capsys.readouterr().out
    shutil.rmtree(tmp_path / "moved" / "p.zarr")
    (tmp_path / "moved" / "p.zarr").mkdir()  # something else under that name: not taken for the parent
    assert main(["info", str(tmp_path / "moved" / "c.zarr"), "--json"]) == 0
    lineage = json.loads(capsys.readouterr().out)["lineage"]
    assert len(lineage) == 1 and lineage[0]["found_at"] is None
    assert lineage[0]["content_address"] == parent_meta["manifest"]
    assert lineage[0]["recorded_url"] == str(tmp_path / "src" / "p.zarr")


# --- the catalog ------------------------------------------------------------------------------------
def catalog_json(capsys, *args) -> list[dict]:
    capsys.readouterr()
    assert main(["catalog", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_catalog_finds_nested_stores_and_bundles_and_filters(shelf, capsys):
    entries = catalog_json(capsys, shelf)
    by_url = {Path(e["url"]).relative_to(shelf).as_posix(): e for e in entries}
    assert sorted(by_url) == sorted([*STORES, "bundles/sst2.hsk.zip"])
    parent = open_store(str(shelf / "team-a" / "sst2.zarr"))
    assert by_url["bundles/sst2.hsk.zip"]["content_address"] == parent.content_address
    int4 = by_url["team-a/sst2-int4.zarr"]
    assert (int4["task"], int4["split"], int4["rows"], int4["config"], int4["codec"]) == ("sst2", "train", 24,
                                                                                           "1,2,0.5", "int4")
    assert int4["parent"] == parent.content_address and int4["teacher_hash"] == parent.meta["teacher"]["weights_hash"]
    assert int4["created"] and all(e["status"] == "complete" for e in entries)
    from hskstore.io.info import storage_report  # the bytes `hsk info` and the card state, from zarr.json alone
    small = open_store(str(shelf / "team-a" / "sst2-int4.zarr"))
    assert int4["bytes"] == small.meta["stored_bytes"] == storage_report(small)["total_bytes"]
    assert int4["card"] is None  # cards are read for the HTML page only
    capsys.readouterr()
    assert main(["catalog", str(shelf / "team-a" / "sst2-int4.zarr")]) == 0
    header, row = capsys.readouterr().out.splitlines()
    size = row[header.index("bytes"):].split("  ")[0]
    assert size == human_bytes(int4["bytes"]) and size.endswith(("KiB", "MiB"))  # the table: as `hsk info` says

    def urls(*filters) -> list[str]:
        return sorted(Path(e["url"]).relative_to(shelf).as_posix() for e in catalog_json(capsys, shelf, *filters))

    assert urls("--task", "mlm") == ["deep/er/mlm.zarr"]
    assert urls("--values", "int4") == ["team-a/sst2-int4.zarr"]
    assert urls("--config", "2,4,0.5") == ["att.zarr", "bundles/sst2.hsk.zip", "team-a/sst2.zarr"]
    assert urls("--derived-from", parent.content_address[:19]) == ["team-a/sst2-int4.zarr"]
    assert len(urls("--teacher", parent.meta["teacher"]["weights_hash"][7:20])) == 4
    capsys.readouterr()
    assert main(["catalog", str(shelf / "nothing-here")]) == 2
    assert "hsk: error: nothing at" in capsys.readouterr().err


def test_catalog_reads_root_metadata_only_and_survives_damage(shelf, tmp_path, capsys):
    """A copy stripped of every chunk lists the same; damaged, incomplete and half-made stores are listed as such."""
    root = tmp_path / "bucket"
    stripped = root / "stripped.zarr"
    shutil.copytree(shelf / "team-a" / "sst2.zarr", stripped)
    for chunk_dir in [p for p in stripped.rglob("c") if p.is_dir()]:
        shutil.rmtree(chunk_dir)
    for name, edit in [("garbled.zarr", lambda t: t[: len(t) // 2]),
                       ("unfinished.zarr", lambda t: t.replace('"complete": true', '"complete": false'))]:
        shutil.copytree(shelf / "att.zarr", root / name)
        zarr_json = root / name / "zarr.json"
        zarr_json.write_text(edit(zarr_json.read_text()))
    (root / "half.zarr").mkdir()
    (root / "half.zarr" / ".hsk-lease.json").write_text("{}")
    (root / "notes").mkdir()
    (root / "notes" / "todo.txt").write_text("not a store")
    (root / "broken.hsk.zip").write_bytes(b"PK not really a zip")
    entries = {Path(e["url"]).name: e for e in catalog_json(capsys, root)}
    assert sorted(entries) == ["broken.hsk.zip", "garbled.zarr", "half.zarr", "stripped.zarr", "unfinished.zarr"]
    assert entries["stripped.zarr"]["status"] == "complete"
    address = open_store(str(shelf / "team-a" / "sst2.zarr")).content_address
    assert entries["stripped.zarr"]["content_address"] == address
    assert entries["garbled.zarr"]["status"].startswith("damaged: root metadata unreadable")
    unfinished = entries["unfinished.zarr"]
    assert unfinished["status"] == "incomplete" and unfinished["content_address"] is None
    assert entries["half.zarr"]["status"].startswith("incomplete: creation cut short")
    assert entries["broken.hsk.zip"]["status"].startswith("damaged: not a readable zip")
    capsys.readouterr()
    assert main(["catalog", str(root)]) == 0  # the table too
    assert capsys.readouterr().out.count("damaged") == 2


def test_catalog_on_loopback_s3(s3, shelf, capsys):
    from s3_server import BUCKET

    prefix = f"{BUCKET}/catalog-{uuid.uuid4().hex[:8]}"
    fs = s3.filesystem()
    fs.put(str(shelf / "team-a"), f"{prefix}/team-a", recursive=True)
    fs.put(str(shelf / "bundles" / "sst2.hsk.zip"), f"{prefix}/b/sst2.hsk.zip")
    entries = catalog_json(capsys, f"s3://{prefix}")
    assert sorted(e["url"] for e in entries) == [f"s3://{prefix}/b/sst2.hsk.zip", f"s3://{prefix}/team-a/sst2-int4.zarr",
                                                 f"s3://{prefix}/team-a/sst2.zarr"]
    local = {Path(e["url"]).name: e for e in catalog_json(capsys, shelf / "team-a", shelf / "bundles")}
    for e in entries:
        mine = local[e["url"].rsplit("/", 1)[-1]]
        assert {k: v for k, v in e.items() if k != "url"} == {k: v for k, v in mine.items() if k != "url"}


def chromium_driver(tmp_path):
    """Headless Chromium from Debian's packages, driven by selenium; skipped (failed in CI) where absent."""
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (binary and driver):
        if os.environ.get("CI") == "true":
            pytest.fail("CI must have chromium and chromium-driver (.ci/run installs them)")
        pytest.skip("no chromium/chromedriver here: apt-get install -y chromium chromium-driver")
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1600,900"):
        options.add_argument(flag)
    return webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver), options=options)


def test_catalog_page_in_a_real_browser(shelf, tmp_path, capsys):
    from selenium.webdriver.common.by import By

    page = tmp_path / "catalog.html"
    assert main(["catalog", str(shelf), "--html", str(page)]) == 0
    assert main(["catalog", str(shelf), "--html", str(page)]) == 2  # an existing page: --overwrite replaces it
    assert main(["catalog", str(shelf), "--html", str(page), "--overwrite"]) == 0
    (tmp_path / "mine.html").write_text("<html>my page</html>")
    assert main(["catalog", str(shelf), "--html", str(tmp_path / "mine.html"), "--overwrite"]) == 2
    assert (tmp_path / "mine.html").read_text() == "<html>my page</html>"
    browser = chromium_driver(tmp_path)
    try:
        browser.get(page.as_uri())
        visible = lambda: [r for r in browser.find_elements(By.CSS_SELECTOR, "#catalog tbody tr") if r.is_displayed()]  # noqa: E731
        assert len(visible()) == 5
        shot = tmp_path / "catalog.png"
        browser.save_screenshot(str(shot))
        if os.environ.get("HSK_SCREENSHOT_DIR"):
            shutil.copy(shot, os.environ["HSK_SCREENSHOT_DIR"])
        browser.find_element(By.ID, "filter").send_keys("int4")
        assert [r.get_attribute("data-task") for r in visible()] == ["sst2"]
        assert browser.find_element(By.ID, "shown").text == "1"
        browser.find_element(By.ID, "filter").clear()
        browser.execute_script("document.getElementById('filter').dispatchEvent(new Event('input'))")
        assert len(visible()) == 5
        headers = browser.find_elements(By.CSS_SELECTOR, "#catalog th")
        bytes_col = [h.text for h in headers].index("bytes")
        headers[bytes_col].click()

        def column(i: int) -> list[int]:
            return [int(r.find_elements(By.TAG_NAME, "td")[i].get_attribute("data-sort")) for r in visible()]

        assert column(bytes_col) == sorted(column(bytes_col)) and len(set(column(bytes_col))) > 2
        headers[bytes_col].click()
        assert column(bytes_col) == sorted(column(bytes_col), reverse=True)
        # lineage: the int4 store's parent cell links to its parent's row, and following it lands there
        link = browser.find_element(By.CSS_SELECTOR, "#catalog tbody tr td a[href^='#store-']")
        target = link.get_attribute("href").split("#", 1)[1]
        link.click()
        assert browser.execute_script("return location.hash") == f"#{target}"
        parent_row = browser.find_element(By.ID, target)
        assert "2,4,0.5" in parent_row.text and "team-a/sst2.zarr" in parent_row.text  # the folder, not its bundle
        # each row carries its card
        parent_row.find_element(By.TAG_NAME, "summary").click()
        assert "hsk store: sst2/train" in parent_row.find_element(By.TAG_NAME, "pre").text
    finally:
        browser.quit()


# --- exports ----------------------------------------------------------------------------------------
def expected_columns(store) -> dict[str, np.ndarray]:
    """The store's arrays as the export promises them; values checked through the dense vectors."""
    out = {}
    for shard in range(store.n_shards):
        data = store.read_shard(shard)
        for name, array in data.items():
            if name.endswith("/scale"):
                continue
            out.setdefault(name.replace("/", "_"), []).append(array)
        for layer in store.layers:
            out.setdefault(f"dense_{layer.name}", []).append(store.dense(data, layer))
    return {k: np.concatenate(v) for k, v in out.items()}


def dense_from_export(values: np.ndarray, masks: np.ndarray, d: int) -> np.ndarray:
    """Scatter exported (decoded, index-ordered) values to the dense vectors their masks name."""
    mask = np.unpackbits(masks, axis=-1, count=d).astype(bool)
    dense = np.zeros(mask.shape, np.float32)
    for idx in np.ndindex(mask.shape[:-1]):
        kept = mask[idx]
        dense[idx][kept] = values[idx][: kept.sum()]
    return dense


def arrow_numpy(column) -> np.ndarray:
    """A (nested) fixed-size-list column as one numpy array of its element type."""
    values, shape = column.combine_chunks(), [len(column)]
    while hasattr(values.type, "list_size"):
        shape.append(values.type.list_size)
        values = values.flatten()
    return values.to_numpy(zero_copy_only=False).reshape(shape)


def element_dtype(arrow_type) -> np.dtype:
    while hasattr(arrow_type, "list_size"):
        arrow_type = arrow_type.value_type
    return np.dtype(arrow_type.to_pandas_dtype())


def check_equal(store, columns: dict[str, np.ndarray], exact_dtypes: bool = True) -> None:
    """Every exported column equals the store's; `exact_dtypes=False` for datasets' numpy view, which widens
    integers to int64 (the datasets' features keep the dtypes: checked apart)."""
    want = expected_columns(store)
    for name, array in want.items():
        if name.startswith("dense_"):
            layer = name.removeprefix("dense_").replace("/", "_")
            masks = np.asarray(columns[f"{layer}_masks"]).astype(np.uint8)
            got = dense_from_export(columns[f"{layer}_values"], masks, store.hidden_size)
            np.testing.assert_array_equal(got, array)
        elif name.endswith("_values"):
            continue  # checked through the dense vectors
        else:
            expected = array.astype(np.float32) if array.dtype == np.float16 else array
            np.testing.assert_array_equal(columns[name].astype(expected.dtype), expected)
            assert columns[name].dtype == expected.dtype or not exact_dtypes, name
    assert set(columns) == {n for n in want if not n.startswith("dense_")}


@pytest.mark.parametrize("name", ["team-a/sst2-int4.zarr", "att.zarr", "deep/er/mlm.zarr"])
def test_export_reads_back_equal_through_pyarrow_datasets_and_the_iterable_dataset(shelf, tmp_path, name):
    import datasets
    import pyarrow.parquet as pq

    from hskstore.share.export import iterable_dataset

    store = open_store(str(shelf / name))
    out = tmp_path / "x.parquet"
    assert main(["export", str(shelf / name), "--format", "parquet", str(out), "--no-progress"]) == 0
    table = pq.read_table(out)
    assert table.num_rows == len(store)
    check_equal(store, {c: arrow_numpy(table[c]) for c in table.column_names})
    loaded = datasets.load_dataset("parquet", data_files=str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert datasets.Features.from_arrow_schema(table.schema) == loaded.features  # dtypes and shapes kept
    check_equal(store, loaded.with_format("numpy")[:], exact_dtypes=False)
    streamed = iterable_dataset(str(shelf / name))
    assert loaded.features["text_hash"] == datasets.Value("uint64")
    assert streamed.features == loaded.features  # the same types by both routes, text_hash uint64 included
    check_equal(store, streamed_columns(streamed))
    signed = iterable_dataset(str(shelf / name), signed_hash=True)  # what torch needs: int64, the same bits
    assert signed.features == datasets.Features({**loaded.features, "text_hash": datasets.Value("int64")})
    check_equal(store, {c: a.view(np.uint64) if c == "text_hash" else a
                        for c, a in streamed_columns(signed).items()})


def streamed_columns(streamed) -> dict[str, np.ndarray]:
    rows = list(streamed)  # python values, typed by the features: numpy arrays of the export's dtypes
    return {c: np.array([row[c] for row in rows], dtype=element_dtype(streamed.features.arrow_schema.field(c).type))
            for c in rows[0]}


def test_export_metadata_names_labels_config_and_each_layers_teacher_layer(shelf, tmp_path):
    """The Parquet file says, without the store, what its labels are and which teacher layer each column holds."""
    import json

    import pyarrow.parquet as pq

    for name in ("team-a/sst2.zarr", "team-a/sst2-int4.zarr", "deep/er/mlm.zarr"):
        store = open_store(str(shelf / name))
        out = tmp_path / (name.replace("/", "_") + ".parquet")
        assert main(["export", str(shelf / name), "--format", "parquet", str(out), "--no-progress"]) == 0
        schema = pq.read_schema(out)
        meta = json.loads(schema.metadata[b"hsk_export"])
        assert meta["content_address"] == store.content_address
        assert meta["labels"] == store.metadata.task.labels  # sst2: the names; masked-LM: none
        assert meta["config"] == store.metadata.selection.get("config")
        assert meta["layers"] == {layer.name.replace("/", "_"): {"teacher_layer": layer.teacher_layer,
                                                                 "ranking_layer": layer.ranking_layer}
                                  for layer in store.layers}
        for column in meta["layers"]:  # every layer named has its columns in the file
            assert f"{column}_values" in schema.names and f"{column}_positions" in schema.names
    sst2 = json.loads(pq.read_schema(tmp_path / "team-a_sst2.zarr.parquet").metadata[b"hsk_export"])
    derived = json.loads(pq.read_schema(tmp_path / "team-a_sst2-int4.zarr.parquet").metadata[b"hsk_export"])
    assert sst2["labels"] == ["negative", "positive"] and derived["config"] == "1,2,0.5"
    # the derived store keeps the source's last layer: its only column is that teacher layer, not layer 0
    assert list(derived["layers"].values())[0] == list(sst2["layers"].values())[-1]


def test_export_follows_the_output_rule(shelf, tmp_path):
    src = str(shelf / "team-a" / "sst2.zarr")
    out = tmp_path / "sst2.parquet"
    assert main(["export", src, "--format", "parquet", str(out), "--no-progress"]) == 0
    before = out.read_bytes()
    assert main(["export", src, "--format", "parquet", str(out), "--no-progress"]) == 2  # exists: refused
    assert main(["export", src, "--format", "parquet", str(out), "--no-progress", "--overwrite"]) == 0
    assert out.read_bytes() == before  # same store, same file
    mine = tmp_path / "mine.parquet"
    mine.write_text("my data")
    assert main(["export", src, "--format", "parquet", str(mine), "--no-progress", "--overwrite"]) == 2
    assert mine.read_text() == "my data"
    assert main(["export", src, "--format", "csv", str(tmp_path / "x.csv")]) == 2
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temporary left behind


def test_a_student_run_records_the_stores_it_read(shelf, glue_dir, tmp_path):
    store = shelf / "team-a" / "sst2-int4.zarr"
    run = tmp_path / "run"
    assert main(["train", "--store", str(store), "--student", "bert2", "--out", str(run), "--max-steps", "1",
                 "--batch-size", "8", "--data-dir", str(glue_dir), "--eval-limit", "8", "--no-progress",
                 "--workers", "1"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stores_read"] == [{"url": str(store), "content_address": open_store(str(store)).content_address}]


def test_iterable_dataset_gives_torch_rows_without_signed_hash(shelf):
    """`.with_format("torch")` of the plain iterable dataset yields rows: text_hash as int64 with the same bits
    (torch has no uint64), every other format uint64 as exported."""
    import datasets

    from hskstore.share.export import iterable_dataset

    store = open_store(str(shelf / "att.zarr"))
    plain = iterable_dataset(str(shelf / "att.zarr"))
    assert plain.features["text_hash"] == datasets.Value("uint64")
    rows = list(plain.with_format("torch"))
    assert len(rows) == len(store) and rows[0]["text_hash"].dtype == torch.int64
    hashes = np.array([int(r["text_hash"]) for r in rows], dtype=np.int64).view(np.uint64)
    assert np.array_equal(hashes, store.read(slice(None))["text_hash"]) and (hashes >= 2**63).any()
    assert list(plain.with_format("numpy"))[0]["text_hash"].dtype == np.uint64
