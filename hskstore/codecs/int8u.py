"""int8u: values rounded to integers and clipped to -127..127, no scale: 8 bits per value.

The codec of indices that are already scaled: the fitted basis of the hidden-state support
(`--support hidden:fit`, hskstore.format.hidden_fit) divides each coordinate by its step before
this codec rounds it, and folds the steps into the stored head. Code of x: rint(x) (a half rounds
to even), clipped to [-127, 127]; decode: the code as float32. Applied to values that are not
scaled first it keeps only their integer part.
"""

from __future__ import annotations

import numpy as np

from .base import Arrays, ValueCodec


class Int8u(ValueCodec):
    name = "int8u"
    bits = 8.0

    def arrays(self, n_width: int) -> Arrays:
        return {"values": ((n_width,), "int8")}

    def quantize(self, values: np.ndarray) -> tuple[np.ndarray, None]:
        return np.clip(np.rint(np.asarray(values, dtype=np.float64)), -127, 127).astype(np.int8), None

    def decode(self, values: np.ndarray, scale: None, n_width: int | None = None) -> np.ndarray:
        return values.astype(np.float32)


CODEC = Int8u()
