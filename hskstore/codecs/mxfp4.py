"""mxfp4 (format 2, the OCP microscaling MXFP4 element and scale): groups of 32, e2m1 codes (sign bit,
then the magnitude index into E2M1_GRID) under one power-of-two scale per group, stored as its E8M0
biased exponent (scale = 2^(e - 127); e = floor(log2 max|v|) - 2 + 127); magnitudes round to the
nearest grid value (ties to the even code) and saturate at 6. Packed two codes per byte like int4,
and quantised from the int8 values like it (`via`). A codec described as data (hskstore.codecs.lut).
"""

from __future__ import annotations

import numpy as np

from .layout import GROUP, grouped, ungrouped
from .lut import E8M0_BIAS, Lut, LutCodec, Scale, nearest_level, scale_of

E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
E2M1_EMAX = 2  # exponent of the largest e2m1 magnitude (6 = 1.5 * 2^2)
E2M1_MID = (E2M1_GRID[1:] + E2M1_GRID[:-1]) / 2
VALUES = np.concatenate([E2M1_GRID, -E2M1_GRID])  # code 8 is -0.0, never written
LEVELS = (*range(15, 8, -1), *range(8))  # -6 .. -0.5, 0 .. 6

__all__ = ["E2M1_EMAX", "E2M1_GRID", "E2M1_MID", "E8M0_BIAS", "CODEC", "quantize_mxfp4_values"]


class MXFP4(LutCodec):
    name = "mxfp4"
    bits = 4.25  # 4-bit codes and an 8-bit exponent per 32
    via = "int8"
    lut = Lut(bits=4, values=VALUES, levels=LEVELS, scale=Scale("e8m0", GROUP), ties="even")


def quantize_mxfp4_values(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float values [..., n] -> (e2m1 codes [..., n] int8 as sign<<3 | magnitude index, E8M0 exponents [..., G])."""
    lut = MXFP4.lut
    groups = grouped(values)
    exps, divisor = scale_of("e8m0", np.abs(groups).max(axis=-1), lut.top)
    codes = np.asarray(LEVELS, dtype=np.int8)[nearest_level(lut, groups / divisor[..., None])]
    return ungrouped(codes, values.shape[-1]), exps


CODEC = MXFP4()
