"""int4 (format 2): groups of 32 consecutive kept values, one fp16 scale per group (max|v| / 7),
codes -7..7 as 4-bit two's complement, packed two per byte (hskstore.codecs.layout.pack_nibbles).

Quantised from the int8 values (`via`): the dump does float16 -> int8 -> int4, so an int4 store
derived from an int8 store is byte for byte the store a dump writes.
"""

from __future__ import annotations

import numpy as np

from .base import Arrays, ValueCodec
from .layout import GROUP, grouped, n_groups, pack_nibbles, per_value, ungrouped, unpack_nibbles

INT4_MAX = 7


def quantize_int4_values(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float values [..., n] -> (signed codes [..., n] int8 in -7..7, fp16 group scales [..., G])."""
    groups = grouped(values)
    scale16 = (np.abs(groups).max(axis=-1) / INT4_MAX).astype(np.float16)
    scale = scale16.astype(np.float32)
    safe = np.where(scale > 0, scale, 1.0)[..., None]
    q = np.clip(np.rint(groups / safe), -INT4_MAX, INT4_MAX).astype(np.int8)
    return ungrouped(q, values.shape[-1]), scale16


class Int4(ValueCodec):
    name = "int4"
    bits = 4.5  # 4-bit codes and an fp16 scale per 32
    via = "int8"

    def arrays(self, n_width: int) -> Arrays:
        return {"values": ((-(-n_width // 2),), "uint8"), "scale": ((n_groups(n_width),), "float16")}

    def quantize(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        codes, scale = quantize_int4_values(values)
        return pack_nibbles(codes), scale

    def decode(self, values: np.ndarray, scale: np.ndarray, n_width: int | None = None) -> np.ndarray:
        nib = unpack_nibbles(values, n_width)
        codes = ((nib.astype(np.int8) ^ 8) - 8).astype(np.float32)  # 4-bit two's complement
        return codes * per_value(scale, nib.shape[-1], GROUP)


CODEC = Int4()
