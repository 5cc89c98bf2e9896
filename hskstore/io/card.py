"""The store card: a `README.md` at the store's root that says what the store holds and how to open it.

Written once, at finalize, from the store's own metadata, in the manner of a Hugging Face dataset
card: YAML front matter a machine reads (task, split, rows, label names, teacher and tokenizer
identity, config and every selection strategy, value dtype, bytes, creation, hsk version) and a
short body a person reads. The front matter is emitted by hand as YAML whose leaves are JSON
scalars and flow lists (JSON is valid YAML), so hskstore needs no YAML library.

The card is a description, not a contract: the checksummed metadata in zarr.json stays the
authority, and `render_card(meta, ...)` rebuilds the card of any store. Nothing in it is written per kind:
the kind's registration (hskstore.format.kinds: its summary, category and arrays as `describe` declares them)
and its typed selection record (`label()`, `kept()`) say everything that differs between kinds.
"""

from __future__ import annotations

import json
import re

import zarr

from ..format import kinds
from ..format.meta import StoreMeta, TaskRef
from ..format.schema import array_specs
from .zarr_adapter import get_bytes, set_bytes

CARD_NAME = "README.md"


def _yaml(obj: dict, indent: int = 0) -> list[str]:
    """Block-mapping YAML of a dict; nested dicts indent, every other value is a JSON scalar or list."""
    lines = []
    pad = " " * indent
    for key, value in obj.items():
        if isinstance(value, dict) and value:
            lines.append(f"{pad}{key}:")
            lines += _yaml(value, indent + 2)
        else:
            lines.append(f"{pad}{key}: {json.dumps(value, default=str)}")
    return lines


# Where a store's metadata names a local file or folder: the teacher, its tokenizer, the data, a parent store.
_LOCAL_NAMES = (("teacher", "name"), ("teacher", "path"), ("tokenizer", "name"), ("tokenizer", "path"),
                ("dataset", "source"), ("derived_from", "url"))


def portable(text):
    """An absolute local path (or `prefix:/path`, as glue_data:/data/glue/SST-2/train.tsv) as its last two
    parts (glue_data:SST-2/train.tsv); anything else (a hub id, an s3:// URL) as it is."""
    if not isinstance(text, str):
        return text
    prefix, sep, rest = text.partition(":")
    if not sep or rest.startswith("//") or "/" in prefix:  # no prefix, a URL, or a path with a colon in it
        prefix, rest = "", text.removeprefix("file://")
    if not rest.startswith("/"):
        return text
    tail = "/".join(part for part in rest.rstrip("/").split("/")[-2:] if part)
    return f"{prefix}:{tail}" if prefix else tail


def shareable(meta: dict) -> dict:
    """The metadata as the card and croissant.json show it: local paths shortened by `portable`, so that a
    store handed on names no one's home folder or machine layout. zarr.json keeps them as recorded (hsk finds
    a store's teacher there); the weights and vocabulary hashes identify the teacher wherever it is."""
    shown = dict(meta)
    for record, key in _LOCAL_NAMES:
        if isinstance(meta.get(record), dict) and key in meta[record]:
            shown[record] = {**shown[record], key: portable(meta[record][key])}
    return shown


def selection_text(meta: dict) -> tuple[str | None, str | None, str]:
    """(config, codec, what the store keeps) from its kind's selection record; for a selection its record cannot
    read (a damaged store a catalog lists) or a kind without one, (None, None, the kind's summary)."""
    kind = kinds.kind_of(meta)
    try:
        record = kind.selection_type.from_dict(meta.get("selection") or {})
        return (*record.label(), record.kept())
    except Exception:  # a damaged selection, or a plugin record without label/kept: the kind still says what it is
        return None, None, kind.summary


def _labelling(task: TaskRef, recorded: dict) -> dict:
    """A labelled task's fields of the card (a kind whose stores hold no labelled task shows none of them)."""
    return {"label_names": task.labels,
            "regression": recorded.get("regression"),  # as recorded: a store may lack it (TaskRef reads False)
            "metric": task.metric}


def front_matter(meta: dict, stored_bytes: int | None) -> dict:
    """The card's machine-readable fields, from a store's hsk metadata (its kind gives its category, its
    selection record the config the title names)."""
    record = StoreMeta.parse(meta)
    task, teacher, tokenizer = record.task, record.teacher, record.tokenizer
    selection = {k: v for k, v in record.selection.items() if k != "deviations"}
    rows = record.layout.n_rows
    config = selection_text(meta)[0] or record.objective
    fields = {
        "pretty_name": f"hsk store: {task.name}/{task.split} at {config}",
        "task_categories": [kinds.get(record.objective).category],
        "objective": record.objective,
        "tags": ["knowledge-distillation", "hidden-state-knowledge", "hsk", "zarr"],
        "task": task.name,
        "split": task.split,
        "rows": rows,
        **(_labelling(task, meta["task"]) if kinds.get(record.objective).labelled else {}),
        "dataset": {"source": record.dataset.source, "fingerprint": record.dataset.fingerprint},
        "teacher": {
            "id": teacher.name,
            "revision": teacher.revision,
            "weights_hash": teacher.weights_hash,
            "architecture": teacher.architecture,
            "num_layers": teacher.num_layers,
            "hidden_size": teacher.hidden_size,
            # recorded since the [CLS] rows of other architectures are read (older cards stay as they were)
            **{k: teacher.record[k] for k in ("model_type", "scores") if k in teacher.record},
            # recorded only when not fp32 (hskstore.format.meta.TeacherRef): fp32 stores keep their cards
            **({"precision": teacher.precision} if teacher.precision else {}),
        },
        "tokenizer": {"id": tokenizer.name, "vocab_hash": tokenizer.vocab_hash, "vocab_size": tokenizer.vocab_size},
        "max_length": record.max_length,
        "config": selection.get("config"),
        "value_dtype": selection.get("value_dtype"),
        "strategies": selection,
        "deviations": sorted(record.selection.get("deviations") or {}),
        "layout": meta["layout"],  # as recorded, key for key
        "bytes": stored_bytes,
        "bytes_per_example": round(stored_bytes / rows, 1) if stored_bytes is not None and rows else None,
        "created": record.created,
        "hsk_version": record.software_version,
        "format_version": record.format_version,
        "identity": record.identity,
    }
    if record.derived_from:
        source = record.derived_from
        fields["derived_from"] = {"url": source.get("url"), "config": source.get("config"),
                                  "identity": source.get("identity")}
    return fields


def with_front_matter(fields: dict, body: str) -> str:
    """A card's text: its fields as YAML front matter, then its body."""
    return "---\n" + "\n".join(_yaml(fields)) + "\n---\n" + body


def _precision_words(teacher: dict) -> str:
    """' (its forward in bf16)' for a teacher that ran in another precision than fp32; nothing for fp32 (the cards of
    stores written before `--precision` existed stay as they were)."""
    return f" (its forward in {teacher['precision']})" if teacher.get("precision") else ""


def array_table(meta: dict) -> list[str]:
    """The card's table of arrays, as the kind's `describe` declares them (each kept layer's once, as <i>)."""
    rows = {}
    for spec in array_specs(meta):
        name = re.sub(r"^layers/\d+/", "layers/<i>/", spec.name)
        codec = spec.attributes.get("codec")
        what = spec.attributes.get("description", "") + (f" (codec `{codec}`)" if codec else "")
        rows.setdefault(name, f"| `{name}` | {', '.join(spec.dims)} | {spec.dtype} | {what} |")
    return ["| array | axes | dtype | what it holds |", "|---|---|---|---|", *rows.values()]


def card_body(meta: dict, fields: dict, name: str) -> str:
    """The card's text below its front matter: what the store holds (its kind's summary, its selection record's
    words, its arrays) and how to open it."""
    kind, kept = kinds.kind_of(meta), selection_text(meta)[2]
    task, teacher = meta["task"], f"`{meta['teacher']['name']}`{_precision_words(meta['teacher'])}"
    table = "\n".join(array_table(meta))
    return f"""
# {fields['pretty_name']}

An offline feature store for teacher-free knowledge distillation, written by hsk: {kind.summary}.
It holds what the teacher {teacher} computed once over the {fields['rows']} rows of {task['name']}/{task['split']}:
{kept}.
Students train from it without the teacher (`hsk train --store {name}`; `hsk methods` lists the methods that read a
{kind.name} store).

Every shard carries checksums; `hsk verify {name}` checks them, `hsk info {name}` describes the
store. The metadata in `zarr.json` (attribute `hsk`) is the authority; this card is rebuilt from it.

{table}

Open it with `hskstore` (numpy and zarr only, no torch):

```python
from hskstore import open_store
store = open_store("{name}")  # also s3://... URLs and .hsk.zip bundles
shard = store.read_shard(0)   # {{array: numpy array}} of shard 0, checked against its digests
```

Or with plain zarr (Zarr v3):

```python
import zarr
group = zarr.open_group("{name}", mode="r")
rows, meta = group["row"][:], group.attrs["hsk"]
```
"""


def render_card(meta: dict, stored_bytes: int | None = None, name: str = "store.zarr") -> str:
    """The card's text: front matter, then what the store is for and how to open it.

    `name` is how the examples refer to the store (its folder name: the card stays true when the
    store is copied elsewhere).
    """
    meta = shareable(meta)
    fields = front_matter(meta, stored_bytes)
    return with_front_matter(fields, card_body(meta, fields, name))


def stored_bytes(group: zarr.Group, names: list[str]) -> int:
    """Bytes the named arrays take on their storage (compressed shards; metadata not counted)."""
    return int(sum(group[name].nbytes_stored() for name in names))


def store_name(url: str) -> str:
    """The folder name the card's examples use: the last part of the URL, without the hidden
    `.NAME.hsk-staged-PID-RANDOM` wrapping of a store being built to replace another
    (hskstore.io.outputs.staged_path)."""
    name = str(url).rstrip("/").rsplit("/", 1)[-1] or "store.zarr"
    match = re.fullmatch(r"\.(.+)\.hsk-staged-\d+(?:-[0-9a-z_]+)?", name)
    return match.group(1) if match else name


def write_card(group: zarr.Group, text: str) -> str:
    """Write a finished store's card (hskstore.io.reader.render_card) at the store's root; returns its text."""
    set_bytes(group, CARD_NAME, text.encode())
    return text


def read_card(group: zarr.Group) -> str | None:
    """The card stored in a store, or None when it has none (incomplete, or written by an older hsk)."""
    data = get_bytes(group, CARD_NAME)
    return None if data is None else data.decode(errors="replace")
