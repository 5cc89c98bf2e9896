"""`example-int3`: 3-bit integer codes -3..3 under an fp16 scale per 32 kept values, from outside hsk.

hsk finds it through the entry point in this package's pyproject.toml (group `hsk.codecs`, named
after the codec) and imports this module the first time a command asks for the codec; CODEC is the
instance. Described as data (hskstore.codecs.lut), it needs no torch code: the device twin is built
from its `lut`.
"""

from __future__ import annotations

import numpy as np

from hskstore.codecs.lut import Lut, LutCodec, Scale

CODES = np.arange(8)


class ExampleInt3(LutCodec):
    name = "example-int3"
    bits = 3.5  # 3-bit codes and an fp16 scale per 32
    via = "int8"  # quantised from the int8 values, as int4: derive from int8 equals a direct dump
    lut = Lut(bits=3, values=((CODES ^ 4) - 4).astype(np.float32),  # 3-bit two's complement
              levels=tuple(int(c) for c in np.arange(-3, 4) & 7), scale=Scale("fp16"), ties="even")


CODEC = ExampleInt3()
