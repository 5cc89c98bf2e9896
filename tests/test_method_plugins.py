"""Distillation methods from other packages (the `hsk.methods` entry points): an installed package's method is
listed and trains through `hsk`; a broken one, or one whose import exits, is one line naming its package."""

from __future__ import annotations

import os
import re
from pathlib import Path

from conftest import REPO, hsk, one_error_line

PLUGIN = Path(__file__).parent / "plugins" / "hsk_example_method"


def _hsk(*args: str, path: Path, cwd: Path):
    """`hsk` in a fresh process whose sys.path starts with `path` (where a package was installed)."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(Path(__file__).resolve().parents[1])])}
    return subprocess.run([sys.executable, "-c", "from pipelines.cli import run; run()", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=900)


def test_a_method_from_an_installed_package_is_listed_and_trains(sst2_store, glue_dir, tmp_path):
    import json
    import shutil
    import subprocess
    import sys

    source = Path(shutil.copytree(PLUGIN, tmp_path / "src"))  # the build leaves files beside the sources
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(source)], check=True, timeout=600)
    listed = _hsk("methods", path=target, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"^example-kd +an installed package's method", listed.stdout, flags=re.M)
    assert "from: hsk-example-method 0.1.0" in listed.stdout
    out = tmp_path / "run"
    run = _hsk("train", "--store", str(sst2_store / "sst2.zarr"), "--student", "bert2", "--method", "example-kd",
               "--out", str(out), "--max-steps", "2", "--batch-size", "8", "--eval-limit", "8", "--data-dir",
               str(glue_dir), "--device", "cpu", "--no-progress", path=target, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "example-kd" and summary["steps"] == 2
    assert summary["method_options"] == {"epochs": 1.0, "lr": None, "temperature": 4.0, "alpha": 0.9}
    # without the package on the path the name is unknown again: nothing was registered anywhere else
    assert "unknown method 'example-kd'" in _hsk("train", "--store", str(sst2_store / "sst2.zarr"), "--student",
                                                 "bert2", "--method", "example-kd", "--out", str(tmp_path / "x"),
                                                 path=tmp_path / "empty", cwd=tmp_path).stderr


def test_a_broken_extension_fails_alone_in_one_line_naming_its_package(sst2_store, tmp_path):
    """`hsk methods` lists hsk's own methods and warns in one line; asking for the broken package's method is
    refused in that line; a built-in method is found without it."""
    dist = tmp_path / "site" / "broken_ext-0.2.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-ext\nVersion: 0.2\n")
    (dist / "entry_points.txt").write_text("[hsk.methods]\nbroken = no_such_module_here\n")
    done = _hsk("methods", path=tmp_path / "site", cwd=tmp_path)
    assert done.returncode == 0 and "clm-kd" in done.stdout and "pkd" in done.stdout, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hsk: warning: the hsk.methods extension 'broken' of broken-ext 0.2")
    assert "uninstall broken-ext" in lines[0]
    for method, code, words in (("broken", 2, "uninstall broken-ext"), ("nosuch", 2, "not loaded: the hsk.methods")):
        done = _hsk("train", "--store", str(sst2_store / "sst2.zarr"), "--method", method, "--student", "bert1",
                    "--out", str(tmp_path / "run"),
                    path=tmp_path / "site", cwd=tmp_path)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == code and len(lines) == 1 and words in lines[0], done.stderr


def test_a_method_plugin_whose_import_exits_is_one_line_naming_its_package(sst2_store, tmp_path):
    site = tmp_path / "site"
    dist = site / "exiting_ext-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: exiting-ext\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[hsk.methods]\nexiting = exiting_ext_module\n")
    (site / "exiting_ext_module.py").write_text("import sys\nsys.exit(3)\n")
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{site}"}
    code, out, err = hsk("methods", timeout=60, **env)
    assert code == 0 and "kd" in out and "exiting-ext 0.1" in err and "SystemExit" in err, err
    one_error_line(hsk("train", "--store", str(sst2_store / "sst2.zarr"), "--method", "exiting", "--student", "bert1",
                       "--out", str(tmp_path / "run"),
                       timeout=60, **env), "exiting-ext 0.1", "SystemExit", "uninstall exiting-ext")
