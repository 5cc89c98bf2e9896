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
    (dist / "entry_points.txt").write_text("[hsk.store_kinds]\n" + "".join(f"{k} = {v}\n" for k, v in ENTRIES.items()))
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
