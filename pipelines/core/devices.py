"""Where compute runs: the user's choice, else a GPU when there is one."""

from __future__ import annotations

import torch

from hskstore.format.config import ConfigError

COMPUTE_DEVICES = ("cpu", "cuda", "mps")


def check_device(requested: str | None) -> None:
    """Refuse, in one line, a device torch does not know or cannot use here (None = the default)."""
    if requested is None:
        return
    try:
        device = torch.device(requested)
    except (RuntimeError, ValueError):
        raise ConfigError(
            f"--device {requested!r} is not a torch device: use cpu, cuda, cuda:N or mps"
        ) from None
    problem = _unusable(requested, device)
    if problem:
        raise ConfigError(problem)


def _unusable(requested: str, device: torch.device) -> str | None:
    """Why this machine cannot compute on `device` (as the user wrote it: `requested`), or None."""
    if device.type not in COMPUTE_DEVICES:  # meta tensors hold no data; other backends are untested
        return f"--device {requested}: hsk computes on {', '.join(COMPUTE_DEVICES)} (cuda:N for one GPU)"
    if device.type == "cuda" and not torch.cuda.is_available():
        return f"--device {requested} asked for, but torch sees no CUDA GPU: use --device cpu"
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        return f"--device {requested}: torch sees {torch.cuda.device_count()} CUDA GPU(s)"
    if device.type == "mps" and not torch.backends.mps.is_available():
        return f"--device {requested} asked for, but MPS is not available here: use --device cpu"
    return None


def pick_device(requested: str | None = None) -> str:
    if requested:
        check_device(requested)
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"
