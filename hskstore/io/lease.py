"""One writer at a time: a lease object inside the store (`.hsk-lease.json`).

The lease names its holder (pid, host, process start, start time) and is refreshed while the holder
writes. Taking it:

- local disks: created with O_CREAT|O_EXCL, atomic on POSIX filesystems (NFS v3+ included);
- fsspec URLs: created with mode "xb", which backends implement as a conditional create where the
  object store supports it (s3fs: If-None-Match); on a backend without it the check and the create
  are two steps, and two writers starting in the same instant can both believe they hold it.

A writer of another output than a store (a training run's folder) names that output's `kind` in its lease, so a
folder that holds nothing but the lease yet is recognised as what it is becoming (hskstore.io.outputs).

A lease is stale, and taken over with a message, when its holder is gone: same host and that
process no longer runs, or not refreshed for STALE_AFTER_S seconds (a holder on another host, or a
frozen one). An unreadable lease (empty, torn, garbled) names no holder: it counts as held until its
file is STALE_AFTER_S seconds old. A holder refreshes every REFRESH_S seconds from a daemon thread,
and checks before each shard that the lease is still its own.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import threading
import time
import uuid

from ..errors import StoreError
from .location import Location, location
from .outputs import LEASE_NAME

STALE_AFTER_S = 600.0
REFRESH_S = 30.0


class LeaseHeldError(StoreError):
    """Another writer holds the store's lease."""


def _now() -> float:
    return time.time()


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="seconds")


def _proc_start(pid: int) -> str | None:
    """The kernel's start time of a process (Linux), so a reused pid is not mistaken for the holder."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _pid_alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # runs, as another user
    if start is not None and _proc_start(pid) not in (None, start):
        return False  # the pid was reused by another process
    return True


def describe(doc: dict) -> str:
    if not doc.get("pid") and not doc.get("host"):
        return "a writer that cannot be identified (its lease file is empty or unreadable)"
    return f"pid {doc.get('pid')} on {doc.get('host')} since {doc.get('started')}"


def stale_reason(doc: dict, now: float | None = None, modified: float | None = None) -> str | None:
    """Why a lease's holder is gone, or None while it may still be writing.

    `doc` is {} for an unreadable lease: held until the file (modified at `modified`) is STALE_AFTER_S old.
    """
    now = _now() if now is None else now
    if not doc:
        if modified is not None and now - modified <= STALE_AFTER_S:
            return None
        return f"its lease is unreadable and was not modified for over {STALE_AFTER_S:.0f}s"
    if doc.get("host") == socket.gethostname() and isinstance(doc.get("pid"), int):
        if not _pid_alive(doc["pid"], doc.get("proc_start")):
            return "that process is gone"
    refreshed = doc.get("refreshed_at")
    if not isinstance(refreshed, (int, float)) or now - refreshed > STALE_AFTER_S:
        return f"not refreshed for over {STALE_AFTER_S:.0f}s"
    return None


class Lease:
    """The writer lease of the store at `url`; `acquire` it before writing anything, `release` it after."""

    def __init__(self, url: str, *, log=None, kind: str | None = None):
        self.url = str(url).rstrip("/")
        self.log = log
        self.kind = kind  # what the folder becomes (a run...), for a folder that holds nothing but the lease yet
        self.token = uuid.uuid4().hex
        self.doc: dict = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # --- storage -------------------------------------------------------------------------------
    @property
    def path(self) -> str:
        return f"{self.url}/{LEASE_NAME}"

    @property
    def _file(self) -> Location:
        return location(self.url).child(LEASE_NAME)

    def _read(self) -> dict | None:
        try:
            text = self._file.read_bytes().decode()
        except (FileNotFoundError, KeyError):
            return None
        except (IsADirectoryError, NotADirectoryError):
            raise LeaseHeldError(
                f"{self.path} is a folder, not an hsk writer lease: hsk cannot tell who writes {self.url}; "
                "remove that folder yourself if no hsk command is writing there"
            ) from None
        except UnicodeDecodeError:
            return {}
        try:
            doc = json.loads(text)
        except ValueError:
            return {}  # torn or damaged: treated as a holder that cannot be identified
        return doc if isinstance(doc, dict) else {}

    def _modified(self) -> float | None:
        """When the lease file was last written (None when that cannot be told)."""
        return self._file.modified()

    def _create(self, text: str) -> bool:
        """Create the lease object only if none exists; False when one does (see the module docstring). The
        lease is a writer's first file: a path where no folder can be made (/proc/self/x) is refused here."""
        try:
            return self._file.create_exclusive(text.encode())
        except (FileNotFoundError, NotADirectoryError, FileExistsError, IsADirectoryError) as exc:
            raise StoreError(f"{self.url}: hsk cannot create an output there ({exc.strerror or exc}): choose "
                             "another --out, in a folder you can write to") from None

    def _replace(self, text: str) -> None:
        self._file.write_atomic(text.encode())

    def _document(self) -> str:
        now = _now()
        if not self.doc:
            self.doc = {"pid": os.getpid(), "host": socket.gethostname(), "proc_start": _proc_start(os.getpid()),
                        "started": _iso(now), "token": self.token}
            if self.kind:
                self.doc["kind"] = self.kind
        self.doc["refreshed_at"] = now
        return json.dumps(self.doc, sort_keys=True)

    # --- protocol ------------------------------------------------------------------------------
    def acquire(self) -> Lease:
        """Take the lease, taking over a stale one; LeaseHeldError (one line) while another writer holds it."""
        for _ in range(3):  # a lease released between our create and our read: try again
            if self._create(self._document()):
                self._start_refreshing()
                return self
            holder = self._read()
            if holder is None:
                continue
            reason = stale_reason(holder, modified=self._modified() if not holder else None)
            if reason is None:
                raise LeaseHeldError(self._held_message(holder))
            if self._take_over(holder):
                if self.log is not None:
                    self.log(f"taking over the lease of {self.url} from {describe(holder)}: {reason}")
                self._start_refreshing()
                return self
        raise LeaseHeldError(f"{self.url}: could not take the writer lease ({LEASE_NAME}); rerun the command")

    def refuse_if_held(self) -> None:
        """LeaseHeldError (one line) while a live writer holds the lease; nothing otherwise (no lease, or a stale
        one). Takes nothing: a command that would refuse the output for another reason says this first, as
        waiting for that writer comes before whatever else it would have to do."""
        holder = self._read()
        if holder is not None and stale_reason(holder, modified=self._modified() if not holder else None) is None:
            raise LeaseHeldError(self._held_message(holder))

    def _held_message(self, holder: dict) -> str:
        if not holder:
            age = f"{STALE_AFTER_S:.0f}s"
            return (f"{self.url} has an unreadable writer lease ({LEASE_NAME}, written in the last {age}): a writer "
                    f"may be starting; it is taken over once it is {age} old (delete it yourself if no hsk command "
                    "is writing there)")
        return (f"{self.url} is being written by {describe(holder)} (lease {LEASE_NAME}): wait for it to "
                f"finish, or stop that process; a lease not refreshed for {STALE_AFTER_S:.0f}s is taken over")

    def _take_over(self, stale: dict) -> bool:
        """Replace the stale lease with ours, unless someone else replaced it first. On a local disk the
        holder's file is flock'ed while it is checked and replaced, so one taker wins; on an object store
        this is best effort (see the module docstring)."""
        with self._file.locked() as still_there:
            if not still_there or self._read() != stale:
                return False
            self._replace(self._document())
            return True

    def _start_refreshing(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._refresh_loop, name="hsk-lease", daemon=True)
        self._thread.start()

    def _refresh_loop(self) -> None:
        while not self._stop.wait(REFRESH_S):
            with self._lock:
                if self._stop.is_set():
                    return
                try:
                    if (self._read() or {}).get("token") == self.token:
                        self._replace(self._document())
                except OSError:
                    pass  # a missed refresh is harmless: the next one, or check(), tells

    def check(self) -> None:
        """Raise LeaseHeldError when the lease is no longer ours (taken over as stale by another writer)."""
        holder = self._read() or {}
        if holder.get("token") != self.token:
            raise LeaseHeldError(
                f"{self.url}: the writer lease was taken over by {describe(holder)} while this run wrote; "
                "stopping (the other writer goes on)"
            )

    def release(self) -> None:
        """Stop refreshing and delete the lease, if it is still ours."""
        self._stop.set()
        with self._lock:
            if self._thread is not None:
                self._thread = None
            try:
                if (self._read() or {}).get("token") != self.token:
                    return
                self._file.remove_file()
            except OSError:
                pass

    def moved_to(self, url: str) -> Lease:
        """The same lease after its store was renamed (a staged overwrite swapped in)."""
        self.url = str(url).rstrip("/")
        return self
