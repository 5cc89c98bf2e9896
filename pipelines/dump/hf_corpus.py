"""A Hugging Face dataset as an LM dump's corpus (`--data-file`): a folder a `datasets.Dataset` was saved to
(`save_to_disk`), read from its memory-mapped Arrow files from any row on; or `hf:NAME[:CONFIG][@SPLIT]`,
`datasets.load_dataset(NAME, CONFIG, split=SPLIT, streaming=True)` (a hub dataset, or a local folder of data
files), its rows streamed as they download. A row's place is its index: a saved dataset seeks to it.

A streamed dataset cannot seek to a row, so its iteration state (`IterableDataset.state_dict()`: which data
file, and which example in it) is kept every SNAPSHOT_ROWS rows as a `StreamState`, and each shard records the
last one at or before where the next shard starts (pipelines.dump.corpus.ShardCursors). A resume loads it
(`load_state_dict`): the data files before it are not opened again; datasets reads the file it names from that
file's start up to the example (a state at a file's end names that file), and the dump reads at most
SNAPSHOT_ROWS - 1 rows more to reach the resume point. A resume refuses data files other than those the state was
taken on (added, removed, renamed, resized; a hub dataset's compared by name, whatever its commit), as a text
corpus's changed files are refused; a state the installed datasets lays out otherwise is warned of, and the rows
before the resume point are read again."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipelines.core.data import DataError

PREFIX = "hf:"
SAVED, STREAMED = "hf", "hf-stream"
BATCH_ROWS = 1024  # rows per read of a saved dataset
SNAPSHOT_ROWS = 32  # a stream's state is kept every this many rows (a state_dict() call: ~4.6 us, 0.15 us a row)


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


@dataclass(frozen=True)
class StreamState:
    """A streamed dataset's iteration state before row `row` (`IterableDataset.state_dict()`: iterating after
    `load_state_dict(state)` yields row `row` first), and the data files it was taken on: how many, and a
    digest of their names and, where local, their sizes (data_files)."""

    row: int
    state: dict
    n_files: int
    files: str

    def to_json(self) -> bytes:
        return json.dumps({"row": self.row, "state": self.state, "n_files": self.n_files, "files": self.files},
                          separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes) -> StreamState:
        fields = json.loads(data.decode("utf-8"))
        return cls(int(fields["row"]), fields["state"], int(fields["n_files"]), str(fields["files"]))


def unversioned(path: str) -> str:
    """A hub data file's path without the commit datasets resolved it at (`hf://datasets/NAME@SHA/...`): a new
    commit that leaves the files' names (a card edited) does not make an interrupted dump's stream another."""
    return re.sub(r"@[0-9a-f]{40}(?=/|$)", "", path, count=1) if path.startswith("hf://") else path


def data_files(dataset) -> tuple[int, str]:
    """How many data files a streamed dataset reads, and a digest of their names, in order, and of each local
    one's size (a text corpus's files are compared so). datasets keeps the list in its examples iterable's
    arguments (`original_files` of JSON and text loaders, `files` of Parquet's); where it is elsewhere, the
    dataset's shard count alone is compared."""
    arguments = getattr(getattr(dataset, "_ex_iterable", None), "kwargs", None) or {}
    files = next((arguments[key] for key in ("original_files", "files") if isinstance(arguments.get(key), list)), [])
    described = [[unversioned(str(f)), os.path.getsize(f) if os.path.isfile(str(f)) else -1] for f in files]
    text = json.dumps([dataset.num_shards, described])
    return len(files) or dataset.num_shards, hashlib.sha256(text.encode()).hexdigest()


def _fits(saved, fresh) -> bool:
    """Whether a recorded state has the layout of this dataset's own (None, not yet set, fits anything)."""
    if saved is None or fresh is None:
        return True
    if type(saved) is not type(fresh):
        return False
    if isinstance(fresh, dict):
        return saved.keys() == fresh.keys() and all(_fits(saved[k], v) for k, v in fresh.items())
    if isinstance(fresh, list):
        return len(saved) == len(fresh) and all(map(_fits, saved, fresh))
    return saved == fresh if isinstance(fresh, str) else True


def _taken_up(dataset, spec: str, resume: StreamState | None, files: tuple[int, str], start: int
              ) -> StreamState | None:
    """`resume` loaded into `dataset` (returned), or None where there is none or it does not fit (a warning:
    the rows before the resume point `start` are read again); changed data files are refused in one line."""
    if resume is None:
        return None
    if not 0 <= resume.row <= start:  # a damaged record: taken up there, the rows before it would be lost
        print(f"WARNING: --data-file {spec}: the recorded stream position (row {resume.row}) is not at or before "
              f"the resume point (row {start}); the rows before it are read again", file=sys.stderr, flush=True)
        return None
    if (resume.n_files, resume.files) != files:
        change = "other names or sizes" if resume.n_files == files[0] else f"{files[0]} now"
        raise DataError(f"--data-file {spec}: its data files are not those this interrupted dump read ({resume.n_files}"
                        f" files then, {change}): resume with the same files, or pass --overwrite to start again")
    if not _fits(resume.state, dataset.state_dict()):
        print(f"WARNING: --data-file {spec}: the recorded stream position is not laid out as this datasets "
              f"release lays it out; the {resume.row} rows before it are read again", file=sys.stderr, flush=True)
        return None
    dataset.load_state_dict(resume.state)
    return resume


def _examples(dataset, spec: str, first: int) -> Iterator[tuple[int, dict]]:
    """(row, example) of a stream whose next row is `first`; a row that cannot be read is refused in one line."""
    iterator, row = iter(dataset), first
    while True:
        try:
            example = next(iterator)
        except StopIteration:
            return
        except Exception as exc:  # datasets and its readers raise many kinds (a damaged file, a dropped connection)
            said = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise DataError(f"--data-file {spec}: cannot read row {row} ({said}); the shards written are kept: "
                            "rerun the same command to resume once the dataset reads again") from None
        yield row, example
        row += 1


def _stream_rows(spec: str, names: tuple[str, ...], start: int, resume: StreamState | None
                 ) -> Iterator[tuple[tuple, int, StreamState | None]]:
    dataset = _streamed(spec)
    files = data_files(dataset)
    state = _taken_up(dataset, spec, resume, files, start)
    for row, example in _examples(dataset, spec, state.row if state else 0):
        if row >= start:  # rows between the state and the start: fewer than SNAPSHOT_ROWS, read and dropped
            yield tuple(example.get(name) for name in names), row, state
        if (row + 1) % SNAPSHOT_ROWS == 0:  # the state after this row: the next row's (a dict copy)
            state = StreamState(row + 1, dataset.state_dict(), *files)


def dataset_rows(location: str, kind: str, names: tuple[str, ...], start: int, resume: StreamState | None = None
                 ) -> Iterator[tuple[tuple, int, StreamState | None]]:
    """(the named columns' values, row index, the streamed dataset's latest state at or before it: None for a
    saved dataset, and before a stream's first state) of every row from row `start` on; a streamed dataset
    takes up its iteration at `resume` (a state at or before `start`) instead of at its first row."""
    if kind == STREAMED:
        yield from _stream_rows(location, names, start, resume)
        return
    dataset = _saved(location).select_columns(list(names))
    for first in range(start, len(dataset), BATCH_ROWS):
        batch = dataset[first:first + BATCH_ROWS]
        columns = [batch[name] for name in names]
        for i in range(len(columns[0])):
            yield tuple(column[i] for column in columns), first + i, None
