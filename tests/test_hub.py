"""A store pushed to the Hugging Face Hub as a dataset repository (docs/guide/sharing.md, "On the Hugging Face Hub"):
the guide's commands build the folder it pushes, offline, and the Hub client reads its card as dataset-card metadata.
The push itself needs the network and a token; nothing here reaches either."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
from pathlib import Path

from hskstore import open_store
from pipelines.cli import main

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "guide" / "sharing.md").read_text(encoding="utf-8")
SECTION = GUIDE.split("## On the Hugging Face Hub\n", 1)[1].split("\n## ", 1)[0]


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", SECTION, flags=re.S)


def _run_guide_commands(cwd: Path, monkeypatch) -> None:
    """The section's shell block, line by line as a reader types it (hsk lines through the CLI's entry point)."""
    monkeypatch.chdir(cwd)
    (block,) = _blocks("bash")
    for line in filter(None, (raw.split("#")[0].strip() for raw in block.splitlines())):
        if line.startswith("hsk "):
            assert main([*shlex.split(line)[1:], "--no-progress"]) == 0, line
        else:
            subprocess.run(["bash", "-c", line], cwd=cwd, check=True)


def test_the_guide_builds_the_folder_it_pushes_offline(tmp_path, monkeypatch):
    from huggingface_hub import DatasetCard

    # a complete store named as the guide names it: the int8 conformance vector, unpacked
    assert main(["unpack", str(ROOT / "docs" / "conformance" / "int8.hsk.zip"), str(tmp_path / "sst2.zarr")]) == 0
    store = open_store(str(tmp_path / "sst2.zarr"))
    _run_guide_commands(tmp_path, monkeypatch)

    hub = tmp_path / "runs" / "hub"
    assert sorted(p.name for p in hub.iterdir()) == ["README.md", "sst2.croissant.json", "sst2.hsk.zip"]
    bundle = hub / "sst2.hsk.zip"
    # the bundle is the store: same content address, every digest checked on the way
    assert open_store(str(bundle)).content_address == store.content_address
    # its Croissant names the bundle by its sha256, so a downloader can check the file it got
    assert hashlib.sha256(bundle.read_bytes()).hexdigest() in (hub / "sst2.croissant.json").read_text()
    # the repository's README is the store's card, and the Hub client reads its front matter as card metadata
    card_text = (hub / "README.md").read_text(encoding="utf-8")
    assert card_text == (tmp_path / "sst2.zarr" / "README.md").read_text(encoding="utf-8")
    data = DatasetCard.load(hub / "README.md").data.to_dict()
    meta = store.metadata
    assert data["pretty_name"].startswith("hsk store: sst2/train")
    assert data["task_categories"] == ["text-classification"] and "hsk" in data["tags"]
    assert data["label_names"] == meta.task.labels and data["identity"] == store.meta["identity"]
    assert data["config"] == meta.selection.get("config") and data["rows"] == len(store)


def test_the_guide_pushes_that_folder_to_a_dataset_repository():
    """The push block names the folder built above and a dataset repository, and is valid Python."""
    (push,) = _blocks("python")
    compile(push, "sharing.md", "exec")
    assert 'upload_folder(folder_path="runs/hub"' in push and push.count('repo_type="dataset"') >= 3
    assert "hf_hub_download(" in push and "open_store(" in push
    # the extra, as pyproject.toml declares it (read as text: tomllib is Python 3.11+, hsk supports 3.10)
    assert 'hub = ["huggingface_hub>=0.24"]' in (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[0]
    assert 'pip install -e ".[hub]"' in SECTION


def test_the_card_front_matter_is_yaml_the_hub_client_round_trips(tmp_path):
    """Every store kind's card: the Hub client parses it, and its metadata survives a write and a re-read."""
    from huggingface_hub import DatasetCard

    for name in ("int4", "mlm", "clm", "derived"):
        out = tmp_path / f"{name}.zarr"
        assert main(["unpack", str(ROOT / "docs" / "conformance" / f"{name}.hsk.zip"), str(out)]) == 0
        card = DatasetCard.load(out / "README.md")
        data = card.data.to_dict()
        assert data["pretty_name"] and data["task_categories"] and "hsk" in data["tags"], name
        again = tmp_path / f"{name}-README.md"
        card.save(again)
        assert DatasetCard.load(again).data.to_dict() == data, name
        assert json.dumps(data)  # plain JSON types only: what the Hub stores
