"""The numeric precision of a training step: fp32, or mixed precision (bf16, fp16 with loss scaling).

`--precision auto` (the default) is bf16 on a CUDA GPU that supports it and fp32 everywhere else, so a
CPU run computes exactly what it computed before mixed precision existed. bf16 and fp16 run the
student's forward and the loss terms under `torch.autocast` (the weights, the optimiser state and the
loss sums stay float32: the terms cast to float32 themselves); fp16 scales the loss against
underflow (`torch.amp.GradScaler`), whose state a checkpoint keeps. The resolved precision is part of
a run's identity (a checkpoint trained in bf16 is not resumed in fp32) and of its summary.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from hskstore.config import ConfigError
from pipelines.train.options import PRECISIONS

# name -> the autocast dtype (None: no autocast)
DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
CHOICES = PRECISIONS


def resolve(name: str | None, device: str) -> str:
    """`auto` (or None) -> bf16 on a CUDA GPU that supports it, else fp32; a named precision as it is,
    refused in one line where this device cannot run it."""
    kind = torch.device(device).type
    name = (name or "auto").lower()
    if name not in CHOICES:
        raise ConfigError(f"--precision {name}: choose one of {', '.join(CHOICES)}")
    if name == "auto":
        return "bf16" if kind == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    if name != "fp32" and kind not in ("cuda", "cpu"):
        raise ConfigError(f"--precision {name} runs on a CUDA GPU or the CPU, not on {kind}: use --precision fp32")
    if name == "bf16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("--precision bf16: this GPU does not support bfloat16; use --precision fp16 (with loss "
                          "scaling) or fp32")
    return name


@dataclass
class Precision:
    """How a step runs: `autocast()` around the forward and the losses, `backward`, `unscale` before
    gradient clipping and `step` (the scaler's under fp16)."""

    name: str = "fp32"
    device_type: str = "cpu"
    scaler: Any = field(default=None, repr=False)

    @classmethod
    def make(cls, name: str, device: str) -> Precision:
        kind = torch.device(device).type
        scaler = torch.amp.GradScaler(kind) if name == "fp16" else None
        return cls(name, kind, scaler)

    def autocast(self) -> contextlib.AbstractContextManager:
        dtype = DTYPES[self.name]
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
