"""int8: symmetric codes -127..127 under one fp16 scale per vector (scale = max|v| / 127): 8 bits + 16 per vector."""

from __future__ import annotations

import numpy as np

from .base import Arrays, ValueCodec


def quantize_int8(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-vector symmetric int8: returns (int8 values, fp16 scale [...]).

    The fp16 scale itself is what decoding uses, so quantising from it keeps encode and decode
    consistent; a subset of values that still holds the vector's max gets the same codes.
    """
    v = values.astype(np.float32)
    scale16 = (np.abs(v).max(axis=-1) / 127.0).astype(np.float16)
    scale = scale16.astype(np.float32)
    safe = np.where(scale > 0, scale, 1.0)[..., None]
    q = np.clip(np.rint(v / safe), -127, 127).astype(np.int8)
    return q, scale16


class Int8(ValueCodec):
    name = "int8"
    bits = 8.0  # plus one fp16 scale per vector

    def arrays(self, n_width: int) -> Arrays:
        return {"values": ((n_width,), "int8"), "scale": ((), "float16")}

    def quantize(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return quantize_int8(values)

    def decode(self, values: np.ndarray, scale: np.ndarray, n_width: int | None = None) -> np.ndarray:
        return values.astype(np.float32) * scale.astype(np.float32)[..., None]


CODEC = Int8()
