"""The one output rule every writing command follows (stores, teacher folders, runs, sweeps, reports).

- A path that exists and is not an output of the command's kind is refused with one line and left
  untouched: a file, an ordinary folder, a symlink, a zarr group that is not an hsk store, the
  working directory or one of its ancestors. An empty folder counts as nothing there.
- `--overwrite` replaces only an output of the same kind, and only once the new one is complete:
  `staged_replace` builds it in a hidden sibling and swaps it in; an interrupted overwrite leaves the
  old output intact.

How an output is recognised: an hsk store by its zarr.json holding hsk attributes, or by its writer
lease (the first file a writer creates, so even a half-created store is recognised); any other
output folder by the MARKER file `mark_output` writes into it before anything else.

The rule is the same for local paths and fsspec URLs (s3://, memory://...): storage goes through
hskstore.io.location. This module knows one kind itself, the store; the kinds of other folders (runs,
teachers, sweeps...) and which of them resume are the commands' (pipelines/core/output_kinds.py).
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import StoreError, StoreExistsError
from ..format.schema import top_level_entries
from ..version import __version__
from .location import WRITABLE_SCHEMES, LocalLocation, Location, is_bundle, location, private_folder

MARKER = ".hsk-output.json"
STORE = "store"
LEASE_NAME = ".hsk-lease.json"  # a store's writer lease (hskstore.io.lease); names a store from its first byte


@functools.cache
def store_entries() -> frozenset[str]:
    """The top-level entries a store of any hsk version and kind can hold (from the schema); a zarr group with no
    attributes and only these is a store whose creation was interrupted by an older hsk (it wrote the attributes
    last). Computed on first use: it asks every kind, installed packages' included, which no import should do."""
    return top_level_entries() | {LEASE_NAME}


def _staged_store_entries() -> frozenset[str]:
    """What an unpack killed while extracting leaves in its staged folder (zip members come in name order, the
    root zarr.json last): these names alone mark a staged folder as hsk's."""
    return store_entries() | {"README.md", "croissant.json"}

# zarr's local store writes each object to `<name>.<uuid4 hex>.partial`, then renames it into place.
PARTIAL_FILE = re.compile(r"\.[0-9a-f]{32}\.partial$")


class OutputError(StoreExistsError):
    """An output path holds something this command must not write over; the message says what to do."""


def refuse_bundle_output(url: str) -> None:
    """Writers call this: a bundle name is no writable output (bundles are read-only, made only by `hsk pack`)."""
    if is_bundle(url):
        raise StoreExistsError(
            f"{url} is a bundle name: bundles are read-only. Write the store to a folder or URL, then "
            f"`hsk pack STORE {url}`"
        )


def fault(point: str) -> None:
    """Test hook (see hskstore.io.writer): with HSK_FAULT=<point>, end the process here as a kill would, with
    exit status 86; with HSK_FAULT=wait-<point>:<file>, wait here until <file> exists."""
    name, _, flag = os.environ.get("HSK_FAULT", "").partition(":")
    if name == point:
        os._exit(86)
    if name == f"wait-{point}" and flag:
        while not os.path.exists(flag):
            time.sleep(0.05)


def _notice(message: str) -> None:
    """Something hsk did on its own that the user must hear about (a repaired leftover), on stderr."""
    print(f"hsk: {message}", file=sys.stderr)


def check_output_url(url: str) -> None:
    """Refuse (OutputError) a URL hsk cannot write an output to: unknown, read-only (http://...) or the like."""
    loc = location(str(url))
    problem = loc.problem()
    if problem is None and not loc.writable:
        scheme = str(url).split("://", 1)[0].lower()
        problem = (f"{url}: hsk does not write outputs to {scheme}:// URLs; give a local path or an object "
                   f"store or network filesystem URL ({', '.join(sorted(WRITABLE_SCHEMES - {'memory'})[:6])}...)")
    if problem:
        raise OutputError(problem)


def _what_to_do(path: str, flag: str = "--out") -> str:
    return f"choose another {flag} (hsk never writes into {path}: remove it yourself if it is yours to lose)"


def _read_json(text: str) -> dict | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _marked_kind(path: str, read) -> str:
    kind = (_read_json(read(MARKER)) or {}).get("kind")
    if not isinstance(kind, str) or not kind:
        raise OutputError(f"{path} has an unreadable {MARKER}: {_what_to_do(path)}")
    return kind


def _zarr_kind(path: str, names: set[str], read) -> str:
    doc = _read_json(read("zarr.json"))
    if doc is None:
        raise OutputError(
            f"{path} holds an unreadable zarr.json, so it is not a readable hsk store: {_what_to_do(path)}"
        )
    attrs = doc.get("attributes") or {}
    if doc.get("node_type") == "group" and ("hsk" in attrs or (not attrs and names <= store_entries())):
        return STORE  # with attributes; or half-created by an older hsk (structure only, attributes not yet written)
    raise OutputError(f"{path} is a zarr {doc.get('node_type', 'node')} but not an hsk store: {_what_to_do(path)}")


def _leased_kind(read) -> str:
    """The kind a folder holding only a writer lease is becoming: the lease's `kind`, else a store (a store
    writer's lease names none)."""
    try:
        kind = (_read_json(read(LEASE_NAME)) or {}).get("kind")
    except (OSError, UnicodeDecodeError):
        kind = None
    return kind if isinstance(kind, str) and kind else STORE


def _kind_from_entries(path: str, names: set[str], read) -> str:
    """The kind of a non-empty folder from its top-level entry names; `read(name)` gives a file's text."""
    names = {name for name in names if not PARTIAL_FILE.search(name)} or names
    if MARKER in names:
        return _marked_kind(path, read)
    if "zarr.json" in names:
        return _zarr_kind(path, names, read)
    if LEASE_NAME in names and names <= store_entries():
        return _leased_kind(read)  # a writer took the lease and stopped before creating its output
    if ".zgroup" in names or ".zarray" in names:
        raise OutputError(f"{path} is a Zarr v2 store, not an hsk store (Zarr v3): {_what_to_do(path)}")
    listing = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
    raise OutputError(f"{path} is a folder that is not an hsk output (it holds {listing}): {_what_to_do(path)}")


def output_kind(path: str) -> str | None:
    """What output is at `path`: None (nothing there, or an empty folder), "store" for an hsk store
    (half-created ones included), or the kind recorded in a MARKER folder.

    Raises OutputError (one line) for anything else: a file, an ordinary or non-empty folder, a
    symlink, a zarr group that is not hsk, a Zarr v2 store, the working directory or an ancestor of it.
    """
    path = str(path)
    loc = location(path)
    check_output_url(path)
    if loc.is_link():
        raise OutputError(f"{path} is a symbolic link: give the real path of a new or hsk output instead")
    if not loc.exists():
        return None
    if loc.holds_cwd():
        raise OutputError(f"{path} is the working directory or one of its parents: {_what_to_do(path)}")
    if not loc.is_dir():
        raise OutputError(f"{path} is a file, not an output folder: {_what_to_do(path)}")
    names = loc.names()
    if not names:
        return None
    return _kind_from_entries(path, names, lambda name: loc.child(name).read_text())


def mark_output(folder: str, kind: str, **info) -> None:
    """Create `folder` if needed and write its MARKER (kind + info) before anything else goes in."""
    doc = {"kind": kind, "hsk_version": __version__, **info}
    loc = location(folder)
    loc.makedirs()
    loc.child(MARKER).write_atomic(json.dumps(doc, indent=2, sort_keys=True, default=str).encode())  # whole or none


def claim_output(path: str, kind: str, *, overwrite: bool) -> str:
    """Decide what a command writing a `kind` output at `path` does: "new" (nothing there),
    "resume" (an output of this kind is there, no overwrite: the command resumes it or says it is
    complete), "replace" (same kind, overwrite: build the new one with `staged_replace`).

    Refuses (OutputError) a path holding another kind or foreign data, with or without overwrite.
    Writes nothing itself, except to finish an `--overwrite` killed in its swap (`recover_swap`).
    """
    recover_swap(path)
    found = output_kind(path)
    if found is None:
        return "new"
    if found != kind:
        raise OutputError(
            f"{path} holds a {found}, not a {kind}: choose another --out (--overwrite replaces only a {kind})"
        )
    location(str(path)).check_plain_tree()  # a link inside would make a resume write outside the output
    return "replace" if overwrite else "resume"


def staged_path(path: str, tag: str = "staged") -> str:
    """A hidden sibling of `path` (same parent, so a rename is cheap) named `.NAME.hsk-TAG-PID-RANDOM`: the pid
    tells a later command whether its writer is gone, the random part makes the name unpredictable. On a local
    disk a "staged" folder is created here, empty and new (never a folder or link planted in advance)."""
    loc = location(str(path).rstrip("/"))
    prefix = f".{loc.name}.hsk-{tag}-{os.getpid()}-"
    if isinstance(loc, LocalLocation) and tag == "staged":
        return private_folder(loc.path.parent, prefix)
    return loc.sibling(prefix + uuid.uuid4().hex[:12]).url


def remove_tree(path: str) -> None:
    """Delete a folder this process created (a staged or set-aside output); local or fsspec."""
    location(path).remove_tree()


def _staged_by_hsk(loc: Location) -> bool:
    """Whether a staged sibling holds only what hsk puts there: nothing yet, the entries of a store (an unpack
    killed before the root zarr.json), or an output hsk recognises."""
    if loc.is_link() or not loc.is_dir():
        return False
    if loc.names() <= _staged_store_entries():
        return True
    try:
        return output_kind(loc.url) is not None
    except StoreError:  # not something hsk made (or a link, a FIFO where its metadata should be): left alone
        return False


def _remove_dead_staged(path: str) -> None:
    """Delete staged siblings `.NAME.hsk-staged-PID-...` of earlier runs killed on this machine (local disks).

    Only hsk-made outputs under exactly that name, and only when process PID no longer runs.
    """
    for sibling in location(path).leftovers("staged"):
        if _staged_by_hsk(sibling):
            sibling.remove_tree()
            _notice(f"removed {sibling.url}, what an interrupted command left while building {path}")


def remove_dead_temporaries(path: str) -> None:
    """Delete the temporary files `.NAME.hsk-tmp-PID-...` (hskstore.io.location.atomic_file) of earlier commands on
    `path` killed on this machine: plain files under exactly that name whose process no longer runs."""
    for tmp in location(str(path)).leftovers("tmp"):
        if isinstance(tmp, LocalLocation) and tmp.path.is_file() and not tmp.path.is_symlink():
            tmp.remove_file()


@contextmanager
def staged_replace(path: str) -> Iterator[str]:
    """Yield a hidden sibling of `path` to write the new output into; swap it in on normal exit.

    The swap renames the old output aside, renames the new one in, then deletes the old one. On an
    exception (or a kill) nothing is swapped: the old output stays intact at `path` and the staged
    sibling stays behind (a rerun stages afresh under its own pid, and deletes staged siblings whose
    process is gone; they are hidden, named `.NAME.hsk-staged-PID`, and safe to delete).

    Local disks: each rename is atomic, so `path` always holds either the whole old or the whole new
    output, except for the instant between the two renames (a kill there leaves the old one at
    `.NAME.hsk-old-PID`, which the next command on `path` moves back: `recover_swap`). Object stores
    have no rename: fsspec's move copies then deletes object by object, so a kill during the swap can
    leave `path` partly copied; the staged copy is complete and the command can be rerun.
    """
    path = str(path).rstrip("/")
    _remove_dead_staged(path)
    staged = staged_path(path)
    yield staged
    target, aside = location(path), location(staged_path(path, "old"))
    had_old = output_kind(path) is not None
    if had_old:
        target.move_to(aside)
        fault("between-swap-renames")
    else:
        target.remove_empty_folder()  # an empty folder counts as nothing there; rename needs it gone
    location(staged).move_to(target)
    if had_old:
        aside.remove_tree()


def recover_swap(path: str, *, only_if_missing: bool = False) -> None:
    """Finish the swap of an `--overwrite` killed between its renames (local disks; says what it did).

    A dead process's `.NAME.hsk-old-PID` is the old output set aside: with nothing at `path` (killed before
    the new one moved in) it is moved back, as if the overwrite never ran (its staged copy is cleaned up
    by the next overwrite); with an output at `path` (killed after) it is what the overwrite replaced,
    and is deleted. Anything under that name that hsk did not make is left alone. `only_if_missing`
    (readers): act only when nothing is at `path`.
    """
    if not str(path).strip("/"):
        return
    target = location(str(path).rstrip("/"))
    _remove_dead_staged(str(path).rstrip("/"))  # a killed overwrite's half-built copy: no later command needs it
    asides = target.leftovers("old")  # none on object stores: no request made
    if only_if_missing and asides and target.exists():
        return
    for aside in asides:
        if _made_by_hsk(aside):
            _finish_swap(aside, target, str(path))


def _finish_swap(aside: Location, target: Location, path: str) -> None:
    if _made_by_hsk(target):
        aside.remove_tree()
        _notice(f"removed {aside.url}, the old output an interrupted --overwrite of {path} left beside the new one")
    elif not target.exists() or (target.is_dir() and not target.names()):
        target.remove_empty_folder()
        aside.move_to(target)
        _notice(f"restored {path} from {aside.name}: an --overwrite was killed while swapping it (the new "
                "output was not swapped in; rerun that command)")


def _made_by_hsk(loc: Location) -> bool:
    try:
        return not loc.is_link() and loc.exists() and loc.is_dir() and output_kind(loc.url) is not None
    except StoreError:  # OutputError, or a link or FIFO where its metadata should be
        return False


def claim_file_output(path: str, kind: str, recognise, *, overwrite: bool, flag: str = "OUT") -> Path:
    """The output rule for commands that write one local file (a catalog page, a parquet export).

    Nothing there: "new". A file `recognise(path)` says this command wrote: replaced only with
    `overwrite` (write it with `hskstore.io.location.atomic_file`). Anything else (a folder, a link, a
    foreign file) is refused with one line and left untouched. Temporaries of earlier runs on `path`
    that were killed are deleted. `flag` names where the user gave `path` (an argument, an option such as
    --html): a refusal says to choose another one.
    """
    loc = location(str(path))
    if not isinstance(loc, LocalLocation):
        raise OutputError(f"{path}: {kind} outputs are local files; write it here, then copy it where it goes")
    remove_dead_temporaries(str(path))
    p = loc.path
    if p.is_symlink() or (p.exists() and not p.is_file()):
        raise OutputError(f"{path} exists and is not a file hsk wrote: {_what_to_do(str(path), flag)}")
    if p.exists():
        if not recognise(p):
            raise OutputError(f"{path} exists and is not a {kind} hsk wrote: {_what_to_do(str(path), flag)}")
        if not overwrite:
            raise OutputError(
                f"{path} already holds a {kind}: pass --overwrite to replace it, or choose another {flag}")
    return p
