"""Fine-tune a base encoder into a task teacher and save it as a plain Hugging Face checkpoint.

The store is only as good as its teacher, and `hsk dump` needs a fine-tuned sequence classifier;
this makes one when the user has none (e.g. from the offline 'minilm' base). Standard BERT
fine-tuning, run by the one training loop as the `finetune` method (pipelines/methods/finetune.py):
AdamW, weight decay 0.01 except bias/LayerNorm, linear schedule with warmup, gradient clipping,
best dev evaluation kept. Deterministic for a seed on CPU. The loop works in a hidden sibling
`.OUT.hsk-train` (checkpoint, metrics.jsonl), so an interrupted run resumes; the teacher is then
built in a staged sibling and swapped in whole (the output rule, hskstore/io/outputs.py), and the
work folder is removed.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import time
from collections.abc import Callable
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hskstore.format.config import ConfigError
from hskstore.io.outputs import mark_output, staged_replace
from pipelines.core.data import DataError, Examples, load_examples
from pipelines.core.models import (
    load_classifier,
    load_tokenizer,
    model_revision,
    resolve_model,
    vocab_hash,
    weights_hash,
)
from pipelines.core.output_kinds import TEACHER
from pipelines.core.precision import StepPrecision
from pipelines.core.tasks import Task, get_task
from pipelines.registry import Context
from pipelines.train.data.sources import MemorySource, memory_source
from pipelines.train.options import TrainOptions
from pipelines.train.run.checkpoints import RunIdentity
from pipelines.train.run.loop import Evaluator, Keeper, Run, Student, TaskFeed
from pipelines.train.run.setup import train_in_own_folder
from pipelines.train.students.build import StudentInfo
from pipelines.train.students.heads import Heads

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SUMMARY_FILE = "hsk_teacher.json"
OUTPUT_KIND = TEACHER.name  # what `hsk teacher --out` holds (pipelines.core.output_kinds)


def _readable_by_others(folder: Path) -> None:
    # transformers 5 writes model.safetensors with mode 0600; a teacher is meant to be shared.
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)


def _software() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for dist in ("hsk", "torch", "transformers", "tokenizers", "numpy", "datasets"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    return versions


def _clean(metrics: dict[str, float]) -> dict[str, float | None]:
    # NaN is not JSON: an undefined metric is written as null.
    return {k: (None if math.isnan(v) else round(float(v), 6)) for k, v in metrics.items()}


def work_dir(out: Path) -> Path:
    """Where the loop trains (resumable): a hidden sibling of the teacher folder, removed at the end."""
    return out.parent / f".{out.name}.hsk-train"


def check_numbers(*, epochs: float, lr: float, batch_size: int, **optional: int | None) -> None:
    """Refuse out-of-range values at once, before data or models are loaded (never replace them)."""
    if not epochs > 0:
        raise ConfigError(f"--epochs must be > 0, got {epochs}")
    if not lr > 0:
        raise ConfigError(f"--lr must be > 0, got {lr}")
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {batch_size}")
    for name, value in optional.items():
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def _labelled_train(task: Task, data_dir, data_file, text_columns, label_column, limit, log) -> Examples:
    train = load_examples(task, "train", data_dir=data_dir, data_file=data_file, text_columns=text_columns,
                          label_column=label_column, limit=limit)
    labelled = train.has_label
    if not labelled.all():
        log(f"dropping {int((~labelled).sum())} training rows without a gold label")
        train = train.select(labelled)
    if len(train) == 0:
        raise DataError(f"no labelled training examples for {task.name} in {train.source}")
    return train


def _dev_sets(task: Task, data_dir, data_file, limit, log) -> dict[str, Examples]:
    dev_sets: dict[str, Examples] = {}
    for split in task.dev_splits:
        try:
            dev_sets[split] = load_examples(task, split, data_dir=data_dir, limit=limit)
        except DataError as exc:
            if data_file is None:
                raise
            log(f"WARNING: no {split} data, so no dev evaluation; the last epoch is kept.\n{exc}")
    return dev_sets


def _cpu_threads(device: str | torch.device) -> dict:
    """On CPU a training step's last bits depend on torch's thread count: the card records it (not the resume
    identity: as for `hsk train`, a run may resume under another count)."""
    return {"torch_threads": torch.get_num_threads()} if torch.device(device).type == "cpu" else {}


def _base_model(task: Task, base: str, seed: int, device, log=print):
    torch.manual_seed(seed)  # the fresh classification head is drawn from this
    model = load_classifier(base, num_labels=task.num_labels, device=device, log=log)
    base_hash = weights_hash(model.base_model)
    if task.labels is not None:
        model.config.id2label = dict(enumerate(task.labels))
        model.config.label2id = {name: i for i, name in enumerate(task.labels)}
        model.config.problem_type = "single_label_classification"
    else:
        model.config.id2label, model.config.label2id = {0: "score"}, {"score": 0}
        model.config.problem_type = "regression"
    model.config.finetuning_task = task.name
    return model, base_hash


def _history(work: Path, steps_per_epoch: int) -> list[dict]:
    """Per epoch: its last step, mean train loss and the dev metrics of its evaluation (metrics.jsonl)."""
    records = _jsonl(work / "metrics.jsonl")
    train = [r for r in records if r["type"] == "train"]
    evals = {r["step"]: r["metrics"] for r in records if r["type"] == "eval"}
    epochs = sorted({r["epoch"] for r in train})
    return [_epoch_entry(epoch, [r for r in train if r["epoch"] == epoch], evals) for epoch in epochs]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _epoch_entry(epoch: int, steps: list[dict], evals: dict) -> dict:
    """One epoch's history entry: its last step, mean train loss and that step's dev metrics."""
    last = max(r["step"] for r in steps)
    return {"epoch": epoch + 1, "step": last, "train_loss": round(float(np.mean([r["loss"] for r in steps])), 6),
            "dev": _dev_metrics(evals.get(last) or {}, clean=True)}


def _dev_metrics(by_split: dict, *, clean: bool = False) -> dict:
    """{split: {metric: value}} without the example counts ("n"), JSON-clean if asked."""
    kept = {s: {k: v for k, v in m.items() if k != "n"} for s, m in by_split.items()}
    return {s: _clean(m) for s, m in kept.items()} if clean else kept


def publish_teacher(out: Path, fill: Callable[[Path], Any], summary: dict, **marker: Any) -> None:
    """Build a teacher folder in a staged sibling (`fill` writes the model into it, then the summary
    goes in) and swap it in whole: an interrupted run leaves the old teacher, or nothing, at `out`."""
    with staged_replace(str(out)) as staged:
        mark_output(staged, OUTPUT_KIND, **marker)
        fill(Path(staged))
        (Path(staged) / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
        _readable_by_others(Path(staged))


def _save_teacher(work: Path, out: Path, summary: dict) -> None:
    """Publish the kept model (work/best) as the teacher folder, then drop the work folder."""

    def copy_best(folder: Path) -> None:
        for item in (work / "best").iterdir():
            if item.name != "hsk_student.json":
                shutil.copy2(item, folder / item.name)

    publish_teacher(out, copy_best, summary, task=summary["task"])
    shutil.rmtree(work)


def _run(work: Path, identity: RunIdentity, options: TrainOptions, precision: StepPrecision, source: MemorySource,
         stages: list, base: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, dev_sets: dict,
         max_length: int, device: str, log: Callable[[str], object]) -> Run:
    """Fine-tune through the one loop (resuming the work folder's checkpoint when it is this run's)."""
    task = source.task
    info = StudentInfo.of_model(base, model, tokenizer)
    return train_in_own_folder(
        work, identity, precision, log=log, options=options, feed=TaskFeed(source), task=task,
        student=Student(model, info, None, Heads(model)), stages=stages, pairs=[[]], device=device,
        batch_size=options.batch_size,
        evaluator=Evaluator(task, dev_sets, tokenizer, max_length, options.eval_batch_size, device),
        keeper=Keeper(work, task, source.store.url))


def _card(task: Task, base: str, base_hash: str, tokenizer: PreTrainedTokenizerBase, run: Run, work: Path,
          train: Examples, dev_sets: dict, settings: dict, log: Callable[[str], object]) -> dict:
    """hsk_teacher.json of a finished fine-tuning run (without its time fields), from the kept weights."""
    steps_per_epoch = run.stage_results["finetune"]["steps_per_epoch"]
    history = _history(work, steps_per_epoch)
    _log_history(history, log)
    best = run.keeper.best or {}
    best_dev = _dev_metrics(best.get("metrics") or {})
    best_epoch = math.ceil(best["step"] / max(steps_per_epoch, 1)) if best else len(history)
    model = load_classifier(str(work / "best"))  # the kept weights, not the last step's
    return {
        "format": "hsk-teacher/1",
        "task": task.name,
        "labels": list(task.labels) if task.labels is not None else None,
        "metric": task.metric,
        "base": base,
        "base_resolved": resolve_model(base),
        "base_revision": model_revision(base),
        "base_weights_hash": base_hash,
        "weights_hash": weights_hash(model),
        "vocab_hash": vocab_hash(tokenizer),
        "dev_metrics": {split: _clean(m) for split, m in best_dev.items()},
        "best_epoch": best_epoch,
        "history": history,
        "epochs": settings["epochs"],
        "steps": run.position.global_step,
        **{k: settings[k] for k in _CARD_SETTINGS if k in settings},
        "train_examples": len(train),
        "train_source": train.source,
        "train_fingerprint": train.fingerprint,
        "dev_data": {s: _data_record(ex) for s, ex in dev_sets.items()},
        "software": _software(),
    }


_CARD_SETTINGS = ("lr", "batch_size", "warmup_ratio", "weight_decay", "max_grad_norm", "seed", "device", "max_length",
                  "torch_threads", "precision")


def _log_history(history: list[dict], log: Callable[[str], object]) -> None:
    for h in history:
        shown = "".join(f"; {s}: " + ", ".join(f"{k} {v}" for k, v in m.items()) for s, m in h["dev"].items())
        log(f"epoch {h['epoch']}: train loss {h['train_loss']}{shown}")


def _data_record(examples: Examples) -> dict:
    return {"source": examples.source, "examples": len(examples), "fingerprint": examples.fingerprint}


def fine_tune_teacher(
    task: Task | str,
    base: str,
    out_dir: str | Path,
    *,
    data_dir: str | Path | None = None,
    data_file: str | Path | None = None,
    text_columns: str | list[str] | None = None,
    label_column: str | None = None,
    epochs: float = 3.0,
    lr: float = 5e-5,
    batch_size: int = 32,
    max_length: int | None = None,
    train_limit: int | None = None,
    eval_limit: int | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
    warmup_ratio: float = 0.1,
    weight_decay: float = 0.01,
    max_grad_norm: float = 1.0,
    precision: str = "auto",
    progress: bool = True,
    overwrite: bool = False,
    log: Callable[[str], object] = print,
) -> dict:
    """Fine-tune `base` on the task's train split, keep the best dev evaluation, save it to `out_dir`.

    `data_file` (columns named by `text_columns` / `label_column`, default the task's) replaces the
    train split (rows without a gold label are dropped); dev data still comes from `data_dir` /
    $HSK_DATA_DIR / the hub, and if none is found with a `data_file`, the last model is kept. Saves
    `save_pretrained` model + tokenizer and hsk_teacher.json; returns that summary (its
    "dev_metrics" are those of the saved model).

    `precision`: auto (bf16 on a GPU that has it, else fp32), fp32, bf16 or fp16 (pipelines.core.precision).

    `out_dir` follows the output rule (hskstore.io.outputs): it must be new (or an empty folder), or a
    teacher folder with `overwrite`; the checkpoint is built in a hidden sibling and moved in whole,
    so an interrupted run leaves the old teacher (or nothing) at `out_dir`.
    """
    from pipelines.methods import get_method

    task = get_task(task)
    check_numbers(epochs=epochs, lr=lr, batch_size=batch_size, max_length=max_length,
                   limit=train_limit, eval_limit=eval_limit)  # named as the CLI names them
    step_precision = StepPrecision.resolve(precision, str(device))  # refused here, before anything is written
    TEACHER.claim(str(out_dir), overwrite=overwrite)
    method = get_method("finetune")
    method_options = method.make_options({"epochs": epochs, "lr": lr, "warmup_ratio": warmup_ratio})
    options = TrainOptions(method="finetune", batch_size=batch_size, weight_decay=weight_decay,
                           max_grad_norm=max_grad_norm or None, seed=seed, workers=0, progress=progress,
                           log_every=1, eval_batch_size=batch_size * 2, precision=precision)
    max_length = max_length or task.max_length
    out = Path(out_dir)
    started = time.perf_counter()
    train = _labelled_train(task, data_dir, data_file, text_columns, label_column, train_limit, log)
    dev_sets = _dev_sets(task, data_dir, data_file, eval_limit, log)
    tokenizer = load_tokenizer(base)
    model, base_hash = _base_model(task, base, seed, device, log)
    log(f"{task.name}: {len(train)} train examples from {train.source}; max_length {max_length}")
    source = memory_source(task, train, base, model, tokenizer, max_length)
    stages = method.stages(method_options, Context(task, source.selection, source.metadata))
    work = work_dir(out)
    work.mkdir(parents=True, exist_ok=True)
    identity = RunIdentity(method.name, method.option_dict(method_options), base, train.fingerprint, "memory",
                           batch_size, {"task": task.name, "seed": seed, "max_length": max_length})
    run = _run(work, identity, options, step_precision, source, stages, base, model, tokenizer, dev_sets, max_length,
               str(device), log)
    settings = {"epochs": epochs, "lr": lr, "batch_size": batch_size, "warmup_ratio": warmup_ratio,
                "weight_decay": weight_decay, "max_grad_norm": max_grad_norm, "seed": seed, "device": str(device),
                "max_length": max_length, "precision": run.precision.name, **_cpu_threads(device)}
    summary = _card(task, base, base_hash, tokenizer, run, work, train, dev_sets, settings, log)
    summary["train_seconds"] = round(time.perf_counter() - started, 2)
    summary["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    _save_teacher(work, out, summary)
    log(f"teacher saved to {out} (best epoch {summary['best_epoch']}: {summary['dev_metrics'] or 'no dev data'})")
    return summary
