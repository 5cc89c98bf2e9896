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

stdlib + fsspec only: the rule is the same for local paths and fsspec URLs (s3://, memory://...).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import fsspec

from .errors import StoreExistsError
from .schema import top_level_entries

MARKER = ".hsk-output.json"
STORE = "store"
LEASE_NAME = ".hsk-lease.json"  # a store's writer lease (hskstore.lease); names a store from its first byte
# The top-level entries a store of any hsk version and kind can hold (from the schema); a zarr group with no
# attributes and only these is a store whose creation was interrupted by an older hsk (it wrote the attributes last).
STORE_ENTRIES = top_level_entries() | {LEASE_NAME}

# zarr's local store writes each object to `<name>.<uuid4 hex>.partial`, then renames it into place.
PARTIAL_FILE = re.compile(r"\.[0-9a-f]{32}\.partial$")


class OutputError(StoreExistsError):
    """An output path holds something this command must not write over; the message says what to do."""


# Where outputs can go besides local folders: object stores and network filesystems (fsspec protocols).
# memory:// is for code in one process (tests); a command refuses it, since it is gone when hsk exits.
WRITABLE_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "hdfs", "webhdfs", "sftp",
                              "ssh", "ftp", "smb", "oci", "oss", "memory"})


def fault(point: str) -> None:
    """Test hook (see hskstore.writer): with HSK_FAULT=<point>, end the process here as a kill would, with
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


def url_problem(url: str) -> str | None:
    """Why `url` cannot name an hsk output or input (an unknown URL scheme, or one whose package is missing)."""
    text = str(url)
    if is_local(text):
        return None
    scheme = text.split("://", 1)[0].split("::")[-1].lower()
    try:
        fsspec.get_filesystem_class(scheme)
    except ValueError:
        return (f"{text}: unknown URL scheme {scheme}://; give a local path or a storage URL such as "
                "s3://bucket/store.zarr")
    except ImportError as exc:
        return f"{text}: {scheme}:// needs a package that is not installed ({exc})"
    return None


def check_output_url(url: str) -> None:
    """Refuse (OutputError) a URL hsk cannot write an output to: unknown, read-only (http://...) or the like."""
    problem = url_problem(url)
    if problem is None and not is_local(str(url)):
        scheme = str(url).split("://", 1)[0].lower()
        if scheme not in WRITABLE_SCHEMES:
            problem = (f"{url}: hsk does not write outputs to {scheme}:// URLs; give a local path or an object "
                       f"store or network filesystem URL ({', '.join(sorted(WRITABLE_SCHEMES - {'memory'})[:6])}...)")
    if problem:
        raise OutputError(problem)


def is_local(path: str) -> bool:
    return "://" not in str(path) or str(path).startswith("file://")


def local_path(path: str) -> Path:
    text = str(path)
    return Path(text[len("file://"):] if text.startswith("file://") else text)


def _what_to_do(path: str) -> str:
    return f"choose another --out (hsk never writes into {path}: remove it yourself if it is yours to lose)"


def _read_json(text: str) -> dict | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _kind_from_entries(path: str, names: set[str], read) -> str | None:
    """The kind of a non-empty folder from its top-level entry names; `read(name)` gives a file's text."""
    names = {name for name in names if not PARTIAL_FILE.search(name)} or names
    if MARKER in names:
        doc = _read_json(read(MARKER)) or {}
        kind = doc.get("kind")
        if not isinstance(kind, str) or not kind:
            raise OutputError(f"{path} has an unreadable {MARKER}: {_what_to_do(path)}")
        return kind
    if "zarr.json" in names:
        doc = _read_json(read("zarr.json"))
        if doc is None:
            raise OutputError(
                f"{path} holds an unreadable zarr.json, so it is not a readable hsk store: {_what_to_do(path)}"
            )
        attrs = doc.get("attributes") or {}
        if doc.get("node_type") == "group" and "hsk" in attrs:
            return STORE
        if doc.get("node_type") == "group" and not attrs and names <= STORE_ENTRIES:
            return STORE  # half-created by an older hsk: structure only, attributes not yet written
        raise OutputError(f"{path} is a zarr {doc.get('node_type', 'node')} but not an hsk store: {_what_to_do(path)}")
    if LEASE_NAME in names and names <= STORE_ENTRIES:
        return STORE  # a writer took the lease and stopped before creating the group
    if ".zgroup" in names or ".zarray" in names:
        raise OutputError(f"{path} is a Zarr v2 store, not an hsk store (Zarr v3): {_what_to_do(path)}")
    listing = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
    raise OutputError(f"{path} is a folder that is not an hsk output (it holds {listing}): {_what_to_do(path)}")


def _local_kind(path: str) -> str | None:
    p = local_path(path)
    if p.is_symlink():
        raise OutputError(f"{path} is a symbolic link: give the real path of a new or hsk output instead")
    if not p.exists():
        return None
    resolved, cwd = p.resolve(), Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents:
        raise OutputError(f"{path} is the working directory or one of its parents: {_what_to_do(path)}")
    if not p.is_dir():
        raise OutputError(f"{path} is a file, not an output folder: {_what_to_do(path)}")
    names = {entry.name for entry in p.iterdir()}
    if not names:
        return None
    return _kind_from_entries(path, names, lambda name: (p / name).read_text(errors="replace"))


def _remote_kind(path: str) -> str | None:
    fs, root = fsspec.core.url_to_fs(path)
    root = root.rstrip("/")
    if not fs.exists(root):
        return None
    if fs.isfile(root):
        raise OutputError(f"{path} is a file, not an output folder: {_what_to_do(path)}")
    names = {entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(root, detail=False)}
    names.discard("")
    if not names:
        return None
    return _kind_from_entries(path, names, lambda name: fs.cat_file(f"{root}/{name}").decode(errors="replace"))


def output_kind(path: str) -> str | None:
    """What output is at `path`: None (nothing there, or an empty folder), "store" for an hsk store
    (half-created ones included), or the kind recorded in a MARKER folder.

    Raises OutputError (one line) for anything else: a file, an ordinary or non-empty folder, a
    symlink, a zarr group that is not hsk, a Zarr v2 store, the working directory or an ancestor of it.
    """
    path = str(path)
    if is_local(path):
        return _local_kind(path)
    check_output_url(path)
    return _remote_kind(path)


def mark_output(folder: str, kind: str, **info) -> None:
    """Create `folder` if needed and write its MARKER (kind + info) before anything else goes in."""
    from . import __version__

    doc = {"kind": kind, "hsk_version": __version__, **info}
    text = json.dumps(doc, indent=2, sort_keys=True, default=str)
    if is_local(folder):
        p = local_path(folder)
        p.mkdir(parents=True, exist_ok=True)
        tmp = p / f"{MARKER}.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, p / MARKER)  # atomic: a reader sees the whole marker or none
        return
    fs, root = fsspec.core.url_to_fs(folder)
    fs.makedirs(root, exist_ok=True)
    fs.pipe_file(f"{root.rstrip('/')}/{MARKER}", text.encode())


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
    return "replace" if overwrite else "resume"


def claim_whole_output(path: str, kind: str, *, overwrite: bool) -> str:
    """`claim_output` for outputs built whole in one go (teacher, student, report), which have nothing
    to resume: "new" or "replace"; the same kind already there without `overwrite` is refused."""
    status = claim_output(path, kind, overwrite=overwrite)
    if status == "resume":
        raise OutputError(f"{path} already holds a {kind}: pass --overwrite to replace it, or choose another --out")
    return status


def staged_path(path: str, tag: str = "staged") -> str:
    """A hidden sibling of `path` (same parent, so a rename is cheap) named with this process's pid."""
    path = str(path).rstrip("/")
    parent, _, name = path.rpartition("/")
    if not parent and not is_local(path):
        raise OutputError(f"{path}: cannot stage an output at the root of a bucket; give a folder")
    sibling = f".{name}.hsk-{tag}-{os.getpid()}"
    if is_local(path):
        return str(local_path(path).parent / sibling)
    return f"{parent}/{sibling}"


def remove_tree(path: str) -> None:
    """Delete a folder this process created (a staged or set-aside output); local or fsspec."""
    if is_local(path):
        shutil.rmtree(local_path(path), ignore_errors=True)
        return
    fs, root = fsspec.core.url_to_fs(path)
    if fs.exists(root):
        fs.rm(root, recursive=True)


def _move(src: str, dst: str) -> None:
    if is_local(src):
        os.rename(local_path(src), local_path(dst))  # atomic on one filesystem; refuses a non-empty dst
        return
    fs, src_root = fsspec.core.url_to_fs(src)
    fs.mv(src_root, fsspec.core.url_to_fs(dst)[1], recursive=True)


def _remove_dead_staged(path: str) -> None:
    """Delete staged siblings `.NAME.hsk-staged-PID` of earlier runs killed on this machine (local only).

    Only hsk-made outputs under exactly that name, and only when process PID no longer runs.
    """
    if not is_local(path):
        return
    p = local_path(path)
    prefix = f".{p.name}.hsk-staged-"
    for sibling in p.parent.glob(f"{glob.escape(prefix)}*"):
        pid = sibling.name[len(prefix):]
        if not pid.isdigit() or sibling.is_symlink() or _running(int(pid)):
            continue
        try:
            if output_kind(str(sibling)) is not None:
                shutil.rmtree(sibling, ignore_errors=True)
        except OutputError:
            pass  # not something hsk made: left alone


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    staged = staged_path(path)
    remove_tree(staged)  # a leftover of this very pid (pids are reused): never someone else's
    _remove_dead_staged(path)
    yield staged
    aside = staged_path(path, "old")
    had_old = output_kind(path) is not None
    if had_old:
        _move(path, aside)
        fault("between-swap-renames")
    elif is_local(path) and local_path(path).is_dir():
        local_path(path).rmdir()  # an empty folder counts as nothing there; rename needs it gone
    _move(staged, path)
    if had_old:
        remove_tree(aside)


def recover_swap(path: str) -> None:
    """Finish the swap of an `--overwrite` killed between its renames (local disks; says what it did).

    A dead process's `.NAME.hsk-old-PID` is the old output set aside: with nothing at `path` (killed before
    the new one moved in) it is moved back, as if the overwrite never ran (its staged copy is cleaned up
    by the next overwrite); with an output at `path` (killed after) it is what the overwrite replaced,
    and is deleted. Anything under that name that hsk did not make is left alone.
    """
    if not is_local(path) or not str(path).strip("/"):
        return
    p = local_path(str(path).rstrip("/"))
    prefix = f".{p.name}.hsk-old-"
    for aside in sorted(p.parent.glob(f"{glob.escape(prefix)}*")):
        pid = aside.name[len(prefix):]
        if pid.isdigit() and not aside.is_symlink() and not _running(int(pid)) and _made_by_hsk(aside):
            _finish_swap(aside, p, str(path))


def _finish_swap(aside: Path, p: Path, path: str) -> None:
    if _made_by_hsk(p):
        shutil.rmtree(aside, ignore_errors=True)
        _notice(f"removed {aside}, the old output an interrupted --overwrite of {path} left beside the new one")
    elif not p.exists() or (p.is_dir() and not any(p.iterdir())):
        if p.exists():
            p.rmdir()
        os.rename(aside, p)
        _notice(f"restored {path} from {aside.name}: an --overwrite was killed while swapping it (the new "
                "output was not swapped in; rerun that command)")


def _made_by_hsk(path: Path) -> bool:
    try:
        return not path.is_symlink() and path.is_dir() and output_kind(str(path)) is not None
    except OutputError:
        return False


def claim_file_output(path: str, kind: str, recognise, *, overwrite: bool) -> Path:
    """The output rule for commands that write one local file (a catalog page, a parquet export).

    Nothing there: "new". A file `recognise(path)` says this command wrote: replaced only with
    `overwrite` (write it to `staged_path(path)` and `os.replace` it in). Anything else (a folder, a
    link, a foreign file) is refused with one line and left untouched.
    """
    p = local_path(path)
    if not is_local(str(path)):
        raise OutputError(f"{path}: {kind} outputs are local files; write it here, then copy it where it goes")
    if p.is_symlink() or (p.exists() and not p.is_file()):
        raise OutputError(f"{path} exists and is not a file hsk wrote: {_what_to_do(str(path))}")
    if p.exists():
        if not recognise(p):
            raise OutputError(f"{path} exists and is not a {kind} hsk wrote: {_what_to_do(str(path))}")
        if not overwrite:
            raise OutputError(f"{path} already holds a {kind}: pass --overwrite to replace it, or choose another path")
    return p
