"""A newcomer's first hour (issue 39): the README's Python block on a real dump, one name per option across
commands, `-h` everywhere, `--threads`, `hsk doctor`, and methods from other packages."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import save_tiny_teacher

from hskstore import open_store
from pipelines.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


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


def _readme_python_block(containing: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    found = [b for b in blocks if containing in b]
    assert len(found) == 1, f"the README has {len(found)} python blocks with {containing!r}"
    return found[0]


def test_the_readme_torch_format_block_runs_on_a_real_dump(sst2_store, monkeypatch):
    import torch

    block = _readme_python_block('with_format("torch")')
    monkeypatch.chdir(sst2_store)  # the block names the store "sst2.zarr", as the README's dump writes it
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)  # noqa: S102 - the README's own code, as a user runs it
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
