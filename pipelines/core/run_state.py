"""A training run's state on disk: RNG state, atomic checkpoint and JSON writes, the metrics.jsonl log."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def atomic_save(obj: object, path: Path) -> None:
    """torch.save to a sibling, then rename: a run killed while saving keeps the previous checkpoint.

    A failed save (a full disk) removes the half-written sibling; torch reports a failed write as a
    RuntimeError, raised here as OSError(ENOSPC) so the CLI prints one line.
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(obj, tmp)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, RuntimeError) and _failed_write(exc):
            raise OSError(errno.ENOSPC, f"cannot write {path}: {str(exc).splitlines()[-1]}") from exc
        raise
    os.replace(tmp, path)


def save_model_folder(model: nn.Module, tokenizer: PreTrainedTokenizerBase, tmp: Path) -> None:
    """save_pretrained of a model and its tokenizer into `tmp`; on a full disk the half-written folder is
    removed and the failure raised as OSError(ENOSPC) (safetensors reports it as its own SafetensorError)."""
    from safetensors import SafetensorError

    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    except (SafetensorError, RuntimeError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if "os error 28" in str(exc) or "No space left" in str(exc) or _failed_write(exc):
            raise OSError(errno.ENOSPC, f"cannot write {tmp}: {str(exc).splitlines()[-1]}") from exc
        raise


def _failed_write(exc: BaseException) -> bool:
    """torch's zip writer on a full disk: "PytorchStreamWriter failed writing file ...", or, when the failure
    surfaces as the archive is closed, "unexpected pos N vs M" (fewer bytes landed than were written)."""
    text = str(exc).lower()
    return "writ" in text or "unexpected pos" in text


def write_json(path: Path, obj: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=json_default))
    os.replace(tmp, path)


def json_default(obj: object) -> object:
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


class MetricsLog:
    """metrics.jsonl: one JSON record per log or eval step; a resume drops records past its checkpoint.

    A record is written once: a second record with the same (type, stage, step) as one already in the
    file (a stage's end met again by a resume, a re-entered stage) is left out, so every row of the file
    stands for one event.
    """

    def __init__(self, path: Path, keep_until_step: int | None, sinks: tuple = ()):
        self.path = path
        self.sinks = sinks  # where each new record also goes (TensorBoardLog)
        self._seen: set[tuple] = set()
        if keep_until_step is None:
            path.write_text("")
        elif path.exists():
            kept = []
            for line in path.read_text().splitlines():
                record = json.loads(line) if line.strip() else None
                if record is None or record.get("step", 0) > keep_until_step or _key(record) in self._seen:
                    continue
                self._seen.add(_key(record))
                kept.append(line)
            path.write_text("".join(f"{line}\n" for line in kept))

    def write(self, record: dict) -> None:
        key = _key(record)
        if key in self._seen:
            return
        self._seen.add(key)
        with self.path.open("a") as f:
            f.write(json.dumps(record, default=json_default) + "\n")
        for sink in self.sinks:
            sink.write(record)


class TensorBoardLog:
    """metrics.jsonl's records as TensorBoard scalars, in event files beside it (`--report-to tensorboard`):
    per stage the training loss, each loss term, the learning rate and examples/s, and each dev metric."""

    def __init__(self, folder: Path):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package (checked up front)

        self.writer = SummaryWriter(log_dir=str(folder))

    def write(self, record: dict) -> None:
        for tag, value in _scalars(record):
            self.writer.add_scalar(tag, value, record["step"])
        self.writer.flush()  # a run read live, or killed, shows every record written so far


def _scalars(record: dict) -> list[tuple[str, float]]:
    stage, kind = record.get("stage"), record.get("type")
    if kind == "train":
        values = {"loss": record.get("loss"), "lr": record.get("lr"), "examples_per_s": record.get("examples_per_s"),
                  **{f"terms/{name}": v for name, v in (record.get("terms") or {}).items()}}
        return [(f"train/{stage}/{name}", float(v)) for name, v in values.items() if v is not None]
    if kind == "eval":
        return [(f"eval/{stage}/{split}/{name}", float(v)) for split, metrics in record["metrics"].items()
                for name, v in metrics.items() if isinstance(v, (int, float))]
    return []


def report_sinks(report_to: str, folder: Path) -> tuple:
    """The sinks a run's metrics go to besides metrics.jsonl: `report_to` is TrainOptions.report_to."""
    return (TensorBoardLog(folder),) if report_to == "tensorboard" else ()


def _key(record: dict) -> tuple:
    return record.get("type"), record.get("stage"), record.get("step")
