"""Every use of zarr's private API in hsk, in one place (tests/test_zarr_adapter.py fails when zarr moves it).

zarr 3 has no public synchronous call to read, write or list one raw object of a store, and its
ZipStore opens local paths only. hsk needs both: a store's card and croissant.json are plain objects
beside the arrays, `hsk pack` copies objects as they are, and a bundle behind a URL is read through
an fsspec file. What this module touches that zarr does not promise:

- `zarr.core.sync.sync` (run a store coroutine from synchronous code) and
  `zarr.core.buffer.cpu.Buffer` / `default_buffer_prototype` (the byte buffers stores take and give);
- `ZipStore._sync_open` and its fields `_lock`, `_zf`, `_is_open` (to open a zip over a file object);
- `Array._async_array` (to read several arrays' rows in one go: zarr's synchronous API reads one array
  at a time, so a shard of 12 arrays behind 50 ms of network latency would cost 12 round trips);
- `zarr.storage._local._put` (LocalStore's atomic file write, called in the writing thread) and
  `LocalStore._is_open`;
- `Array.store_path` (the array's place in its store): whole shard objects are fetched
  (`read_shards`) and stored (`put_shard`) here, encoded and decoded by hskstore.format.shard_codec. zarr
  reads and writes a shard's inner chunks as separate tasks on a thread pool; for a shard of 4
  chunks and 19 arrays that costs more CPU than the compression (benchmarks/train/loader_throughput.py,
  shard_write_cost.py).
"""

from __future__ import annotations

import asyncio
import os
import threading
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import fsspec
import numpy as np
import zarr
from zarr.core.buffer import cpu, default_buffer_prototype
from zarr.core.sync import sync

try:  # a zarr release that moves it writes local shards through its event loop, as other stores are written
    from zarr.storage._local import _put
except ImportError:  # pragma: no cover - the test of PRIVATE_NAMES says when zarr moves it
    _put = None

from ..format.shard_codec import ShardLayout

# The private names above, for the test that checks zarr still has them.
PRIVATE_NAMES = ("zarr.core.sync.sync", "zarr.core.buffer.cpu.Buffer", "zarr.core.buffer.default_buffer_prototype",
                 "zarr.storage.ZipStore._sync_open", "zarr.core.array.AsyncArray.getitem",
                 "zarr.core.array.AsyncArray.oindex", "zarr.storage._local._put")
ARRAY_FIELDS = ("_async_array",)  # zarr.Array's handle on its AsyncArray
ZIPSTORE_FIELDS = ("_lock", "_zf", "_is_open")  # zarr's; `_file` is ours (LocalStore's `_is_open` too)


def _key(group: zarr.Group, name: str) -> str:
    return f"{group.path}/{name}" if group.path else name


def read_many(arrays: list[zarr.Array], index: int | slice | np.ndarray) -> list[np.ndarray | BaseException]:
    """The same rows of several arrays, read concurrently on zarr's event loop (a network store answers the
    requests together); each result is the array's data, or the exception its read raised."""

    async def one(array: zarr.Array) -> np.ndarray:
        handle = array._async_array
        if isinstance(index, np.ndarray):
            return await handle.oindex.getitem(index)
        return await handle.getitem(index)

    async def every() -> list[np.ndarray | BaseException]:
        return await asyncio.gather(*(one(a) for a in arrays), return_exceptions=True)

    return sync(every())


def _shard_key(array: zarr.Array, shard: int) -> str:
    return f"{array.path}/{array.metadata.encode_chunk_key((shard,) + (0,) * (array.ndim - 1))}"


ObjectReader = Callable[[list[str]], list[bytes | None | BaseException]]  # Location.object_reader()


def fetch_objects(arrays: list[zarr.Array], shard: int,
                  objects: ObjectReader | None = None) -> list[np.ndarray | None | BaseException]:
    """The bytes of shard `shard`'s object of each array (None: not written; or the exception raised).
    With `objects` (the store's Location reads them itself: a local folder's files, in the calling
    thread, since a hop to zarr's event loop and its file threads costs more CPU than the read) through
    it; otherwise the zarr store is asked concurrently on zarr's event loop."""
    keys = [_shard_key(a, shard) for a in arrays]
    if objects is not None:
        return [np.frombuffer(raw, dtype=np.uint8) if isinstance(raw, bytes) else raw for raw in objects(keys)]

    async def get(array: zarr.Array, key: str) -> np.ndarray | None:
        buf = await array.store.get(key, prototype=default_buffer_prototype())
        return None if buf is None else buf.as_numpy_array()

    async def every() -> list[np.ndarray | None | BaseException]:
        return await asyncio.gather(*(get(a, k) for a, k in zip(arrays, keys)), return_exceptions=True)

    return sync(every())


def read_shards(arrays: list[zarr.Array], formats: list[ShardLayout], shard: int, rows: int,
                out: list[np.ndarray] | None = None, objects: ObjectReader | None = None
                ) -> list[np.ndarray | BaseException]:
    """Whole shard `shard` of several arrays (its first `rows` rows): the shard objects fetched
    (fetch_objects), then decoded in the calling thread (blosc and numpy release the GIL, so reader
    threads decode in parallel); each result is the data or the exception raised. With `out` (one
    C-contiguous [rows, ...] array per array), the data is decoded into it."""
    results: list[np.ndarray | BaseException] = []
    for i, (raw, fmt) in enumerate(zip(fetch_objects(arrays, shard, objects), formats)):
        try:
            results.append(raw if isinstance(raw, BaseException) else _decode_into(raw, fmt, rows, out and out[i]))
        except Exception as exc:  # a damaged object: reported like zarr's own read errors
            results.append(exc)
    return results


def _decode_into(raw: np.ndarray | None, fmt: ShardLayout, rows: int, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return fmt.decode(raw)[:rows]
    if rows == fmt.shard_shape[0]:
        return fmt.decode(raw, out)
    out[...] = fmt.decode(raw)[:rows]  # the last shard, shorter than the object
    return out


def put_shard(array: zarr.Array, key: str, payload: bytes | None) -> None:
    """Store one shard object below a zarr array, in any store zarr writes to (None: no object, as zarr
    leaves for an all-zero shard; one left by an earlier write of the shard is removed). In a local folder
    the object is written by zarr's own file writer in the calling thread (atomically, as zarr writes it),
    without the round trip through zarr's event loop and its thread pool that a store coroutine costs."""
    target = array.store_path / key
    store = target.store
    if payload is None:
        sync(target.delete())
    elif _put is not None and isinstance(store, zarr.storage.LocalStore) and getattr(store, "_is_open", False) \
            and not store.read_only:
        _put(Path(store.root) / target.path, cpu.Buffer.from_bytes(payload))
    else:
        sync(target.set(default_buffer_prototype().buffer.from_bytes(payload)))


def put_row(array: zarr.Array, row: int, value: np.ndarray) -> None:
    """Set row `row` of an array whose chunks are single rows compressed as zarr compresses by default (bytes,
    then zstd): the chunk's bytes encoded here as zarr encodes them (numcodecs' Zstd), a row of zeros (the fill
    value) stored as no object, as zarr does (write_empty_chunks off); any other array is set through zarr.
    A writer's progress records: zarr's setitem costs a few times more than the object's write."""
    zstd = _row_zstd(array)
    if zstd is None:
        array[row] = value
        return
    data = np.ascontiguousarray(value, dtype=array.dtype.newbyteorder("<")).reshape(array.chunks[1:])
    key = "/".join(["c", str(row), *("0" for _ in array.chunks[1:])])
    put_shard(array, key, zstd.encode(data.tobytes()) if data.view(np.uint8).any() else None)


def _row_zstd(array: zarr.Array):
    """numcodecs' Zstd with the array's settings, when its chunks are rows stored bytes (little-endian) then zstd
    with fill value 0, its keys `c/<row>/0...`; else None."""
    from numcodecs import Zstd
    from zarr.codecs import BytesCodec, ZstdCodec

    meta = array.metadata
    codecs = tuple(getattr(meta, "codecs", ()))
    keys = getattr(meta, "chunk_key_encoding", None)
    if len(codecs) != 2 or not isinstance(codecs[0], BytesCodec) or not isinstance(codecs[1], ZstdCodec):
        return None
    endian = codecs[0].endian
    rows_of_zeros = (getattr(keys, "separator", None) == "/", getattr(keys, "name", None) == "default",
                     endian is None or endian.value == "little", array.chunks[0] == 1,
                     tuple(array.chunks[1:]) == tuple(array.shape[1:]), _is_zero(meta.fill_value))
    return Zstd(level=codecs[1].level, checksum=codecs[1].checksum) if all(rows_of_zeros) else None


def _is_zero(fill_value) -> bool:
    try:
        return float(fill_value) == 0.0
    except (TypeError, ValueError):
        return False


def get_bytes(group: zarr.Group, name: str) -> bytes | None:
    """The raw object `name` under a group (None when there is none)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        buf = sync(group.store.get(_key(group, name), prototype=default_buffer_prototype()))
    return None if buf is None else buf.to_bytes()


def set_bytes(group: zarr.Group, name: str, data: bytes) -> None:
    """Write the raw object `name` under a group."""
    sync(group.store.set(_key(group, name), cpu.Buffer.from_bytes(data)))


def list_keys(group: zarr.Group) -> list[str]:
    """Every object key under a group, relative to it, sorted."""
    prefix = f"{group.path}/" if group.path else ""

    async def collect() -> list[str]:
        return [key async for key in group.store.list_prefix(prefix)]

    return sorted(key[len(prefix):] for key in sync(collect()))


class RemoteZipStore(zarr.storage.ZipStore):
    """zarr's read-only ZipStore over an fsspec file, for a bundle behind a URL: the zip reader seeks
    and fsspec (s3fs, ...) serves byte ranges, so only the objects read are fetched. (fsspec's own
    zip filesystem lists nested groups wrongly under zarr, hence this.)"""

    def __init__(self, url: str) -> None:
        super().__init__(url.rsplit("/", 1)[-1], mode="r", read_only=True)  # the path is a label only
        self.url = url

    def _sync_open(self) -> None:
        if self._is_open:
            raise ValueError("store is already open")
        self._lock = threading.RLock()
        self._file = fsspec.open(self.url, "rb").open()
        self._zf = zipfile.ZipFile(self._file, mode="r")
        self._is_open = True


def local_store(root, mode: str) -> zarr.storage.LocalStore:
    """zarr's LocalStore over a folder, opened in `mode` exactly as zarr opens a path string."""
    return sync(zarr.storage.LocalStore.open(root=root, mode=mode, read_only=mode == "r"))


def read_files_here(root, keys: list[str]) -> list[bytes | None | BaseException]:
    """The objects `keys` under a local folder, read in the calling thread (None: not written)."""
    out: list[bytes | None | BaseException] = []
    for key in keys:
        try:  # never through a link (one planted after the store was opened and checked): ELOOP, reported as damage
            with os.fdopen(os.open(f"{root}/{key}", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC),
                           "rb") as f:
                out.append(f.read())
        except FileNotFoundError:
            out.append(None)  # not written: the fill value, as zarr reads it
        except OSError as exc:
            out.append(exc)
    return out


def zip_store(path: str) -> zarr.storage.ZipStore:
    """zarr's read-only ZipStore over a local zip file."""
    return zarr.storage.ZipStore(path, mode="r", read_only=True)
