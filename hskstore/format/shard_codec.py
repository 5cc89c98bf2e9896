"""A shard object's bytes, both ways, as docs/STORE_FORMAT.md ("Shard objects") specifies them.

hsk writes and reads whole shards, so it needs none of zarr's per-chunk machinery: zarr runs every
inner chunk through its async codec pipeline, which cost a dump's writing and a loader's reading
more CPU than the compression itself (benchmarks/store/shard_write_cost.py, loader_throughput.py). A
`ShardLayout` encodes a shard's inner chunks with the array's own Blosc settings, leaves out those
whose bytes are all zero (zarr's `write_empty_chunks=False`), and appends the index (offset and
length per chunk, little-endian uint64, 2^64-1 for a chunk not stored, then its CRC32C); it
decodes such an object straight into the rows of a result, checking the index's checksum and each
chunk's size. The bytes are zarr's own (tests/test_shard_codec.py, tests/test_fast_loader.py), so
zarr reads what hsk writes and the other way round. Arrays laid out any other way are left to zarr
(`ShardLayout.of` returns None). The object I/O is in zarr_adapter.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import google_crc32c
import numpy as np
from numcodecs import Blosc, blosc
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec, ShardingCodecIndexLocation

EMPTY_CHUNK = 2**64 - 1  # both index fields of a chunk that is not stored (its bytes all zero)
_SHUFFLES = {"noshuffle": Blosc.NOSHUFFLE, "shuffle": Blosc.SHUFFLE, "bitshuffle": Blosc.BITSHUFFLE}


@dataclass(frozen=True)
class ShardLayout:
    """One array's shards: whole rows (every other axis in one chunk), fill value 0, inner codecs bytes
    (little endian) then Blosc, the index (bytes, crc32c) at the end."""

    n_rows: int
    shard_shape: tuple[int, ...]
    chunk_rows: int
    dtype: np.dtype
    blosc: Blosc

    @property
    def chunks(self) -> int:
        """Inner chunks per shard."""
        return self.shard_shape[0] // self.chunk_rows

    @classmethod
    def of(cls, array) -> ShardLayout | None:
        """The layout of a zarr array as hsk writes them, else None (zarr then reads and writes it)."""
        meta = array.metadata
        codecs = tuple(getattr(meta, "codecs", ()))
        if sys.byteorder != "little" or not _hsk_sharding(codecs) or not _is_zero(meta.fill_value) \
                or getattr(meta.chunk_key_encoding, "separator", None) != "/":
            return None
        shard, chunk = tuple(meta.chunk_grid.chunk_shape), tuple(codecs[0].chunk_shape)
        if chunk[1:] != shard[1:] or shard[1:] != tuple(array.shape[1:]) or min(shard) < 1 or shard[0] % chunk[0]:
            return None
        return cls(array.shape[0], shard, chunk[0], np.dtype(array.dtype), _blosc(codecs[0].codecs[1]))

    def key(self, shard: int) -> str:
        """The shard's object key below the array's own path (`c/<shard>/0/...`)."""
        return "/".join(["c", str(shard), *("0" for _ in self.shard_shape[1:])])

    def rows(self, shard: int) -> int:
        """Rows of the array in `shard` (the last one may hold fewer than shard_rows)."""
        return min(self.shard_shape[0], self.n_rows - shard * self.shard_shape[0])

    def encode(self, shard: int, data: np.ndarray) -> bytes | None:
        """The object of `shard` holding `data` (its rows), or None when no chunk's bytes are nonzero
        (zarr then stores no object at all)."""
        rows = self.rows(shard)
        if data.shape != (rows, *self.shard_shape[1:]):
            raise ValueError(f"shard {shard} needs shape {(rows, *self.shard_shape[1:])}, got {data.shape}")
        data = np.ascontiguousarray(data, dtype=self.dtype)
        index = np.full((self.chunks, 2), EMPTY_CHUNK, dtype="<u8")
        parts, offset = [], 0
        for c in range(-(-rows // self.chunk_rows)):  # chunks past the array's end are never stored
            chunk = data[c * self.chunk_rows : (c + 1) * self.chunk_rows]
            if not chunk.view(np.uint8).any():  # zarr compares bits: a chunk of -0.0 is stored
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

    def decode(self, raw: np.ndarray | None, out: np.ndarray | None = None) -> np.ndarray:
        """One shard object's bytes (uint8; None: no object) -> its data [shard rows, ...], each inner
        chunk decompressed straight into its rows of the result (`out`, C-contiguous, when given)."""
        out = np.empty(self.shard_shape, dtype=self.dtype) if out is None else out
        if raw is None:
            out.fill(0)
            return out
        size = 16 * self.chunks
        if len(raw) < size + 4:
            raise ValueError(f"a shard object of {len(raw)} bytes cannot hold the index of {self.chunks} chunks")
        index = raw[len(raw) - size - 4 :]
        if google_crc32c.value(index[:size].tobytes()) != int(index[size:].view("<u4")[0]):
            raise ValueError("the shard index does not match its crc32c checksum")
        rows = out.reshape(self.chunks, -1).view(np.uint8)
        for chunk, (start, nbytes) in enumerate(index[:size].view("<u8").reshape(-1, 2).tolist()):
            if start == EMPTY_CHUNK:
                rows[chunk] = 0
                continue
            src = raw[start : start + nbytes]
            # bytes 4-7 of a blosc header: the decompressed size (blosc would fill a larger buffer only partly)
            if start + nbytes > len(raw) - size - 4 or nbytes < 16 or int(src[4:8].view("<u4")[0]) != rows.shape[1]:
                raise ValueError(f"inner chunk {chunk} of the shard does not decode to its {rows.shape[1]} bytes")
            blosc.decompress(src, rows[chunk])
        return out


def _little(codec) -> bool:
    return isinstance(codec, BytesCodec) and (codec.endian is None or codec.endian.value == "little")


def _hsk_sharding(codecs: tuple) -> bool:
    """One sharding codec: index at the end (bytes, crc32c), inner codecs bytes then blosc."""
    if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
        return False
    inner, index = codecs[0].codecs, codecs[0].index_codecs
    return (codecs[0].index_location == ShardingCodecIndexLocation.end
            and len(inner) == 2 and _little(inner[0]) and isinstance(inner[1], BloscCodec)
            and len(index) == 2 and _little(index[0]) and isinstance(index[1], Crc32cCodec))


def _blosc(codec: BloscCodec) -> Blosc:
    return Blosc(cname=codec.cname.value, clevel=codec.clevel, shuffle=_SHUFFLES[codec.shuffle.value],
                 blocksize=codec.blocksize, typesize=codec.typesize)


def _is_zero(fill_value) -> bool:
    try:
        return float(fill_value) == 0.0
    except (TypeError, ValueError):
        return False
