"""int4 (format 2): groups of 32 consecutive kept values, one fp16 scale per group (max|v| / 7),
codes -7..7 as 4-bit two's complement, packed two per byte (code 2k in the low nibble of byte k).

A codec described as data (hskstore.codecs.lut): the grid, the scale layout and the rounding (ties
to even, as np.rint) are all it declares. Quantised from the int8 values (`via`): the dump does
float16 -> int8 -> int4, so an int4 store derived from an int8 store is byte for byte a direct dump.
"""

from __future__ import annotations

import numpy as np

from .lut import Lut, LutCodec, Scale

INT4_MAX = 7
CODES = np.arange(16)
VALUES = ((CODES ^ 8) - 8).astype(np.float32)  # 4-bit two's complement: code 8 (-8) is never written
LEVELS = tuple(int(c) for c in np.arange(-INT4_MAX, INT4_MAX + 1) & 0xF)  # -7..7


class Int4(LutCodec):
    name = "int4"
    bits = 4.5  # 4-bit codes and an fp16 scale per 32
    via = "int8"
    lut = Lut(bits=4, values=VALUES, levels=LEVELS, scale=Scale("fp16"), ties="even")


CODEC = Int4()
