"""mxfp4 (format 2, the OCP microscaling MXFP4 element and scale): groups of 32, e2m1 codes (sign bit,
then the magnitude index into E2M1_GRID) under one power-of-two scale per group, stored as its E8M0
biased exponent (scale = 2^(e - 127); e = floor(log2 max|v|) - 2 + 127); magnitudes round to the
nearest grid value (ties to the even code) and saturate at 6. Packed two codes per byte like int4,
and quantised from the int8 values like it (`via`).
"""

from __future__ import annotations

import numpy as np

from .base import Arrays, ValueCodec
from .layout import GROUP, grouped, n_groups, pack_nibbles, ungrouped, unpack_nibbles

E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
E2M1_EMAX = 2  # exponent of the largest e2m1 magnitude (6 = 1.5 * 2^2)
E8M0_BIAS = 127
# e2m1 magnitudes between grid points k and k+1 round up when k is odd (ties to the even code)
E2M1_MID = (E2M1_GRID[1:] + E2M1_GRID[:-1]) / 2


def quantize_mxfp4_values(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float values [..., n] -> (e2m1 codes [..., n] int8 as sign<<3 | magnitude index, E8M0 exponents [..., G])."""
    groups = grouped(values)
    peak = np.abs(groups).max(axis=-1)
    exp = np.frexp(peak)[1].astype(np.int32) - 1 - E2M1_EMAX  # frexp: exact floor(log2 max) + 1
    exp = np.where(peak > 0, np.clip(exp, -E8M0_BIAS, E8M0_BIAS), -E8M0_BIAS)
    mag = np.minimum(np.abs(groups) / np.exp2(exp.astype(np.float32))[..., None], E2M1_GRID[-1])
    idx = np.searchsorted(E2M1_MID, mag, side="left")
    tie_up = (idx < len(E2M1_MID)) & (idx % 2 == 1)
    idx = np.where(tie_up & (mag == E2M1_MID[np.minimum(idx, len(E2M1_MID) - 1)]), idx + 1, idx)
    codes = (idx | np.where((groups < 0) & (idx > 0), 8, 0)).astype(np.int8)
    return ungrouped(codes, values.shape[-1]), (exp + E8M0_BIAS).astype(np.uint8)


class MXFP4(ValueCodec):
    name = "mxfp4"
    bits = 4.25  # 4-bit codes and an 8-bit exponent per 32
    via = "int8"

    def arrays(self, n_width: int) -> Arrays:
        return {"values": ((-(-n_width // 2),), "uint8"), "scale": ((n_groups(n_width),), "uint8")}

    def quantize(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        codes, exps = quantize_mxfp4_values(values)
        return pack_nibbles(codes), exps

    def decode(self, values: np.ndarray, scale: np.ndarray, n_width: int | None = None) -> np.ndarray:
        nib = unpack_nibbles(values, n_width)
        mag = E2M1_GRID[nib & 7]
        per_group = np.exp2(scale.astype(np.float32) - E8M0_BIAS)
        return np.where(nib & 8, -mag, mag) * np.repeat(per_group, GROUP, axis=-1)[..., : nib.shape[-1]]


CODEC = MXFP4()
