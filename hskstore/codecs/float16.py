"""float16: the kept activations themselves, 16 bits each (the dump's full precision)."""

from __future__ import annotations

import numpy as np

from .base import Arrays, ValueCodec


class Float16(ValueCodec):
    name = "float16"
    bits = 16.0
    lossless = True

    def arrays(self, n_width: int) -> Arrays:
        return {"values": ((n_width,), "float16")}

    def quantize(self, values: np.ndarray) -> tuple[np.ndarray, None]:
        return values.astype(np.float16), None

    def encode(self, values16: np.ndarray) -> tuple[np.ndarray, None]:
        return values16, None  # already what is stored

    def decode(self, values: np.ndarray, scale: None, n_width: int | None = None) -> np.ndarray:
        return values.astype(np.float32)


CODEC = Float16()
