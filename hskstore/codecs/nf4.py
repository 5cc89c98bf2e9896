"""nf4: 4-bit NormalFloat codes under a one-byte log scale per group of 64 kept values (4.125 bits per value).

Made for values that are near-normal across a vector, as a causal LM's final hidden state is once rotated
(`hsk dump --objective clm --support hidden:nf4`, hskstore.format.clm.rotation): the 16 levels are QLoRA's
NormalFloat-4 (quantiles of a normal distribution scaled to [-1, 1], zero exact), and one scale per 64 values
keeps a 576-wide vector at 297 bytes (benchmarks/evidence/lm/hidden_codecs.py measures it).

- Grid: NF4_GRID ascending; code c (0..15) stands for level NF4_GRID[(c + 7) % 16], so code 0 is 0.0.
- Scale: per group of 64 consecutive kept values (the last may be shorter), nf3's `log8` byte: the least
  s = 2^((b - 128) / 8) at or above max |x| of the group (hskstore.codecs.lut).
- Code of x: the nearest level of x / s, a value halfway between two levels taking the lower one.
- Packing: two codes per byte, code 2k in the low nibble of byte k.
- Quantised from the int8 values (`via`), as int4, mxfp4 and nf3.
"""

from __future__ import annotations

import numpy as np

from .lut import Lut, LutCodec, Scale

NF4_GRID = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                     -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                     0.24611230194568634, 0.33791524171829224, 0.44070982933044006, 0.5626170039176941,
                     0.7229568362236023, 1.0], dtype=np.float32)
ZERO_INDEX = 7  # code c <-> grid index (c + 7) % 16
GROUP = 64


class NF4(LutCodec):
    name = "nf4"
    bits = 4.125  # 4-bit codes and a one-byte scale per 64
    via = "int8"
    lut = Lut(bits=4, values=NF4_GRID[(np.arange(16) + ZERO_INDEX) % 16],
              levels=tuple(int(c) for c in (np.arange(16) - ZERO_INDEX) % 16), scale=Scale("log8", GROUP))


CODEC = NF4()
