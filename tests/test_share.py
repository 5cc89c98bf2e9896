"""Sharing a store: Croissant metadata, lineage, the catalog and exports.

One folder of real stores, made through the CLI from a tiny 4-layer teacher over 24 SST-2 rows:
a float16 task store (with --license), an int4 store derived from it, a store with attention
rows, a masked-LM store, and a bundle of the first one, in nested folders.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import save_tiny_teacher, tiny_bert_config

from hskstore import open_store
from hskstore.croissant import CROISSANT_NAME, sibling_name
from pipelines.cli import main

mlc = pytest.importorskip("mlcroissant", reason="mlcroissant (the test extra) validates Croissant documents")


def dump_args(teacher_dir, glue_dir, out, *extra) -> list[str]:
    return [
        "dump", "--task", "sst2", "--teacher", str(teacher_dir), "--config", "2,4,0.5", "--student-layers", "2",
        "--data-dir", str(glue_dir), "--limit", "24", "--shard-rows", "8", "--max-length", "32",
        "--batch-size", "8", "--device", "cpu", "--no-progress", "--out", str(out), *extra,
    ]


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
    assert s.meta["dataset"]["source"] in doc["rai:dataCollection"]


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
