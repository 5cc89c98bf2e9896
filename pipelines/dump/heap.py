"""Keep the dump's resident memory flat with glibc's allocator: a fixed mmap threshold and a trim per shard.

glibc raises its mmap threshold each time a large block is freed (up to 32 MiB); after that the forward's
variously sized activations come from the heap, which fragments: its free holes stay resident and grow
with the dump's length (8000 rows: 816 MiB peak against 690 after the first shard). Pinning the threshold
at 512 KiB keeps the large activations on mmap, returned to the OS when freed, at no measurable cost here
(2,000 -> 32,000 rows: +5% at 512 KiB, +6.5% at 1 MiB, benchmarks/results/dump_memory_threshold_ab.json;
128 KiB, the threshold users set with MALLOC_MMAP_THRESHOLD_, also moves the many mid-sized blocks to
mmap and costs about a third of the throughput). `malloc_trim(0)` once per shard returns the heap's
remaining free pages. A threshold the user set in the environment is left as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

MMAP_THRESHOLD = 512 << 10  # bytes: blocks this large and larger are mmapped, never left in the heap
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


@functools.cache
def _libc():
    """glibc, or None (another C library, or not Linux): these are glibc's knobs."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


def pin_mmap_threshold() -> None:
    """Fix glibc's mmap threshold at MMAP_THRESHOLD for this process, unless the environment sets one.

    Fixed once set (glibc stops adjusting it), so it holds for whatever the process runs next.
    """
    libc = _libc()
    if libc is not None and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def release_free_memory() -> None:
    """Return the heap's free pages to the OS where the C library can (glibc); otherwise nothing."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
