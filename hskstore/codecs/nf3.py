"""nf3: 3-bit NormalFloat codes under a one-byte log scale per group of 32 kept values (3.25 bits per value).

Chosen by measurement (benchmarks/store/value_codecs.py, docs/guide/adding-a-codec.md): on a MiniLM-L6
encoder's SST-2 activations at W = 0.2 it stores 16% fewer value and scale bytes than mxfp4 at 1.4x
its round-trip error; int3 codes, e2m0 grids and power-of-two scales measured worse per byte.

- Grid: the 8 NormalFloat-3 levels NF3_GRID (quantiles of a normal distribution scaled to [-1, 1],
  zero exact), in ascending order. Code c (0..7) stands for level NF3_GRID[(c + 3) % 8], so code 0 is
  0.0: padding bits and unused token slots decode to zero.
- Scale, per group g of 32 consecutive kept values (the last may be shorter): one byte b, scale
  s = 2^((b - 128) / 8), the smallest such power >= max |x| of the group (b clipped to 0..255, so
  s is in 2^-16 .. 2^15.875; beyond it values saturate at +-s); an all-zero group has b = 0.
  b is found without a logarithm: E from frexp (max |x| = f * 2^E, f in [0.5, 1)), then j = the
  number of ROOTS (2^(i/8), i = 0..7, float32) below 2f, and b = 8 (E - 1) + j + 128. s is
  ROOTS[k % 8] * 2^(k // 8) for k = b - 128, exact in float32.
- Code of x: the nearest level of x / s (float32 division), a value exactly halfway between two
  levels taking the lower one (NF3_MID, the float32 midpoints).
- Packing: 8 codes in 3 bytes, code 8m + i at bits 3i..3i+2 of the little-endian 24-bit word of
  bytes 3m..3m+2; values hold ceil(3 N^W / 8) bytes (the unused tail bits are 0).
- Quantised from the int8 values (`via`), as int4 and mxfp4: an nf3 store derived from an int8 store
  equals a direct dump byte for byte.
- Described as data (hskstore.codecs.lut: the grid, 3-bit packing, the `log8` scale per 32): numpy's
  quantise and decode and the device twin (pipelines/core/codecs_torch.py) are built from that.
"""

from __future__ import annotations

import numpy as np

from .layout import GROUP
from .lut import LOG_BIAS as BIAS
from .lut import LOG_STEPS as STEPS
from .lut import ROOTS, Lut, LutCodec, Scale, pack_codes, scale_of, scale_value, unpack_codes

NF3_GRID = np.array([-1.0, -0.5350, -0.2469, 0.0, 0.1833, 0.3819, 0.6229, 1.0], dtype=np.float32)
NF3_MID = ((NF3_GRID[1:] + NF3_GRID[:-1]) / 2).astype(np.float32)
ZERO_INDEX = 3  # code c <-> grid index (c + 3) % 8

__all__ = ["BIAS", "CODEC", "NF3_GRID", "NF3_MID", "ROOTS", "STEPS", "ZERO_INDEX", "pack3", "scale_bytes",
           "scale_values", "unpack3"]


class NF3(LutCodec):
    name = "nf3"
    bits = 3.25  # 3-bit codes and a one-byte scale per 32
    via = "int8"
    lut = Lut(bits=3, values=NF3_GRID[(np.arange(8) + ZERO_INDEX) % 8],
              levels=tuple(int(c) for c in (np.arange(8) - ZERO_INDEX) % 8), scale=Scale("log8", GROUP))


def scale_bytes(peak: np.ndarray) -> np.ndarray:
    """max |x| per group -> the scale byte b: s = 2^((b - 128) / 8) is the least such power >= peak."""
    return scale_of("log8", peak.astype(np.float32), np.float32(1))[0]


def scale_values(b: np.ndarray) -> np.ndarray:
    """Scale bytes -> s = 2^((b - 128) / 8) float32, exactly (a root times a power of two)."""
    return scale_value("log8", b)


def pack3(codes: np.ndarray) -> np.ndarray:
    """3-bit codes [..., n] (0..7) -> [..., ceil(3n/8)] uint8, 8 codes per 3 bytes, little-endian."""
    return pack_codes(codes, 3)


def unpack3(packed: np.ndarray, n: int | None = None) -> np.ndarray:
    """[..., ceil(3n/8)] uint8 -> 3-bit codes [..., n] uint8; n=None: every code the bytes hold."""
    return unpack_codes(packed, 3, n).astype(np.uint8)


CODEC = NF3()
