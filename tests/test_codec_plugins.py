"""Value codecs from other packages (entry point group `hsk.codecs`): an installed package's codec is
dumped (torch engine) and derived to the same bytes, decoded on the device as numpy decodes it, with
no torch code of its own (its `lut`); a broken or clashing one is one line naming its package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import save_tiny_teacher

from pipelines.cli import main

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = Path(__file__).parent / "plugins" / "hsk_example_codec"
DUMP = ["--task", "sst2", "--config", "1,3,0.25", "--limit", "20", "--shard-rows", "8", "--max-length", "24",
        "--student-layers", "2", "--no-progress", "--device", "cpu"]


def _python(*args: str, path: Path, cwd: Path) -> subprocess.CompletedProcess:
    """Python in a fresh process whose sys.path starts with `path` (where a package was installed)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(ROOT)])}
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=900)


def _hsk(*args: str, path: Path, cwd: Path) -> subprocess.CompletedProcess:
    return _python("-c", "from pipelines.cli import run; run()", *args, path=path, cwd=cwd)


@pytest.fixture(scope="module")
def teacher_and_store(tmp_path_factory, tiny_tokenizer, glue_dir) -> tuple[Path, Path, Path]:
    """A tiny teacher, its float16 store at 2,4,0.5 and the GLUE folder."""
    root = tmp_path_factory.mktemp("codec_plugins")
    teacher = save_tiny_teacher(root / "teacher", tiny_tokenizer, num_layers=2, seed=4)
    store = root / "big.zarr"
    assert main(["dump", "--task", "sst2", "--teacher", str(teacher), "--config", "2,4,0.5", "--data-dir",
                 str(glue_dir), "--limit", "20", "--shard-rows", "8", "--max-length", "24", "--student-layers", "2",
                 "--no-progress", "--device", "cpu", "--out", str(store)]) == 0
    return teacher, store, glue_dir


CHECK = textwrap.dedent("""
    import sys
    import numpy as np, torch
    from hskstore import codecs, open_store
    from pipelines.core import codecs_torch

    dumped, derived = open_store(sys.argv[1]), open_store(sys.argv[2])
    assert dumped.selection.value_dtype == derived.selection.value_dtype == "example-int3"
    assert dumped.meta["checksums"] == derived.meta["checksums"]  # the torch engine's bytes are the derive's
    codec, twin = codecs.get("example-int3"), codecs_torch.get("example-int3")
    assert type(twin).__name__ == "LutTwin"  # built from the codec's lut: no torch code in the package
    for shard in range(dumped.n_shards):
        a, b = dumped.read_shard(shard), derived.read_shard(shard)
        for name in dumped.specs:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        values, scale = a["layers/0/values"], a["layers/0/scale"]
        ref = codec.decode(values, scale)
        assert ref.any() and values.shape[-1] == 3 and scale.dtype == np.float16
        got = twin.decode(torch.from_numpy(values), torch.from_numpy(scale)).numpy()
        assert got.tobytes() == ref.tobytes()  # the loader's device decode, bit for bit
    print(" ".join(codecs.names()))
""")


def test_an_installed_codec_dumps_derives_and_decodes_alike(teacher_and_store, tmp_path):
    teacher, store, glue_dir = teacher_and_store
    source = Path(shutil.copytree(PLUGIN, tmp_path / "src"))  # the build leaves files beside the sources
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), str(source)], check=True, timeout=600)
    dumped, derived = tmp_path / "dumped.zarr", tmp_path / "derived.zarr"
    run = _hsk("dump", "--teacher", str(teacher), "--data-dir", str(glue_dir), *DUMP, "--values", "example-int3",
               "--selection-engine", "torch", "--out", str(dumped), path=site, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    run = _hsk("derive", str(store), "--config", "1,3,0.25", "--values", "example-int3", "--out", str(derived),
               "--no-progress", path=site, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    (tmp_path / "check.py").write_text(CHECK)
    checked = _python(str(tmp_path / "check.py"), str(dumped), str(derived), path=site, cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.split() == ["float16", "int8", "int4", "mxfp4", "nf3", "nf4", "int8u", "example-int3"]
    # without the package on the path the name is unknown again
    gone = _hsk("info", str(derived), path=tmp_path / "empty", cwd=tmp_path)
    assert gone.returncode == 2 and "value codec 'example-int3', which no installed package provides" in gone.stderr


@pytest.mark.parametrize("entry, message", [
    ("broken = no_such_module_here", "the hsk.codecs extension 'broken' of odd-ext 0.2 (no_such_module_here) "
                                     "cannot be loaded: ModuleNotFoundError"),
    ("nf3 = no_such_module_here", "the hsk.codecs extension 'nf3' of odd-ext 0.2 (no_such_module_here) names a "
                                  "value codec hsk already has; uninstall odd-ext"),
])
def test_a_broken_or_clashing_codec_is_one_line_naming_its_package(teacher_and_store, tmp_path, entry, message):
    _, store, _ = teacher_and_store
    dist = tmp_path / "site" / "odd_ext-0.2.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: odd-ext\nVersion: 0.2\n")
    (dist / "entry_points.txt").write_text(f"[hsk.codecs]\n{entry}\n")
    name = entry.split()[0]
    done = _hsk("derive", str(store), "--config", "1,3,0.25", "--values", name, "--out", str(tmp_path / "x.zarr"),
                "--no-progress", path=tmp_path / "site", cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hsk: error: {message}"), done.stderr
    assert not (tmp_path / "x.zarr").exists()
    if name == "nf3":
        return
    # the other codecs still work: a broken extension fails only the commands that use its name
    assert _hsk("derive", str(store), "--config", "1,3,0.25", "--values", "int8", "--out", str(tmp_path / "y.zarr"),
                "--no-progress", path=tmp_path / "site", cwd=tmp_path).returncode == 0
