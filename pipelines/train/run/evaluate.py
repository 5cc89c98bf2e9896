"""Evaluate any sequence classifier (a saved student, a teacher, a hub model) on a task's dev split(s).

Metrics follow docs/METHOD.md section 10 (pipelines.core.metrics); MNLI reports matched and mismatched.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from pipelines.core.batching import batch_inputs
from pipelines.core.data import Examples, load_examples
from pipelines.core.metrics import compute_metrics
from pipelines.core.tasks import Task, get_task
from pipelines.core.tokenize import encode


def dev_splits(task: Task, split: str) -> list[str]:
    """'dev' means every dev split of the task (MNLI: dev_matched and dev_mismatched)."""
    if split in ("dev", "validation"):
        return list(task.dev_splits)
    return [split]


@torch.inference_mode()
def predict(
    model: nn.Module,
    enc: dict[str, np.ndarray],
    *,
    batch_size: int = 64,
    device: str = "cpu",
    progress: str | None = None,
) -> np.ndarray:
    """Logits [N, C] of a classifier on tokenized rows (input_ids, token_type_ids, length), source order.
    `progress`: the description of a progress bar, shown on a terminal only (None: no bar)."""
    from tqdm.auto import tqdm

    lengths = enc["length"]
    order = np.argsort(-lengths, kind="stable")  # longest first: little padding per batch
    out = None
    was_training = model.training
    model.eval()
    use_types = (getattr(model.config, "type_vocab_size", 0) or 0) > 1  # one type (RoBERTa): no segments
    try:
        starts = range(0, len(order), batch_size)
        for start in tqdm(starts, desc=progress, unit="batch", leave=False, disable=None if progress else True):
            idx = order[start : start + batch_size]
            kwargs = batch_inputs(enc, idx, device)
            if not use_types:
                del kwargs["token_type_ids"]
            logits = model(**kwargs).logits.float().cpu().numpy()
            if out is None:
                out = np.zeros((len(order), logits.shape[1]), dtype=np.float32)
            out[idx] = logits
    finally:
        model.train(was_training)
    return out if out is not None else np.zeros((0, 1), dtype=np.float32)


def evaluate_examples(
    model: nn.Module,
    tokenizer,
    task: Task | str,
    examples: Examples,
    *,
    max_length: int | None = None,
    batch_size: int = 64,
    device: str = "cpu",
    progress: str | None = None,
) -> dict[str, float]:
    """Metrics of `model` on in-memory examples (plus n, the number of rows); `progress` as in `predict`."""
    task = get_task(task)
    enc = encode(tokenizer, examples.texts, max_length or task.max_length)
    logits = predict(model, enc, batch_size=batch_size, device=device, progress=progress)
    metrics = compute_metrics(task, logits, examples.labels)
    return {**metrics, "n": len(examples)}


def evaluate_model(
    model_path_or_model: str | nn.Module,
    task: Task | str,
    *,
    split: str = "dev",
    data_dir: str | None = None,
    batch_size: int = 64,
    max_length: int | None = None,
    device: str = "cpu",
    limit: int | None = None,
    tokenizer=None,
    allow_task_mismatch: bool = False,
    progress: bool = False,
) -> dict:
    """Evaluate a saved model (folder or hub id, loaded with plain transformers) or a model object.

    Returns {"task", "metric" (primary), "score" (primary metric of the first split),
    "splits": {split: {metric: value, ..., "n": rows}}}. split="dev" covers every dev split of the
    task (MNLI: matched and mismatched). A model object needs `tokenizer` (or a loadable name_or_path).
    A model whose label names or task say it was made for another task is refused (as `hsk dump`
    refuses such a teacher) unless `allow_task_mismatch`; "task_fit" in the result says which.
    """
    import pipelines.train.students.sps  # noqa: F401  (registers hsk's SPS students with the transformers Auto classes)
    from hskstore.errors import printable
    from pipelines.core.models import load_classifier, load_tokenizer, teacher_identity
    from pipelines.core.tasks import check_task_fit

    task = get_task(task)
    if isinstance(model_path_or_model, nn.Module):
        model = model_path_or_model.to(device)
        if tokenizer is None:
            tokenizer = load_tokenizer(model.config.name_or_path)
    else:
        model = load_classifier(str(model_path_or_model), device=device, require_head=True)
        tokenizer = tokenizer or load_tokenizer(str(model_path_or_model))
    name = str(model_path_or_model) if isinstance(model_path_or_model, str) else model.config.name_or_path
    identity = teacher_identity(name, model.config) if name else {
        "num_labels": model.config.num_labels, "labels": None, "task": None,
    }
    fit = check_task_fit(task, identity, f"model {printable(name)}", allow_mismatch=allow_task_mismatch)
    results = {}
    for s in dev_splits(task, split):
        examples = load_examples(task, s, data_dir=data_dir, limit=limit)
        results[s] = evaluate_examples(
            model, tokenizer, task, examples, max_length=max_length, batch_size=batch_size, device=device,
            progress=f"eval {task.name}/{s}" if progress else None,
        )
    first = next(iter(results.values()))
    return {"task": task.name, "metric": task.metric, "score": first[task.metric], "task_fit": fit, "splits": results}
