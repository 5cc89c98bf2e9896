"""Store-kind packages (entry point group `hsk.store_kinds`, hskstore.format.kinds): each is imported on the first
lookup of its own kind, so a broken one fails only the commands that open its stores, in one line naming its
package, while `hsk methods`, `hsk dump --task`, `hsk verify`/`hsk info` of other stores and `hsk catalog` go on.
The packages are installed for real: a dist-info with entry points on the PYTHONPATH of `hsk` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, hsk, hsk_env, save_tiny_teacher, tree_hashes

VECTORS = REPO / "docs" / "conformance"
PACKAGE = "kind-ext 0.3"

# the package's module, by kind name: what each does when imported
MODULES = {
    "raising": "raise RuntimeError('the kind module is broken')\n",
    "exiting": "import sys\nsys.exit(3)\n",
    "builtin": ("from hskstore.format import clm, kinds\n"
                "kinds.register(kinds.StoreKind('clm', 'a second clm', clm.array_specs, clm.describe, "
                "frozenset(), 'hskstore.io.clm_store:ClmStore'))\n"),
    "badreader": ("from hskstore.format import kinds, schema\n"
                  "kinds.register(kinds.StoreKind('badreader', 'its reader is missing', schema.task_array_specs, "
                  "schema.described, frozenset(), 'no_such_reader_module:Reader'))\n"),
    "badspecs": ("from hskstore.format import kinds, schema\n"
                 "def specs(meta):\n    raise RuntimeError('array_specs is broken')\n"
                 "kinds.register(kinds.StoreKind('badspecs', 'its array_specs raises', specs, schema.described, "
                 "frozenset(), 'hskstore.io.reader:TaskStore'))\n"),
    "attribute": ("from hskstore.format import kinds, schema\n"
                  "KIND = kinds.StoreKind('attribute', 'named by a module attribute', schema.task_array_specs, "
                  "schema.described, frozenset({'sidecar'}), 'hskstore.io.reader:TaskStore')\n"),
}
ENTRIES = {**{name: f"kind_ext_{name}" for name in MODULES}, "missing": "no_such_kind_module",
           "attribute": "kind_ext_attribute:KIND"}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A folder for PYTHONPATH holding the package `kind-ext` 0.3 with one kind of each fault."""
    site = tmp_path_factory.mktemp("kinds") / "site"
    dist = site / "kind_ext-0.3.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kind-ext\nVersion: 0.3\n")
    (dist / "entry_points.txt").write_text("[hsk.store_kinds]\n" + "".join(f"{k} = {v}\n" for k, v in ENTRIES.items())
                                           + "\n[hsk.run_kinds]\nraising = kind_ext_raising\n")
    for name, text in MODULES.items():
        (site / f"kind_ext_{name}.py").write_text(text)
    return site


def _with(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": f"{REPO}{os.pathsep}{site}"}


def _store_of(kind: str, folder: Path) -> Path:
    """A folder whose root metadata is the int8 vector's, its objective `kind` (no arrays: the kind's lookup comes
    first)."""
    with zipfile.ZipFile(VECTORS / "int8.hsk.zip") as zf:
        root = json.loads(zf.read("zarr.json"))
    root["attributes"]["hsk"]["objective"] = kind
    folder.mkdir(parents=True)
    (folder / "zarr.json").write_text(json.dumps(root))
    return folder


def test_other_commands_run_with_a_broken_kind_package_installed(site, tmp_path, tiny_tokenizer, glue_dir):
    env = _with(site)
    code, out, err = hsk("methods", timeout=60, **env)
    assert code == 0 and "clm-kd" in out and "kind-ext" not in out + err, err
    for command in ("verify", "info"):
        code, out, err = hsk(command, str(VECTORS / "int8.hsk.zip"), timeout=60, **env)
        assert code == 0 and "kind-ext" not in out + err, err
    teacher = save_tiny_teacher(tmp_path / "teacher", tiny_tokenizer, num_layers=2, seed=3)
    code, out, err = hsk("dump", "--task", "sst2", "--teacher", str(teacher), "--config", "2,4,0.25", "--data-dir",
                         str(glue_dir), "--limit", "16", "--shard-rows", "8", "--max-length", "32", "--no-progress",
                         "--device", "cpu", "--out", str(tmp_path / "s.zarr"), timeout=120, **env)
    assert code == 0, err
    assert hsk("verify", str(tmp_path / "s.zarr"), timeout=60, **env)[0] == 0


@pytest.mark.parametrize("kind, words", [
    ("raising", "RuntimeError: the kind module is broken"),
    ("exiting", "SystemExit: 3"),
    ("missing", "ModuleNotFoundError"),
    ("builtin", "registers the store kind 'clm', which hsk has built in"),
    ("badreader", "its reader no_such_reader_module:Reader cannot be imported"),
    ("badspecs", "cannot describe this store's arrays (RuntimeError: array_specs is broken)"),
])
def test_a_store_of_a_broken_kind_is_refused_naming_its_package(site, tmp_path, kind, words):
    store = _store_of(kind, tmp_path / f"{kind}.zarr")
    kept = tree_hashes(store)
    for command in ("verify", "info"):
        code, _, err = hsk(command, str(store), timeout=60, **_with(site))
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert PACKAGE in err and words in err and "uninstall kind-ext" in err, err
    assert tree_hashes(store) == kept


def test_the_catalog_goes_on_past_a_store_of_a_broken_kind(site, tmp_path):
    folder = tmp_path / "team"
    _store_of("raising", folder / "bad.zarr")
    with zipfile.ZipFile(VECTORS / "int8.hsk.zip") as zf:
        zf.extractall(folder / "good.zarr")
    code, out, err = hsk("catalog", str(folder), "--json", timeout=60, **_with(site))
    assert code == 0, err
    entries = {Path(e["url"]).name: e for e in json.loads(out)}
    assert set(entries) == {"bad.zarr", "good.zarr"}
    assert PACKAGE in json.dumps(entries["bad.zarr"]) and "kind-ext" not in json.dumps(entries["good.zarr"])


def test_an_attribute_entry_point_registers_the_kind_it_names(site):
    code = ("from hskstore.format import kinds\n"
            "kind = kinds.get('attribute')\n"
            "print(kind.summary, '|', kind.package, '|', 'attribute' in kinds.names())\n")
    out = subprocess.run([sys.executable, "-c", code], env=hsk_env(**_with(site)), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"named by a module attribute | {PACKAGE} | True"


# --- a whole kind from a package: hsk-tokcls (tests/plugins), dumped, trained and evaluated through `hsk` ---------
# Its package lives in tests/plugins (hsk_tokcls/ and its dist-info); it is put on the `hsk` processes' PYTHONPATH
# beside kind-ext, whose broken kinds must not touch it. This process never imports it: the kind declares names in
# hsk's vocabularies, which tests/test_registry.py checks against hsk's own.

PLUGINS = REPO / "tests" / "plugins"
TOKCLS = "hsk-tokcls 0.1"
NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def _with_tokcls(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(REPO), str(PLUGINS), str(site)])}


def _save_token_classifier(out: Path, tokenizer: Path, *, seed: int, scale: float) -> Path:
    """A random 2-layer BertForTokenClassification (hidden 32) over NER_LABELS; `scale` sharpens its labels."""
    import torch
    from conftest import tiny_bert_config
    from transformers import AutoTokenizer, BertForTokenClassification

    config = tiny_bert_config(num_layers=2, num_labels=len(NER_LABELS), id2label=dict(enumerate(NER_LABELS)),
                              label2id={label: i for i, label in enumerate(NER_LABELS)})
    torch.manual_seed(seed)
    model = BertForTokenClassification(config).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(scale)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def ner(tmp_path_factory, site, tiny_tokenizer, glue_dir) -> Path:
    """A folder: a tiny NER teacher and student, 64 SST-2 sentences dumped top-2 (`ner.zarr`, 2 shards) and 32 others
    dumped with every label (`held.zarr`), both by `hsk dump --objective tokcls` with kind-ext installed too."""
    from conftest import corpus_lines

    folder = tmp_path_factory.mktemp("tokcls")
    _save_token_classifier(folder / "teacher", tiny_tokenizer, seed=1, scale=30.0)
    _save_token_classifier(folder / "student", tiny_tokenizer, seed=7, scale=1.0)
    lines = corpus_lines(96)
    for name, texts, support in (("ner", lines[:64], "topk:2"), ("held", lines[64:], "full")):
        (folder / f"{name}.txt").write_text("\n".join(texts) + "\n")
        code, out, err = hsk("dump", "--objective", "tokcls", "--teacher", str(folder / "teacher"), "--out",
                             str(folder / f"{name}.zarr"), "--set", f"text_file={folder / name}.txt", "--set",
                             f"support={support}", "--set", "shard_rows=32", "--device", "cpu", "--threads", "1",
                             "--no-progress", timeout=180, **_with_tokcls(site))
        assert code == 0, err
    return folder


CHECK_DUMP = """
import sys, numpy as np, torch
from hskstore import open_store
from transformers import AutoModelForTokenClassification
folder = sys.argv[1]
teacher = AutoModelForTokenClassification.from_pretrained(folder + '/teacher').eval()
for name, k in (('ner', 2), ('held', 5)):
    store = open_store(folder + '/' + name + '.zarr')
    data = store.read(slice(0, len(store)))
    t = int(data['length'].max())
    mask = np.arange(t)[None, :] < data['length'][:, None]
    with torch.no_grad():
        logits = teacher(input_ids=torch.as_tensor(data['input_ids'][:, :t].astype(np.int64)),
                         attention_mask=torch.as_tensor(mask.astype(np.int64))).logits
    want = torch.log_softmax(logits, -1).numpy()
    got = data['tokcls/logprobs'][:, :t]
    if k == 2:
        want = -np.sort(-want, axis=-1)[..., :2]
        assert (data['tokcls/ids'][:, :t][mask][:, 0] == logits.argmax(-1).numpy()[mask]).all()
    assert np.abs(got[mask] - want[mask]).max() < 1e-4, name
    assert (data['tokcls/logprobs'][:, t:] == 0).all() and (got[~mask] == 0).all()
    print(name, type(store).__name__, store.labelling.support, len(store), int(mask.sum()))
"""


def test_a_plugin_kind_dumps_what_its_teacher_says_and_verifies(ner, site):
    """The stored label log-probs are the teacher's, per word-piece of real SST-2 text (top-2 with their ids, and
    every label), zeros past each row; `hsk verify` and `hsk info` read the stores as their kind."""
    env = _with_tokcls(site)
    done = subprocess.run([sys.executable, "-c", CHECK_DUMP, str(ner)], env=hsk_env(**env), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [line.split()[:4] for line in done.stdout.splitlines()] == [["ner", "TokClsStore", "topk", "64"],
                                                                       ["held", "TokClsStore", "full", "32"]]
    code, out, err = hsk("verify", str(ner / "ner.zarr"), timeout=60, **env)
    assert code == 0 and "2 shards, 64 rows match their checksums" in out, err
    code, out, err = hsk("info", str(ner / "ner.zarr"), timeout=60, **env)
    assert code == 0 and "objective tokcls" in out and f"top-2 of 5 per word-piece: {', '.join(NER_LABELS)}" in out



def test_a_store_of_a_package_kind_names_its_package_where_it_is_missing(ner, tmp_path):
    """The writer records the package of a package's kind (`kind_package`); an hsk without the package refuses the
    store in one line naming it, and changes nothing."""
    meta = json.loads((ner / "ner.zarr" / "zarr.json").read_text())["attributes"]["hsk"]
    assert meta["objective"] == "tokcls" and meta["kind_package"] == "hsk-tokcls"
    kept = tree_hashes(ner / "ner.zarr")
    for command in ("info", "verify"):
        code, out, err = hsk(command, str(ner / "ner.zarr"), timeout=60)
        assert code == 2 and out == "" and err.strip() == ("hsk: error: no store kind 'tokcls': this store's kind "
                                                           "comes from the package hsk-tokcls, which is not "
                                                           "installed: install it"), err
    assert tree_hashes(ner / "ner.zarr") == kept


def test_a_killed_dump_of_a_plugin_kind_resumes_to_the_same_store(ner, site, tmp_path):
    """A package's kind writes through hsk's writer: killed after its first shard (as kill -9 would), the same
    command finishes it, to the bytes and the content address of the dump that was never interrupted."""
    from conftest import chunk_bytes

    out = tmp_path / "ner.zarr"
    args = ("dump", "--objective", "tokcls", "--teacher", str(ner / "teacher"), "--out", str(out), "--set",
            f"text_file={ner / 'ner.txt'}", "--set", "support=topk:2", "--set", "shard_rows=32", "--device", "cpu",
            "--threads", "1", "--no-progress")
    code, _, err = hsk(*args, timeout=180, HSK_FAULT="after-shard-written", **_with_tokcls(site))
    assert code == 86 and not json.loads((out / "zarr.json").read_text())["attributes"]["hsk"]["complete"], err
    code, _, err = hsk(*args, timeout=180, **_with_tokcls(site))
    assert code == 0, err
    resumed, whole = (json.loads((s / "zarr.json").read_text())["attributes"]["hsk"] for s in (out, ner / "ner.zarr"))
    assert resumed["manifest"] == whole["manifest"] and chunk_bytes(out) == chunk_bytes(ner / "ner.zarr")

def test_a_plugin_kind_trains_with_its_method_and_evaluates(ner, site, tmp_path):
    """`hsk train` runs the kind's default method (the package's tokcls-kd, its loss the package's) and `hsk eval
    --objective tokcls` scores the student on the held-out store: closer to the teacher than before training."""
    env = _with_tokcls(site)
    code, out, err = hsk("train", "--store", str(ner / "ner.zarr"), "--student", str(ner / "student"), "--out",
                         str(tmp_path / "run"), "--set", "epochs=4", "--batch-size", "8", "--device", "cpu",
                         "--threads", "1", "--no-progress", timeout=300, **env)
    assert code == 0, err
    assert "method: tokcls-kd (what a tokcls store trains with" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["method"] == "tokcls-kd" and summary["steps"] == 32 and summary["plan"][0]["reads"] == ["tokcls"]
    scores = {}
    for name, model in (("before", ner / "student"), ("after", tmp_path / "run" / "best")):
        code, out, err = hsk("eval", str(model), "--objective", "tokcls", "--set", f"store={ner / 'held.zarr'}",
                             "--json", "--threads", "1", timeout=120, **env)
        assert code == 0, err
        scores[name] = json.loads(out)
    assert scores["before"]["tokens"] == scores["after"]["tokens"] > 500
    assert scores["after"]["kl"] < 0.9 * scores["before"]["kl"], scores
    assert scores["after"]["agreement"] > scores["before"]["agreement"], scores


LOSS_FACTS = """
import torch, torch.nn.functional as F
from hsk_tokcls.compute import token_kl
torch.manual_seed(0)
s, t = torch.randn(3, 7, 5), torch.randn(3, 7, 5) * 3
mask = torch.rand(3, 7) > 0.3
log_p = F.log_softmax(t, -1)
full = token_kl(s, log_p, None, mask)
# the full support: the textbook KL, averaged over the real tokens
want = F.kl_div(F.log_softmax(s, -1), log_p, reduction='none', log_target=True).sum(-1)[mask].mean()
assert torch.allclose(full, want, atol=1e-6), (full, want)
top, ids = log_p.topk(5, -1)
assert torch.allclose(token_kl(s, top, ids, mask), full, atol=1e-5)  # k = every label: the same KL
for k in (1, 2, 4):
    top, ids = log_p.topk(k, -1)
    assert token_kl(s, top, ids, mask) <= full + 1e-6  # merging labels into one bucket never adds divergence
assert token_kl(t, top, ids, mask).abs() < 1e-6 and token_kl(t, log_p, None, mask).abs() < 1e-6
print('ok')
"""


def test_the_plugin_loss_is_the_kl_over_its_support(site):
    done = subprocess.run([sys.executable, "-c", LOSS_FACTS], env=hsk_env(**_with_tokcls(site)), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_broken_kind_beside_a_plugin_kind_fails_alone(ner, site, tmp_path):
    """With hsk-tokcls and the broken kind-ext both installed: a task store is described, `hsk methods` lists the
    package's method, a store and a dump of the broken kind are refused in one line naming kind-ext, and a method
    that cannot read a tokcls store is refused naming the one that can."""
    env = _with_tokcls(site)
    code, out, err = hsk("info", str(VECTORS / "int8.hsk.zip"), timeout=60, **env)
    assert code == 0 and "kind-ext" not in out + err and "tokcls" not in out + err, err
    code, out, err = hsk("methods", timeout=60, **env)
    assert code == 0 and f"from: {TOKCLS}" in out and "kind-ext" not in out + err, err
    broken = _store_of("raising", tmp_path / "raising.zarr")
    kept = tree_hashes(broken)
    for args in (("info", str(broken)), ("dump", "--objective", "raising", "--teacher", str(ner / "teacher"), "--out",
                                         str(tmp_path / "new.zarr"))):
        code, _, err = hsk(*args, timeout=60, **env)
        assert code == 2 and len(err.strip().splitlines()) == 1 and PACKAGE in err and "uninstall kind-ext" in err, err
    assert tree_hashes(broken) == kept and not (tmp_path / "new.zarr").exists()
    before = tree_hashes(ner / "ner.zarr")
    code, _, err = hsk("train", "--store", str(ner / "ner.zarr"), "--student", str(ner / "student"), "--method", "kd",
                       "--out", str(tmp_path / "run"), timeout=60, **env)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "pass --method tokcls-kd" in err, err
    code, _, err = hsk("eval", str(ner / "student"), "--objective", "tokcls", timeout=60, **env)
    assert code == 2 and err.strip() == ("hsk: error: hsk eval --objective tokcls needs --set store=STORE (a "
                                         "token-classification store of held-out text)"), err
    assert tree_hashes(ner / "ner.zarr") == before and not (tmp_path / "run").exists()
