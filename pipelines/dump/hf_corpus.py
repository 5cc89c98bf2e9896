"""A Hugging Face dataset as an LM dump's corpus (`--data-file`): a folder a `datasets.Dataset` was saved to
(`save_to_disk`), read from its memory-mapped Arrow files from any row on; or `hf:NAME[:CONFIG][@SPLIT]`,
`datasets.load_dataset(NAME, CONFIG, split=SPLIT, streaming=True)` (a hub dataset, or a local folder of data
files), its rows streamed as they download. A row's place is its index: a saved dataset seeks to it, a streamed
one skips the rows before it (read again, not kept)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipelines.core.data import DataError

PREFIX = "hf:"
SAVED, STREAMED = "hf", "hf-stream"
BATCH_ROWS = 1024  # rows per read of a saved dataset


@dataclass(frozen=True)
class FoundDataset:
    """A dataset as the corpus records it: where it is, its kind (SAVED | STREAMED), its size in bytes (the Arrow
    files'; 0 when streamed), its columns and how the store describes it."""

    location: str
    kind: str
    size: int
    columns: tuple[str, ...]
    described: str


def is_dataset(data_file: str) -> bool:
    """`hf:...`, or a local folder holding a saved Dataset (its state.json beside dataset_info.json)."""
    folder = Path(data_file).expanduser()
    return data_file.startswith(PREFIX) or ((folder / "state.json").is_file() and
                                            (folder / "dataset_info.json").is_file())


def parse_spec(spec: str) -> tuple[str, str | None, str]:
    """`hf:NAME[:CONFIG][@SPLIT]` -> (NAME, CONFIG, SPLIT); the split is train unless given."""
    body, _, split = spec.removeprefix(PREFIX).partition("@")
    name, _, config = body.partition(":")
    if not name:
        raise DataError(f"--data-file {spec}: name the dataset: hf:NAME[:CONFIG][@SPLIT], e.g. hf:wikitext:"
                        "wikitext-2-raw-v1@train")
    return name, config or None, split or "train"


def _streamed(spec: str):
    import logging

    import datasets

    name, config, split = parse_spec(spec)
    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)  # its retries' warnings: the one line below says what failed
    try:
        return datasets.load_dataset(name, config, split=split, streaming=True)
    except Exception as exc:  # datasets raises many kinds (offline, no such dataset, no such split)
        said = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise DataError(f"--data-file {spec}: cannot load the Hugging Face dataset {name!r} ({said}); where the hub "
                        "is out of reach, pass a folder saved with Dataset.save_to_disk, or the dataset's data files "
                        "(--data-file data/*.parquet)") from None
    finally:
        hub_log.setLevel(level)


def _saved(folder: str):
    import datasets

    try:
        return datasets.load_from_disk(folder)
    except Exception as exc:
        raise DataError(f"--data-file {folder}: not a readable saved dataset ({str(exc).splitlines()[0][:200]}): "
                        "pass the folder save_to_disk wrote (of a DatasetDict: one split's subfolder)") from None


def open_dataset(data_file: str) -> FoundDataset:
    """The dataset `data_file` names, opened (a streamed one's first row read: its columns, and an offline hub
    refused here in one line)."""
    if data_file.startswith(PREFIX):
        dataset = _streamed(data_file)
        columns = dataset.column_names
        if columns is None:
            columns = list(next(iter(dataset), {}))
        return FoundDataset(data_file, STREAMED, 0, tuple(columns), data_file)
    folder = str(Path(data_file).expanduser().resolve())
    dataset = _saved(folder)
    state = json.loads((Path(folder) / "state.json").read_text(encoding="utf-8"))
    size = sum((Path(folder) / entry["filename"]).stat().st_size for entry in state.get("_data_files", []))
    return FoundDataset(folder, SAVED, size, tuple(dataset.column_names), f"dataset:{data_file}")


def dataset_rows(location: str, kind: str, names: tuple[str, ...], start: int) -> Iterator[tuple[tuple, int]]:
    """(the named columns' values, row index) of every row from row `start` on."""
    if kind == STREAMED:
        for offset, row in enumerate(_streamed(location).skip(start)):
            yield tuple(row.get(name) for name in names), start + offset
        return
    dataset = _saved(location).select_columns(list(names))
    for first in range(start, len(dataset), BATCH_ROWS):
        batch = dataset[first:first + BATCH_ROWS]
        columns = [batch[name] for name in names]
        for i in range(len(columns[0])):
            yield tuple(column[i] for column in columns), first + i
