"""Keep the dump's resident memory flat: hand the allocator's free pages back to the OS between shards.

glibc raises its mmap threshold each time a large block is freed; after that the forward's variously
sized activations (and the shard's arrays) come from the heap, whose free holes stay resident, so a
long dump's RSS creeps up with its length. `malloc_trim(0)` returns every free page of every arena
(the holes included, by madvise) at a cost of a few milliseconds: once per shard is enough to keep the
peak flat, where pinning the threshold (MALLOC_MMAP_THRESHOLD_) costs a third of the throughput.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None (another C library, or not Linux)."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_memory() -> None:
    """Return the heap's free pages to the OS where the C library can (glibc); otherwise nothing."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
