"""The device twins of hskstore's value codecs: torch encode and decode, the same bytes as numpy.

hskstore.codecs holds each codec's numpy definition (hskstore imports no torch); this module holds a
twin per codec name, for the dump's torch selection engine (encode on the teacher's device) and the
training loader (decode on the student's device). `get(name)` finds a twin by the name a store
records; tests/test_select_torch.py and tests/test_codec4.py check every registered codec's twin
against numpy byte for byte. docs/guide/adding-a-codec.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from hskstore import codecs
from hskstore.codecs import int4, mxfp4, nf3
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
        via = codecs.get(self.name).via
        if via is None:
            return self.quantize(values16.float())
        parent = get(via)
        return self.quantize(parent.decode(*parent.encode(values16), values16.shape[-1]))


def grouped(values: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """[..., n] -> [..., G, group] float32, the last group zero-padded (hskstore.codecs.layout.grouped)."""
    n = values.shape[-1]
    padded = torch.nn.functional.pad(values.float(), (0, n_groups(n, group) * group - n))
    return padded.view(*values.shape[:-1], -1, group)


def per_value(group_scale: torch.Tensor, n: int, group: int = GROUP) -> torch.Tensor:
    return group_scale.float().repeat_interleave(group, dim=-1)[..., :n]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    nib = (codes.to(torch.int16) & 0xF).to(torch.uint8)
    nib = torch.nn.functional.pad(nib, (0, nib.shape[-1] % 2))
    return nib[..., 0::2] | (nib[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor, n: int | None = None) -> torch.Tensor:
    nib = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)
    return nib if n is None else nib[..., :n]


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


class Int4(TorchCodec):
    name = "int4"

    def quantize(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        groups = grouped(values)
        scale16 = (groups.abs().amax(dim=-1) / const(int4.INT4_MAX, groups)).to(torch.float16)
        scale = scale16.float()
        safe = torch.where(scale > 0, scale, const(1.0, scale))[..., None]
        q = torch.clamp(torch.round(groups / safe), -int4.INT4_MAX, int4.INT4_MAX).to(torch.int8)
        return pack_nibbles(q.flatten(-2)[..., : values.shape[-1]]), scale16

    def decode(self, values: torch.Tensor, scale: torch.Tensor, n_width: int | None = None) -> torch.Tensor:
        nib = unpack_nibbles(values, n_width)
        codes = ((nib.to(torch.int8) ^ 8) - 8).float()  # 4-bit two's complement
        return codes * per_value(scale, nib.shape[-1])


def _power_of_two(exp: torch.Tensor) -> torch.Tensor:
    """2^exp as float32 for integer exp in [-127, 127], from its bits (2^-127 is subnormal)."""
    bits = torch.where(exp >= -126, (exp + 127) << 23, torch.full_like(exp, 1 << 22))
    return bits.to(torch.int32).view(torch.float32)


class MXFP4(TorchCodec):
    name = "mxfp4"

    def quantize_codes(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(e2m1 codes [..., n] int8, E8M0 exponents [..., G] uint8): hskstore's quantize_mxfp4_values."""
        groups = grouped(values)
        peak = groups.abs().amax(dim=-1)
        exp = torch.frexp(peak).exponent.to(torch.int64) - 1 - mxfp4.E2M1_EMAX
        exp = torch.where(peak > 0, exp.clamp(-mxfp4.E8M0_BIAS, mxfp4.E8M0_BIAS), -mxfp4.E8M0_BIAS)
        top = const(float(mxfp4.E2M1_GRID[-1]), groups)
        mag = torch.minimum(groups.abs() / _power_of_two(exp)[..., None], top)
        mids = cached(("e2m1 mids",), groups.device, lambda: torch.from_numpy(mxfp4.E2M1_MID))
        idx = torch.searchsorted(mids, mag.contiguous(), side="left")
        nearest_mid = mids[idx.clamp(max=len(mids) - 1)]
        tie_up = (idx < len(mids)) & (idx % 2 == 1) & (mag == nearest_mid)  # ties to the even code
        idx = torch.where(tie_up, idx + 1, idx)
        codes = idx | torch.where((groups < 0) & (idx > 0), 8, 0)
        scale = (exp + mxfp4.E8M0_BIAS).to(torch.uint8)
        return codes.to(torch.int8).flatten(-2)[..., : values.shape[-1]], scale

    def quantize(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        codes, scale = self.quantize_codes(values)
        return pack_nibbles(codes), scale

    def decode(self, values: torch.Tensor, scale: torch.Tensor, n_width: int | None = None) -> torch.Tensor:
        nib = unpack_nibbles(values, n_width)
        grid = cached(("e2m1 grid",), values.device, lambda: torch.from_numpy(mxfp4.E2M1_GRID))
        mag = grid.index_select(0, (nib & 7).flatten().long()).view(nib.shape)
        per_group = torch.exp2(scale.float() - mxfp4.E8M0_BIAS)
        return torch.where(nib >= 8, -mag, mag) * per_value(per_group, nib.shape[-1])


class NF3(TorchCodec):
    """hskstore.codecs.nf3 on tensors: the scale byte from frexp and root comparisons, no logarithm."""

    name = "nf3"

    def _scale_values(self, b: torch.Tensor) -> torch.Tensor:
        k = b.to(torch.int64) - nf3.BIAS
        roots = cached(("nf3 roots",), b.device, lambda: torch.from_numpy(nf3.ROOTS))
        return roots.index_select(0, (k % nf3.STEPS).flatten()).view(k.shape) * _power_of_two(
            torch.div(k, nf3.STEPS, rounding_mode="floor"))

    def quantize(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        groups = grouped(values)
        peak = groups.abs().amax(dim=-1)
        frac, exp = torch.frexp(peak)
        roots = cached(("nf3 roots",), peak.device, lambda: torch.from_numpy(nf3.ROOTS))
        j = torch.searchsorted(roots, (2 * frac).contiguous(), side="left")
        k = (nf3.STEPS * (exp.to(torch.int64) - 1) + j).clamp(-nf3.BIAS, nf3.BIAS - 1)
        b = torch.where(peak > 0, k + nf3.BIAS, 0).to(torch.uint8)
        x = groups / self._scale_values(b)[..., None]
        mids = cached(("nf3 mids",), peak.device, lambda: torch.from_numpy(nf3.NF3_MID))
        idx = torch.searchsorted(mids, x.contiguous(), side="left")
        codes = ((idx - nf3.ZERO_INDEX) % 8).flatten(-2)[..., : values.shape[-1]]
        return self._pack3(codes), b

    @staticmethod
    def _pack3(codes: torch.Tensor) -> torch.Tensor:
        n = codes.shape[-1]
        c = torch.nn.functional.pad(codes.to(torch.int32), (0, -n % 8)).view(*codes.shape[:-1], -(-n // 8), 8)
        shifts = cached(("nf3 shifts",), codes.device, lambda: 3 * torch.arange(8, dtype=torch.int32))
        word = (c << shifts).sum(-1, dtype=torch.int32)
        out = torch.stack([word & 0xFF, (word >> 8) & 0xFF, word >> 16], dim=-1).to(torch.uint8)
        return out.flatten(-2)[..., : -(-3 * n // 8)]

    def decode(self, values: torch.Tensor, scale: torch.Tensor, n_width: int | None = None) -> torch.Tensor:
        nbytes = values.shape[-1]
        blocks = -(-nbytes // 3)  # explicit: a view of no rows cannot infer it
        b = torch.nn.functional.pad(values.to(torch.int32), (0, -nbytes % 3)).view(*values.shape[:-1], blocks, 3)
        word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
        shifts = cached(("nf3 shifts",), values.device, lambda: 3 * torch.arange(8, dtype=torch.int32))
        codes = ((word.unsqueeze(-1) >> shifts) & 7).flatten(-2)
        codes = codes[..., : n_width if n_width is not None else 8 * nbytes // 3]
        grid = cached(("nf3 grid",), values.device, lambda: torch.from_numpy(nf3.NF3_GRID))
        level = grid.index_select(0, ((codes + nf3.ZERO_INDEX) % 8).flatten().long()).view(codes.shape)
        return level * per_value(self._scale_values(scale), codes.shape[-1])


_TWINS: dict[str, TorchCodec] = {}


def register(twin: TorchCodec) -> None:
    _TWINS[twin.name] = twin


def get(name: str) -> TorchCodec:
    """The twin of the codec registered as `name` (UnknownCodecError for an unknown name)."""
    codecs.get(name)  # an unknown name fails here, in the registry's words
    if name not in _TWINS:
        raise NotImplementedError(f"value codec {name!r} has no torch twin: register one in {__name__}")
    return _TWINS[name]


for _twin in (Float16(), Int8(), Int4(), MXFP4(), NF3()):
    register(_twin)
