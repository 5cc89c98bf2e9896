"""Lineage: where a store came from, recorded in its checksummed metadata and followed back.

- `data_origin` (recorded at finalize, key `data_origin`): the data's fingerprint beyond the
  examples' own (`meta["dataset"]["fingerprint"]`, over texts and labels): the sha256 and size of a
  local source file, or the hub dataset (its revision when the source names one). A derived
  store inherits its parent's.
- `derived_from` (hskstore.share.derive): the parent's URL, content address, identity, config and the
  derive options, nested back to the dump.
- `chain`: the ancestors of a store, nearest first, each found where it is reachable (the recorded
  URL, or a folder of the same name beside the store) and checked by its content address as
  recomputed from what is there (never the address a store claims for itself); otherwise only the
  recorded address is shown.

A store's metadata is what someone handed over: its recorded URL is opened only when it is a local
path or lies where the user's own store URL does (same scheme and host), never a URL of another
host (an `http://` in a forged store would make `hsk info` send a request there).

Each ancestor found is opened as a reader opens a store (metadata, manifest, digests), never its chunks.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import StoreError, printable
from ..format.manifest import identity
from .location import is_local
from .reader import HSKStore

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


def _where(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()


def may_open(recorded: str, child_url: str) -> bool:
    """Whether a URL read from a store's metadata may be opened: a local path, or a URL on the scheme and host of
    the store the user named (`child_url`); never another host."""
    if is_local(recorded):
        return True  # a local folder (hsk reads it as any store: never through links, pipes or devices)
    return not is_local(child_url) and _where(recorded) == _where(child_url)


def _candidates(recorded: object, child_url: str) -> list[str]:
    """Where to look for a parent: its recorded URL (when `may_open`), then a store of the same name beside
    the child."""
    if not isinstance(recorded, str) or not recorded.strip("/"):
        return []
    out = [recorded] if may_open(recorded, child_url) else []
    name = recorded.rstrip("/").rsplit("/", 1)[-1]
    parent_dir = child_url.rstrip("/").rsplit("/", 1)[0] if "/" in child_url.rstrip("/") else "."
    out.append(f"{parent_dir}/{name}")
    return list(dict.fromkeys(out))


def _is_parent(url: str, record: dict) -> bool:
    """Whether the store at url is the one `record` names, by what is recomputed there: its manifest (checked
    against its metadata and arrays as a reader opens it); for a parent of format 1 (no address recorded), its
    identity recomputed from its metadata and its data checksums (checked against its shard digests)."""
    address = record.get("content_address")
    try:
        # recover=False: a path read from metadata is looked at, never tidied (no leftover beside it is touched)
        store = HSKStore(url, allow_unverified=address is None, recover=False)
    except (StoreError, OSError, ValueError):  # nothing there, not a store, damaged, forged: not this parent
        return False
    if address is not None:
        return store.content_address == address
    meta = store.meta
    same_data = meta.get("checksums") is not None and record.get("checksums") == meta.get("checksums")
    return bool(meta.get("complete")) and same_data and record.get("identity") == identity(meta)


def _find(record: dict, child_url: str) -> str | None:
    if record.get("content_address") is None and not record.get("identity"):
        return None  # nothing to check a candidate against
    for url in _candidates(record.get("url"), child_url):
        if _is_parent(url, record):
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
        recorded = record.get("url")
        # the next ancestor is looked for beside this one: where it was found, or where it is recorded when
        # hsk may open that, else beside the store the user named
        here = found or (recorded if isinstance(recorded, str) and may_open(recorded, here) else here)
        record = record.get("derived_from")
    return out


def format_chain(ancestors: list[Ancestor]) -> list[str]:
    """`hsk info` lines: one per ancestor, with where it is or that it is not reachable."""
    names = {1: "parent", 2: "grandparent"}
    lines = []
    for a in ancestors:
        who = names.get(a.depth, f"{'great-' * (a.depth - 2)}grandparent")
        where = f"at {a.found_at}" if a.found_at else f"not reachable (recorded at {a.recorded_url})"
        line = f"{who:<12} {a.content_address or 'no address (older hsk)'}  config {a.config}  {where}"
        lines.append(printable(line))  # addresses, configs and URLs as the store records them: one line each
    return lines
