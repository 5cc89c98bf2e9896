"""The device twins of hskstore's value codecs: torch encode and decode, the same bytes as numpy.

hskstore.codecs holds each codec's numpy definition (hskstore imports no torch); this module gives
each codec name a twin, for the dump's torch selection engine (encode on the teacher's device) and
the training loader (decode on the student's device). A codec described as data (its `lut`,
hskstore.codecs.lut: int4, mxfp4, nf3) gets the generic `LutTwin`, built from that description, so
adding one needs nothing here; only codecs that no `lut` describes (float16, int8) have a twin of
their own. `get(name)` finds a twin by the name a store records; tests/test_select_torch.py and
tests/test_codec4.py check every registered codec's twin against numpy byte for byte.
docs/guide/adding-a-codec.md.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
import torch

from hskstore import codecs
from hskstore.codecs import lut
from hskstore.codecs.layout import GROUP, n_groups

# Small constant tensors, made once per device: building one from host data is a blocking copy on CUDA,
# which would stall the queue of device work the dump and the loader rely on.
_ON_DEVICE: dict[tuple, torch.Tensor] = {}


def cached(key: tuple, device: torch.device, make) -> torch.Tensor:
    """A constant tensor made once per device (grids, divisors)."""
    found = _ON_DEVICE.get((*key, str(device)))
    if found is None:
        found = _ON_DEVICE[(*key, str(device))] = make().to(device)
    return found


def const(value: float, like: torch.Tensor) -> torch.Tensor:
    """A 0-dim float32 tensor on `like`'s device: dividing by it is a true IEEE division everywhere."""
    return cached(("const", value), like.device, lambda: torch.tensor(value, dtype=torch.float32))


class TorchCodec(ABC):
    """The torch twin of the hskstore codec of the same name (`quantize` and `decode` on tensors)."""

    name: ClassVar[str]

    @abstractmethod
    def quantize(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """float32 values [..., N^W] -> (stored values, stored scale or None), as the numpy codec."""

    @abstractmethod
    def decode(self, values: torch.Tensor, scale: torch.Tensor | None, n_width: int | None = None) -> torch.Tensor:
        """Stored values -> float32 [..., N^W] on their device; without N^W, every code the bytes hold."""

    def encode(self, values16: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """fp16 kept values -> the stored arrays, through the numpy codec's `via` chain."""
        via = codecs.chained(self.name).via
        if via is None:
            return self.quantize(values16.float())
        parent = get(via, chained=True)
        return self.quantize(parent.decode(*parent.encode(values16), values16.shape[-1]))


def grouped(values: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """[..., n] -> [..., G, group] float32, the last group zero-padded (hskstore.codecs.layout.grouped)."""
    n = values.shape[-1]
    padded = torch.nn.functional.pad(values.float(), (0, n_groups(n, group) * group - n))
    return padded.view(*values.shape[:-1], -1, group)


def per_value(group_scale: torch.Tensor, n: int, group: int = GROUP) -> torch.Tensor:
    return group_scale.float().repeat_interleave(group, dim=-1)[..., :n]


class Float16(TorchCodec):
    name = "float16"

    def quantize(self, values: torch.Tensor) -> tuple[torch.Tensor, None]:
        return values.to(torch.float16), None

    def encode(self, values16: torch.Tensor) -> tuple[torch.Tensor, None]:
        return values16, None

    def decode(self, values: torch.Tensor, scale: None, n_width: int | None = None) -> torch.Tensor:
        return values.float()


class Int8(TorchCodec):
    name = "int8"

    def quantize(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v = values.float()
        scale16 = (v.abs().amax(dim=-1) / const(127.0, v)).to(torch.float16)
        scale = scale16.float()
        safe = torch.where(scale > 0, scale, const(1.0, scale))[..., None]
        return torch.clamp(torch.round(v / safe), -127, 127).to(torch.int8), scale16

    def decode(self, values: torch.Tensor, scale: torch.Tensor, n_width: int | None = None) -> torch.Tensor:
        return values.float() * scale.float().unsqueeze(-1)


class Int8u(TorchCodec):
    name = "int8u"

    def quantize(self, values: torch.Tensor) -> tuple[torch.Tensor, None]:
        return torch.clamp(torch.round(values.float()), -127, 127).to(torch.int8), None

    def decode(self, values: torch.Tensor, scale: None, n_width: int | None = None) -> torch.Tensor:
        return values.float()


def _power_of_two(exp: torch.Tensor) -> torch.Tensor:
    """2^exp as float32 for integer exp in [-127, 127], from its bits (2^-127 is subnormal)."""
    bits = torch.where(exp >= -126, (exp + 127) << 23, torch.full_like(exp, 1 << 22))
    return bits.to(torch.int32).view(torch.float32)


def _word_type(nbytes: int) -> torch.dtype:
    return torch.int32 if nbytes <= 3 else torch.int64  # a block of up to 24 bits fits an int32's 31


def _shifts(step: int, count: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return cached(("shifts", step, count, dtype), device, lambda: step * torch.arange(count, dtype=dtype))


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """hskstore.codecs.lut.pack_codes on tensors: `bits`-bit codes, little-endian, ceil(bits n / 8) bytes."""
    per, nbytes = lut.block_of(bits)
    word_type = _word_type(nbytes)
    n = codes.shape[-1]
    c = torch.nn.functional.pad(codes.to(word_type), (0, -n % per)).view(*codes.shape[:-1], -(-n // per), per)
    word = (c << _shifts(bits, per, word_type, codes.device)).sum(-1, dtype=word_type)
    out = ((word.unsqueeze(-1) >> _shifts(8, nbytes, word_type, codes.device)) & 0xFF).to(torch.uint8)
    return out.flatten(-2)[..., : -(-bits * n // 8)]


def unpack_codes(packed: torch.Tensor, bits: int, n: int | None = None) -> torch.Tensor:
    """hskstore.codecs.lut.unpack_codes on tensors: the codes [..., n] (int32 or int64; n=None: every code)."""
    per, nbytes = lut.block_of(bits)
    word_type = _word_type(nbytes)
    size = packed.shape[-1]
    if nbytes == 1:  # whole codes per byte (8, 4, 2 or 1 bits): no words to build
        word = packed.to(word_type)
    else:
        blocks = -(-size // nbytes)  # explicit: a view of no rows cannot infer it
        b = torch.nn.functional.pad(packed.to(word_type), (0, -size % nbytes)).view(*packed.shape[:-1], blocks, nbytes)
        word = (b << _shifts(8, nbytes, word_type, packed.device)).sum(-1, dtype=word_type)
    codes = ((word.unsqueeze(-1) >> _shifts(bits, per, word_type, packed.device)) & ((1 << bits) - 1)).flatten(-2)
    return codes[..., : n if n is not None else 8 * size // bits]


def scale_of(kind: str, peak: torch.Tensor, top: float) -> tuple[torch.Tensor, torch.Tensor]:
    """hskstore.codecs.lut.scale_of on tensors: group maxima -> (stored scale, float32 divisor)."""
    if kind == "fp16":
        scale16 = (peak / const(top, peak)).to(torch.float16)
        scale = scale16.float()
        return scale16, torch.where(scale > 0, scale, const(1.0, scale))
    frac, exp = torch.frexp(peak)
    if kind == "e8m0":
        e = exp.to(torch.int64) - 1 - (math.frexp(top)[1] - 1)
        e = torch.where(peak > 0, e.clamp(-lut.E8M0_BIAS, lut.E8M0_BIAS), -lut.E8M0_BIAS)
        return (e + lut.E8M0_BIAS).to(torch.uint8), _power_of_two(e)
    roots = cached(("log roots",), peak.device, lambda: torch.from_numpy(lut.ROOTS))
    j = torch.searchsorted(roots, (2 * frac).contiguous(), side="left")
    k = (lut.LOG_STEPS * (exp.to(torch.int64) - 1) + j).clamp(-lut.LOG_BIAS, lut.LOG_BIAS - 1)
    b = torch.where(peak > 0, k + lut.LOG_BIAS, 0).to(torch.uint8)
    return b, scale_value("log8", b)


def scale_value(kind: str, stored: torch.Tensor) -> torch.Tensor:
    """hskstore.codecs.lut.scale_value on tensors: stored scales -> float32, exactly."""
    if kind == "fp16":
        return stored.float()
    if kind == "e8m0":
        return _power_of_two(stored.to(torch.int64) - lut.E8M0_BIAS)
    k = stored.to(torch.int64) - lut.LOG_BIAS
    roots = cached(("log roots",), stored.device, lambda: torch.from_numpy(lut.ROOTS))
    return roots.index_select(0, (k % lut.LOG_STEPS).flatten()).view(k.shape) * _power_of_two(
        torch.div(k, lut.LOG_STEPS, rounding_mode="floor"))


class LutTwin(TorchCodec):
    """The twin of a codec described as data (hskstore.codecs.lut.Lut): built from its description, so such
    a codec needs no torch code of its own. `get` makes one for any registered codec that has a `lut`."""

    def __init__(self, name: str, table: lut.Lut) -> None:
        self.name, self.lut = name, table

    def _table(self, what: str, device: torch.device, array) -> torch.Tensor:
        return cached(("lut", self.name, what), device, lambda: torch.from_numpy(np.ascontiguousarray(array)))

    def quantize(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        table = self.lut
        groups = grouped(values, table.scale.group)
        stored, divisor = scale_of(table.scale.kind, groups.abs().amax(dim=-1), float(table.top))
        idx = self._nearest((groups / divisor.unsqueeze(-1)).contiguous())
        codes = self._table("levels", idx.device, np.asarray(table.levels, dtype=np.int64))[idx]
        return pack_codes(codes.flatten(-2)[..., : values.shape[-1]], table.bits), stored

    def _nearest(self, x: torch.Tensor) -> torch.Tensor:
        """hskstore.codecs.lut.nearest_level on tensors."""
        table = self.lut
        if table.rint_from is not None:  # consecutive integer levels: torch.round is np.rint (ties to even)
            low = table.rint_from
            return (torch.round(x).clamp(low, low + len(table.levels) - 1) - low).to(torch.int64)
        idx = torch.searchsorted(self._table("mids", x.device, table.mids), x, side="left")
        # a value exactly on a midpoint whose tie goes up moves up one level: the midpoints that do, NaN
        # (never equal) at the others and past the last, so one lookup decides
        ties = self._table("ties", x.device, np.append(np.where(table.ties_up, table.mids, np.nan), np.nan))
        return idx + (x == ties[idx])

    def decode(self, values: torch.Tensor, scale: torch.Tensor, n_width: int | None = None) -> torch.Tensor:
        table = self.lut
        codes = unpack_codes(values, table.bits, n_width)
        grid = self._table("values", values.device, table.values)
        level = grid.index_select(0, codes.flatten()).view(codes.shape)
        return level * per_value(scale_value(table.scale.kind, scale), codes.shape[-1], table.scale.group)


_TWINS: dict[str, TorchCodec] = {}


def register(twin: TorchCodec) -> None:
    """The twin of a codec that its `lut` cannot describe (or a faster one): used instead of the generic one."""
    _TWINS[twin.name] = twin


def get(name: str, *, chained: bool = False) -> TorchCodec:
    """The twin of the codec registered as `name` (UnknownCodecError for an unknown name): a registered
    twin, else the generic one built from the codec's `lut`. `chained`: a step of a `via` chain, which a
    package declaring the same name does not block (hskstore.codecs.chained)."""
    codec = (codecs.chained if chained else codecs.get)(name)  # an unknown name fails here, in the registry's words
    if name not in _TWINS:
        table = getattr(codec, "lut", None)
        if table is None:
            raise NotImplementedError(f"value codec {name!r} has neither a `lut` nor a torch twin: give it one "
                                      f"(docs/guide/adding-a-codec.md)")
        _TWINS[name] = LutTwin(name, table)
    return _TWINS[name]


for _twin in (Float16(), Int8(), Int8u()):
    register(_twin)
