"""Codecs described as data: a code grid (code -> value), a code width and a scale layout (`Lut`).

Most value codecs are the same three steps: each group of `group` kept values gets one scale chosen
from its largest |value| (`Scale`), each value divided by it is rounded to the nearest level of a
grid, and the level's `bits`-bit code is packed little-endian. `LutCodec` implements `quantize` and
`decode` from such a description, in numpy; pipelines/core/codecs_torch.py builds the device twin
(same bytes) from the same description, so a codec that fits here is one module under hskstore/codecs
and its registration, with no torch code (docs/guide/adding-a-codec.md).

Scale kinds (`Scale.kind`), with `top` the largest |level| of the grid:

- `fp16`: the scale is max|v| / top, stored as float16; values are divided by it (by 1 where it is 0).
- `e8m0`: 2^e with e = floor(log2 max|v|) - floor(log2 top) clipped to -127..127 (-127 for an all-zero
  group), stored as the byte e + 127 (OCP MX); found from frexp, exact.
- `log8`: 2^((b - 128) / 8), the least such power at or above max|v|, stored as the byte b (0 for an
  all-zero group, clipped to 0..255); found from frexp and 8 float32 roots, never a logarithm.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from .base import Arrays, ValueCodec
from .layout import GROUP, grouped, n_groups, ungrouped

SCALE_KINDS = ("fp16", "e8m0", "log8")
E8M0_BIAS = 127
LOG_STEPS, LOG_BIAS = 8, 128  # log8: scale steps per octave, the byte of scale 1
ROOTS = np.exp2(np.arange(LOG_STEPS) / LOG_STEPS).astype(np.float32)  # 2^(i/8), i = 0..7
SCALE_DTYPES = {"fp16": "float16", "e8m0": "uint8", "log8": "uint8"}


@dataclass(frozen=True)
class Scale:
    """One scale per `group` consecutive kept values (the last group may be shorter), of a kind above."""

    kind: str
    group: int = GROUP

    def __post_init__(self) -> None:
        if self.kind not in SCALE_KINDS:
            raise ValueError(f"unknown scale kind {self.kind!r}; known: {', '.join(SCALE_KINDS)}")


@dataclass(frozen=True)
class Lut:
    """A grid codec as data. `values[c]` is what code c decodes to (times its group's scale), for all
    2^bits codes (padding is code 0, so values[0] should be 0); `levels` are the codes quantisation
    rounds to, by increasing value; a value exactly halfway between two levels goes to the lower one,
    or with `ties="even"` to the one whose code is even (IEEE's rounding, on codes)."""

    bits: int
    values: np.ndarray  # float32 [2^bits]
    levels: tuple[int, ...]
    scale: Scale
    ties: str = "lower"
    mids: np.ndarray = field(init=False, repr=False)  # float32 midpoints between consecutive levels
    ties_up: np.ndarray = field(init=False, repr=False)  # bool, per midpoint: a tie takes the upper level
    top: np.float32 = field(init=False, repr=False)  # largest |level|
    # the levels are consecutive integers from this one, and rounding them is np.rint's (ties to the even
    # value: the even code): the nearest level is then rint(x) clipped, no search (int4); else None
    rint_from: int | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        values = np.asarray(self.values, dtype=np.float32)
        levels = np.asarray(self.levels, dtype=np.int64)
        grid = values[levels]
        if not 1 <= self.bits <= 8 or values.shape != (1 << self.bits,) or (np.diff(grid) <= 0).any():
            raise ValueError("a Lut needs 1..8 bits, a value per code and levels by strictly increasing value")
        if self.ties not in ("lower", "even"):
            raise ValueError(f"ties must be 'lower' or 'even', not {self.ties!r}")
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "mids", ((grid[1:] + grid[:-1]) / 2).astype(np.float32))
        object.__setattr__(self, "ties_up", (levels[1:] % 2 == 0) & (self.ties == "even"))
        object.__setattr__(self, "top", np.float32(np.abs(grid).max()))
        consecutive = (grid == grid[0] + np.arange(len(grid))).all() and grid[0] == int(grid[0])
        even = self.ties == "even" and (levels % 2 == grid.astype(np.int64) % 2).all()
        object.__setattr__(self, "rint_from", int(grid[0]) if consecutive and even else None)

    def n_bytes(self, n: int) -> int:
        return -(-self.bits * n // 8)



def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """`bits`-bit codes [..., n] -> [..., ceil(bits n / 8)] uint8: code i at bits i*bits.. of the
    little-endian bit stream (4 bits: code 2k in the low nibble of byte k; 3 bits: 8 codes per 3 bytes)."""
    per, nbytes = block_of(bits)
    n = codes.shape[-1]
    blocks = -(-n // per)
    c = np.zeros((*codes.shape[:-1], blocks * per), dtype=np.int64)
    c[..., :n] = codes
    word = (c.reshape(*codes.shape[:-1], blocks, per) << (bits * np.arange(per))).sum(-1)
    out = ((word[..., None] >> (8 * np.arange(nbytes))) & 0xFF).astype(np.uint8)
    return out.reshape(*codes.shape[:-1], blocks * nbytes)[..., : -(-bits * n // 8)]


def unpack_codes(packed: np.ndarray, bits: int, n: int | None = None) -> np.ndarray:
    """[..., nbytes] uint8 -> the codes [..., n] int64; n=None: every code the bytes hold."""
    per, nbytes = block_of(bits)
    size = packed.shape[-1]
    blocks = -(-size // nbytes)  # explicit: a reshape of no rows cannot infer it
    b = np.zeros((*packed.shape[:-1], blocks * nbytes), dtype=np.int64)
    b[..., :size] = packed
    word = (b.reshape(*packed.shape[:-1], blocks, nbytes) << (8 * np.arange(nbytes))).sum(-1)
    codes = (word[..., None] >> (bits * np.arange(per))) & ((1 << bits) - 1)
    return codes.reshape(*packed.shape[:-1], blocks * per)[..., : n if n is not None else 8 * size // bits]


def block_of(bits: int) -> tuple[int, int]:
    """(codes, bytes) of the smallest whole-byte run of `bits`-bit codes: (2, 1) at 4 bits, (8, 3) at 3."""
    g = int(np.gcd(bits, 8))
    return 8 // g, bits // g


def _pow2(exp: np.ndarray) -> np.ndarray:
    """2^exp float32, exactly (e8m0's byte 255, never written, is 2^128: inf, as before)."""
    with np.errstate(over="ignore"):
        return np.ldexp(np.float32(1), exp.astype(np.int32)).astype(np.float32)


def scale_of(kind: str, peak: np.ndarray, top: np.float32) -> tuple[np.ndarray, np.ndarray]:
    """Group maxima (float32) -> (stored scale, float32 divisor)."""
    if kind == "fp16":
        scale16 = (peak / top).astype(np.float16)
        scale = scale16.astype(np.float32)
        return scale16, np.where(scale > 0, scale, np.float32(1))
    frac, exp = np.frexp(peak)  # peak = frac * 2^exp, frac in [0.5, 1): exact
    if kind == "e8m0":
        e = exp.astype(np.int64) - 1 - (int(np.frexp(top)[1]) - 1)
        e = np.where(peak > 0, np.clip(e, -E8M0_BIAS, E8M0_BIAS), -E8M0_BIAS)
        return (e + E8M0_BIAS).astype(np.uint8), _pow2(e)
    j = np.searchsorted(ROOTS, 2 * frac, side="left")  # roots below 2 frac: 2^(j/8) >= 2 frac
    k = np.clip(LOG_STEPS * (exp.astype(np.int64) - 1) + j, -LOG_BIAS, LOG_BIAS - 1)
    b = np.where(peak > 0, k + LOG_BIAS, 0).astype(np.uint8)
    return b, scale_value("log8", b)


def scale_value(kind: str, stored: np.ndarray) -> np.ndarray:
    """Stored scales -> their float32 values, exactly."""
    if kind == "fp16":
        return stored.astype(np.float32)
    if kind == "e8m0":
        return _pow2(stored.astype(np.int64) - E8M0_BIAS)
    k = stored.astype(np.int64) - LOG_BIAS
    return ROOTS[k % LOG_STEPS] * _pow2(k // LOG_STEPS)


def nearest_level(lut: Lut, x: np.ndarray) -> np.ndarray:
    """Index into lut.levels of the level nearest each x (ties as lut.ties; beyond the grid: its ends)."""
    low = lut.rint_from
    if low is not None:
        return (np.clip(np.rint(x), low, low + len(lut.levels) - 1) - low).astype(np.int64)
    idx = np.searchsorted(lut.mids, x, side="left")
    at = np.minimum(idx, len(lut.mids) - 1)
    return np.where((idx < len(lut.mids)) & lut.ties_up[at] & (x == lut.mids[at]), idx + 1, idx)


class LutCodec(ValueCodec):
    """A value codec given by its `lut`: subclasses set name, bits, via and lut, nothing else."""

    lut: ClassVar[Lut]

    def arrays(self, n_width: int) -> Arrays:
        scale = self.lut.scale
        return {"values": ((self.lut.n_bytes(n_width),), "uint8"),
                "scale": ((n_groups(n_width, scale.group),), SCALE_DTYPES[scale.kind])}

    def quantize(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lut = self.lut
        groups = grouped(values, lut.scale.group)
        stored, divisor = scale_of(lut.scale.kind, np.abs(groups).max(axis=-1), lut.top)
        idx = nearest_level(lut, groups / divisor[..., None])
        codes = np.asarray(lut.levels, dtype=np.int64)[idx]
        return pack_codes(ungrouped(codes, values.shape[-1]), lut.bits), stored

    def decode(self, values: np.ndarray, scale: np.ndarray, n_width: int | None = None) -> np.ndarray:
        lut = self.lut
        codes = unpack_codes(values, lut.bits, n_width)
        per_group = scale_value(lut.scale.kind, scale)
        return lut.values[codes] * np.repeat(per_group, lut.scale.group, axis=-1)[..., : codes.shape[-1]]
