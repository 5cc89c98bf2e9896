"""Keep the dump's resident memory in check with glibc's allocator: the heap trimmed once per shard.

`malloc_trim(0)` once per shard returns the heap's free pages to the OS. glibc's mmap threshold is left
dynamic: fixing it at 512 KiB kept a CPU dump's peak RSS flatter over long dumps but put the forward's
activations on fresh mmapped pages, whose page faults cost a CPU dump part of its throughput
(docs/benchmarks.md "Dump memory"). A user who wants the flat heap back sets `MALLOC_MMAP_THRESHOLD_=524288`
in the environment, which glibc reads at start-up. On a GPU the activations are not on this heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _libc():
    """glibc, or None (another C library, or not Linux): malloc_trim is glibc's."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def release_free_memory() -> None:
    """Return the heap's free pages to the OS where the C library can (glibc); otherwise nothing."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
