"""Where hsk reads and writes: a local path or an fsspec URL (s3://, gs://, memory://...), behind one interface.

`location(url)` gives a `LocalLocation` (a path, or a file:// URL) or a `RemoteLocation` (any other URL,
through fsspec). Callers ask for what they need (exists, names, read, write atomically, create
exclusively, move, remove, list leftovers) and never which kind they hold. What only a local disk
offers stays inside `LocalLocation`: symbolic links and the working directory are reported (the
output rule refuses them), a lease file is created with O_CREAT|O_EXCL and replaced under flock,
writes go to a temporary sibling and are renamed in, and renames are atomic, so a swap killed
between two renames can be finished (`leftovers`). On an object store those are best effort or
absent, as the docstrings say.

stdlib + fsspec + zarr's zip stores only.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import glob
import os
import shutil
import stat
import tempfile
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import BinaryIO

import fsspec
import zarr

from ..errors import CorruptStoreError, StoreError
from .zarr_adapter import ObjectReader, RemoteZipStore, local_store, read_files_here, zip_store

# Where outputs can go besides local folders: object stores and network filesystems (fsspec protocols).
# memory:// is for code in one process (tests); a command refuses it, since it is gone when hsk exits.
WRITABLE_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "hdfs", "webhdfs", "sftp",
                              "ssh", "ftp", "smb", "oci", "oss", "memory"})
BUNDLE_SUFFIX = ".hsk.zip"
# A metadata file (zarr.json, a card, croissant.json, a lease) is KiB; one larger than this is refused unread, so a
# store handed over with a huge or endless one cannot exhaust memory.
METADATA_LIMIT = 64 << 20
_METADATA_SUFFIXES = (".json", ".md")
_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once (os.umask can only be read by setting it): new files get the usual permissions


def _kind_of(mode: int) -> str:
    kinds = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a device"),
             (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _unsafe(path: str, what: str) -> StoreError:
    return StoreError(f"{path} is {what}: hsk reads and writes only plain files and folders inside stores and "
                      "outputs, never through links, pipes or devices; remove it (or re-copy the store without it)")


def read_regular(path: str | os.PathLike, limit: int = METADATA_LIMIT) -> bytes:
    """The bytes of a regular file, never through a symbolic link, at most `limit` of them (StoreError otherwise,
    one line). A FIFO or device is refused without blocking on it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if os.path.islink(path):
            raise _unsafe(str(path), "a symbolic link") from None
        raise exc
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            raise _unsafe(str(path), _kind_of(mode))
        data = f.read(limit + 1)
    if len(data) > limit:
        raise CorruptStoreError(f"{path} is over {limit >> 20} MiB, too large for the metadata it should hold: the "
                                "store is damaged or forged; re-copy it")
    return data


def check_plain_tree(root: str | os.PathLike) -> None:
    """Refuse (StoreError, one line) a local folder holding anything but plain files and folders: a symbolic link
    (it would make hsk read or write outside the folder), a FIFO, a device or a socket (a read would hang or never
    end), or a metadata file (*.json, *.md) over METADATA_LIMIT. The folder itself may be reached by a link."""
    stack = [str(root)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:  # the entry types come with the listing: a stat only for metadata files
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            elif not entry.is_file(follow_symlinks=False):
                raise _unsafe(entry.path, _kind_of(entry.stat(follow_symlinks=False).st_mode))
            elif entry.name.endswith(_METADATA_SUFFIXES) and entry.stat(follow_symlinks=False).st_size > METADATA_LIMIT:
                raise CorruptStoreError(f"{entry.path} is over {METADATA_LIMIT >> 20} MiB, too large for the metadata "
                                        "it should hold: the store is damaged or forged; re-copy it")


def _member_name_problem(name: str, is_dir: bool) -> str | None:
    """Why a member's name is no store key: absolute, with `.`, `..` or empty parts, a backslash, or a control
    character (a key no hsk store holds: zarr would warn about it, or extract it somewhere unexpected)."""
    parts = (name[:-1] if is_dir and name.endswith("/") else name).split("/")
    if name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts) or not name.isprintable():
        return f"its member {name!r} is not a plain relative name (a forged bundle?)"
    return None


def _names_problem(files: list[str]) -> str | None:
    """A member that is a file and, by another member's name, a folder too (`zarr.json` and `zarr.json/x`)."""
    folders = {name.rsplit("/", 1)[0] for name in files if "/" in name}
    folders |= {folder.rsplit("/", i)[0] for folder in folders for i in range(1, folder.count("/") + 1)}
    both = sorted(folders.intersection(files))
    return f"its member {both[0]!r} is both a file and a folder (a forged bundle?)" if both else None


def zip_problem(zf: zipfile.ZipFile) -> str | None:
    """Why a bundle's zip directory cannot be trusted (None when it can): two members of one name (zip tools take
    the first, a reader may take the last: a forged member could hide behind the genuine one), a member name that
    is no plain store key, a metadata member over METADATA_LIMIT once inflated, or a member stored encrypted."""
    seen: set[str] = set()
    for info in zf.infolist():
        if info.filename in seen:
            return f"it holds two members named {info.filename!r} (a forged bundle?)"
        seen.add(info.filename)
        problem = _member_name_problem(info.filename, info.is_dir())
        if problem:
            return problem
        if info.flag_bits & 0x1:
            return f"its member {info.filename!r} is encrypted"
        if info.filename.endswith(_METADATA_SUFFIXES) and info.file_size > METADATA_LIMIT:
            return f"its member {info.filename!r} is over {METADATA_LIMIT >> 20} MiB"
    return _names_problem([info.filename for info in zf.infolist() if not info.is_dir()])


def _new_file_mode(fd: int) -> None:
    os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; a file hsk writes gets what open() would give it


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[tuple[BinaryIO, Path]]:
    """(an open file, its path) to write `path`'s new bytes into; renamed onto `path` on normal exit, deleted
    otherwise. The temporary is created beside `path` under an unpredictable name (tempfile.mkstemp: O_EXCL, so
    never through a link planted in advance), hidden and named `.NAME.hsk-tmp-PID-...` so that the next
    command on `path` deletes it if this process is killed (`LocalLocation.leftovers("tmp")`). The rename
    replaces a link at `path` itself, never the file it points to."""
    path = Path(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.hsk-tmp-{os.getpid()}-", suffix=suffix)
    tmp = Path(name)
    try:
        _new_file_mode(fd)
        with os.fdopen(fd, "wb") as f:
            yield f, tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive advisory lock (flock) on the file `path`, made with its folder when absent, while the
    body runs, so processes sharing a folder take turns; blocks until the lock is free. The file is opened for
    writing: NFS takes an exclusive flock only on a writable descriptor (`LocalLocation.locked`, which must
    neither create its file nor write it, opens read-only). Without flock (not POSIX) the body runs unlocked."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def private_folder(parent: str | os.PathLike, prefix: str) -> str:
    """A new empty folder in `parent` under an unpredictable name starting with `prefix` (tempfile.mkdtemp: never
    an existing folder or a planted link), with the permissions a new folder gets."""
    made = tempfile.mkdtemp(dir=parent, prefix=prefix)
    os.chmod(made, 0o777 & ~_UMASK)
    return made


def _pid_of(rest: str) -> int | None:
    """The pid at the start of what follows `.NAME.hsk-TAG-` (`PID`, `PID-random`, `PID-random.suffix`)."""
    head = rest.split("-", 1)[0].split(".", 1)[0]
    return int(head) if head.isascii() and head.isdigit() else None


def is_local(path: str) -> bool:
    return "://" not in str(path) or str(path).startswith("file://")


def local_path(path: str) -> Path:
    text = str(path)
    return Path(text[len("file://"):] if text.startswith("file://") else text)


def process_running(pid: int) -> bool:
    """Whether process `pid` runs on this machine (as any user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class FoundRoot:
    """A folder `find_roots` stopped at: its head file's bytes (None: only the marker is there)."""

    url: str
    rel: str  # its path under the folder searched ("" for that folder itself)
    head: bytes | None
    marked: bool  # the marker file was seen beside it (object stores list only folders without a head)
    problem: str | None = None  # why the head file could not be read (a link, a FIFO, too large...)

    def name_under(self, name: str) -> str:
        """The path of `name` in this folder, relative to the folder searched (for `read_many`)."""
        return f"{self.rel}/{name}" if self.rel else name


class Location(ABC):
    """One file or folder, local or remote: every storage operation hskstore needs.

    Subclasses implement the storage. Defaults here are what an object store does; `LocalLocation`
    overrides them with the checks only a local disk can make.
    """

    url: str
    writable = True  # a command may write outputs here

    # --- array data: zarr reads and writes through a store made here, never from a URL string ---
    @abstractmethod
    def zarr_store(self, mode: str = "r") -> zarr.abc.store.Store:
        """The zarr store over this folder, opened in `mode` ("r": read-only; "r+", "w-", ...) as zarr
        opens a path or URL string: a new backend is a Location subclass, not a URL zarr knows."""

    def object_reader(self) -> ObjectReader | None:
        """A reader of raw objects under this folder that beats asking the zarr store (the loader's shard
        objects), or None: the zarr store is asked, concurrently on its event loop."""
        return None

    # --- naming ---
    @abstractmethod
    def child(self, name: str) -> Location: ...

    @abstractmethod
    def sibling(self, name: str) -> Location: ...

    @property
    @abstractmethod
    def name(self) -> str: ...

    def problem(self) -> str | None:
        """Why this URL cannot name an hsk output or input (unknown scheme, missing package), or None."""
        return None

    # --- facts ---
    @abstractmethod
    def exists(self) -> bool: ...

    @abstractmethod
    def is_file(self) -> bool: ...

    @abstractmethod
    def is_dir(self) -> bool:
        """Whether an existing path is a folder."""

    @abstractmethod
    def names(self) -> set[str]:
        """The names of a folder's top-level entries (empty for an empty folder)."""

    @abstractmethod
    def modified(self) -> float | None:
        """When the file was last written (None when that cannot be told)."""

    def is_link(self) -> bool:
        return False

    def holds_cwd(self) -> bool:
        """Whether this is the working directory or one of its parents."""
        return False

    def check_plain_tree(self) -> None:  # noqa: B027 (a default, not abstract: object stores have nothing to check)
        """Refuse a folder holding links, FIFOs, devices or huge metadata (module function `check_plain_tree`);
        object stores hold only objects: nothing to check."""

    def leftovers(self, tag: str) -> list[Location]:
        """Hidden siblings `.NAME.hsk-TAG-PID` whose process is gone (local disks; none on object stores,
        where no rename is atomic and a pid names no process here)."""
        return []

    # --- reading ---
    @abstractmethod
    def read_bytes(self) -> bytes: ...

    def read_text(self) -> str:
        return self.read_bytes().decode(errors="replace")

    @abstractmethod
    def read_many(self, names: list[str]) -> dict[str, bytes | None]:
        """name -> bytes of the objects `name` under this folder (None where unreadable), read concurrently."""

    @abstractmethod
    def zip_store(self) -> zarr.storage.ZipStore:
        """zarr's read-only ZipStore over the zip file here (a bundle)."""

    @abstractmethod
    def find_roots(self, head: str, marker: str, keep_file: Callable[[str], bool],
                   also: tuple[str, ...] = ()) -> tuple[list[FoundRoot], list[str]]:
        """(folders holding `head`, `marker` or one of `also` (a root whose head was deleted), never descended
        into; files `keep_file` selects) under this folder; hidden entries and symbolic links are skipped."""

    # --- writing ---
    @abstractmethod
    def makedirs(self) -> None: ...

    @abstractmethod
    def write_atomic(self, data: bytes) -> None:
        """Write the whole file: a reader sees it whole or the previous one."""

    @abstractmethod
    def create_exclusive(self, data: bytes) -> bool:
        """Create the file only if none exists; False when one does."""

    @abstractmethod
    def locked(self) -> contextlib.AbstractContextManager[bool]:
        """Hold this file still while the body checks and replaces it; yields False when it is gone."""

    @abstractmethod
    def move_to(self, dst: Location) -> None: ...

    @abstractmethod
    def remove_file(self) -> None: ...

    @abstractmethod
    def remove_tree(self) -> None:
        """Delete a folder (nothing when absent)."""

    @abstractmethod
    def remove(self) -> None:
        """Delete a file, link or folder here (nothing when absent); a link's target is left alone."""

    @abstractmethod
    def remove_empty_folder(self) -> None:
        """An empty folder counts as nothing there; a move onto it needs it gone."""

    @abstractmethod
    def remove_files(self, keep: Callable[[str], bool]) -> list[str]:
        """Delete every file under this folder whose name `keep` selects; their paths."""


class LocalLocation(Location):
    def __init__(self, url: str) -> None:
        self.url = str(url)
        self.path = local_path(self.url)

    def __repr__(self) -> str:
        return f"LocalLocation({self.url!r})"

    def child(self, name: str) -> LocalLocation:
        return LocalLocation(str(self.path / name))

    def sibling(self, name: str) -> LocalLocation:
        return LocalLocation(str(self.path.parent / name))

    @property
    def name(self) -> str:
        return self.path.name

    # --- facts ---
    def exists(self) -> bool:
        return self.path.exists()

    def is_file(self) -> bool:
        return self.path.is_file()

    def is_dir(self) -> bool:
        return self.path.is_dir()

    def is_link(self) -> bool:
        return self.path.is_symlink()

    def holds_cwd(self) -> bool:
        resolved, cwd = self.path.resolve(), Path.cwd().resolve()
        return resolved == cwd or resolved in cwd.parents

    def names(self) -> set[str]:
        return {entry.name for entry in self.path.iterdir()}

    def modified(self) -> float | None:
        try:
            return self.path.stat().st_mtime
        except OSError:
            return None

    # --- reading ---
    def read_bytes(self) -> bytes:
        """A metadata-sized regular file, never through a link (StoreError for a link, FIFO, device, huge file)."""
        return read_regular(self.path)

    def check_plain_tree(self) -> None:
        if self.path.is_dir():
            check_plain_tree(self.path)

    def read_many(self, names: list[str]) -> dict[str, bytes | None]:
        return dict(zip(names, _read_files([str(self.path / name) for name in names]).values()))

    # --- writing ---
    def makedirs(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)

    def write_atomic(self, data: bytes) -> None:
        """Write to a temporary sibling, then rename: a reader sees the whole file or the previous one."""
        with atomic_file(self.path) as (f, _):
            f.write(data)

    def create_exclusive(self, data: bytes) -> bool:
        """Create the file only if none exists (O_CREAT|O_EXCL, atomic on POSIX and NFS v3+); False when one does."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return True

    @contextlib.contextmanager
    def locked(self) -> Iterator[bool]:
        """Hold an exclusive flock on this file while the body runs; yields False when the file is gone."""
        import fcntl  # POSIX only, and only here

        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield True
        finally:
            os.close(fd)

    def move_to(self, dst: Location) -> None:
        os.rename(self.path, local_path(dst.url))  # atomic on one filesystem; refuses a non-empty dst

    def remove_file(self) -> None:
        self.path.unlink(missing_ok=True)

    def remove_tree(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def remove(self) -> None:
        """Delete a file, link or folder here (nothing when absent); a link's target is left alone."""
        if self.path.is_dir() and not self.path.is_symlink():
            shutil.rmtree(self.path)
        elif self.path.exists() or self.path.is_symlink():
            self.path.unlink()

    def remove_empty_folder(self) -> None:
        """An empty folder counts as nothing there; a rename onto it needs it gone."""
        if self.path.is_dir():
            self.path.rmdir()

    def remove_files(self, keep: Callable[[str], bool]) -> list[str]:
        """Delete every file under this folder whose name `keep` selects; their paths."""
        found = [os.path.join(root, name) for root, _, files in os.walk(self.path) for name in files if keep(name)]
        for path in found:
            os.remove(path)
        return found

    def leftovers(self, tag: str) -> list[Location]:
        prefix = f".{self.path.name}.hsk-{tag}-"
        out: list[Location] = []
        for sibling in sorted(self.path.parent.glob(f"{glob.escape(prefix)}*")):
            pid = _pid_of(sibling.name[len(prefix):])
            if pid is not None and not sibling.is_symlink() and not process_running(pid):
                out.append(LocalLocation(str(sibling)))
        return out

    def zarr_store(self, mode: str = "r") -> zarr.storage.LocalStore:
        return local_store(self.path, mode)

    def object_reader(self) -> ObjectReader:
        return functools.partial(read_files_here, self.path)  # picklable, like the store that holds it

    def zip_store(self):
        if not self.path.is_file():
            raise StoreError(f"no bundle at {self.url}: check the path (make one with `hsk pack STORE "
                             f"OUT{BUNDLE_SUFFIX}`)")
        return zip_store(str(self.path))

    # --- finding stores ---
    def find_roots(self, head: str, marker: str, keep_file: Callable[[str], bool],
                   also: tuple[str, ...] = ()) -> tuple[list[FoundRoot], list[str]]:
        roots, files, stack = [], [], [str(self.path)]
        while stack:
            folder = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            if any(e.name in (head, marker, *also) for e in entries):
                roots.append(folder)
                continue
            folders, found = _children([(e.name, e.path, e.is_dir(follow_symlinks=False)) for e in entries
                                        if e.is_dir(follow_symlinks=False) or e.is_file()], keep_file)
            stack += folders
            files += found
        heads = _read_or_why([os.path.join(r, head) for r in roots])
        found_roots = []
        for r in sorted(roots):
            got = heads[os.path.join(r, head)]
            found_roots.append(FoundRoot(r, _relative(r, str(self.path)), got if isinstance(got, bytes) else None,
                                         os.path.lexists(os.path.join(r, marker)),
                                         got if isinstance(got, str) else None))
        return found_roots, sorted(files)


def _relative(path: str, top: str) -> str:
    return path[len(top):].strip("/") if path.startswith(top) else path


def _read_files(paths: list[str]) -> dict[str, bytes | None]:
    """path -> bytes (None where unreadable), read concurrently."""
    return {path: got if isinstance(got, bytes) else None for path, got in _read_or_why(paths).items()}


def _read_or_why(paths: list[str]) -> dict[str, bytes | str | None]:
    """path -> bytes, or why the file cannot be read (a link, FIFO, device, too large), or None when it is absent;
    read concurrently, each as `read_regular` reads it."""
    def read(path: str) -> bytes | str | None:
        try:
            return read_regular(path)
        except FileNotFoundError:
            return None
        except StoreError as exc:
            return str(exc).split(": hsk ", 1)[0].split(": the store", 1)[0]
        except OSError as exc:
            return f"{path}: {exc.strerror}"

    with ThreadPoolExecutor(max_workers=8) as pool:
        return dict(zip(paths, pool.map(read, paths)))


def _children(entries: list[tuple[str, str, bool]], keep_file: Callable[[str], bool]) -> tuple[list[str], list[str]]:
    """(sub-folders, kept files) among a folder's (name, path, is_dir) entries; hidden ones skipped."""
    folders, files = [], []
    for name, path, is_dir in entries:
        if name.startswith("."):
            continue  # staged outputs, leases, editors' files
        if is_dir:
            folders.append(path)
        elif keep_file(name):
            files.append(path)
    return folders, files


class RemoteLocation(Location):
    """An fsspec URL. Object stores have no rename (a move copies then deletes) and, on some backends, no
    conditional create: `create_exclusive` and `locked` are then best effort."""

    def __init__(self, url: str) -> None:
        self.url = str(url)

    def __repr__(self) -> str:
        return f"RemoteLocation({self.url!r})"

    @cached_property
    def _fs_path(self) -> tuple[fsspec.AbstractFileSystem, str]:
        fs, path = fsspec.core.url_to_fs(self.url)
        return fs, path.rstrip("/")

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        return self._fs_path[0]

    @property
    def path(self) -> str:
        return self._fs_path[1]

    @property
    def scheme(self) -> str:
        return self.url.split("://", 1)[0].split("::")[-1].lower()

    @property
    def writable(self) -> bool:  # type: ignore[override]
        return self.url.split("://", 1)[0].lower() in WRITABLE_SCHEMES

    def problem(self) -> str | None:
        try:
            fsspec.get_filesystem_class(self.scheme)
        except ValueError:
            return (f"{self.url}: unknown URL scheme {self.scheme}://; give a local path or a storage URL such as "
                    "s3://bucket/store.zarr")
        except ImportError as exc:
            return f"{self.url}: {self.scheme}:// needs a package that is not installed ({exc})"
        return None

    def child(self, name: str) -> RemoteLocation:
        return RemoteLocation(f"{self.url.rstrip('/')}/{name}")

    def sibling(self, name: str) -> RemoteLocation:
        return RemoteLocation(f"{self.url.rstrip('/').rpartition('/')[0]}/{name}")

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rpartition("/")[2]

    # --- facts ---
    def exists(self) -> bool:
        return self.fs.exists(self.path)

    def is_file(self) -> bool:
        return self.fs.isfile(self.path)

    def is_dir(self) -> bool:
        return not self.fs.isfile(self.path)  # called on a path that exists: a prefix or folder

    def names(self) -> set[str]:
        names = {entry.rstrip("/").rsplit("/", 1)[-1] for entry in self.fs.ls(self.path, detail=False)}
        names.discard("")
        return names

    def modified(self) -> float | None:
        try:
            return self.fs.modified(self.path).timestamp()
        except (OSError, NotImplementedError, ValueError):
            return None

    # --- reading ---
    def read_bytes(self) -> bytes:
        data = self.fs.cat_file(self.path, start=0, end=METADATA_LIMIT + 1)
        if len(data) > METADATA_LIMIT:
            raise CorruptStoreError(f"{self.url} is over {METADATA_LIMIT >> 20} MiB, too large for the metadata it "
                                    "should hold: the store is damaged or forged; re-copy it")
        return data

    def read_many(self, names: list[str]) -> dict[str, bytes | None]:
        got = self.fs.cat([f"{self.path}/{n}" for n in names], on_error="return") if names else {}
        return {n: _bytes_or_none(got.get(f"{self.path}/{n}")) for n in names}  # s3fs: keys without protocol

    # --- writing ---
    def makedirs(self) -> None:
        self.fs.makedirs(self.path, exist_ok=True)

    def write_atomic(self, data: bytes) -> None:
        """One PUT: object stores show a whole object or the previous one."""
        self.fs.pipe_file(self.path, data)

    def create_exclusive(self, data: bytes) -> bool:
        """Create with mode "xb": a conditional create where the backend has one (s3fs: If-None-Match)."""
        try:
            with self.fs.open(self.path, "xb") as f:
                f.write(data)
        except FileExistsError:
            return False
        except OSError:
            # s3fs reports a failed conditional create (HTTP 412, If-None-Match) as a plain OSError
            if self.fs.exists(self.path):
                return False
            raise
        return True

    @contextlib.contextmanager
    def locked(self) -> Iterator[bool]:
        """No lock on object stores: the caller's check-then-replace is best effort."""
        yield True

    def move_to(self, dst: Location) -> None:
        self.fs.mv(self.path, fsspec.core.url_to_fs(dst.url)[1], recursive=True)

    def remove_file(self) -> None:
        self.fs.rm_file(self.path)

    def remove_tree(self) -> None:
        if self.fs.exists(self.path):
            self.fs.rm(self.path, recursive=True)

    def remove(self) -> None:
        self.remove_tree()

    def remove_empty_folder(self) -> None:
        """Object stores have no empty folders to make way for a move."""

    def remove_files(self, keep: Callable[[str], bool]) -> list[str]:
        found = [p for p in self.fs.find(self.path) if keep(p.rsplit("/", 1)[-1])]
        for path in found:
            self.fs.rm_file(path)
        return found

    def zarr_store(self, mode: str = "r") -> zarr.abc.store.Store:
        return zarr.storage.FsspecStore.from_url(self.url, read_only=mode == "r")

    def zip_store(self):
        return RemoteZipStore(self.url)

    # --- finding stores ---
    def find_roots(self, head: str, marker: str, keep_file: Callable[[str], bool],
                   also: tuple[str, ...] = ()) -> tuple[list[FoundRoot], list[str]]:
        """As LocalLocation.find_roots, one folder level at a time: a level's `head` objects are fetched in one
        concurrent batch, and only the folders without one are listed (concurrently) to descend. Round trips
        grow with the depth, not with the number of stores."""
        protocol = self.url.split("://", 1)[0]
        roots: dict[str, tuple[bytes | None, bool]] = {}
        files, level = [], [self.path]
        with ThreadPoolExecutor(max_workers=16) as pool:
            while level:
                level = self._level(level, (head, marker, also), keep_file, pool, roots, files)
        found_roots = [FoundRoot(f"{protocol}://{d}", _relative(d, self.path), v, marked)
                       for d, (v, marked) in roots.items()]
        return found_roots, [f"{protocol}://{f}" for f in sorted(files)]

    def _level(self, level: list[str], names: tuple[str, str, tuple[str, ...]], keep_file: Callable[[str], bool],
               pool: ThreadPoolExecutor, roots: dict[str, tuple[bytes | None, bool]], files: list[str]) -> list[str]:
        """One level of `find_roots`: adds its roots and kept files; returns the next level's folders."""
        head, marker, also = names
        got = self.fs.cat([f"{d}/{head}" for d in level], on_error="return")
        found = {d: got.get(f"{d}/{head}") for d in level}
        roots.update({d: (v, False) for d, v in found.items() if isinstance(v, bytes)})
        rest = [d for d, v in found.items() if not isinstance(v, bytes)]
        below = []
        for folder, listing in zip(rest, pool.map(self._entries, rest)):
            seen = {name for name, _, _ in listing}
            if marker in seen or seen & set(also):
                roots[folder] = (None, marker in seen)  # no head: creation stopped before it, or it was deleted
                continue
            folders, kept = _children(listing, keep_file)
            below += folders
            files += kept
        return below

    def _entries(self, folder: str) -> list[tuple[str, str, bool]]:
        try:
            listing = self.fs.ls(folder, detail=True)
        except (FileNotFoundError, OSError):
            return []
        return [(e["name"].rstrip("/").rsplit("/", 1)[-1], e["name"].rstrip("/"), e["type"] == "directory")
                for e in listing]


def _bytes_or_none(value) -> bytes | None:
    return value if isinstance(value, bytes) else None


def location(url: str) -> LocalLocation | RemoteLocation:
    """The Location for a local path (or file:// URL) or an fsspec URL."""
    return LocalLocation(url) if is_local(url) else RemoteLocation(url)


def url_problem(url: str) -> str | None:
    """Why `url` cannot name an hsk output or input (an unknown URL scheme, or one whose package is missing)."""
    return location(str(url)).problem()


# --- bundles: what zarr opens for a URL ------------------------------------------------------------
def is_bundle(url: str) -> bool:
    """Whether url names a bundle (by its name: `*.zip`, `.hsk.zip` recommended)."""
    return str(url).rstrip("/").lower().endswith(".zip")


def check_bundle(url: str) -> None:
    """Refuse (CorruptStoreError, one line) a bundle whose zip directory cannot be trusted (`zip_problem`); one
    that is no readable zip at all is left to the reader's own message."""
    try:
        with fsspec.open(url, "rb") as raw, zipfile.ZipFile(raw) as zf:
            problem = zip_problem(zf)
    except (OSError, zipfile.BadZipFile, ValueError):
        return
    if problem:
        raise CorruptStoreError(f"{url} is not a trustworthy bundle: {problem}; ask for it again or pack it again")


def zarr_location(url: str, mode: str = "r") -> zarr.abc.store.Store:
    """The zarr store for url, made by its Location: a read-only ZipStore for a bundle (its zip directory
    checked), else the folder's store opened in `mode` after `check_plain_tree` (a bundle is only read)."""
    url = str(url)
    loc = location(url)
    if is_bundle(url):
        if mode != "r":
            raise StoreError(f"{url} is a bundle: it is only read (unpack it to write)")
        store = loc.zip_store()  # refuses a local path that is no file
        check_bundle(url)
        return store
    loc.check_plain_tree()
    return loc.zarr_store(mode)


def object_reader(url: str) -> ObjectReader | None:
    """The Location's own reader of url's raw objects (None for a bundle, and where zarr's store is better)."""
    return None if is_bundle(str(url)) else location(str(url)).object_reader()
