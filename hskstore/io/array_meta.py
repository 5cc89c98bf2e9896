"""Dimension names and attributes on the arrays of an existing store: what `hsk upgrade` adds to a store
written before format 3 (hskstore/format/schema.py declares them; new stores are created with them).

zarr has no public call that changes an existing array's `dimension_names`, so each array's zarr.json is
rewritten with the two fields set, its other fields as they were (the data is not touched).
"""

from __future__ import annotations

import json

import zarr

from ..format.manifest import array_description, list_arrays, manifest_of
from ..format.schema import PROGRESS_DESCRIBED, array_specs
from .zarr_adapter import get_bytes, set_bytes

ZARR_JSON = "zarr.json"


def intended(meta: dict) -> dict[str, tuple[tuple[str, ...], dict]]:
    """(dimension names, attributes) of every array a store described by `meta` has, progress arrays included."""
    out = {spec.name: (spec.dims, spec.attributes) for spec in array_specs(meta)}
    out.update(PROGRESS_DESCRIBED)
    return out


def described_manifest(meta: dict, group: zarr.Group) -> str:
    """The manifest of `meta` over the store's arrays as they will be once `write_described` has run."""
    wanted = intended(meta)
    descriptions = {}
    for name, array in list_arrays(group).items():
        doc = array_description(array)
        if name in wanted:
            dims, attributes = wanted[name]
            doc.update(dimension_names=list(dims), attributes=attributes)
        descriptions[name] = doc
    return manifest_of(meta, descriptions)


def write_described(group: zarr.Group, meta: dict) -> list[str]:
    """Give every array of the store its dimension names and attributes; the paths whose zarr.json changed."""
    changed = []
    for name, (dims, attributes) in intended(meta).items():
        key = f"{name}/{ZARR_JSON}"
        raw = get_bytes(group, key)
        if raw is None:
            continue  # an array the store lacks is reported by the reader, not made up here
        doc = json.loads(raw)
        if doc.get("dimension_names") == list(dims) and doc.get("attributes") == attributes:
            continue
        doc.update(dimension_names=list(dims), attributes=attributes)
        set_bytes(group, key, json.dumps(doc, indent=2).encode())
        changed.append(name)
    return changed
