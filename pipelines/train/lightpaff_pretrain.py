"""`hsk train --method lightpaff-pretrain`: pre-training distillation of a student from a masked-LM store.

A masked-LM store (`hsk dump --objective mlm`) holds the masked inputs and, per masked position,
the original token and the teacher's top-k ids, logits and full log-sum-exp. The student is a
BertForMaskedLM (decoder tied to the word embeddings): its encoder and MLM head are trained on the
stage's terms (pipelines.methods.lightpaff) at the masked positions only, with the same stream,
optimiser, schedule and loss-term machinery as every other method. There is no task, dev set or
classifier here, so this runs its own short loop instead of pipelines.train.loop. It keeps the
final model (OUT/best, plain transformers) and, like every run, checkpoints every
--checkpoint-every steps to OUT/checkpoint/state.pt (model, optimiser, schedule, stream position,
RNG): a rerun of the same command continues from there and computes the same steps.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn

from hskstore import open_store
from hskstore.config import ConfigError
from hskstore.meta import StoreMeta
from hskstore.outputs import claim_output, mark_output
from pipelines.core.run_state import MetricsLog, atomic_save, rng_state, set_rng_state, write_json
from pipelines.methods import Context, get_method
from pipelines.registry import Stage
from pipelines.train.loop import CHECKPOINT_VERSION, Checkpoints, param_groups, schedule_factor
from pipelines.train.losses import TermInputs, weighted_sum
from pipelines.train.options import TrainOptions
from pipelines.train.sources import Source, run_device, store_teacher
from pipelines.train.stream import StoreStream

MLM_ARRAYS = ["input_ids", "token_type_ids", "length", "mlm/positions", "mlm/labels", "mlm/topk_ids",
              "mlm/topk_logits", "mlm/lse"]


def mlm_student(student: str, teacher: str) -> tuple[nn.Module, Any, str]:
    """(BertForMaskedLM, tokenizer, how it was made): bert<k> = the MLM teacher's first k layers and its head;
    a folder = that encoder, with its MLM head when it has one, else a fresh head tied to its embeddings."""
    from transformers import BertForMaskedLM

    from pipelines.core.models import ModelLoadError, load_tokenizer, resolve_model

    match = re.fullmatch(r"bert(\d+)", student.strip().lower())
    source = teacher if match else resolve_model(student)
    kwargs = {"num_hidden_layers": _depth(int(match.group(1)), teacher)} if match else {}
    try:
        model = BertForMaskedLM.from_pretrained(source, **kwargs)
    except Exception as exc:  # transformers raises many kinds; say what to pass instead
        reason = str(exc).splitlines()[0][:200]
        raise ModelLoadError(f"cannot load {student} as a BERT masked LM ({reason}): pass bert<k> or a BERT "
                             "encoder folder") from None
    try:
        tokenizer = load_tokenizer(source)
    except ModelLoadError:
        tokenizer = load_tokenizer(teacher)
    init = f"first {kwargs['num_hidden_layers']} layers + MLM head of {teacher}" if match else f"encoder {source}"
    return model, tokenizer, init


def _depth(k: int, teacher: str) -> int:
    from pipelines.core.models import ModelLoadError, load_config

    depth = load_config(teacher).num_hidden_layers
    if not 1 <= k <= depth:
        raise ModelLoadError(f"bert{k} needs 1..{depth} layers of the store's teacher {teacher}, which has {depth}")
    return k


def _check_student(model: nn.Module, tokenizer: Any, meta: StoreMeta) -> None:
    """The KL compares vocabulary ids: the student must share the teacher's vocabulary."""
    from pipelines.core.models import vocab_hash

    want = meta.teacher.vocab_size
    if want is not None and model.config.vocab_size != want:
        raise ConfigError(f"the student's vocabulary has {model.config.vocab_size} ids but the store's teacher "
                          f"{want}: pre-training distillation needs the teacher's vocabulary (use bert<k>)")
    if vocab_hash(tokenizer) != meta.tokenizer.vocab_hash:
        raise ConfigError("the student's tokenizer is not the one the store was tokenized with: pre-training "
                          "distillation compares token ids, so use bert<k> or a student with the teacher's vocabulary")


def mlm_batch(raw: dict[str, np.ndarray], device: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Student inputs and, per used masked slot (flattened), the targets the loss terms read."""
    ids = torch.as_tensor(raw["input_ids"].astype(np.int64), device=device)
    lengths = torch.as_tensor(raw["length"].astype(np.int64), device=device)
    types = torch.as_tensor(raw["token_type_ids"].astype(np.int64), device=device)
    inputs = {"input_ids": ids, "token_type_ids": types,
              "attention_mask": (torch.arange(ids.shape[1], device=device)[None, :] < lengths[:, None]).long()}
    positions = torch.as_tensor(raw["mlm/positions"].astype(np.int64), device=device)
    used = positions >= 0
    targets = {
        "positions": positions, "used": used,
        "mlm_labels": torch.as_tensor(raw["mlm/labels"].astype(np.int64), device=device)[used],
        "topk_ids": torch.as_tensor(raw["mlm/topk_ids"].astype(np.int64), device=device)[used],
        "topk_logits": torch.as_tensor(raw["mlm/topk_logits"], device=device)[used],
        "lse": torch.as_tensor(raw["mlm/lse"], device=device)[used],
    }
    return inputs, targets


def masked_logits(model: nn.Module, inputs: dict, positions: torch.Tensor, used: torch.Tensor) -> torch.Tensor:
    """The student's vocabulary logits at the used masked positions only: [N masked, V]."""
    hidden = model.bert(**inputs).last_hidden_state
    gathered = hidden.gather(1, positions.clamp(min=0)[..., None].expand(-1, -1, hidden.shape[-1]))
    return model.cls(gathered[used])


def _plan(options: TrainOptions, store: Any) -> tuple[Any, Any, Stage]:
    method = get_method(options.method)
    method_options = method.make_options(options.method_options)
    stages = method.stages(method_options, Context(None, None, store.meta))  # type: ignore[arg-type]
    return method, method_options, stages[0]


def _save(model: nn.Module, tokenizer: Any, out: Path, card: dict) -> Path:
    target, tmp = out / "best", out / "best.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "hsk_student.json").write_text(json.dumps(card, indent=2, default=str))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def _identity(options: TrainOptions, student: str, store: Any, method: Any, method_options: Any,
              batch_size: int) -> dict:
    """What a checkpoint must share with the run that resumes it."""
    return {"student": student, "source": str(store.url), "address": store.content_address,
            "method": method.name, "method_options": method.option_dict(method_options), "batch_size": batch_size,
            "seed": options.seed, "max_steps": options.max_steps}


def pretrain(options: TrainOptions, *, student: str, out_dir: str, store: str,
             log: Callable[[str], Any] = print, on_step: Callable[[dict], Any] | None = None) -> dict:
    """Distil `student` from the masked-LM store at `store`; OUT/best holds a plain BertForMaskedLM."""
    from pipelines.train.distill import RUN_KIND

    claim_output(out_dir, RUN_KIND, overwrite=False)
    hsk_store = open_store(store)
    method, method_options, stage = _plan(options, hsk_store)
    source = Source("offline", hsk_store, hsk_store.meta, None, hsk_store.metadata.teacher.name)  # type: ignore
    torch.manual_seed(options.seed)
    from pipelines.dump.mlm import load_mlm_teacher

    teacher = store_teacher(source, options.teacher, load=lambda name: load_mlm_teacher(name, "cpu"))
    model, tokenizer, init = mlm_student(student, teacher)
    _check_student(model, tokenizer, hsk_store.metadata)
    device = run_device(options)
    out = Path(out_dir)
    batch_size = options.batch_size or 32
    checkpoints = Checkpoints(out / "checkpoint" / "state.pt",
                              _identity(options, student, hsk_store, method, method_options, batch_size))
    state = checkpoints.resume(options.resume, out, log)
    mark_output(str(out), RUN_KIND, method=method.name)
    model.to(device).train()
    stream = StoreStream(hsk_store, batch_size=batch_size, seed=options.seed,
                         buffer_shards=options.buffer_shards, workers=options.workers, names=MLM_ARRAYS)
    total = math.ceil(stage.epochs * len(stream))
    if options.max_steps is not None:
        total = min(total, options.max_steps)
    optimizer = torch.optim.AdamW(param_groups([model], options.weight_decay), lr=stage.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule_factor(stage.schedule, total, stage.warmup_ratio))
    progress = {"step": 0, "seconds": 0.0, "last": {}}
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        stream.load_state_dict(state["stream"])
        set_rng_state(state["rng"])
        progress = state["progress"]
        log(f"resuming from {checkpoints.path} at step {progress['step']} of {total}")
    metrics = MetricsLog(out / "metrics.jsonl", progress["step"] if state is not None else None)
    log(f"lightpaff-pretrain: {init}; {total} steps over {len(hsk_store)} rows, terms "
        + ", ".join(f"{t.weight:g} {t.name}" for t in stage.terms))

    def save() -> None:
        atomic_save({"version": CHECKPOINT_VERSION, "identity": checkpoints.identity, "progress": progress,
                     "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "scheduler": scheduler.state_dict(), "stream": stream.state_dict(), "rng": rng_state()},
                    checkpoints.path)

    checkpoints.path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter() - progress["seconds"]
    while progress["step"] < total:
        for raw in stream:
            progress["last"] = _step(model, stage, optimizer, scheduler, raw, device, options.max_grad_norm)
            progress["step"] += 1
            progress["seconds"] = time.perf_counter() - started
            record = {"type": "train", "stage": stage.name, "step": progress["step"], "loss": progress["last"]["loss"],
                      "terms": progress["last"]["terms"], "lr": scheduler.get_last_lr()[0]}
            if progress["step"] % options.log_every == 0 or progress["step"] == total:
                metrics.write(record)
            if progress["step"] % options.checkpoint_every == 0 or progress["step"] == total:
                save()
            if on_step is not None:
                on_step(record)
            if progress["step"] >= total:
                break
    return _finish(progress, model, tokenizer, out, init, hsk_store, method, method_options, student, stage, log)


def _finish(progress: dict, model: nn.Module, tokenizer: Any, out: Path, init: str, hsk_store: Any, method: Any,
            method_options: Any, student: str, stage: Stage, log: Callable[[str], Any]) -> dict:
    step, last, seconds = progress["step"], progress["last"], round(progress["seconds"], 2)
    options_dict = method.option_dict(method_options)
    card = {"reason": "end of pre-training distillation", "step": step, "init": init, "source": str(hsk_store.url),
            "method": method.name, "method_options": options_dict}
    best = _save(model, tokenizer, out, card)
    summary = {"method": method.name, "method_options": options_dict, "student": student,
               "student_init": init, "store": str(hsk_store.url), "steps": step, "train_seconds": seconds,
               "final_losses": last, "stage": stage.describe(), "model_dir": str(best)}
    write_json(out / "summary.json", summary)
    log(f"done: {step} steps, losses {last}; pre-trained student in {best} (use it as --init of --method lightpaff)")
    return summary


def _step(model: nn.Module, stage: Stage, optimizer, scheduler, raw: dict, device: str,
          max_grad_norm: float | None) -> dict[str, float]:
    inputs, targets = mlm_batch(raw, device)
    logits = masked_logits(model, inputs, targets["positions"], targets["used"])
    loss, values = weighted_sum(stage.terms, TermInputs(SimpleNamespace(logits=logits), targets, [], None))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    return {"loss": float(loss.detach()), "terms": values}
