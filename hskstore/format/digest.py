"""Checksums: one digest per (shard, array) over the decoded data, and one per array from those.

Digests cover decoded values (dtype and shape included), so they do not depend on codecs, and
a reader can check each shard as it streams it.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .schema import DIGEST_BYTES


def shard_digest(data: np.ndarray) -> bytes:
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    h.update(f"{data.dtype.str}{data.shape}".encode())
    h.update(np.ascontiguousarray(data))  # the buffer itself: the same bytes as tobytes(), without a copy
    return h.digest()


def array_checksum(shard_digests: list[bytes]) -> str:
    h = hashlib.sha256()
    for d in shard_digests:
        h.update(bytes(d))
    return "sha256:" + h.hexdigest()


def fingerprint(obj: bytes | str) -> str:
    data = obj.encode() if isinstance(obj, str) else obj
    return "sha256:" + hashlib.sha256(data).hexdigest()
