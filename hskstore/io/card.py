"""The store card: a `README.md` at the store's root that says what the store holds and how to open it.

Written once, at finalize, from the store's own metadata, in the manner of a Hugging Face dataset
card: YAML front matter a machine reads (task, split, rows, label names, teacher and tokenizer
identity, config and every selection strategy, value dtype, bytes, creation, hsk version) and a
short body a person reads. The front matter is emitted by hand as YAML whose leaves are JSON
scalars and flow lists (JSON is valid YAML), so hskstore needs no YAML library.

The card is a description, not a contract: the checksummed metadata in zarr.json stays the
authority, and `hskstore.io.reader.render_card(meta, ...)` rebuilds the card of any store.
"""

from __future__ import annotations

import json
import re

import zarr

from ..format.meta import StoreMeta
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


def front_matter(meta: dict, stored_bytes: int | None, at: str, category: str) -> dict:
    """The card's machine-readable fields, from a store's hsk metadata.

    `at` (what the store keeps, in a few words) and `category` (its Hugging Face task category) are its
    kind's: hskstore.io.reader's store classes give them (`card_headline`).
    """
    record = StoreMeta.parse(meta)
    task, teacher, tokenizer = record.task, record.teacher, record.tokenizer
    selection = {k: v for k, v in record.selection.items() if k != "deviations"}
    rows = record.layout.n_rows
    fields = {
        "pretty_name": f"hsk store: {task.name}/{task.split} at {at}",
        "task_categories": [category],
        "objective": record.objective,
        "tags": ["knowledge-distillation", "hidden-state-knowledge", "hsk", "zarr"],
        "task": task.name,
        "split": task.split,
        "rows": rows,
        "label_names": task.labels,
        "regression": meta["task"].get("regression"),  # as recorded: a store may lack it (TaskRef reads False)
        "metric": task.metric,
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


def task_body(meta: dict, fields: dict, name: str) -> str:
    """A task store's card below its front matter: what it holds and how to open it."""
    task, sel = meta["task"], meta["selection"]
    layers = ", ".join(str(i) for i in sel["teacher_layers"]) or "none (logits only)"
    body = f"""
# {fields['pretty_name']}

An offline feature store for teacher-free knowledge distillation, written by hsk. It holds
what the teacher `{meta['teacher']['name']}` computed{_precision_words(meta['teacher'])}
once over the {fields['rows']} rows of {task['name']}/{task['split']}: its logits, and the hidden-state
knowledge (HSK) kept at config `{sel['config']}`: teacher layers {layers}, {sel['config'].split(',')[1]}
tokens per example ranked by [CLS] attention ({sel['token_strategy']}), and a fraction
{sel['config'].split(',')[2]} of each kept vector's activations ({sel['width_strategy']}), as
{sel['value_dtype']} values with bit-packed masks. Students train from it without the teacher:
`hsk train --store {name} --student tinybert4 --out runs/student`.

Every shard carries checksums; `hsk verify {name}` checks them, `hsk info {name}` describes the
store. The metadata in `zarr.json` (attribute `hsk`) is the authority; this card is rebuilt from it.

Open it with `hskstore` (numpy and zarr only, no torch):

```python
from hskstore import open_store
store = open_store("{name}")                       # also s3://... URLs and .hsk.zip bundles
dense = store.dense(store.read_shard(0), store.layers[0])  # [rows, NL, d] teacher vectors
```

Or with plain zarr (Zarr v3):

```python
import zarr
group = zarr.open_group("{name}", mode="r")
logits, meta = group["logits"][:], group.attrs["hsk"]
```
"""
    return body


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
