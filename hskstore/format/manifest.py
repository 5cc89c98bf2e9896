"""The manifest: one digest over what a complete store holds and the metadata that describes it.

From format 4 (ADDRESS_SINCE) it covers the canonical JSON (hskstore.format.canonical, RFC 8785) of the hsk
attributes but the writer's notes (the manifest itself, `stored_bytes`, `created`, `software_version`,
`upgraded`: where, when and how compactly a writer wrote, not what) and of each array's description (shape,
dtype, chunks, shards, fill value, dimension names, attributes), not its codecs: the per-array checksums cover
the decoded data, so two writers of the same data, whatever they compress with and however they spell their
zarr.json, reach the same manifest. It is the store's content address. Stores of formats 2 and 3 keep the rule
they were written with (LEGACY: Python's json.dumps over every attribute and the codecs too), so their
addresses still verify. Computing it reads metadata only (one zarr.json per array), so readers check it on open.
"""

from __future__ import annotations

import json
import warnings

import numpy as np

from .canonical import canonical
from .digest import fingerprint
from .schema import ADDRESS_SINCE

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


# Attributes the format-4 manifest leaves out: what one writer notes about its own run, not the content.
WRITER_NOTES = (MANIFEST_KEY, "stored_bytes", "created", "software_version", "upgraded")
# What the format-4 manifest takes of an array's description: how its decoded values are laid out and named;
# its codecs (compressor, level, shuffle) are how one writer chose to store them.
DESCRIBED = ("shape", "dtype", "chunks", "shards", "fill_value", "dimension_names", "attributes")


def _canonical_rule(meta: dict) -> bool:
    version = meta.get("format_version")
    return isinstance(version, int) and not isinstance(version, bool) and version >= ADDRESS_SINCE


def identity(meta: dict) -> str:
    """The digest of the fields that decide a store's content (recorded as `identity`; a resume must match it):
    canonical JSON from format 4, the spelling of json.dumps before."""
    fields = {k: meta.get(k) for k in IDENTITY_FIELDS}
    if _canonical_rule(meta):
        return fingerprint(canonical(fields))
    return fingerprint(json.dumps(fields, sort_keys=True, default=str))


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
    """The manifest of `meta` over array descriptions given by path (what `array_description` gives), by the rule
    of the format `meta` records."""
    if _canonical_rule(meta):
        return fingerprint(canonical({
            "hsk": {k: v for k, v in meta.items() if k not in WRITER_NOTES},
            "arrays": {name: {key: descriptions[name].get(key) for key in DESCRIBED} for name in descriptions},
        }))
    return _legacy_manifest(meta, descriptions)


def _legacy_manifest(meta: dict, descriptions: dict[str, dict]) -> str:
    """Formats 2 and 3: every attribute but the manifest, the codecs too, Python's json.dumps spelling."""
    doc = {
        "hsk": {k: v for k, v in meta.items() if k != MANIFEST_KEY},
        "arrays": {name: descriptions[name] for name in sorted(descriptions)},
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    return fingerprint(text)
