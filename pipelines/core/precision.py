"""The arithmetic a teacher's forward runs in (`hsk dump --precision`): fp32, tf32, fp16 or bf16.

A store records the precision its teacher ran in (hskstore.meta.TeacherRef.precision; absent in a
store means fp32), because what the store keeps depends on it. `auto` resolves before anything is
recorded: fp32 on a CPU (or MPS); on a CUDA GPU fp16 where its tensor cores take it (compute
capability >= 7.0), else fp32. The basis (issue 35, one H200): fp16 runs a BERT-base forward 3.0x
and a MiniLM one 1.8x faster than fp32, and moves the last layer's fp16-rounded hidden states by
6.7e-4 (base) / 2.4e-4 (MiniLM) relative, a few times what storing them in fp16 already costs
(1.8e-4) and far below what int8/4-bit values cost; bf16 moves them 8x more for no more speed. What
that does to a student's accuracy has yet to be measured on a GPU (docs/guide/gpu-dump.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from hskstore.config import PRECISION, ConfigError

FP32 = "fp32"
AUTO = "auto"
_AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_precision(requested: str | None, device: str) -> str:
    """The precision `requested` means on `device` (auto resolved), or one line saying why it cannot run there."""
    requested = requested or AUTO
    if requested not in PRECISION.values:
        raise ConfigError(f"--precision {requested!r}: pass one of {', '.join(PRECISION.values)}")
    kind = torch.device(device).type
    if requested == AUTO:
        return "fp16" if kind == "cuda" and _capability(device) >= (7, 0) else FP32
    if requested == "tf32" and (kind != "cuda" or _capability(device) < (8, 0)):
        raise ConfigError("--precision tf32 is a tensor-core mode of NVIDIA GPUs from Ampere (8.0) on: "
                          f"on {device} use fp32, fp16 or bf16")
    if requested == "bf16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"--precision bf16: {device} has no bfloat16 support; use fp16 or fp32")
    if requested in _AUTOCAST and kind not in ("cpu", "cuda"):
        raise ConfigError(f"--precision {requested} runs on cpu or cuda; on {device} use fp32")
    return requested


def _capability(device: str) -> tuple[int, int]:
    return torch.cuda.get_device_capability(torch.device(device)) if torch.cuda.is_available() else (0, 0)


@contextlib.contextmanager
def forward_precision(precision: str, device: str) -> Iterator[None]:
    """Run the enclosed teacher forward in `precision` (a resolved one: never auto).

    fp16/bf16: torch.autocast (matmuls in half precision, reductions and softmax as autocast keeps
    them). tf32 and fp32 set float32 matmul precision for the forward and restore it after, so fp32
    means fp32 whatever the process set before.
    """
    kind = torch.device(device).type
    if precision in _AUTOCAST:
        with torch.autocast(kind, dtype=_AUTOCAST[precision]):
            yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)
