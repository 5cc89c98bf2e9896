"""A causal-LM teacher fine-tuned on a corpus (`hsk teacher --objective clm`): LightPAFF's fine-tuning stage.

The corpus is packed into blocks as a causal-LM store packs it (hskstore.format.clm.pack_blocks) and held in
memory, laid out as a store's shards (`RowsInMemory`); the one loop trains the whole model on next-token
cross-entropy (the `clm_ce` term of `hsk train --method clm-kd`, with no teacher). The last tenth of the blocks
is held out: its perplexity is evaluated at every epoch's end. The output rule, the resume and the staged
swap are `hsk teacher`'s (pipelines/train/kinds/teacher.py); the result is a plain causal-LM folder, which
`hsk dump --objective clm --teacher OUT` reads.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from hskstore.format.clm import block_hashes
from pipelines.core.data import Examples
from pipelines.core.models import load_tokenizer, resolve_model, vocab_hash, weights_hash
from pipelines.core.output_kinds import TEACHER
from pipelines.core.precision import StepPrecision
from pipelines.dump.clm import eos_of, tokenize_corpus
from pipelines.registry import Stage, Term
from pipelines.train.data.stream import StoreStream
from pipelines.train.kinds.clm import clm_student, lm_batch
from pipelines.train.kinds.mlm_teacher import RowsInMemory
from pipelines.train.kinds.teacher import check_numbers, publish_teacher, work_dir
from pipelines.train.options import TrainOptions
from pipelines.train.run.checkpoints import RunIdentity
from pipelines.train.run.loop import Keeper, Student
from pipelines.train.run.setup import train_in_own_folder
from pipelines.train.students.build import StudentInfo
from pipelines.train.students.heads import Heads

if TYPE_CHECKING:
    from torch import nn

STATE_FILE = "clm-state.pt"
ROWS = ("row", "input_ids", "length")


class _Maker:
    def __init__(self, device: str):
        self.device = device

    def __call__(self, raw: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return lm_batch(raw, None, self.device, None)

    def close(self) -> None:
        pass


@dataclass
class BlocksFeed:
    """Blocks in memory: a stage reads their tokens, and learns each next one."""

    store: RowsInMemory

    def names(self, stage: Stage, kept: list[int]) -> list[str]:
        return list(ROWS)

    def maker(self, stage: Stage, kept: list[int], device: str, stream: StoreStream) -> _Maker:
        return _Maker(device)


class HeldOutPerplexity:
    """The held-out blocks' next-token perplexity (lower is better: scored as its negative)."""

    head, metric = "clm", "perplexity"

    def __init__(self, blocks: np.ndarray, lengths: np.ndarray, batch_size: int, device: str):
        self.blocks, self.lengths, self.batch_size, self.device = blocks, lengths, batch_size, device

    def __bool__(self) -> bool:
        return len(self.blocks) > 0

    @torch.no_grad()
    def __call__(self, model: nn.Module) -> dict:
        model.eval()
        total, count = 0.0, 0
        for start in range(0, len(self.blocks), self.batch_size):
            raw = {"input_ids": self.blocks[start:start + self.batch_size],
                   "length": self.lengths[start:start + self.batch_size]}
            batch = lm_batch(raw, None, self.device, None)
            logits = model(input_ids=batch["input_ids"]).logits.float()[batch["ce_mask"]]
            total += float(torch.nn.functional.cross_entropy(logits, batch["labels"][batch["ce_mask"]],
                                                             reduction="sum"))
            count += int(batch["ce_mask"].sum())
        model.train()
        return {"held_out": {"perplexity": math.exp(total / max(count, 1)), "tokens": count}}

    def score(self, metrics: dict | None) -> float:
        return -metrics["held_out"]["perplexity"] if metrics else float("-inf")


def _stage(epochs: float, lr: float) -> Stage:
    import pipelines.methods  # noqa: F401  declares the clm_ce loss term (pipelines.methods.clm_kd)

    return Stage(name="clm", epochs=epochs, lr=lr, terms=(Term("ce", "clm_ce"),), schedule="warmup-linear",
                 warmup_ratio=0.05, head="clm", select_best=True)


def _split(blocks: np.ndarray, lengths: np.ndarray) -> tuple[dict, np.ndarray, np.ndarray]:
    """The training rows (all but the last tenth of the blocks, at least one) and the held-out blocks."""
    n_dev = len(blocks) // 10 if len(blocks) >= 10 else 0
    n = len(blocks) - n_dev
    rows = {"row": np.arange(n, dtype=np.int64), "input_ids": blocks[:n], "length": lengths[:n]}
    return rows, blocks[n:], lengths[n:]


def train_clm_teacher(base: str, corpus: Examples, out: str | Path, *, block_size: int = 256, epochs: float = 1.0,
                      lr: float = 5e-5, batch_size: int = 8, seed: int = 0, device: str = "cpu",
                      precision: str = "auto", overwrite: bool = False, checkpoint_every: int = 100,
                      progress: bool = True, log: Callable[[str], object] = print) -> dict:
    """Fine-tune the causal LM `base` on `corpus` (next-token CE); save it at `out` (hsk teacher's output rule)."""
    out = Path(out)
    step_precision = StepPrecision.resolve(precision, str(device))  # refused before anything is written
    check_numbers(epochs=epochs, lr=lr, batch_size=batch_size, max_length=block_size)
    TEACHER.claim(str(out), overwrite=overwrite)
    started = time.perf_counter()
    tokenizer = load_tokenizer(base)
    blocks, lengths = tokenize_corpus(tokenizer, list(corpus.texts[0]), block_size, eos_of(tokenizer, base))
    rows, dev_blocks, dev_lengths = _split(blocks, lengths)
    torch.manual_seed(seed)
    model, _, init = clm_student(base, base)
    identity = RunIdentity("clm-teacher", {"epochs": epochs, "lr": lr, "block_size": block_size}, base,
                           corpus.fingerprint, "memory", batch_size,
                           {"seed": seed, "blocks": str(block_hashes(blocks[:1])[0]) if len(blocks) else None})
    work = work_dir(out)
    work.mkdir(parents=True, exist_ok=True)
    options = TrainOptions(method=None, batch_size=batch_size, weight_decay=0.01, seed=seed, workers=0,
                           log_every=1, checkpoint_every=checkpoint_every, progress=progress, precision=precision)
    info = StudentInfo.of_model(base, model, tokenizer, kind="causal_lm", init=init)
    memory = RowsInMemory(rows, f"memory:{corpus.source}", shard_rows=batch_size)
    run = train_in_own_folder(
        work, identity, step_precision, state_file=STATE_FILE, log=log, options=options, feed=BlocksFeed(memory),
        task=None, student=Student(model.to(device), info, None, Heads(model, "clm")), stages=[_stage(epochs, lr)],
        pairs=[[]], device=str(device), batch_size=batch_size,
        evaluator=HeldOutPerplexity(dev_blocks, dev_lengths, batch_size, str(device)),
        keeper=Keeper(work, None, memory.url))
    summary = {"format": "hsk-teacher/1", "objective": "clm", "base": base, "base_resolved": resolve_model(base),
               "epochs": epochs, "lr": lr, "batch_size": batch_size, "block_size": block_size, "seed": seed,
               "precision": run.precision.name, "train_blocks": len(rows["row"]), "held_out_blocks": len(dev_blocks),
               "corpus": corpus.source, "corpus_fingerprint": corpus.fingerprint, "steps": run.position.global_step,
               "dev_metrics": HeldOutPerplexity(dev_blocks, dev_lengths, batch_size, str(device))(model)
               if len(dev_blocks) else None,
               "weights_hash": weights_hash(model), "vocab_hash": vocab_hash(tokenizer),
               "train_seconds": round(time.perf_counter() - started, 2)}

    def fill(target: Path) -> None:  # the last model
        model.eval().save_pretrained(target)
        tokenizer.save_pretrained(target)

    publish_teacher(out, fill, summary, objective="clm")
    shutil.rmtree(work, ignore_errors=True)
    return summary
