"""The store format alone (no torch): write, resume, read, verify, refuse damage."""

import os
from pathlib import Path

import numpy as np
import pytest

from hskstore import CorruptStoreError, IncompleteStoreError, StoreError, StoreExistsError, open_store
from hskstore.format.config import HSKConfig, Selection
from hskstore.format.schema import array_specs, make_layout
from hskstore.io.writer import StoreWriter

D = 16


def make_meta(n_rows=10, config="2,3,0.25", value_dtype="float16", shard_rows=4):
    cfg = HSKConfig.parse(config)
    sel = Selection(cfg, D, 4, (2, 4), (1, 2), (2, 4), ref_student_layers=2, l_top=4, value_dtype=value_dtype)
    return {
        "task": {"name": "sst2", "split": "train", "labels": ["negative", "positive"], "regression": False},
        "dataset": {"source": "synthetic", "fingerprint": "x", "n_rows": n_rows},
        "teacher": {"name": "t", "weights_hash": "w", "num_layers": 4, "hidden_size": D, "num_labels": 2},
        "tokenizer": {"name": "t", "vocab_hash": "v", "vocab_size": 100, "sep_id": 3},
        "max_length": 8,
        "selection": sel.to_dict(),
        "layout": make_layout(n_rows, sel.n_width, shard_rows),
    }


def shard_arrays(meta, start, stop, seed=0):
    rng = np.random.default_rng(seed + start)
    return {
        s.name: (
            rng.integers(0, 50, size=(stop - start, *s.shape[1:]))
            if "int" in s.dtype
            else rng.normal(size=(stop - start, *s.shape[1:]))
        ).astype(s.dtype)
        for s in array_specs(meta)
    }


def write_all(url, meta, shards=None, **kw):
    writer = StoreWriter.open(url, meta, **kw)
    for shard in writer.pending_shards() if shards is None else shards:
        writer.write_shard(shard, shard_arrays(meta, *writer.shard_bounds(shard)))
    return writer


@pytest.mark.parametrize("url", ["local", "memory://hsk-test-store"])
def test_round_trip_local_and_fsspec(tmp_path, url):
    url = str(tmp_path / "s.zarr") if url == "local" else url
    meta = make_meta()
    write_all(url, meta).finalize()
    store = open_store(url)
    assert len(store) == 10 and store.n_shards == 3 and [lay.teacher_layer for lay in store.layers] == [2, 4]
    expected = shard_arrays(meta, 4, 8)
    got = store.read_shard(1)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])
    assert store.verify() == []
    np.testing.assert_array_equal(store[5]["logits"], expected["logits"][1])


def test_incomplete_store_is_refused_and_resume_matches(tmp_path):
    meta = make_meta()
    write_all(tmp_path / "a.zarr", meta).finalize()
    write_all(str(tmp_path / "b.zarr"), meta, shards=[0, 2])  # "killed" before shard 1
    with pytest.raises(IncompleteStoreError, match="2/3 shards.*Rerun"):
        open_store(str(tmp_path / "b.zarr"))
    writer = StoreWriter.open(str(tmp_path / "b.zarr"), meta)
    assert writer.pending_shards() == [1]
    write_all(str(tmp_path / "b.zarr"), meta).finalize()
    a, b = open_store(str(tmp_path / "a.zarr")), open_store(str(tmp_path / "b.zarr"))
    assert a.meta["checksums"] == b.meta["checksums"]


def test_existing_output_is_never_lost(tmp_path):
    url = str(tmp_path / "s.zarr")
    meta = make_meta()
    write_all(url, meta).finalize()
    assert StoreWriter.open(url, meta).complete  # the same store again: nothing to do
    other = make_meta(config="2,2,0.25")
    with pytest.raises(StoreExistsError, match="--overwrite"):
        StoreWriter.open(url, other)
    (tmp_path / "half.zarr").mkdir()
    write_all(str(tmp_path / "half.zarr"), meta, shards=[0])
    with pytest.raises(StoreExistsError, match="different selection"):
        StoreWriter.open(str(tmp_path / "half.zarr"), other)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "zarr.json").write_text("my notes")
    with pytest.raises(StoreExistsError, match="not a readable hsk store"):
        StoreWriter.open(str(tmp_path / "notes"), meta, overwrite=True)
    assert (tmp_path / "notes" / "zarr.json").read_text() == "my notes"


def _chunk_files(url):
    return sorted(
        p for p in Path(url).rglob("*") if p.is_file() and "c" in p.parts and "_progress" not in p.parts
    )


def test_corrupted_and_truncated_stores_are_detected(tmp_path):
    url = str(tmp_path / "s.zarr")
    write_all(url, make_meta()).finalize()
    victim = next(p for p in _chunk_files(url) if "values" in str(p))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    problems = open_store(url).verify()
    assert problems and "values" in problems[0]

    url2 = str(tmp_path / "t.zarr")
    write_all(url2, make_meta()).finalize()
    victim = next(p for p in _chunk_files(url2) if "masks" in str(p))
    os.remove(victim)  # a missing chunk reads as zeros: only checksums catch it
    store = open_store(url2)
    with pytest.raises(CorruptStoreError, match="masks"):
        for shard in range(store.n_shards):
            store.read_shard(shard)

    url3 = str(tmp_path / "u.zarr")
    write_all(url3, make_meta()).finalize()
    os.remove(Path(url3) / "layers" / "1" / "scores" / "zarr.json")
    with pytest.raises(CorruptStoreError, match="truncated"):
        open_store(url3)
    with pytest.raises(StoreError, match="no store"):
        open_store(str(tmp_path / "missing.zarr"))


def test_int8_layout_has_scales(tmp_path):
    meta = make_meta(value_dtype="int8")
    names = {s.name: s.dtype for s in array_specs(meta)}
    assert names["layers/0/values"] == "int8" and names["layers/0/scale"] == "float16"
    write_all(str(tmp_path / "q.zarr"), meta).finalize()
    assert open_store(str(tmp_path / "q.zarr")).verify() == []
