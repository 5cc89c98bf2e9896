"""A run's checkpoint (out/checkpoint/state.pt, one layout: CHECKPOINT_VERSION): what it holds, whose run it is
(its `RunIdentity`, the precision included), and how a rerun continues from it or refuses another run's in one
line."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
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

# 4: one layout for every training (distillation, LightPAFF pre-training, `hsk teacher`, the MLM teacher):
# "position" (stage index and step inside it) and "progress" (steps, examples and seconds so far) apart, and one
# identity (RunIdentity) for every kind of run
CHECKPOINT_VERSION = 4


def _plain(value: object) -> object:
    """`value` as JSON gives it back (tuples as lists, paths as strings): how an identity compares."""
    return json.loads(json.dumps(value, default=str))


@dataclass(frozen=True)
class RunIdentity:
    """What a checkpoint must share with the run that resumes it, written into the checkpoint and read back by this
    class alone (every kind of run: `hsk train` on any store, `hsk teacher`, the masked-LM and causal-LM teachers).

    Not the number of ranks: the data order is one global order that every rank count slices
    (stream.global_plan). Not the store's path either: the order follows the store's content address, so a store
    copied elsewhere (or to S3) resumes. Not the torch threads (recorded in the summary: a run may resume under
    another count)."""

    method: str  # the method (`hsk methods`), or what a command's own run trains ("mlm-teacher", "clm-teacher")
    method_options: Mapping[str, object]  # the method's resolved options (or the command's own settings)
    student: str  # the student as named, or the base model a teacher is fine-tuned from
    source: str  # the store's content address (else its URL), or the fingerprint of the rows a command read
    mode: str = "offline"  # offline | online (a live teacher) | memory (a command's rows in memory)
    batch_size: int | None = None  # the global batch, resolved
    options: Mapping[str, object] = field(default_factory=dict)  # what else changes the result: seed, --max-steps...
    inputs: object = None  # a task store's inputs and selection (its metadata), or None
    selection: object = None
    precision: str = "fp32"  # the step's, resolved (pipelines.core.precision); a run of before it ran in fp32

    def to_json(self) -> dict[str, object]:
        """The identity as a checkpoint holds it (JSON types: what `read` gives back compares equal)."""
        return _plain(dataclasses.asdict(self))

    @classmethod
    def read(cls, data: Mapping[str, object] | None) -> RunIdentity | None:
        """The identity a checkpoint holds (None: it holds none this class can read)."""
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, Mapping) or not set(data) <= names or not {"method", "student", "source"} <= set(data):
            return None
        return cls(**data)

    def differences(self, found: RunIdentity | None) -> str:
        """What differs between a checkpoint's identity (`found`) and this run's, as `--max-steps 3 there, 5 here`."""
        return identity_differences(found.to_json() if found else {}, self.to_json())


@dataclass
class Checkpoints:
    """out/checkpoint/state.pt: everything a rerun needs to continue; refused when it is another run's.
    The run's precision is part of its identity."""

    path: Path
    identity: RunIdentity
    precision: StepPrecision = field(default_factory=StepPrecision)

    @property
    def full_identity(self) -> RunIdentity:
        """The run's identity with the precision it resolved at its start."""
        return dataclasses.replace(self.identity, precision=self.precision.name)

    def save(self, parts: tuple[Saved, ...], stage_results: dict, optimizer=None, scheduler=None,
             stream=None) -> None:
        """The run's state: `parts` (its position, student and keeper, each `state()`), the stage results and the
        optimizer, scheduler and data stream of the stage under way (None between stages)."""
        state = {
            "version": CHECKPOINT_VERSION,
            "identity": self.full_identity.to_json(),
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
        found, wanted = RunIdentity.read(state.get("identity")), self.full_identity
        if found is None or found.to_json() != wanted.to_json():
            same_but_precision = found is not None and (
                dataclasses.replace(found, precision=wanted.precision).to_json() == wanted.to_json())
            return {"foreign": True, "precision": found.precision if same_but_precision else None,
                    "differ": wanted.differences(found)}
        return state

    def resume(self, resume: bool, out: Path, log: Callable[[str], object], finished: bool = False) -> dict | None:
        """The state to continue from (None: start); another run's checkpoint is refused in one line
        (an unfinished one can be restarted with --no-resume, a finished one replaced with --overwrite)."""
        if not resume:
            if self.path.exists() and not finished:
                log(f"--no-resume: starting over in {out} (the old checkpoint will be replaced)")
            return None
        state = self.load()
        if state is None or not state.get("foreign"):
            return state
        if state.get("older") is not None and finished:  # a finished run is judged by its summary (the driver)
            return None
        raise ConfigError(refusal(state, out, self.precision.name, finished))


def refusal(foreign: dict, out: Path, precision: str, finished: bool) -> str:
    """Why `out`'s checkpoint (Checkpoints.load's answer for another run's) is not resumed, and what to pass."""
    fix = "--overwrite to replace that finished run" if finished else "--no-resume to start over"
    if foreign.get("older") is not None:
        return (f"{out} holds a checkpoint of an older hsk (checkpoint version {foreign['older']}; this hsk resumes "
                f"version {CHECKPOINT_VERSION}): finish it with the hsk that wrote it, or pass --no-resume to start "
                "over")
    if foreign.get("precision"):
        return (f"{out} holds a checkpoint trained in {foreign['precision']} and this run asks for {precision}: pass "
                f"--precision {foreign['precision']} to resume it, or {fix}")
    return f"{out} holds a checkpoint of another run ({foreign['differ']}): use another --out, or {fix}"


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
