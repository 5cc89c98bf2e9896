"""Numeric precision, in one home: a teacher's forward (`hsk dump --precision`) and a training step
(`hsk train`/`hsk teacher --precision`).

**The forward** runs in fp32, tf32, fp16 or bf16. A store records the precision its teacher ran in
(hskstore.format.meta.TeacherRef.precision; absent in a store means fp32), because what the store keeps depends
on it. `auto` resolves before anything is recorded: fp32 on a CPU (or MPS); on a CUDA GPU fp16 where its
tensor cores take it (compute capability >= 7.0), else fp32. The basis (docs/guide/gpu-dump.md has the
numbers): fp16 runs a BERT forward several times faster than fp32 and moves the last layer's fp16-rounded
hidden states by a few times what storing them in fp16 already costs, far below what int8/4-bit values
cost; bf16 moves them much more for no more speed.
What that does to a student's accuracy has yet to be measured on a GPU; on a CPU under autocast (SST-2,
3 seeds) an fp16 teacher's store trained students of the same accuracy (docs/guide/gpu-dump.md).

**A training step** runs in fp32, or mixed precision: bf16, or fp16 with loss scaling. `auto` (the
default) is bf16 on a CUDA GPU that supports it and fp32 everywhere else, so a CPU run computes exactly
what it computed before mixed precision existed. bf16 and fp16 run the student's forward and the loss
terms under `torch.autocast` (the weights, the optimiser state and the loss sums stay float32: the terms
cast to float32 themselves); fp16 scales the loss against underflow (`torch.amp.GradScaler`), whose
state a checkpoint keeps. The resolved precision is part of a run's identity (a checkpoint trained in
bf16 is not resumed in fp32) and of its summary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from hskstore.format.config import PRECISION, ConfigError

FP32 = "fp32"
AUTO = "auto"
_AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_forward(requested: str | None, device: str) -> str:
    """The precision `requested` means on `device` (auto resolved), or one line saying why it cannot run there."""
    requested = requested or AUTO
    if requested not in PRECISION.values:
        raise ConfigError(f"--precision {requested!r}: pass one of {', '.join(PRECISION.values)}")
    kind = torch.device(device).type
    if requested == AUTO:
        return "fp16" if kind == "cuda" and _capability(device) >= (7, 0) else FP32
    problem = _forward_problem(requested, device, kind)
    if problem:
        raise ConfigError(problem)
    return requested


def _forward_problem(requested: str, device: str, kind: str) -> str | None:
    """Why the named forward precision cannot run on `device` (of type `kind`), or None."""
    if requested == "tf32" and (kind != "cuda" or _capability(device) < (8, 0)):
        return ("--precision tf32 is a tensor-core mode of NVIDIA GPUs from Ampere (8.0) on: "
                f"on {device} use fp32, fp16 or bf16")
    if requested == "bf16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        return f"--precision bf16: {device} has no bfloat16 support; use fp16 or fp32"
    if requested in _AUTOCAST and kind not in ("cpu", "cuda"):
        return f"--precision {requested} runs on cpu or cuda; on {device} use fp32"
    return None


def cpu_half_warning(requested: str | None, device: str) -> str | None:
    """One WARNING line where `requested` runs, but slowly: fp16 on a CPU is emulated under autocast (7-10x
    slower than fp32 there, measured on BERT-sized models); None elsewhere. Not refused: it is how fp16's
    numerics are tested without a GPU."""
    if (requested or AUTO).lower() != "fp16" or torch.device(device).type != "cpu":
        return None
    return (f"WARNING: --precision fp16 on {device} runs several times slower than fp32 (a CPU has no fast "
            "float16 arithmetic); pass --precision fp32 (or auto), or a GPU with --device cuda")


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


# --- a training step ------------------------------------------------------------------------------------------
# name -> the autocast dtype (None: no autocast)
STEP_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, **_AUTOCAST}
STEP_PRECISIONS = (AUTO, *STEP_DTYPES)  # what `--precision` of a training step takes


def resolve_step(name: str | None, device: str) -> str:
    """`auto` (or None) -> bf16 on a CUDA GPU that supports it, else fp32; a named precision as it is,
    refused in one line where this device cannot run it."""
    kind = torch.device(device).type
    name = (name or "auto").lower()
    if name not in STEP_PRECISIONS:
        raise ConfigError(f"--precision {name}: choose one of {', '.join(STEP_PRECISIONS)}")
    if name == "auto":
        return "bf16" if kind == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    problem = _step_problem(name, kind)
    if problem:
        raise ConfigError(problem)
    return name


def _step_problem(name: str, kind: str) -> str | None:
    """Why the named step precision cannot run on a device of type `kind`, or None."""
    if name != "fp32" and kind not in ("cuda", "cpu"):
        return f"--precision {name} runs on a CUDA GPU or the CPU, not on {kind}: use --precision fp32"
    if name == "bf16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        return ("--precision bf16: this GPU does not support bfloat16; use --precision fp16 (with loss "
                "scaling) or fp32")
    return None


@dataclass
class StepPrecision:
    """How a step runs: `autocast()` around the forward and the losses, `backward`, `unscale` before
    gradient clipping and `step` (the scaler's under fp16)."""

    name: str = "fp32"
    device_type: str = "cpu"
    scaler: Any = field(default=None, repr=False)

    @classmethod
    def resolve(cls, requested: str | None, device: str) -> StepPrecision:
        """The step precision `requested` means on `device` (resolve_step), once for the whole run."""
        return cls.make(resolve_step(requested, device), device)

    @classmethod
    def make(cls, name: str, device: str) -> StepPrecision:
        kind = torch.device(device).type
        scaler = torch.amp.GradScaler(kind) if name == "fp16" else None
        return cls(name, kind, scaler)

    def autocast(self) -> contextlib.AbstractContextManager:
        dtype = STEP_DTYPES[self.name]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """The true gradients before clipping them (fp16: divided by the loss scale)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimiser's step; fp16: skipped where the scaled gradients overflowed, the scale adapted."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> dict | None:
        return None if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
