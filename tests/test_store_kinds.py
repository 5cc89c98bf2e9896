"""Store kinds as types and typed metadata: open_store gives each kind's class (a TaskStore, an MLMStore, ...),
each parsing its metadata once into hskstore.format.meta records; the entry list comes from the schema; and
every kind lives in its own modules, which no generic module branches on by name."""

from __future__ import annotations

import io
import json
import re
import tokenize
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from hskstore import open_store
from hskstore.format import kinds
from hskstore.format.meta import DataRef, Layout, StoreMeta, TaskRef, TeacherRef, TokenizerRef
from hskstore.format.schema import array_specs, make_layout
from hskstore.io.mlm_store import MLMStore
from hskstore.io.outputs import store_entries
from hskstore.io.reader import HSKStore, TaskStore, render_card, store_type

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "docs" / "conformance"


def _stored_meta(bundle: Path) -> dict:
    with zipfile.ZipFile(bundle) as z:
        root = min((n for n in z.namelist() if n.endswith("zarr.json")), key=len)
        return json.loads(z.read(root))["attributes"]["hsk"]


def test_open_store_gives_each_kind_its_class():
    """A task store and a masked-LM store, each as its own class under the one verifying HSKStore."""
    task, mlm = open_store(str(VECTORS / "int8.hsk.zip")), open_store(str(VECTORS / "mlm.hsk.zip"))
    assert type(task) is TaskStore and type(mlm) is MLMStore
    assert task.selection.value_dtype == "int8" and str(task.config) == "3,4,0.55"
    assert mlm.selection is None and mlm.config is None and mlm.layers == []
    assert (mlm.masking.top_k, mlm.masking.max_masked, mlm.masking.mask_seed) == (3, 5, 1)
    assert mlm.hidden_size == 64 == task.hidden_size
    assert "mlm" in mlm.reads and "logits" not in mlm.reads
    assert {"logits", "layers"} <= task.reads and "mlm" not in task.reads
    assert type(HSKStore(str(VECTORS / "mlm.hsk.zip"))) is MLMStore  # the base class named directly: its kind


@pytest.mark.parametrize("name", ["int8", "mlm", "derived"])
def test_metadata_is_typed_and_agrees_with_the_stored_dict(name):
    store = open_store(str(VECTORS / f"{name}.hsk.zip"))
    meta, typed = _stored_meta(VECTORS / f"{name}.hsk.zip"), store.metadata
    assert store.meta == meta and typed.raw is store.meta
    assert typed.layout == Layout(**meta["layout"]) and typed.layout.n_shards == store.n_shards == 2
    assert typed.task.name == meta["task"]["name"] and typed.task.split == "train"
    assert typed.teacher.name == meta["teacher"]["name"]
    assert typed.teacher.weights_hash == meta["teacher"]["weights_hash"]
    assert typed.tokenizer.vocab_hash == meta["tokenizer"]["vocab_hash"] and typed.tokenizer.pad_id == 0
    assert typed.max_length == meta["max_length"] and typed.complete and typed.manifest == meta["manifest"]
    assert typed.inputs == meta["inputs_hash"] and typed.objective == meta.get("objective", "task")
    assert (typed.derived_from is not None) == (name == "derived")


@pytest.mark.parametrize("name", ["int8", "mlm"])
def test_the_records_serialise_to_the_stored_bytes(name):
    """The dump writes task, dataset and layout through these records: same keys, same order, same values."""
    meta = _stored_meta(VECTORS / f"{name}.hsk.zip")
    for key, record in (("task", TaskRef), ("dataset", DataRef), ("layout", Layout)):
        again = record.from_dict(meta[key]).to_dict()
        assert json.dumps(again) == json.dumps(meta[key]), key
    layout = meta["layout"]
    assert make_layout(layout["n_rows"], layout["n_width"], layout["shard_rows"], layout["chunk_rows"]) == layout


DESCRIPTION = ("objective", "task", "dataset", "teacher", "tokenizer", "max_length", "selection", "layout")


@pytest.mark.parametrize("name", ["int8", "mlm", "derived", "attention"])
def test_store_meta_serialises_to_the_stored_description(name):
    """Reading and writing share one definition: StoreMeta.parse(meta).to_dict() gives the description the
    dump wrote (teacher and tokenizer included) key for key, in order, and the typed bookkeeping."""
    meta = _stored_meta(VECTORS / f"{name}.hsk.zip")
    again = StoreMeta.parse(meta).to_dict()
    described = [k for k in meta if k in DESCRIPTION]
    assert list(again)[: len(described)] == described
    assert json.dumps({k: again[k] for k in described}) == json.dumps({k: meta[k] for k in described})
    for key in ("manifest", "checksums", "identity", "inputs_hash", "format_version", "derived_from"):
        assert again.get(key) == meta.get(key), key


def test_teacher_ref_grows_without_changing_old_bytes():
    """A record read keeps its keys and order (unknown keys from a newer hsk too); one built without
    `written` writes the fields that are set, so a new optional field costs old stores nothing."""
    recorded = {"name": "t", "revision": None, "weights_hash": "sha256:1", "precision": "bf16", "num_layers": 2}
    ref = TeacherRef.from_dict(recorded)
    assert json.dumps(ref.to_dict()) == json.dumps(recorded) and ref.revision is None and ref.num_labels is None
    assert TeacherRef("t", weights_hash="sha256:1", num_layers=2).to_dict() == {
        "name": "t", "weights_hash": "sha256:1", "num_layers": 2}
    written = TeacherRef("t", hub_id="org/t", written=("name", "path", "hub_id")).to_dict()
    assert json.dumps(written) == json.dumps({"name": "t", "path": None, "hub_id": "org/t"})
    tok = TokenizerRef.from_dict({"name": "t", "vocab_hash": "h", "mask_id": 4})
    assert tok.to_dict() == {"name": "t", "vocab_hash": "h", "mask_id": 4} and tok.mask_id == 4


@pytest.mark.parametrize("name", ["int8", "mlm", "attention"])
def test_the_card_is_its_kinds(name):
    """The card each kind renders is the one the store carries (README.md, written at finalize)."""
    store = open_store(str(VECTORS / f"{name}.hsk.zip"))
    with zipfile.ZipFile(VECTORS / f"{name}.hsk.zip") as z:
        card = next(z.read(n).decode() for n in z.namelist() if n.endswith("README.md"))
    assert render_card(store.meta, store.meta["stored_bytes"], name=f"{name}.zarr") == card
    assert ("fill-mask" in card) == (name == "mlm")


def test_store_entries_come_from_the_schema():
    """Every top-level name an array of either kind has is a store entry (the mlm group included)."""
    for name in ("int8", "attention", "mlm"):
        meta = _stored_meta(VECTORS / f"{name}.hsk.zip")
        assert {spec.name.split("/")[0] for spec in array_specs(meta)} <= store_entries()
    assert {"mlm", "layers", "_progress", "zarr.json", ".hsk-lease.json"} <= store_entries()


def test_the_objective_names_a_registered_kind():
    """No objective: a task store (the key came later); a kind this hsk does not know is refused by name, never
    read as a task store (a store of a newer hsk would be misread)."""
    from hskstore.format.kinds import UnknownKindError
    from hskstore.io.clm_store import ClmStore

    assert store_type({"objective": "mlm"}) is MLMStore and store_type({"objective": "clm"}) is ClmStore
    assert store_type({}) is TaskStore
    with pytest.raises(UnknownKindError, match="no store kind 'other': this hsk knows task, mlm, clm"):
        store_type({"objective": "other"})


def test_damaged_metadata_is_refused_by_the_parser():
    meta = _stored_meta(VECTORS / "int8.hsk.zip")
    with pytest.raises(KeyError):
        StoreMeta.parse({k: v for k, v in meta.items() if k != "teacher"})


@pytest.mark.parametrize("bundle", sorted(VECTORS.glob("*.hsk.zip")), ids=lambda p: p.name)
def test_store_meta_reads_and_writes_every_conformance_store_as_it_is(bundle):
    """StoreMeta both ways: parse then to_dict gives the stored metadata back, every key in its order (the
    bookkeeping fields included), so that code reading the typed record can write it again unchanged."""
    meta = _stored_meta(bundle)
    again = StoreMeta.parse(meta).to_dict()
    assert json.dumps(again) == json.dumps(meta)
    typed = StoreMeta.parse(meta)
    assert typed.data_origin == meta.get("data_origin") and typed.compute == meta.get("compute")


# --- where each kind lives ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Home:
    """A kind's place in the code: its reader, what in a module's code names it, the modules that are its home,
    and the declarations elsewhere (registry tables looked up by name: the store kinds, the run kinds, the
    vocabularies of pipelines/registry.py, the student adapters keyed by head)."""

    reader: str
    naming: str  # a regex over a module's code (comments left out)
    homes: frozenset[str] = frozenset()
    declarations: frozenset[str] = frozenset()


_KINDS_PY, _RUNKINDS, _REGISTRY = "hskstore/format/kinds.py", "pipelines/runkinds.py", "pipelines/registry.py"
HOMES = {
    # the first kind, the generic base: its name is the default objective, so what names it is a comparison of an
    # objective with it (its constant TASK or the string)
    "task": Home("TaskStore", r"""objective[^\n=!]*[!=]=\s*["']task["']|["']task["']\s*[!=]=[^\n]*objective"""
                 r"|[!=]=\s*TASK\b|\bTASK\s*[!=]=",
                 # (its arrays are declared in the generic schema, which compares no objective)
                 frozenset({"hskstore/io/reader.py", "pipelines/dump/stage.py", "pipelines/train/kinds/teacher.py",
                            "pipelines/kinds/task.py"}),
                 frozenset({_KINDS_PY})),  # the default objective, and that new metadata records none for it
    "mlm": Home("MLMStore", r"""["']mlm["']""",
                frozenset({"hskstore/format/mlm.py", "hskstore/io/mlm_store.py", "pipelines/dump/mlm.py",
                           "pipelines/methods/lightpaff.py", "pipelines/train/kinds/lightpaff_pretrain.py",
                           "pipelines/train/kinds/mlm_teacher.py", "pipelines/kinds/mlm.py"}),
                # its head and store read are named "mlm" too: the student adapters are keyed by head
                frozenset({_KINDS_PY, _RUNKINDS, _REGISTRY, "pipelines/train/students/adapter.py"})),
    "clm": Home("ClmStore", r"""["']clm["']|clm_(?!kd)""",
                frozenset({"hskstore/format/clm.py", "hskstore/io/clm_store.py", "hskstore/share/support_derive.py",
                           "pipelines/dump/clm.py", "pipelines/dump/clm_distributed.py", "pipelines/train/kinds/clm.py",
                           "pipelines/methods/clm_kd.py", "pipelines/methods/xtok.py",
                           "pipelines/train/run/lm_eval.py", "pipelines/train/losses/lm.py",
                           "pipelines/train/kinds/clm_teacher.py", "pipelines/kinds/clm.py",
                           "pipelines/dump/clm_layers.py", "pipelines/train/kinds/clm_layers.py"}),
                frozenset({_KINDS_PY, _RUNKINDS, _REGISTRY, "pipelines/train/losses/terms.py",
                           "pipelines/train/students/adapter.py",
                           # seq2seq runs train with the causal-LM loss terms (clm_ce, ...) on the target's positions
                           "pipelines/methods/s2s_kd.py", "pipelines/train/kinds/seq2seq.py"})),
    "seq2seq": Home("Seq2seqStore", r"""["']seq2seq["']""",
                    frozenset({"hskstore/format/seq2seq.py", "hskstore/io/seq2seq_store.py",
                               "pipelines/dump/seq2seq.py", "pipelines/train/kinds/seq2seq.py",
                               "pipelines/methods/s2s_kd.py", "pipelines/train/run/s2s_eval.py",
                               "pipelines/core/pair_models.py", "pipelines/kinds/seq2seq.py"}),
                    frozenset({_KINDS_PY, _RUNKINDS, _REGISTRY})),
}


def _code(path: Path) -> str:
    """A module's text without its comments (what it does, not what it says about it)."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return tokenize.untokenize((t.type, t.string) for t in tokens if t.type != tokenize.COMMENT)


def _naming(home: Home) -> set[str]:
    """The modules under hskstore/ and pipelines/ whose code names the kind."""
    modules = (path for folder in ("hskstore", "pipelines") for path in (ROOT / folder).rglob("*.py"))
    return {str(path.relative_to(ROOT)) for path in modules if re.search(home.naming, _code(path))}


@pytest.mark.parametrize("name", kinds.names())
def test_each_kind_is_found_by_name_and_named_only_in_its_home(name):
    """Outside the modules that are a kind's home, the generic code looks it up (no module branches on its name),
    except the declarations listed here and in docs/guide/adding-a-store-kind.md. A kind a package adds has no
    home here: nothing in hsk names it."""
    home = HOMES.get(name, Home(kinds.get(name).reader.rpartition(":")[2], f"""["']{re.escape(name)}["']"""))
    assert kinds.get(name).reader_class().__name__ == home.reader
    naming = _naming(home)
    assert naming - home.homes <= home.declarations, sorted(naming - home.homes - home.declarations)


@pytest.mark.parametrize("vector", ["int8", "mlm", "clm", "seq2seq"])
def test_a_damaged_selection_is_one_line_and_loses_nothing(vector, tmp_path, monkeypatch, capsys):
    """A store whose selection lacks a key its kind's record needs (its manifest gone, read unverified as the
    refusal of an unverified store tells the user to): `hsk info` says so in one line, exit 2, bytes untouched."""
    from conftest import tree_hashes

    from pipelines.cli import main

    store = tmp_path / f"{vector}.zarr"
    with zipfile.ZipFile(VECTORS / f"{vector}.hsk.zip") as z:
        z.extractall(store)
    doc = json.loads((store / "zarr.json").read_text())
    meta = doc["attributes"]["hsk"]
    meta.pop("manifest")
    meta["selection"].pop(next(iter(meta["selection"])))
    (store / "zarr.json").write_text(json.dumps(doc))
    before = tree_hashes(tmp_path)
    monkeypatch.setenv("HSK_ALLOW_UNVERIFIED", "1")
    code = main(["info", str(store)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1 and "damaged" in err and "re-copy it or dump again" in err, err
    assert tree_hashes(tmp_path) == before
