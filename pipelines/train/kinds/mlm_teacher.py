"""An MLM teacher that can be had offline: train a masked-LM head on a base encoder (LightPAFF's teacher).

The MiniLM package ships an encoder without its MLM head. This puts BERT's head on it (dense +
GELU + LayerNorm, then a decoder tied to the word embeddings, as BERT does, plus a bias) and trains
the head, and optionally the top `train_layers` encoder layers, with BERT's masking on in-domain
raw text; everything else stays frozen. The one training loop (pipelines.train.run.loop) runs it: the
rows are tokenized once and held in memory, laid out as a store's shards (`RowsInMemory`), and
masked per batch (`MaskingFeed`), anew each epoch (a function of the seed, the epoch and the row,
so a resumed run masks as an uninterrupted one). The held-out tenth is evaluated at every epoch's
end (`HeldOut`). The result is a plain `BertForMaskedLM` checkpoint, which `hsk dump --objective mlm`
reads.

The output rule is `hsk teacher`'s (pipelines/train/kinds/teacher.py): `--out` must be new, or a teacher
folder with `--overwrite`; training runs in the hidden sibling `.OUT.hsk-train`, checkpointed every
`checkpoint_every` steps (mlm-state.pt, the loop's checkpoint), so a rerun of the same command resumes
(RNG state included: the resumed run takes the same steps as an uninterrupted one); the teacher folder
is built in a staged sibling and swapped in whole.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from hskstore.format.config import ConfigError
from hskstore.format.meta import Layout
from pipelines.core.batching import batch_inputs, length_bucketed_batches
from pipelines.core.data import Examples
from pipelines.core.models import ModelLoadError, load_tokenizer, resolve_model, vocab_hash, weights_hash
from pipelines.core.output_kinds import TEACHER
from pipelines.core.precision import StepPrecision
from pipelines.core.tokenize import encode
from pipelines.dump.mlm import Masking, mask_rows
from pipelines.registry import Stage, Term
from pipelines.train.data.sources import ShardedRows
from pipelines.train.data.stream import StoreStream
from pipelines.train.kinds.teacher import check_numbers, publish_teacher, work_dir
from pipelines.train.options import TrainOptions
from pipelines.train.run.checkpoints import RunIdentity
from pipelines.train.run.loop import Keeper, Run, Student, first_split_score
from pipelines.train.run.setup import train_in_own_folder
from pipelines.train.students.adapter import masked_lm_batch, masked_lm_outputs
from pipelines.train.students.build import StudentInfo
from pipelines.train.students.heads import Heads

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

STATE_FILE = "mlm-state.pt"
ROWS = ["row", "input_ids", "token_type_ids", "length"]


def _trainable(model: PreTrainedModel, train_layers: int) -> list[torch.nn.Parameter]:
    """The MLM head (transform and bias; the decoder is the tied word embedding, frozen) and the top layers."""
    for p in model.parameters():
        p.requires_grad_(False)
    modules = [model.cls.predictions.transform]
    if train_layers:
        modules += list(model.bert.encoder.layer[-train_layers:])
    params = [p for m in modules for p in m.parameters()] + [model.cls.predictions.bias]
    for p in params:
        p.requires_grad_(True)
    return params


def epoch_masking(seed: int, epoch: int) -> Masking:
    """BERT's masking, drawn anew each epoch: its seed is a function of the run's seed and the epoch."""
    return Masking(mask_seed=int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0]))


@dataclass(frozen=True)
class _Spec:
    dtype: np.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class _RowsMeta:
    """The part of a store's metadata the StoreStream reads: complete, and the layout."""

    layout: Layout
    complete: bool = True


class RowsInMemory(ShardedRows):
    """Tokenized rows laid out as a store's shards, for the StoreStream (nothing is written)."""

    def __init__(self, arrays: dict[str, np.ndarray], url: str, shard_rows: int = 1024):
        layout = Layout(len(arrays["row"]), shard_rows, chunk_rows=shard_rows, n_width=0)
        super().__init__(_RowsMeta(layout), arrays, url)
        self.specs = {name: _Spec(a.dtype, a.shape) for name, a in arrays.items()}


def bucketed(data: _Data, batch_size: int, seed: int, url: str) -> RowsInMemory:
    """The training rows laid out in batches of similar length, one batch a shard, the short batch last:
    the stream (one shard a window) then shuffles whole batches each epoch and pads little, as the
    length-bucketed batches of the dump do (SST-2 sentences are short: random batches pad ~3x more)."""
    batches = length_bucketed_batches(data.train["length"], batch_size, shuffle_seed=seed)
    order = np.concatenate(sorted(batches, key=lambda b: len(b) < batch_size))  # stable: the short one last
    arrays = {"row": data.rows[order], **{k: data.train[k][order] for k in ROWS[1:]}}
    return RowsInMemory(arrays, url, shard_rows=batch_size)


class _MaskingMaker:
    def __init__(self, stream: StoreStream, tokenizer: PreTrainedTokenizerBase, seed: int, device: str):
        self.stream, self.tokenizer, self.seed, self.device = stream, tokenizer, seed, device

    def __call__(self, raw: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        masking = epoch_masking(self.seed, self.stream.epoch)  # the epoch this batch belongs to
        masked = mask_rows(raw, raw["row"], masking, self.tokenizer)
        return masked_lm_batch(masked["input_ids"], raw["token_type_ids"], raw["length"], masked["mlm/positions"],
                               masked["mlm/labels"], self.device)

    def close(self) -> None:
        pass


@dataclass
class MaskingFeed:
    """Rows in memory, masked per batch: a stage reads the masked inputs and the original tokens."""

    store: RowsInMemory
    tokenizer: PreTrainedTokenizerBase
    seed: int

    def names(self, stage: Stage, kept: list[int]) -> list[str]:
        return list(ROWS)

    def maker(self, stage: Stage, kept: list[int], device: str, stream: StoreStream) -> _MaskingMaker:
        return _MaskingMaker(stream, self.tokenizer, self.seed, device)


class HeldOut:
    """Loss and accuracy of the MLM head on the held-out rows' masked tokens (masked once, with the seed)."""

    head, metric = "mlm", "accuracy"

    def __init__(self, enc: dict, arrays: dict | None, batch_size: int, device: str):
        self.enc, self.arrays, self.batch_size, self.device = enc, arrays, batch_size, device

    def __bool__(self) -> bool:
        return self.arrays is not None

    def __call__(self, model: PreTrainedModel) -> dict:
        model.eval()
        total, correct, count = 0.0, 0, 0
        masked = {**self.enc, "input_ids": self.arrays["input_ids"]}
        with torch.no_grad():
            for rows in length_bucketed_batches(self.enc["length"], self.batch_size):
                batch = batch_inputs(masked, rows, self.device)
                positions = torch.as_tensor(self.arrays["mlm/positions"][rows].astype(np.int64), device=self.device)
                logits = masked_lm_outputs(model, None, {**batch, "positions": positions, "used": positions >= 0},
                                           ()).logits
                target = torch.as_tensor(self.arrays["mlm/labels"][rows].astype(np.int64), device=self.device)
                target = target[positions >= 0]
                n = int(target.numel())
                total += float(F.cross_entropy(logits.float(), target)) * n
                correct, count = correct + int((logits.argmax(-1) == target).sum()), count + n
        model.train()
        return {"held_out": {"loss": _finite(total / max(count, 1)), "accuracy": round(correct / max(count, 1), 6),
                             "tokens": count}}

    def score(self, metrics: dict | None) -> float:
        return first_split_score(metrics, self.metric)


def _finite(x: float) -> float | None:
    """Rounded for the summary; None for a diverged (nan/inf) loss, which JSON cannot hold."""
    return round(float(x), 6) if math.isfinite(x) else None


@dataclass
class _Data:
    train: dict
    rows: np.ndarray
    dev: dict
    dev_arrays: dict | None


def _load_model(base: str, train_layers: int, device: str) -> Any:
    from transformers import BertForMaskedLM

    try:
        model = BertForMaskedLM.from_pretrained(resolve_model(base), dtype=torch.float32).to(device)
    except Exception as exc:
        reason = str(exc).splitlines()[0][:200]
        raise ModelLoadError(f"cannot put an MLM head on {base} ({reason}): pass a BERT encoder") from None
    if not 0 <= train_layers <= model.config.num_hidden_layers:
        raise ConfigError(f"--train-layers {train_layers} must be in 0..{model.config.num_hidden_layers}")
    return model


def _split(corpus: Examples, tokenizer: PreTrainedTokenizerBase, max_length: int, seed: int) -> _Data:
    """The last tenth of the corpus (at most 500 rows) is held out, masked once with the seed."""
    held_out = min(max(len(corpus) // 10, 1), 500) if len(corpus) > 1 else 0
    enc = encode(tokenizer, corpus.texts, max_length)
    split = len(corpus) - held_out
    dev = {k: v[split:] for k, v in enc.items()}
    dev_arrays = mask_rows(dev, corpus.rows[split:], Masking(mask_seed=seed), tokenizer) if held_out else None
    return _Data({k: v[:split] for k, v in enc.items()}, corpus.rows[:split], dev, dev_arrays)


def _history(metrics_file: Path) -> list[dict]:
    """Per epoch: its last step, mean train loss and the held-out evaluation at its end (metrics.jsonl)."""
    records = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    evals = {r["step"]: r["metrics"].get("held_out", {}) for r in records if r["type"] == "eval"}
    epochs: dict[int, list[dict]] = {}
    for r in records:
        if r["type"] == "train":
            epochs.setdefault(r["epoch"], []).append(r)
    history = []
    for epoch, steps in sorted(epochs.items()):
        last = steps[-1]["step"]
        history.append({"epoch": epoch + 1, "step": last, "train_loss": _finite(np.mean([r["loss"] for r in steps])),
                        "dev": evals.get(last, {})})
    return history


def _stage(epochs: float, lr: float) -> Stage:
    import pipelines.methods  # noqa: F401  registers the mlm_mle loss term (pipelines.methods.lightpaff)

    return Stage(name="mlm", epochs=epochs, lr=lr, terms=(Term("mle", "mlm_mle"),), schedule="constant", head="mlm",
                 select_best=True)  # select_best: the held-out rows are evaluated at every epoch's end


def train_mlm_teacher(
    base: str,
    corpus: Examples,
    out: str | Path,
    *,
    train_layers: int = 0,
    epochs: float = 1.0,
    lr: float = 1e-4,
    batch_size: int = 32,
    max_length: int = 128,
    seed: int = 0,
    device: str = "cpu",
    precision: str = "auto",
    overwrite: bool = False,
    checkpoint_every: int = 100,
    progress: bool = True,
    log: Callable[[str], object] = print,
    on_step: Callable[[int], object] | None = None,
) -> dict:
    """Train an MLM head (and the top `train_layers` layers) of `base` on `corpus`; save a BertForMaskedLM.

    `out` follows hsk teacher's output rule; a rerun after an interruption resumes (module docstring).
    `on_step(step)` is called after every optimizer step. `precision`: as `hsk train --precision`.
    """
    out = Path(out)
    step_precision = StepPrecision.resolve(precision, str(device))  # refused here, before anything is written
    check_numbers(epochs=epochs, lr=lr, batch_size=batch_size, max_length=max_length)
    TEACHER.claim(str(out), overwrite=overwrite)
    started = time.perf_counter()
    tokenizer = load_tokenizer(base)
    torch.manual_seed(seed)  # the fresh head is drawn from this
    model = _load_model(base, train_layers, device)
    _trainable(model, train_layers)
    data = _split(corpus, tokenizer, max_length, seed)
    identity = RunIdentity("mlm-teacher", {"train_layers": train_layers, "epochs": epochs, "lr": lr,
                                           "max_length": max_length}, base, corpus.fingerprint, "memory", batch_size,
                           {"seed": seed})
    work = work_dir(out)
    work.mkdir(parents=True, exist_ok=True)
    options = _options(batch_size, seed, checkpoint_every, progress, precision)
    run = _run(model, tokenizer, data, (work, identity, step_precision), options, base, corpus, epochs, lr, device, log,
               on_step)
    history = _history(work / "metrics.jsonl")
    for h in history:
        log(f"epoch {h['epoch']}: train loss {h['train_loss']}; held-out masked tokens {h['dev']}")
    summary = {
        "format": "hsk-teacher/1", "objective": "mlm", "base": base, "base_resolved": resolve_model(base),
        "train_layers": train_layers, "epochs": epochs, "lr": lr, "batch_size": batch_size, "seed": seed,
        "max_length": max_length, "precision": run.precision.name,
        "train_rows": len(data.rows), "held_out_rows": len(corpus) - len(data.rows),
        "corpus": corpus.source, "corpus_fingerprint": corpus.fingerprint, "history": history,
        "dev_metrics": history[-1]["dev"], "steps": run.position.global_step, "weights_hash": weights_hash(model),
        "vocab_hash": vocab_hash(tokenizer), "train_seconds": round(time.perf_counter() - started, 2),
    }

    def fill(folder: Path) -> None:  # the last model (the held-out evaluation chooses nothing)
        model.eval().save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    publish_teacher(out, fill, summary, objective="mlm")
    shutil.rmtree(work, ignore_errors=True)
    return summary


def _options(batch_size: int, seed: int, checkpoint_every: int, progress: bool, precision: str) -> TrainOptions:
    return TrainOptions(method=None, batch_size=batch_size, weight_decay=0.01, max_grad_norm=None,
                        seed=seed, workers=0, log_every=1, checkpoint_every=checkpoint_every, progress=progress,
                        buffer_shards=1, precision=precision)  # a shard is a batch of similar lengths (`bucketed`)


def _run(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, data: _Data,
         folder: tuple[Path, RunIdentity, StepPrecision], options: TrainOptions, base: str, corpus: Examples,
         epochs: float, lr: float, device: str, log: Callable[[str], object],
         on_step: Callable[[int], object] | None) -> Run:
    """Train in the work folder (resuming its checkpoint when it is this run's): the whole model is the student
    (only the unfrozen parameters train), head mlm."""
    work, identity, precision = folder
    batch_size, seed = options.batch_size, options.seed
    rows = bucketed(data, batch_size, seed, f"memory:{corpus.source}")
    return train_in_own_folder(
        work, identity, precision, state_file=STATE_FILE, log=log, options=options,
        feed=MaskingFeed(rows, tokenizer, seed), task=None,
        student=Student(model, StudentInfo.of_model(base, model, tokenizer), None,
                        Heads(model, "mlm")),
        stages=[_stage(epochs, lr)], pairs=[[]], device=str(device), batch_size=batch_size,
        evaluator=HeldOut(data.dev, data.dev_arrays, batch_size, str(device)), keeper=Keeper(work, None, rows.url),
        on_step=(lambda record: on_step(record["step"])) if on_step else None)
