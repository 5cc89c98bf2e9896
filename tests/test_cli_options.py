"""The CLI's options across commands: the sharing guide's Python block on a real dump, one name per option across
commands, `-h` everywhere, old names hidden but parsed."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from hskstore import open_store
from pipelines.cli import main

SHARING_GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide" / "sharing.md"


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
    assert {path: o.default for path, o in seen["--seed"]} == {"train": 0, "teacher": 0, "student lm": 0}
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


