"""Shards encoded by hskstore.format.shard_codec are the bytes zarr writes for the same data, object for object."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr

from hskstore.format.schema import ArraySpec
from hskstore.format.shard_codec import ShardLayout
from hskstore.io.zarr_adapter import put_shard


def objects(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def shards_of(spec: ArraySpec, rng: np.random.Generator) -> list[np.ndarray]:
    """Data for every shard: random, with an all-zero chunk, an all-zero shard and -0.0 where floats allow."""
    n = spec.shape[0]
    data = rng.integers(-300, 300, size=spec.shape).astype(spec.dtype)
    if np.dtype(spec.dtype).kind == "f":
        data[: spec.chunk_rows] = -0.0  # equal to the fill value, yet zarr stores it (it compares bits)
        data[-1, ...] = np.nan
    else:
        data[: spec.chunk_rows] = 0
    if n > 2 * spec.shard_rows:
        data[spec.shard_rows : 2 * spec.shard_rows] = 0  # a whole shard of zeros: no object at all
    return [data[s : s + spec.shard_rows] for s in range(0, n, spec.shard_rows)]


SPECS = [
    ArraySpec("row", (23,), "int64", 8, 2),
    ArraySpec("input_ids", (21, 16), "uint16", 8, 8),
    ArraySpec("token_type_ids", (21, 16), "uint8", 8, 2, bitshuffle=False),
    ArraySpec("layers/0/values", (30, 4, 7), "float16", 12, 3),
    ArraySpec("layers/0/masks", (17, 4, 8), "uint8", 4, 1, bitshuffle=False, clevel=5),
    ArraySpec("layers/0/scores", (9, 4), "float32", 4, 2),
]


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_shards_are_the_bytes_zarr_writes(tmp_path, spec):
    rng = np.random.default_rng(0)
    shards = shards_of(spec, rng)
    by_zarr, by_us = tmp_path / "zarr.zarr", tmp_path / "ours.zarr"
    for root in (by_zarr, by_us):
        spec.create(zarr.open_group(str(root), mode="w"))
    theirs = zarr.open_group(str(by_zarr), mode="r+")[spec.name]
    ours = zarr.open_group(str(by_us), mode="r+")[spec.name]
    encoder = ShardLayout.of(ours)
    assert encoder is not None
    for s, data in enumerate(shards):
        theirs[s * spec.shard_rows : s * spec.shard_rows + len(data)] = data
        put_shard(ours, encoder.key(s), encoder.encode(s, data))
    assert objects(by_us) == objects(by_zarr)
    np.testing.assert_array_equal(zarr.open_group(str(by_us), mode="r")[spec.name][:], theirs[:])


def test_rewriting_a_shard_with_zeros_removes_its_object(tmp_path):
    spec = ArraySpec("logits", (8, 2), "float32", 4, 2)
    spec.create(zarr.open_group(str(tmp_path / "s.zarr"), mode="w"))
    array = zarr.open_group(str(tmp_path / "s.zarr"), mode="r+")["logits"]
    encoder = ShardLayout.of(array)
    put_shard(array, encoder.key(1), encoder.encode(1, np.ones((4, 2), np.float32)))
    assert (tmp_path / "s.zarr" / "logits" / "c" / "1" / "0").is_file()
    put_shard(array, encoder.key(1), encoder.encode(1, np.zeros((4, 2), np.float32)))
    assert not (tmp_path / "s.zarr" / "logits" / "c" / "1" / "0").exists()
    assert not array[:].any()


def test_a_wrong_shape_or_a_foreign_layout_is_refused(tmp_path):
    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    ArraySpec("length", (10,), "int16", 4, 2).create(group)
    encoder = ShardLayout.of(group["length"])
    with pytest.raises(ValueError, match="shard 2 needs shape"):
        encoder.encode(2, np.ones(4, np.int16))  # the last shard holds 2 rows
    plain = group.create_array("plain", shape=(10,), dtype="int16", chunks=(5,))
    assert ShardLayout.of(plain) is None  # not sharded: zarr writes it
