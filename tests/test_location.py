"""hskstore.io.location: the same operations on a local folder and an fsspec URL; local-only checks stay local.

Also the shape of hskstore around it: files import each other one way, private zarr names only in
hskstore/io/zarr_adapter.py, and a store writer's thread pool is shut down when its writer is done.
"""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

import pytest

from hskstore.io.location import LocalLocation, RemoteLocation, location

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["local", "memory"])
def folder(request, tmp_path):
    if request.param == "local":
        return location(str(tmp_path / "f"))
    return location(f"memory://hsk-location-{uuid.uuid4().hex[:8]}/f")


def test_location_kinds():
    assert isinstance(location("a/b"), LocalLocation)
    assert isinstance(location("file:///tmp/x"), LocalLocation)
    assert location("file:///tmp/x").path == Path("/tmp/x")
    assert isinstance(location("s3://bucket/x"), RemoteLocation)
    assert location("nosuch://x").problem().startswith("nosuch://x: unknown URL scheme")
    assert location("a/b").problem() is None and location("memory://x").problem() is None
    assert location("http://host/x").writable is False and location("s3://b/x").writable is True


def test_the_same_operations_everywhere(folder):
    assert not folder.exists()
    folder.makedirs()
    assert folder.exists() and folder.is_dir() and folder.names() == set()
    lease = folder.child("lease.json")
    assert lease.create_exclusive(b"one") is True
    assert lease.create_exclusive(b"two") is False  # exclusive: the first writer keeps it
    assert lease.read_bytes() == b"one" and lease.is_file()
    lease.write_atomic(b"three")
    assert lease.read_text() == "three" and isinstance(lease.modified(), float)
    with lease.locked() as held:
        assert held
    folder.child("sub").makedirs()
    folder.child("sub").child("a.partial").write_atomic(b"x")
    assert folder.names() == {"lease.json", "sub"}
    assert folder.read_many(["lease.json", "absent"]) == {"lease.json": b"three", "absent": None}
    removed = folder.remove_files(lambda name: name.endswith(".partial"))
    assert len(removed) == 1 and not folder.child("sub").child("a.partial").exists()
    moved = folder.sibling(".f.hsk-staged-1")
    folder.move_to(moved)
    assert not folder.exists() and moved.child("lease.json").read_bytes() == b"three"
    moved.child("lease.json").remove_file()
    moved.remove_tree()
    assert not moved.exists()


def test_find_roots_stops_at_stores_and_keeps_bundles(folder):
    folder.child("a").child("s.zarr").makedirs()
    folder.child("a").child("s.zarr").child("zarr.json").write_atomic(b"{}")
    folder.child("a").child("s.zarr").child("inner").makedirs()
    folder.child("a").child("s.zarr").child("inner").child("zarr.json").write_atomic(b"{}")
    folder.child("b").child("cut.zarr").makedirs()
    folder.child("b").child("cut.zarr").child(".lease").write_atomic(b"")
    folder.child("b").child("x.hsk.zip").write_atomic(b"zip")
    folder.child(".hidden").child("h.zarr").makedirs()
    folder.child(".hidden").child("h.zarr").child("zarr.json").write_atomic(b"{}")
    roots, files = folder.find_roots("zarr.json", ".lease", lambda name: name.endswith(".zip"))
    found = {r.rel: (r.head, r.marked) for r in roots}
    assert found == {"a/s.zarr": (b"{}", False), "b/cut.zarr": (None, True)}
    assert [f.rsplit("/", 1)[-1] for f in files] == ["x.hsk.zip"]
    assert folder.read_many([r.name_under("zarr.json") for r in roots])["a/s.zarr/zarr.json"] == b"{}"


def test_local_only_checks(tmp_path, monkeypatch):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert location(str(tmp_path / "link")).is_link() and not location(str(tmp_path / "real")).is_link()
    monkeypatch.chdir(tmp_path / "real")
    assert location(".").holds_cwd() and location(str(tmp_path)).holds_cwd()
    assert not location(str(tmp_path / "link" / "x")).holds_cwd()
    dead = tmp_path / ".real.hsk-old-999999999"  # no such pid
    dead.mkdir()
    (tmp_path / f".real.hsk-old-{os.getpid()}").mkdir()  # this process runs: not a leftover
    assert [loc.url for loc in location(str(tmp_path / "real")).leftovers("old")] == [str(dead)]
    remote = location("memory://x/real")
    assert not remote.is_link() and not remote.holds_cwd() and remote.leftovers("old") == []


def test_private_zarr_names_only_in_the_adapter():
    offenders = []
    for path in list((ROOT / "hskstore").rglob("*.py")) + list((ROOT / "pipelines").rglob("*.py")):
        if path.name == "zarr_adapter.py":
            continue
        text = path.read_text()
        if "zarr.core" in text or "._sync_open" in text:
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def _write_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("hsk-write")]


def test_store_writer_shuts_its_pool(tmp_path):
    from test_store import make_meta, shard_arrays

    from hskstore.io.writer import StoreWriter, writing

    meta = make_meta()
    with writing(str(tmp_path / "s.zarr"), meta) as writer:
        for shard in writer.pending_shards()[:-1]:
            writer.write_shard(shard, shard_arrays(meta, *writer.shard_bounds(shard)))
        assert _write_threads()  # the pool started with the first shard
    assert _write_threads() == []
    with StoreWriter.open(str(tmp_path / "s.zarr"), meta) as again:  # resumed: the last shard
        shard = again.pending_shards()[0]
        again.write_shard(shard, shard_arrays(meta, *again.shard_bounds(shard)))
        again.finalize()
    assert _write_threads() == [] and again.complete


def test_array_data_goes_through_the_location(tmp_path, monkeypatch):
    """The writer and the reader get their zarr store from the Location (a new backend is one class): every
    store the dump's writer and the reader open here is made by LocalLocation.zarr_store."""
    from test_store import make_meta, shard_arrays

    from hskstore.errors import StoreError
    from hskstore.io.location import zarr_location
    from hskstore.io.reader import open_store
    from hskstore.io.writer import writing

    made = []
    original = LocalLocation.zarr_store
    monkeypatch.setattr(LocalLocation, "zarr_store", lambda self, mode="r": made.append(mode) or original(self, mode))
    url, meta = str(tmp_path / "s.zarr"), make_meta()
    with writing(url, meta) as writer:
        for shard in writer.pending_shards():
            writer.write_shard(shard, shard_arrays(meta, *writer.shard_bounds(shard)))
        writer.finalize()
    assert {"w-", "r+"} <= set(made)
    made.clear()
    store = open_store(url)
    assert made and set(made) == {"r"} and store.group.store.read_only
    assert store._objects is not None  # a local folder's shard objects are read by its Location
    assert set(store.read_shard(0)) == set(store.specs)
    with pytest.raises(StoreError, match="only read"):
        zarr_location(str(tmp_path / "x.hsk.zip"), "r+")
