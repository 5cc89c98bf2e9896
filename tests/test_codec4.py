"""4-bit values (int4, mxfp4): round-trip bounds, exactness, torch decode, derive equality, old stores.

The bounds are the formats' definitions: 4-bit codes are quantised from the int8 values (the chain
float16 -> int8 -> 4-bit), so each value is within half a 4-bit step of its int8 value, and within
that plus half an int8 step of its fp16 value.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import save_tiny_teacher

from hskstore import codecs, open_store
from hskstore.codecs import layout, mxfp4
from hskstore.codecs.int8 import quantize_int8
from hskstore.format import codec
from hskstore.format.schema import FORMAT_VERSION
from hskstore.io.info import format_report, storage_report
from pipelines.cli import main
from pipelines.train.data.decode import decode_batch, dense_targets

V1_STORE = Path(__file__).parent / "data" / "store_v1_int8"  # written by hsk's format-1 code


def heavy_tailed(shape, seed=0) -> np.ndarray:
    """Activations with outliers, like a transformer's (a few dims far larger than the rest)."""
    rng = np.random.default_rng(seed)
    v = rng.standard_t(3, size=shape) * 0.5
    v[..., :3] *= 20
    return v.astype(np.float16)


def per_value(group_scale: np.ndarray, n: int) -> np.ndarray:
    return np.repeat(group_scale, layout.GROUP, axis=-1)[..., :n]


@pytest.mark.parametrize("n_width", [1, 7, 32, 38, 77])
def test_int4_round_trip_within_half_a_step(n_width):
    v16 = heavy_tailed((40, 3, n_width), seed=n_width)
    packed, scale = codec.encode_kept(v16, "int4")
    assert packed.shape == (40, 3, (n_width + 1) // 2) and packed.dtype == np.uint8
    assert scale.shape == (40, 3, -(-n_width // 32)) and scale.dtype == np.float16
    decoded = codec.decode_values("int4", packed, scale, n_width)
    q8, s8 = quantize_int8(v16)
    int8_values = codec.decode_values("int8", q8, s8)
    step = per_value(scale.astype(np.float32), n_width)
    tol = 1e-6 * np.abs(int8_values).max()
    assert (np.abs(decoded - int8_values) <= step / 2 + tol).all()
    err = np.abs(decoded - v16.astype(np.float32))
    assert (err <= step / 2 + s8.astype(np.float32)[..., None] / 2 + tol).all()
    # the group scale is max|v| / 7: the largest value of each group gets code +-7
    codes = layout.unpack_nibbles(packed, n_width)
    assert ((codes == 7) | (codes == 9)).any()


def test_int4_nibble_order_and_exact_values():
    # Group maxima 7*t*s8 with small integers t: every int8 value k*t*s8 (|k| <= 7) is exact in int4.
    s8 = np.array([0.25], dtype=np.float16)
    k = np.array([7, -3, 0, 5, -7, 1, 2, -1] * 4 + [-7, 4, 0, 6, 3], dtype=np.int8)  # groups: 32 + 5
    t = np.repeat(np.array([3, 2]), [32, 5])
    q8 = (k * t).astype(np.int8)[None]
    packed, scale = codecs.get("int4").requantize("int8", codec.decode_values("int8", q8, s8))
    np.testing.assert_array_equal(scale[0].astype(np.float32), [0.75, 0.5])
    np.testing.assert_array_equal(codec.decode_values("int4", packed, scale, 37)[0], q8[0] * np.float32(0.25))
    # value 2k in the low nibble, 2k+1 in the high nibble, 4-bit two's complement; odd tail padded 0
    assert packed[0, 0] == (7 | ((-3 & 0xF) << 4)) and packed[0, -1] == 3


def e2m1_half_step(mag: np.ndarray) -> np.ndarray:
    """Half the e2m1 grid spacing at a magnitude (in units of the scale); saturation above 6."""
    return np.select([mag < 2, mag < 4, mag <= 6], [0.25, 0.5, 1.0], mag - 6)


@pytest.mark.parametrize("n_width", [5, 38, 77])
def test_mxfp4_round_trip_within_half_a_step(n_width):
    v16 = heavy_tailed((40, 3, n_width), seed=10 + n_width)
    packed, exps = codec.encode_kept(v16, "mxfp4")
    assert exps.dtype == np.uint8 and exps.shape == (40, 3, -(-n_width // 32))
    decoded = codec.decode_values("mxfp4", packed, exps, n_width)
    int8_values = codec.decode_values("int8", *quantize_int8(v16))
    scale = per_value(np.exp2(exps.astype(np.float32) - 127), n_width)
    # OCP MX: scale = 2^(floor(log2 max) - 2), so every value is below 8 scales
    assert (np.abs(int8_values) < 8 * scale).all()
    bound = e2m1_half_step(np.abs(int8_values) / scale) * scale
    assert (np.abs(decoded - int8_values) <= bound * (1 + 1e-6)).all()


def test_mxfp4_exact_on_the_grid_ties_to_even():
    grid = np.concatenate([mxfp4.E2M1_GRID, -mxfp4.E2M1_GRID[1:]])  # 15 values
    x = np.resize(grid, 32).astype(np.float32) * 0.5  # group max 6 * 2^-1: scale 2^-1
    codes, exps = mxfp4.quantize_mxfp4_values(x[None])
    assert exps[0, 0] == 127 - 1
    np.testing.assert_array_equal(codec.decode_values("mxfp4", layout.pack_nibbles(codes), exps, 32)[0], x)
    # midpoints go to the even code: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4
    mids = np.array([[0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]], dtype=np.float32)
    codes, exps = mxfp4.quantize_mxfp4_values(mids)
    assert exps[0, 0] == 127
    np.testing.assert_array_equal(mxfp4.E2M1_GRID[codes[0] & 7], [0, 1, 1, 2, 2, 4, 4, 6])


@pytest.mark.parametrize("value_dtype", codecs.names())
def test_torch_decode_equals_numpy(value_dtype):
    from hskstore.method.selection import width_mask

    d, n_width = 48, 13
    vectors = heavy_tailed((6, 4, d), seed=3).astype(np.float32)
    valid = np.ones((6, 4), dtype=bool)
    valid[0, 3] = valid[2, 1] = False  # unused token slots decode to zeros
    mask = width_mask(vectors, n_width, "mag", valid=valid)
    values, scale = codec.encode_values(vectors, mask, n_width, value_dtype)
    packed = codec.pack_mask(mask)
    expected = codec.dense(value_dtype, values, packed, d, scale)
    got = dense_targets(torch.from_numpy(values), torch.from_numpy(packed), d,
                        None if scale is None else torch.from_numpy(scale), codec=value_dtype)
    np.testing.assert_array_equal(got.numpy(), expected)
    assert not expected[0, 3].any() and (expected[mask] != 0).any()


@pytest.fixture(scope="module")
def stores(tmp_path_factory, tiny_tokenizer, glue_dir) -> dict[str, Path]:
    """A tiny teacher dumped at 2,4,0.5 float16 and, directly, at 1,3,0.25 in int8 / int4 / mxfp4."""
    root = tmp_path_factory.mktemp("codec4")
    teacher = save_tiny_teacher(root / "teacher", tiny_tokenizer, num_layers=2, seed=4)
    out = {}
    for name, config, values in [("big", "2,4,0.5", "float16"), ("int8", "1,3,0.25", "int8"),
                                 ("int4", "1,3,0.25", "int4"), ("mxfp4", "1,3,0.25", "mxfp4")]:
        out[name] = root / f"{name}.zarr"
        args = ["dump", "--task", "sst2", "--teacher", str(teacher), "--config", config, "--values", values,
                "--data-dir", str(glue_dir), "--limit", "20", "--shard-rows", "8", "--max-length", "24",
                "--student-layers", "2", "--no-progress", "--device", "cpu", "--out", str(out[name])]
        assert main(args) == 0
    return out


def assert_same_arrays(a_url, b_url):
    a, b = open_store(str(a_url)), open_store(str(b_url))
    assert list(a.specs) == list(b.specs) and a.meta["identity"] == b.meta["identity"]
    assert a.meta["checksums"] == b.meta["checksums"]
    for shard in range(a.n_shards):
        da, db = a.read_shard(shard), b.read_shard(shard)
        for name in a.specs:
            assert da[name].dtype == db[name].dtype
            np.testing.assert_array_equal(da[name], db[name], err_msg=name)


@pytest.mark.parametrize("dtype", ["int4", "mxfp4"])
def test_derived_4bit_store_equals_direct_dump(stores, tmp_path, dtype):
    """float16 -> 4-bit, and float16 -> int8 -> 4-bit, both give the directly dumped store."""
    via_f16 = tmp_path / "from_f16.zarr"
    assert main(["derive", str(stores["big"]), "--config", "1,3,0.25", "--values", dtype, "--out", str(via_f16),
                 "--no-progress"]) == 0
    assert_same_arrays(via_f16, stores[dtype])
    via_int8 = tmp_path / "from_int8.zarr"
    assert main(["derive", str(stores["int8"]), "--config", "1,3,0.25", "--values", dtype, "--out",
                 str(via_int8), "--no-progress"]) == 0
    assert_same_arrays(via_int8, stores[dtype])
    store = open_store(str(stores[dtype]))
    assert store.meta["format_version"] == FORMAT_VERSION and store.selection.value_dtype == dtype
    assert store.specs["layers/0/values"].dtype == "uint8"


@pytest.mark.parametrize("source, config, values, message", [
    ("int4", "1,3,0.25", "int8", "int4 values cannot become int8"),
    ("int4", "1,3,0.25", "float16", "int4 values cannot become float16"),
    ("mxfp4", "1,3,0.25", "int4", "mxfp4 values cannot become int4"),
    ("int4", "1,3,0.125", None, "cannot re-rank a narrower width"),
    ("big", "1,3,0.25", "int2", "unknown value dtype 'int2'"),
])
def test_derive_never_goes_back_up(stores, tmp_path, capsys, source, config, values, message):
    out = tmp_path / "x.zarr"
    args = ["derive", str(stores[source]), "--config", config, "--out", str(out), "--no-progress"]
    assert main(args + (["--values", values] if values else [])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hsk: error:") and message in err
    assert not out.exists()


def test_info_reports_bytes_per_part(stores, capsys):
    store = open_store(str(stores["int4"]))
    report = storage_report(store)
    parts = report["hsk_parts"]
    assert set(parts) == {"values", "masks", "positions", "scores", "scale"} and all(parts.values())
    assert sum(parts.values()) == report["hsk_bytes"]
    assert report["hsk_parts_per_kept_value"]["values"] == parts["values"] / report["kept_values"]
    assert "HSK by part" in format_report(store, report)
    assert main(["info", str(stores["int4"])]) == 0
    assert "scale" in capsys.readouterr().out


def test_format_1_store_still_opens_decodes_and_derives(tmp_path, capsys, monkeypatch):
    src = tmp_path / "v1.zarr"
    shutil.copytree(V1_STORE, src)
    assert main(["info", str(src)]) == 2  # no manifest covers its metadata: refused unless opted in (issue 19)
    assert f"hsk upgrade {src}" in capsys.readouterr().err
    monkeypatch.setenv("HSK_ALLOW_UNVERIFIED", "1")
    store = open_store(str(src))
    assert store.meta["format_version"] == 1 and store.verify() == []
    shard = store.read_shard(0)
    dense = store.dense(shard, store.layers[0])
    expected = codec.decode_values("int8", shard["layers/0/values"], shard["layers/0/scale"])
    np.testing.assert_array_equal(dense[codec.unpack_mask(shard["layers/0/masks"], 16)],
                                  expected[shard["layers/0/positions"] >= 0].reshape(-1))
    batch = decode_batch(shard, store.layers, store.hidden_size, "cpu", store.selection.value_dtype)
    np.testing.assert_array_equal(batch["dense_1"].numpy(), store.dense(shard, store.layers[1]))
    out = tmp_path / "v2-int4.zarr"
    assert main(["derive", str(src), "--config", "1,2,0.25", "--values", "int4", "--out", str(out),
                 "--no-progress"]) == 0
    derived = open_store(str(out))
    assert derived.meta["format_version"] == FORMAT_VERSION and derived.selection.value_dtype == "int4"
    assert main(["info", str(src)]) == 0 and "format v1" in capsys.readouterr().out
    monkeypatch.delenv("HSK_ALLOW_UNVERIFIED")
    assert main(["upgrade", str(src)]) == 0  # a real format-1 store: data checked, metadata covered
    assert main(["verify", str(src)]) == 0 and "matches the manifest" in capsys.readouterr().out
    assert open_store(str(src)).meta["upgraded"]["from_version"] == 1
