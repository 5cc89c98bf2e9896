"""Lineage: where a store came from, recorded in its checksummed metadata and followed back.

- `data_origin` (recorded at finalize, key `data_origin`): the data's fingerprint beyond the
  examples' own (`meta["dataset"]["fingerprint"]`, over texts and labels): the sha256 and size of a
  local source file, or the hub dataset (its revision when the source names one). A derived
  store inherits its parent's.
- `derived_from` (hskstore.derive): the parent's URL, content address, identity, config and the
  derive options, nested back to the dump.
- `chain`: the ancestors of a store, nearest first, each found where it is reachable (the recorded
  URL, or a folder of the same name beside the store) and checked by content address; otherwise
  only the recorded address is shown.

Everything here reads root metadata only (one zarr.json per ancestor), never chunks.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

from .location import location

_FILE_SOURCES = ("glue_data", "file", "text", "table")


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def data_origin(source: str) -> dict:
    """The data's fingerprint from a dataset source string ("glue_data:/x/train.tsv", "hub:glue/sst2:train")."""
    kind, _, rest = str(source).partition(":")
    if kind in _FILE_SOURCES and os.path.isfile(rest):
        return {"kind": "files", "files": [{"path": rest, "sha256": _sha256_file(rest),
                                            "bytes": os.path.getsize(rest)}]}
    if kind == "hub":
        name, _, split = rest.rpartition(":")
        repo, _, revision = name.partition("@")
        return {"kind": "hub", "dataset": repo, "split": split, "revision": revision or None}
    return {"kind": "unknown", "source": str(source)}


@dataclass(frozen=True)
class Ancestor:
    """One store up a chain: its recorded address and config, and where it was found (None: not reachable)."""

    depth: int  # 1 parent, 2 grandparent...
    content_address: str | None
    config: str | None
    recorded_url: str | None
    found_at: str | None


def _root_meta(url: str) -> dict | None:
    """The hsk attributes of the store at url from its root zarr.json alone; None when there is none."""
    try:
        doc = json.loads(location(url).child("zarr.json").read_bytes())
    except Exception:  # missing, unreadable or not JSON: not reachable here
        return None
    meta = (doc.get("attributes") or {}).get("hsk") if isinstance(doc, dict) else None
    return meta if isinstance(meta, dict) else None


def _candidates(recorded: str | None, child_url: str) -> list[str]:
    """Where to look for a parent: its recorded URL, then a store of the same name beside the child."""
    if not recorded:
        return []
    out = [recorded]
    name = recorded.rstrip("/").rsplit("/", 1)[-1]
    parent_dir = child_url.rstrip("/").rsplit("/", 1)[0] if "/" in child_url.rstrip("/") else "."
    out.append(f"{parent_dir}/{name}")
    return list(dict.fromkeys(out))


def _find(record: dict, child_url: str) -> str | None:
    address = record.get("content_address")
    for url in _candidates(record.get("url"), child_url):
        meta = _root_meta(url)
        if meta is not None and meta.get("complete") and (address is None or meta.get("manifest") == address):
            return url
    return None


def chain(url: str, meta: dict, max_depth: int = 32) -> list[Ancestor]:
    """The ancestors of the store at url (whose metadata is `meta`), parent first."""
    out: list[Ancestor] = []
    record, here = meta.get("derived_from"), url
    while isinstance(record, dict) and len(out) < max_depth:
        found = _find(record, here)
        out.append(Ancestor(len(out) + 1, record.get("content_address"), record.get("config"), record.get("url"),
                            found))
        here = found or record.get("url") or here
        record = record.get("derived_from")
    return out


def format_chain(ancestors: list[Ancestor]) -> list[str]:
    """`hsk info` lines: one per ancestor, with where it is or that it is not reachable."""
    names = {1: "parent", 2: "grandparent"}
    lines = []
    for a in ancestors:
        who = names.get(a.depth, f"{'great-' * (a.depth - 2)}grandparent")
        where = f"at {a.found_at}" if a.found_at else f"not reachable (recorded at {a.recorded_url})"
        lines.append(f"{who:<12} {a.content_address or 'no address (older hsk)'}  config {a.config}  {where}")
    return lines
