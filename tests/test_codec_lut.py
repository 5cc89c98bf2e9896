"""Codecs described as data (hskstore.codecs.lut): the numpy pieces and the generic torch twin built from a
codec's `lut` give the same bytes and floats, for every code width, every stored scale byte, every
midpoint tie and arbitrary stored bytes, for each registered codec that has a `lut`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hskstore import codecs
from hskstore.codecs import lut
from pipelines.core import codecs_torch

LUT_CODECS = [name for name in codecs.names() if getattr(codecs.get(name), "lut", None) is not None]


def test_the_4_and_3_bit_codecs_are_described_as_data():
    assert set(LUT_CODECS) >= {"int4", "mxfp4", "nf3"}
    assert all(type(codecs_torch.get(name)) is codecs_torch.LutTwin for name in LUT_CODECS)


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 77])
def test_packing_round_trips_alike(bits, n):
    codes = np.random.default_rng(bits * 100 + n).integers(0, 1 << bits, size=(5, n))
    packed = lut.pack_codes(codes, bits)
    assert packed.shape == (5, -(-bits * n // 8)) and packed.dtype == np.uint8
    assert codecs_torch.pack_codes(torch.from_numpy(codes), bits).numpy().tobytes() == packed.tobytes()
    np.testing.assert_array_equal(lut.unpack_codes(packed, bits, n), codes)
    every = lut.unpack_codes(packed, bits)  # every code the bytes hold: the tail's are 0
    assert every.shape[-1] == 8 * packed.shape[-1] // bits and not every[:, n:].any()
    got = codecs_torch.unpack_codes(torch.from_numpy(packed), bits).numpy()
    np.testing.assert_array_equal(got, every)
    if bits == 4:  # the nibble order of docs/STORE_FORMAT.md: code 2k in the low nibble of byte k
        assert lut.pack_codes(np.array([[1, 2]]), 4).tolist() == [[0x21]]


@pytest.mark.parametrize("kind", ["e8m0", "log8"])
def test_every_scale_byte_decodes_alike(kind):
    b = np.arange(256, dtype=np.uint8)
    ref = lut.scale_value(kind, b)
    assert codecs_torch.scale_value(kind, torch.from_numpy(b)).numpy().tobytes() == ref.tobytes()


@pytest.mark.parametrize("name", LUT_CODECS)
def test_ties_saturation_and_stray_bytes_alike(name):
    codec, twin = codecs.get(name), codecs_torch.get(name)
    table = codec.lut
    # every midpoint, every level, beyond both ends, and zeros, at a group peak the scale maps to the top
    x = np.concatenate([table.mids, table.values[list(table.levels)], [0.0, -0.0, 3 * table.top, -3 * table.top]])
    x = np.resize(x.astype(np.float32), (4, 2 * table.scale.group))
    x[:, 0] = table.top  # the group's peak
    x = x * np.float32(2.0) ** np.arange(-3, 1, dtype=np.float32)[:, None]
    ref = codec.quantize(x)
    got = twin.quantize(torch.from_numpy(x))
    assert got[0].numpy().tobytes() == ref[0].tobytes() and got[1].numpy().tobytes() == ref[1].tobytes()
    # any stored bytes (codes the encoder never writes too) decode alike
    rng = np.random.default_rng(len(name))
    values = rng.integers(0, 256, size=(6, *codec.arrays(45)["values"][0]), dtype=np.uint8)
    _, scale = codec.quantize((rng.standard_normal((6, 45)) * 10.0 ** rng.integers(-6, 4, (6, 1))).astype(np.float32))
    ref = codec.decode(values, scale)
    assert twin.decode(torch.from_numpy(values), torch.from_numpy(scale)).numpy().tobytes() == ref.tobytes()


def test_a_lut_that_cannot_be_read_is_refused():
    with pytest.raises(ValueError, match="strictly increasing"):
        lut.Lut(bits=2, values=np.array([0, 1, 2, 3], dtype=np.float32), levels=(2, 1), scale=lut.Scale("fp16"))
    with pytest.raises(ValueError, match="unknown scale kind"):
        lut.Scale("fp8")
