"""One whole shard of an array, encoded to its bytes as docs/STORE_FORMAT.md "Codecs" specifies.

zarr's write path runs every inner chunk through its async codec pipeline, which cost a dump about
as much CPU as the compression itself (benchmarks/dump_ceiling.py). A writer that always writes
whole shards needs none of that machinery: this encodes the inner chunks with the array's own Blosc
settings, skips those whose bytes are all zero (zarr's `write_empty_chunks=False`), and appends the shard
index (offset and length per chunk, little-endian uint64, 2^64-1 for an empty chunk, then its
CRC32C). The bytes equal zarr's (tests/test_shard_codec.py), so readers go on reading through
zarr. Arrays laid out any other way are left to zarr (`ShardEncoder.of` returns None).
"""

from __future__ import annotations

from dataclasses import dataclass

import google_crc32c
import numpy as np
from numcodecs import Blosc
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec
from zarr.codecs.sharding import ShardingCodecIndexLocation
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync

EMPTY = np.uint64(2**64 - 1)
_SHUFFLES = {"noshuffle": Blosc.NOSHUFFLE, "shuffle": Blosc.SHUFFLE, "bitshuffle": Blosc.BITSHUFFLE}


@dataclass(frozen=True)
class ShardEncoder:
    """Encodes shards of one array whose shards span whole rows (every other axis in one chunk)."""

    path: str  # the array's key in the store
    shape: tuple[int, ...]
    shard_rows: int
    chunk_rows: int
    dtype: np.dtype
    blosc: Blosc

    @classmethod
    def of(cls, array) -> ShardEncoder | None:
        """The encoder for a zarr array laid out as hsk writes them, else None."""
        meta = array.metadata
        codecs = getattr(meta, "codecs", ())
        if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec) or not _is_zero(meta.fill_value):
            return None
        sharding = codecs[0]
        inner, index = sharding.codecs, sharding.index_codecs
        if not (len(inner) == 2 and isinstance(inner[0], BytesCodec) and isinstance(inner[1], BloscCodec)
                and len(index) == 2 and isinstance(index[1], Crc32cCodec)
                and sharding.index_location == ShardingCodecIndexLocation.end
                and getattr(meta.chunk_key_encoding, "separator", None) == "/"):
            return None
        shard, chunk = tuple(meta.chunk_grid.chunk_shape), tuple(sharding.chunk_shape)
        if shard[1:] != tuple(array.shape[1:]) or chunk[1:] != shard[1:] or shard[0] % chunk[0]:
            return None
        return cls(array.path, tuple(array.shape), shard[0], chunk[0], np.dtype(array.dtype), _blosc(inner[1]))

    def key(self, shard: int) -> str:
        """The shard's object key below the array's own path."""
        return "/".join(["c", str(shard), *("0" for _ in self.shape[1:])])

    def encode(self, shard: int, data: np.ndarray) -> bytes | None:
        """The bytes of `shard` holding `data` (its rows; the last shard may hold fewer), or None when
        every chunk is zero (zarr then writes no object at all)."""
        start = shard * self.shard_rows
        rows = min(self.shard_rows, self.shape[0] - start)
        if data.shape != (rows, *self.shape[1:]):
            raise ValueError(f"{self.path}: shard {shard} needs shape {(rows, *self.shape[1:])}, got {data.shape}")
        data = np.ascontiguousarray(data, dtype=self.dtype.newbyteorder("<"))
        n_chunks = self.shard_rows // self.chunk_rows
        index = np.full((n_chunks, 2), EMPTY, dtype="<u8")
        parts, offset = [], 0
        for c in range(-(-rows // self.chunk_rows)):  # chunks past the array's end are never written
            chunk = data[c * self.chunk_rows : (c + 1) * self.chunk_rows]
            if not chunk.view(np.uint8).any():  # zero bytes (zarr compares bits: -0.0 is not empty)
                continue
            if len(chunk) < self.chunk_rows:  # the array's last chunk is stored whole, zero-padded
                pad = np.zeros((self.chunk_rows - len(chunk), *chunk.shape[1:]), chunk.dtype)
                chunk = np.concatenate([chunk, pad])
            payload = self.blosc.encode(chunk)
            index[c] = (offset, len(payload))
            parts.append(payload)
            offset += len(payload)
        if not parts:
            return None
        index_bytes = index.tobytes()
        return b"".join([*parts, index_bytes, google_crc32c.value(index_bytes).to_bytes(4, "little")])


def _blosc(codec: BloscCodec) -> Blosc:
    return Blosc(cname=codec.cname.value, clevel=codec.clevel, shuffle=_SHUFFLES[codec.shuffle.value],
                 blocksize=codec.blocksize, typesize=codec.typesize)


def _is_zero(fill_value) -> bool:
    try:
        return float(fill_value) == 0.0
    except (TypeError, ValueError):
        return False


def put_shard(array, key: str, payload: bytes | None) -> None:
    """Store one shard's bytes below a zarr array, in any store zarr writes to (None: no object, as zarr
    leaves for an all-zero shard; one left by an earlier write of the shard is removed)."""
    target = array.store_path / key
    if payload is None:
        sync(target.delete())
    else:
        sync(target.set(default_buffer_prototype().buffer.from_bytes(payload)))
