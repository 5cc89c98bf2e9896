"""nf3, the 3-bit codec added as one module (hskstore/codecs/nf3.py) plus its registration: its bytes as
docs/STORE_FORMAT.md defines them, both engines byte for byte, `hsk dump --values nf3` and `hsk derive
--values nf3` (from float16 and from int8: the directly dumped store), and derive refusing to go back up.
The suites that run every registered codec (test_select_torch, test_fast_loader, test_codec4's torch
decode, test_conformance) cover it too."""

from __future__ import annotations

from pathlib import Path

import conformance_reader as reader
import numpy as np
import pytest
import torch
from conftest import save_tiny_teacher
from test_codec4 import assert_same_arrays, heavy_tailed

from hskstore import codecs, open_store
from hskstore.codecs import nf3
from hskstore.format import codec
from pipelines.cli import main
from pipelines.core import codecs_torch


@pytest.mark.parametrize("n_width", [1, 5, 8, 13, 32, 33, 77])
def test_round_trip_and_layout(n_width):
    v16 = heavy_tailed((40, 3, n_width), seed=n_width)
    v16[0, 0] = 0  # an unused slot: all zero bytes
    values, scale = codec.encode_kept(v16, "nf3")
    assert values.dtype == scale.dtype == np.uint8
    assert values.shape == (40, 3, -(-3 * n_width // 8)) and scale.shape == (40, 3, -(-n_width // 32))
    assert not values[0, 0].any() and not scale[0, 0].any()
    decoded = codec.decode_values("nf3", values, scale, n_width)
    int8 = codecs.get("int8")
    x = int8.decode(*int8.encode(v16))  # nf3 quantises the int8 values
    s = np.repeat(nf3.scale_values(scale), 32, axis=-1)[..., :n_width]
    assert (np.abs(x) <= s).all()  # the least 2^(b/8) at or above the group's max
    gaps = np.diff(nf3.NF3_GRID).max()
    assert (np.abs(decoded - x) <= s * gaps / 2 * (1 + 1e-6)).all()  # within half the widest level gap
    # the reader written from docs/STORE_FORMAT.md decodes the same floats
    assert reader.decode(values, scale, "nf3", n_width).tobytes() == decoded.tobytes()


def test_packing_and_levels_as_documented():
    # grid values at scale 1 (b = 128): each level quantises to itself; code c <-> level (c + 3) % 8
    x = np.tile(nf3.NF3_GRID, 4)[None]
    values, scale = codecs.get("nf3").quantize(x)
    assert scale.tolist() == [[128]]
    codes = nf3.unpack3(values, 32)[0]
    np.testing.assert_array_equal(nf3.NF3_GRID[(codes.astype(int) + 3) % 8], x[0])
    assert codes[3] == 0 and codes[7] == 4 and codes[0] == 5  # 0 -> code 0, 1 -> 4, -1 -> 5
    # 8 codes per 3 bytes, little-endian: codes 1..7, 0 -> bits 3i..3i+2 of one 24-bit word
    word = sum(c << (3 * i) for i, c in enumerate([1, 2, 3, 4, 5, 6, 7, 0]))
    assert nf3.pack3(np.array([[1, 2, 3, 4, 5, 6, 7, 0]])).tolist() == [[word & 0xFF, word >> 8 & 0xFF, word >> 16]]
    # halfway between two levels: the lower one
    mid = nf3.NF3_MID[4]
    values, _ = codecs.get("nf3").quantize(np.array([[mid, 1.0]], dtype=np.float32))
    assert nf3.unpack3(values, 2)[0, 0] == (4 - 3) % 8
    # the scale byte is the least power 2^(k/8) >= the peak, found without a logarithm
    peaks = np.array([1.0, 1.0001, 0.5, 3.0, 2.0 ** 0.375, 1e-9, 70000.0], dtype=np.float32)
    b = nf3.scale_bytes(peaks)
    s = nf3.scale_values(b)
    below = nf3.scale_values(np.maximum(b.astype(int) - 1, 0).astype(np.uint8))
    ok = (b > 0) & (b < 255)
    assert (s[ok] >= peaks[ok]).all() and (below[ok] < peaks[ok]).all() and b[-1] == 255


@pytest.mark.parametrize("n_width", [3, 32, 45])
def test_torch_twin_gives_the_same_bytes(n_width):
    v16 = heavy_tailed((30, 4, n_width), seed=7 + n_width)
    v16[1, 2] = 0
    v16[2, 0, 0] = 6e4  # a peak past the largest scale: saturates alike
    ref_values, ref_scale = codec.encode_kept(v16, "nf3")
    twin = codecs_torch.get("nf3")
    values, scale = twin.encode(torch.from_numpy(v16))
    assert values.numpy().tobytes() == ref_values.tobytes() and scale.numpy().tobytes() == ref_scale.tobytes()
    got = twin.decode(values, scale, n_width).numpy()
    assert got.tobytes() == codec.decode_values("nf3", ref_values, ref_scale, n_width).tobytes()
    whole = twin.decode(values, scale).numpy()  # every code the bytes hold: the padding decodes to 0
    assert (whole[..., :n_width] == got).all() and not whole[..., n_width:].any()


@pytest.fixture(scope="module")
def stores(tmp_path_factory, tiny_tokenizer, glue_dir) -> dict[str, Path]:
    """A tiny teacher dumped at 2,4,0.5 float16 and, directly, at 1,3,0.25 in int8 and nf3."""
    root = tmp_path_factory.mktemp("nf3")
    teacher = save_tiny_teacher(root / "teacher", tiny_tokenizer, num_layers=2, seed=4)
    out = {}
    for name, config, values in [("big", "2,4,0.5", "float16"), ("int8", "1,3,0.25", "int8"),
                                 ("nf3", "1,3,0.25", "nf3")]:
        out[name] = root / f"{name}.zarr"
        args = ["dump", "--task", "sst2", "--teacher", str(teacher), "--config", config, "--values", values,
                "--data-dir", str(glue_dir), "--limit", "20", "--shard-rows", "8", "--max-length", "24",
                "--student-layers", "2", "--no-progress", "--device", "cpu", "--out", str(out[name])]
        assert main(args) == 0
    return out


def test_dump_and_derive_give_the_same_store(stores, tmp_path):
    store = open_store(str(stores["nf3"]))
    assert store.selection.value_dtype == "nf3" and store.specs["layers/0/scale"].dtype == "uint8"
    shard = store.read_shard(0)
    assert store.dense(shard, store.layers[0]).any()
    for source in ("big", "int8"):
        out = tmp_path / f"from_{source}.zarr"
        assert main(["derive", str(stores[source]), "--config", "1,3,0.25", "--values", "nf3", "--out", str(out),
                     "--no-progress"]) == 0
        assert_same_arrays(out, stores["nf3"])


@pytest.mark.parametrize("values, message", [("int4", "nf3 values cannot become int4"),
                                             ("int8", "nf3 values cannot become int8")])
def test_derive_never_goes_back_up(stores, tmp_path, capsys, values, message):
    out = tmp_path / "x.zarr"
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["derive", str(stores["nf3"]), "--config", "1,3,0.25", "--values", values, "--out", str(out),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hsk: error:") and message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_no_rows_decode_to_no_rows():
    """A batch whose slots are all unused decodes no vectors (the loader's CPU path)."""
    empty = np.zeros((0, 29), dtype=np.uint8)
    scale = np.zeros((0, 3), dtype=np.uint8)
    assert codecs_torch.get("nf3").decode(torch.from_numpy(empty), torch.from_numpy(scale)).shape == (0, 77)
    assert codec.decode_values("nf3", empty, scale).shape == (0, 77)
