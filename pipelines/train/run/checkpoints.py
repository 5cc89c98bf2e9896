"""A run's checkpoint (out/checkpoint/state.pt, one layout: CHECKPOINT_VERSION): what it holds, whose run it is
(its identity, the precision included), and how a rerun continues from it or refuses another run's in one line."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from hskstore.format.config import ConfigError
from pipelines.core.precision import StepPrecision
from pipelines.core.run_state import atomic_save, rng_state
from pipelines.train.options import cli_flag


class Saved(Protocol):
    """A part of a run that a checkpoint saves (pipelines.train.run.loop's Position, Student and Keeper)."""

    def state(self) -> dict: ...

# 3: one layout for every training (distillation, LightPAFF pre-training, `hsk teacher`, the MLM teacher):
# "position" (stage index and step inside it) and "progress" (steps, examples and seconds so far) apart
CHECKPOINT_VERSION = 3


@dataclass
class Checkpoints:
    """out/checkpoint/state.pt: everything a rerun needs to continue; refused when it is another run's.
    The run's precision is part of its identity (a checkpoint without one was trained in fp32)."""

    path: Path
    identity: dict
    precision: StepPrecision = field(default_factory=StepPrecision)

    @property
    def full_identity(self) -> dict:
        return {**self.identity, "precision": self.precision.name}

    def save(self, parts: tuple[Saved, ...], stage_results: dict, optimizer=None, scheduler=None,
             stream=None) -> None:
        """The run's state: `parts` (its position, student and keeper, each `state()`), the stage results and the
        optimizer, scheduler and data stream of the stage under way (None between stages)."""
        state = {
            "version": CHECKPOINT_VERSION,
            "identity": self.full_identity,
            "scaler": self.precision.state_dict(),
            **{key: value for part in parts for key, value in part.state().items()},
            "stage_results": stage_results,
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "stream": stream.state_dict() if stream is not None else None,
            "rng": rng_state(),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_save(state, self.path)

    def load(self) -> dict | None:
        if not self.path.exists():
            return None
        state = torch.load(self.path, map_location="cpu", weights_only=False)
        if state.get("version") != CHECKPOINT_VERSION:
            return {"foreign": True, "older": state.get("version", 1)}
        found = {"precision": "fp32", **(state.get("identity") or {})}
        if found != self.full_identity:
            same_but_precision = {**found, "precision": self.precision.name} == self.full_identity
            return {"foreign": True, "precision": found["precision"] if same_but_precision else None,
                    "differ": identity_differences(found, self.full_identity)}
        return state

    def resume(self, resume: bool, out: Path, log: Callable[[str], object], finished: bool = False) -> dict | None:
        """The state to continue from (None: start); another run's checkpoint is refused in one line
        (an unfinished one can be restarted with --no-resume, a finished one replaced with --overwrite)."""
        if not resume:
            if self.path.exists() and not finished:
                log(f"--no-resume: starting over in {out} (the old checkpoint will be replaced)")
            return None
        state = self.load()
        if state is not None and state.get("older") is not None:
            if finished:  # a finished run is judged by its summary (distill: the same run, or refused)
                return None
            raise ConfigError(
                f"{out} holds a checkpoint of an older hsk (checkpoint version {state['older']}; this hsk "
                f"resumes version {CHECKPOINT_VERSION}): finish it with the hsk that wrote it, or pass --no-resume "
                "to start over"
            )
        if state is not None and state.get("precision"):
            fix = "--overwrite to replace that finished run" if finished else "--no-resume to start over"
            raise ConfigError(
                f"{out} holds a checkpoint trained in {state['precision']} and this run asks for "
                f"{self.precision.name}: pass --precision {state['precision']} to resume it, or {fix}")
        if state is not None and state.get("foreign"):
            fix = "--overwrite to replace that finished run" if finished else "--no-resume to start over"
            raise ConfigError(f"{out} holds a checkpoint of another run ({state['differ']}): use another --out, or "
                              f"{fix}")
        return state


# Identity keys as the user knows them (the rest are option names: --max-steps for max_steps)
_IDENTITY_NAMES = {"source": "store", "inputs": "store inputs", "selection": "store selection", "mode": "mode",
                   "student": "--student", "method": "--method"}


def identity_differences(found: dict, wanted: dict, depth: int = 0) -> str:
    """What differs between a checkpoint's identity and this run's, as `--max-steps 3 there, 5 here`."""
    shown = []
    for key in sorted(set(found) | set(wanted), key=str):
        there, here = found.get(key), wanted.get(key)
        if there == here:
            continue
        if depth == 0 and isinstance(there, dict) and isinstance(here, dict) and key.endswith("options"):
            shown.append(identity_differences(there, here, depth + 1))  # a method's or the run's option
            continue
        name = _IDENTITY_NAMES.get(key) or cli_flag(str(key))
        shown.append(f"{name} {_short(there)} there, {_short(here)} here")
    return "; ".join(shown) or "its identity differs"


def _short(value) -> str:
    text = json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def work_state(checkpoints: Checkpoints, log: Callable[[str], object]) -> dict | None:
    """The checkpoint of a work folder (`hsk teacher`'s hidden sibling): resumed when it is this run's;
    another run's (or an older hsk's) is started over, as the folder is the command's own."""
    state = checkpoints.load()
    if state is not None and state.get("foreign"):
        log(f"{checkpoints.path} is another run's checkpoint: starting over")
        return None
    return state
