"""The manifest: one digest over everything a complete store says about itself.

It covers the canonical JSON of the hsk attributes (all of them but the manifest itself, so the
per-array checksums, the layout, the selection, the task, the teacher...) and the zarr metadata of
every array in the group (shape, dtype, chunks, shards, codecs, fill value, attributes). The
per-array checksums cover the data, the manifest covers them: the manifest is the store's content
address. Computing it reads metadata only (one zarr.json per array), so readers check it on open.
"""

from __future__ import annotations

import json
import warnings

import numpy as np

from .digest import fingerprint

MANIFEST_KEY = "manifest"
# Fields that decide the store's content; a resume must match them exactly.
IDENTITY_FIELDS = (
    "format_version",
    "task",
    "dataset",
    "teacher",
    "tokenizer",
    "max_length",
    "selection",
    "layout",
)


def identity(meta: dict) -> str:
    """The digest of the fields that decide a store's content (recorded as `identity`; a resume must match it)."""
    return fingerprint(json.dumps({k: meta.get(k) for k in IDENTITY_FIELDS}, sort_keys=True, default=str))


def list_arrays(group) -> dict:
    """Every array under a zarr group, by path (the writer lease is a file zarr does not know: no warning)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not recognized as a component of a Zarr hierarchy")
        return {path: obj for path, obj in group.members(max_depth=None) if hasattr(obj, "shards")}


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    return value


def array_description(array) -> dict:
    """What decides how an array's bytes are read, in a form that does not depend on JSON spelling.

    `dimension_names` is there only when the array's zarr.json has it (format 3): the manifest of a store
    written before stays what it was."""
    doc = {
        "shape": list(array.shape),
        "dtype": str(array.dtype),
        "chunks": list(array.chunks),
        "shards": None if array.shards is None else list(array.shards),
        "codecs": [codec.to_dict() for codec in array.metadata.codecs],
        "fill_value": _jsonable(array.fill_value),
        "attributes": array.attrs.asdict(),
    }
    names = array.metadata.dimension_names
    if names is not None:
        doc["dimension_names"] = list(names)
    return doc


def compute_manifest(meta: dict, arrays: dict) -> str:
    """`sha256:` over the hsk attributes (minus the manifest) and the description of every array."""
    return manifest_of(meta, {name: array_description(arrays[name]) for name in arrays})


def manifest_of(meta: dict, descriptions: dict[str, dict]) -> str:
    """The manifest of `meta` over array descriptions given by path (what `array_description` gives)."""
    doc = {
        "hsk": {k: v for k, v in meta.items() if k != MANIFEST_KEY},
        "arrays": {name: descriptions[name] for name in sorted(descriptions)},
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    return fingerprint(text)
