"""nf3: 3-bit NormalFloat codes under a one-byte log scale per group of 32 kept values (3.25 bits per value).

Chosen by measurement (benchmarks/value_codecs.py, docs/guide/adding-a-codec.md): on a MiniLM-L6
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
"""

from __future__ import annotations

import numpy as np

from .base import Arrays, ValueCodec
from .layout import GROUP, grouped, n_groups, ungrouped

NF3_GRID = np.array([-1.0, -0.5350, -0.2469, 0.0, 0.1833, 0.3819, 0.6229, 1.0], dtype=np.float32)
NF3_MID = ((NF3_GRID[1:] + NF3_GRID[:-1]) / 2).astype(np.float32)
ZERO_INDEX = 3  # code c <-> grid index (c + 3) % 8
ROOTS = np.exp2(np.arange(8) / 8).astype(np.float32)  # 2^(i/8)
STEPS = 8  # scale steps per octave
BIAS = 128


def scale_bytes(peak: np.ndarray) -> np.ndarray:
    """max |x| per group -> the scale byte b: s = 2^((b - 128) / 8) is the least such power >= peak."""
    frac, exp = np.frexp(peak.astype(np.float32))  # peak = frac * 2^exp, frac in [0.5, 1); exact
    j = np.searchsorted(ROOTS, 2 * frac, side="left")  # roots below 2 frac: 2^(j/8) >= 2 frac
    k = np.clip(STEPS * (exp.astype(np.int64) - 1) + j, -BIAS, BIAS - 1)
    return np.where(peak > 0, k + BIAS, 0).astype(np.uint8)


def scale_values(b: np.ndarray) -> np.ndarray:
    """Scale bytes -> s = 2^((b - 128) / 8) float32, exactly (a root times a power of two)."""
    k = b.astype(np.int64) - BIAS
    return np.ldexp(ROOTS[k % STEPS], (k // STEPS).astype(np.int32)).astype(np.float32)


def pack3(codes: np.ndarray) -> np.ndarray:
    """3-bit codes [..., n] (0..7) -> [..., ceil(3n/8)] uint8, 8 codes per 3 bytes, little-endian."""
    n = codes.shape[-1]
    blocks = -(-n // 8)
    c = np.zeros((*codes.shape[:-1], blocks * 8), dtype=np.uint32)
    c[..., :n] = codes
    word = (c.reshape(*codes.shape[:-1], blocks, 8) << (3 * np.arange(8, dtype=np.uint32))).sum(-1, dtype=np.uint32)
    out = np.stack([word & 0xFF, (word >> 8) & 0xFF, word >> 16], axis=-1).astype(np.uint8)
    return out.reshape(*codes.shape[:-1], -1)[..., : -(-3 * n // 8)]


def unpack3(packed: np.ndarray, n: int | None = None) -> np.ndarray:
    """[..., ceil(3n/8)] uint8 -> the codes [..., n] uint8; n=None: every whole code the bytes hold."""
    nbytes = packed.shape[-1]
    blocks = -(-nbytes // 3)
    b = np.zeros((*packed.shape[:-1], blocks * 3), dtype=np.uint32)
    b[..., :nbytes] = packed
    b = b.reshape(*packed.shape[:-1], blocks, 3)
    word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
    codes = ((word[..., None] >> (3 * np.arange(8, dtype=np.uint32))) & 7).astype(np.uint8)
    return codes.reshape(*packed.shape[:-1], blocks * 8)[..., : n if n is not None else 8 * nbytes // 3]


class NF3(ValueCodec):
    name = "nf3"
    bits = 3.25  # 3-bit codes and a one-byte scale per 32
    via = "int8"

    def arrays(self, n_width: int) -> Arrays:
        return {"values": ((-(-3 * n_width // 8),), "uint8"), "scale": ((n_groups(n_width),), "uint8")}

    def quantize(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        groups = grouped(values)
        b = scale_bytes(np.abs(groups).max(axis=-1))
        s = scale_values(b)
        x = groups / s[..., None]
        idx = np.searchsorted(NF3_MID, x, side="left")  # ties to the lower level
        codes = ((idx - ZERO_INDEX) % 8).astype(np.uint8)
        return pack3(ungrouped(codes, values.shape[-1])), b

    def decode(self, values: np.ndarray, scale: np.ndarray, n_width: int | None = None) -> np.ndarray:
        codes = unpack3(values, n_width)
        level = NF3_GRID[(codes.astype(np.int64) + ZERO_INDEX) % 8]
        return level * np.repeat(scale_values(scale), GROUP, axis=-1)[..., : codes.shape[-1]]


CODEC = NF3()
