"""hskstore.io.zarr_adapter holds every private zarr name hsk uses: this fails when zarr renames or removes one."""

from __future__ import annotations

import importlib
import inspect
import zipfile

import fsspec
import numpy as np
import zarr

from hskstore.io import zarr_adapter


def _resolve(dotted: str):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def test_private_names_still_exist_in_zarr():
    for dotted in zarr_adapter.PRIVATE_NAMES:
        assert _resolve(dotted) is not None, dotted
    # the override must replace zarr's own method of that name, with the same signature
    original = zarr.storage.ZipStore.__dict__["_sync_open"]
    assert list(inspect.signature(original).parameters) == ["self"]


def test_zipstore_fields_the_remote_store_sets_are_zarrs(tmp_path):
    path = tmp_path / "g.zip"
    with zarr.storage.ZipStore(str(path), mode="w") as store:
        zarr.create_group(store, attributes={"a": 1})
    store = zarr.storage.ZipStore(str(path), mode="r", read_only=True)
    store._sync_open()
    for field in zarr_adapter.ZIPSTORE_FIELDS:
        assert hasattr(store, field), field
    assert store._is_open and isinstance(store._zf, zipfile.ZipFile)
    store.close()


def test_raw_objects_round_trip_and_list():
    group = zarr.create_group(zarr.storage.MemoryStore(), attributes={"x": 1})
    sub = group.create_group("sub")
    zarr_adapter.set_bytes(sub, "NOTE.md", b"hello")
    assert zarr_adapter.get_bytes(sub, "NOTE.md") == b"hello"
    assert zarr_adapter.get_bytes(sub, "absent") is None
    sub.create_array("a", shape=(4,), dtype="int32", chunks=(4,))[:] = np.arange(4)
    keys = zarr_adapter.list_keys(sub)
    assert "NOTE.md" in keys and "a/zarr.json" in keys and keys == sorted(keys)


def test_remote_zip_store_reads_a_zip_behind_a_url(tmp_path):
    path = tmp_path / "g.zip"
    with zarr.storage.ZipStore(str(path), mode="w") as store:
        group = zarr.create_group(store, attributes={"hsk": {"n": 3}})
        group.create_array("v", shape=(3,), dtype="float32", chunks=(3,))[:] = [1, 2, 3]
    url = f"memory://zarr-adapter-{id(path)}/g.zip"
    with fsspec.open(url, "wb") as f:
        f.write(path.read_bytes())
    opened = zarr.open_group(zarr_adapter.RemoteZipStore(url), mode="r")
    assert opened.attrs["hsk"] == {"n": 3}
    assert list(opened["v"][:]) == [1, 2, 3]
    local = zarr.open_group(zarr_adapter.zip_store(str(path)), mode="r")
    assert local.attrs["hsk"] == {"n": 3}


def test_read_many_reads_what_zarrs_own_indexing_reads_and_returns_each_arrays_error():
    group = zarr.group(zarr.storage.MemoryStore())
    a = group.create_array("a", shape=(100, 3), chunks=(10, 3), dtype="f4")
    a[:] = np.arange(300, dtype="f4").reshape(100, 3)
    b = group.create_array("b", shape=(100,), chunks=(10,), dtype="i4")
    b[:] = np.arange(100)
    for field in zarr_adapter.ARRAY_FIELDS:
        assert hasattr(a, field), field
    rows = np.array([1, 5, 17, 99])
    for index, expect in ((slice(10, 30), lambda x: x[10:30]), (rows, lambda x: x.oindex[rows]), (7, lambda x: x[7])):
        got = zarr_adapter.read_many([a, b], index)
        assert all(np.array_equal(g, expect(x)) for g, x in zip(got, (a, b)))
    short = group.create_array("short", shape=(10,), chunks=(10,), dtype="i4")
    got = zarr_adapter.read_many([a, short], 50)  # row 50 exists in a, not in short: short's error comes back
    assert np.array_equal(got[0], a[50]) and isinstance(got[1], IndexError)


def test_put_row_and_put_shard_write_the_bytes_zarr_writes(tmp_path):
    """A progress record's row set by put_row (encoded here, written by zarr's file writer in this thread) is
    the object zarr's setitem writes, byte for byte: int64 and uint8 rows, a row of zeros stored as no object
    (removing an earlier one); an array of other codecs is set through zarr. put_shard to a local folder writes
    the payload as zarr's store would."""
    ours = zarr.open_group(str(tmp_path / "ours.zarr"), mode="w")
    theirs = zarr.open_group(str(tmp_path / "theirs.zarr"), mode="w")
    shapes = {"cursors": ((6, 9), "int64"), "digests": ((6, 10, 16), "uint8"), "done": ((6,), "uint8")}
    rng = np.random.default_rng(0)
    for name, (shape, dtype) in shapes.items():
        for group in (ours, theirs):
            group.create_array(name, shape=shape, dtype=dtype, chunks=(1, *shape[1:]), fill_value=0)
        for row in (0, 3, 3, 5):
            value = rng.integers(-9 if dtype == "int64" else 0, 200, shape[1:]).astype(dtype) if row != 5 else \
                np.zeros(shape[1:], dtype)
            if row == 3 and (tmp_path / "ours.zarr" / name / "c" / "3").exists():
                value = np.zeros(shape[1:], dtype)  # the second write of row 3: zeros remove its object
            zarr_adapter.put_row(ours[name], row, value)
            theirs[name][row] = value
        assert zarr_adapter._row_zstd(ours[name]) is not None
    mine = {str(p.relative_to(tmp_path / "ours.zarr")): p.read_bytes() for p in (tmp_path / "ours.zarr").rglob("c/**/*")
            if p.is_file()}
    zarrs = {str(p.relative_to(tmp_path / "theirs.zarr")): p.read_bytes()
             for p in (tmp_path / "theirs.zarr").rglob("c/**/*") if p.is_file()}
    assert mine == zarrs and any("digests/c/0" in key for key in mine) and not any("/c/3" in key for key in mine)
    blosc = ours.create_array("blosc", shape=(4, 3), dtype="int32", chunks=(1, 3),
                              compressors=zarr.codecs.BloscCodec(cname="zstd", clevel=3))
    assert zarr_adapter._row_zstd(blosc) is None
    zarr_adapter.put_row(blosc, 2, np.array([1, 2, 3]))
    assert blosc[2].tolist() == [1, 2, 3]
    zarr_adapter.put_shard(ours["done"], "c/9", b"payload")
    assert (tmp_path / "ours.zarr" / "done" / "c" / "9").read_bytes() == b"payload"
