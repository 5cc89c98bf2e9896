"""The one training loop: runs the stages of any method (pipelines.methods) on a student.

Every training the product does runs here: the task methods (`hsk train`), LightPAFF pre-training
on a masked-LM store, `hsk teacher` and the MLM teacher. Each stage: an AdamW optimiser over what
it trains, its LR schedule, a stream of batches (a `Feed` says which arrays the stage streams and
how its batches are made: a task store, a live teacher online, rows in memory, a masked-LM store),
the student's forward through an adapter with fixed output keys (pipelines.train.students.adapter), the
weighted sum of its loss terms (each logged in metrics.jsonl), evaluation and best-checkpoint
selection when the stage asks for it. A checkpoint (pipelines.train.run.checkpoints) records the
stage index and the step inside the stage explicitly, with the stream's position and the RNG
state, so a rerun resumes mid-stage and computes the very same losses as an uninterrupted run; an
older layout is refused in one line. A step reads nothing back from the device: its loss and terms stay
there (pipelines.train.run.meter) until a step logs, evaluates or checkpoints, where a NaN or infinite loss
since the last reading stops the run before anything is saved. The step's precision (and torch.compile)
come from pipelines.core.precision and the run's options; pipelines.train.run.setup builds every kind of Run.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn
from tqdm.auto import tqdm

from pipelines.core.precision import StepPrecision
from pipelines.core.run_state import (
    MetricsLog,
    json_default,
    save_model_folder,
    set_rng_state,
)
from pipelines.core.tasks import Task
from pipelines.registry import Method, Stage
from pipelines.train.data.sources import BatchMaker, RowSource, TaskSource, TrainingSource
from pipelines.train.data.stream import StoreStream
from pipelines.train.losses.pairs import LayerPair
from pipelines.train.losses.terms import TermInputs, weighted_sum
from pipelines.train.options import TrainOptions
from pipelines.train.run.checkpoints import Checkpoints, RunIdentity
from pipelines.train.run.ddp import Ranks
from pipelines.train.run.meter import LossMeter, NonFiniteLoss
from pipelines.train.students.adapter import StudentOutputs, adapter_for
from pipelines.train.students.build import StudentInfo
from pipelines.train.students.heads import Heads

if TYPE_CHECKING:  # the dev data of a task run (only its type is named here)
    from pipelines.train.data.dev import DevData



# --------------------------------------------------------------------------------------------------
# Optimisation


def param_groups(modules: list[nn.Module], weight_decay: float) -> list[dict]:
    """Weight decay on weights only: not on biases nor LayerNorm."""
    decay, no_decay = [], []
    for module in modules:
        for name, p in module.named_parameters():
            if not p.requires_grad:
                continue
            skip = name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name or "norm." in name.lower()
            (no_decay if skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def schedule_factor(schedule: str, total_steps: int, warmup_ratio: float = 0.0) -> Callable[[int], float]:
    """LR multiplier per step: constant; linear decay to 0; linear warmup then linear decay."""
    if schedule == "constant":
        return lambda step: 1.0
    if schedule == "linear":
        return lambda step: max(0.0, 1.0 - step / max(total_steps, 1))
    warmup = int(warmup_ratio * total_steps)

    def factor(step: int) -> float:  # transformers.get_linear_schedule_with_warmup's shape
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return factor


# --------------------------------------------------------------------------------------------------
# The pieces of a run


@dataclass
class Student:
    """The model being trained, its projection W and its heads; `forward` gives fixed output keys."""

    model: nn.Module
    info: StudentInfo
    projection: nn.Module | None
    heads: Heads
    runner: nn.Module | None = None  # the model in DistributedDataParallel under torchrun (it hides .config)

    def modules(self, trains: tuple[str, ...]) -> list[nn.Module]:
        out = [self.model] if "student" in trains else []
        if "projection" in trains and self.projection is not None:
            out.append(self.projection)
        return out

    def forward(self, batch: dict, outputs: tuple[str, ...]) -> StudentOutputs:
        return adapter_for(self.heads.current)(self.model, self.runner, batch, outputs)

    def state(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "projection": self.projection.state_dict() if self.projection is not None else None,
            "heads": self.heads.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("heads"):
            self.heads.load_state_dict(state["heads"])
        self.model.load_state_dict(state["model"])
        if self.projection is not None and state.get("projection") is not None:
            self.projection.load_state_dict(state["projection"])


@dataclass
class Position:
    """Where a run is, as its checkpoint records it: stage index and step inside the stage, explicitly."""

    stage_index: int = 0
    stage_step: int = 0  # optimizer steps done in the current stage (0: the stage has not started)
    global_step: int = 0
    examples_seen: int = 0
    train_seconds: float = 0.0
    stage_examples: int = 0
    stage_seconds: float = 0.0

    def advance(self, n: int, seconds: float) -> None:
        self.stage_step += 1
        self.global_step += 1
        self.examples_seen += n
        self.stage_examples += n
        self.train_seconds += seconds
        self.stage_seconds += seconds

    def next_stage(self) -> None:
        self.stage_index += 1
        self.stage_step = self.stage_examples = 0
        self.stage_seconds = 0.0

    def state(self) -> dict:
        """The checkpoint's "position" (where in the plan) and "progress" (how far, in all)."""
        return {"position": {"stage_index": self.stage_index, "stage_step": self.stage_step},
                "progress": {"step": self.global_step, "examples": self.examples_seen, "seconds": self.train_seconds,
                             "stage_examples": self.stage_examples, "stage_seconds": self.stage_seconds}}

    @classmethod
    def from_state(cls, state: dict) -> Position:
        progress = state["progress"]
        return cls(state["position"]["stage_index"], state["position"]["stage_step"], progress["step"],
                   progress["examples"], progress["seconds"], progress["stage_examples"], progress["stage_seconds"])


class Evaluator:
    """Dev metrics of the student, tokenized once with its tokenizer at the store's length.

    Any evaluator (the MLM teacher's held-out masked tokens too) gives {split: {metric: value}} for the
    head it judges (`head`), and `metric`, the one model selection reads."""

    head = "task"

    def __init__(self, task: Task, dev: dict, tokenizer, max_length: int, batch_size: int, device: str,
                 progress: bool = False):
        self.task, self.dev, self.tokenizer = task, dev, tokenizer
        self.max_length, self.batch_size, self.device = max_length, batch_size, device
        self.progress = progress  # a bar per evaluation, on a terminal only
        self._enc: dict | None = None

    def __bool__(self) -> bool:
        return bool(self.dev)

    def __call__(self, model: nn.Module) -> dict:
        from pipelines.core.metrics import compute_metrics
        from pipelines.core.tokenize import encode
        from pipelines.train.run.evaluate import predict

        if self._enc is None:
            self._enc = {split: encode(self.tokenizer, ex.texts, self.max_length) for split, ex in self.dev.items()}
        metrics = {}
        for split, ex in self.dev.items():
            logits = predict(model, self._enc[split], batch_size=self.batch_size, device=self.device,
                             progress=f"eval {split}" if self.progress else None)
            metrics[split] = {**compute_metrics(self.task, logits, ex.labels), "n": len(ex)}
        model.train()
        return metrics

    @property
    def metric(self) -> str:
        return self.task.metric

    def score(self, metrics: dict | None) -> float:
        """The metric model selection uses: the primary metric of the first dev split."""
        return first_split_score(metrics, self.metric)


def first_split_score(metrics: dict | None, metric: str) -> float:
    if not metrics:
        return float("nan")
    value = next(iter(metrics.values())).get(metric)
    return float("nan") if value is None else float(value)


@dataclass
class Keeper:
    """The best dev result so far and the saved student (out/best, plain transformers format)."""

    out: Path
    task: Task | None  # None: a masked-LM run (no task)
    source_url: str
    best: dict | None = None  # {"step", "stage", "metrics", "score", "saved"}
    last_eval: dict | None = None

    def save(self, student: Student, step: int, reason: str) -> None:
        target, tmp = self.out / "best", self.out / "best.tmp"
        save_model_folder(student.model, student.info.tokenizer, tmp)  # a full disk: one line, rerun resumes
        card = {"reason": reason, "step": step, "task": self.task.name if self.task else None,
                "student": student.info.describe(), "source": self.source_url, "best": self.best}
        (tmp / "hsk_student.json").write_text(json.dumps(card, indent=2, default=json_default))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        if self.best is not None and reason == "best dev score":
            self.best["saved"] = True

    def state(self) -> dict:
        return {"best": self.best, "last_eval": self.last_eval}


class Maker(Protocol):
    """Raw stream batch (numpy) -> the dict of device tensors the student and the loss terms read."""

    def __call__(self, raw: dict) -> dict: ...

    def close(self) -> None: ...


class Feed(Protocol):
    """What differs between kinds of training data: the arrays a stage streams and how its batches are made.
    `store` is what the StoreStream reads (a store, or rows in memory laid out as one)."""

    store: RowSource

    def names(self, stage: Stage, kept: list[int]) -> list[str]: ...

    def maker(self, stage: Stage, kept: list[int], device: str, stream: StoreStream) -> Maker: ...


@dataclass
class TaskFeed:
    """A task store, a live teacher standing in for one (online), or labelled rows in memory (`hsk teacher`)."""

    source: TaskSource
    pad_to_max_length: bool = False  # pad every batch to the store's max length (benchmarks)
    student_inputs: dict | None = None  # the student's own encoding of the rows (another tokenizer)

    @property
    def store(self) -> RowSource:
        return self.source.store

    def names(self, stage: Stage, kept: list[int]) -> list[str]:
        return self.source.stream_names(stage.reads, kept)

    def maker(self, stage: Stage, kept: list[int], device: str, stream: StoreStream) -> Maker:
        meta = self.source.metadata
        pad_to = meta.max_length if self.pad_to_max_length else None
        return BatchMaker(self.source, [f"layers/{i}" for i in kept], device, pad_to, self.student_inputs,
                          meta.tokenizer.pad_id or 0)


@dataclass
class Run:
    """A run's fixed inputs and its small mutable parts; `run_stages` drives it."""

    options: TrainOptions
    feed: Feed
    task: Task | None  # None: no task (masked-LM training)
    student: Student
    stages: list[Stage]
    pairs: list[list[LayerPair]]  # per stage
    device: str
    batch_size: int
    evaluator: Evaluator | None
    keeper: Keeper
    checkpoints: Checkpoints
    metrics_log: MetricsLog
    log: Callable[[str], object]
    on_step: Callable[[dict], object] | None = None
    position: Position = field(default_factory=Position)
    stage_results: dict = field(default_factory=dict)
    ranks: Ranks = field(default_factory=Ranks)

    @property
    def precision(self) -> StepPrecision:
        return self.checkpoints.precision

    def restore(self, state: dict) -> None:
        self.student.load_state_dict(state)
        self.position = Position.from_state(state)
        self.keeper.best, self.keeper.last_eval = state["best"], state.get("last_eval")
        self.stage_results = state["stage_results"]

    def names_read(self) -> list[str]:
        """Every store array the plan reads (all stages, whichever of them ran in this process)."""
        names: set[str] = set()
        for stage, pairs in zip(self.stages, self.pairs):
            names.update(self.feed.names(stage, sorted({p.kept for p in pairs})))
        return sorted(names)

    def evaluate(self, stage: Stage) -> None:
        """Dev metrics now; the best so far is saved to out/best. Rank 0 alone; the others wait for it."""
        if not self.evaluator or stage.head != self.evaluator.head:
            return
        if self.ranks.main:
            self._evaluate(stage)
        self.ranks.barrier()

    def _evaluate(self, stage: Stage) -> None:
        step = self.position.global_step
        if self.keeper.last_eval and self.keeper.last_eval.get("step") == step:
            return
        with self.precision.autocast():
            metrics = self.evaluator(self.student.model)
        score = self.evaluator.score(metrics)
        keeper = self.keeper
        best_score = keeper.best["score"] if keeper.best else float("nan")
        is_best = not math.isnan(score) and (math.isnan(best_score) or score > best_score)
        keeper.last_eval = {"step": step, "metrics": metrics, "score": score}
        self.metrics_log.write({"type": "eval", "stage": stage.name, "step": step, "metrics": metrics,
                                "score": score, "best": is_best})
        metric = self.evaluator.metric
        shown = ", ".join(f"{split} {metric} {m[metric]:.4f}" for split, m in metrics.items())
        self.log(f"eval at step {step}: {shown}{' (best so far)' if is_best else ''}")
        if is_best or keeper.best is None:
            keeper.best = {"step": step, "stage": stage.name, "metrics": metrics, "score": score}
            keeper.save(self.student, step, "best dev score")


@dataclass
class RunParts:
    """What one kind of training prepares for the loop (distill's task runs; LightPAFF pre-training), every
    check done: the rest of a run (its folder, checkpoints, resume, summary) is the same for all."""

    source: TrainingSource  # a task source (store, live teacher) or a StoreSource (LM stores)
    method: Method
    method_options: Any  # an instance of `method.options` (each method has its own dataclass)
    stages: list[Stage]
    student: Student
    pairs: list[list[LayerPair]]  # per stage
    feed: Feed
    evaluator: Evaluator | None  # None: no dev evaluation (the last model is kept)
    batch_size: int
    identity: RunIdentity  # what a checkpoint must share with the run that resumes it
    dev: DevData | None = None  # the dev data of a task run
    done_note: str = ""  # said after the run's last line


# --------------------------------------------------------------------------------------------------
# Running the stages


@dataclass
class _StageRun:
    """One stage in progress: its optimiser, schedule, stream and batch maker."""

    stage: Stage
    pairs: list[LayerPair]
    total: int
    steps_per_epoch: int
    modules: list[nn.Module]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    stream: StoreStream
    maker: Maker  # what the feed made for this stage (Feed.maker)
    compute: Callable[[dict], tuple] | None = None  # batch -> (loss, terms): _forward_losses, compiled or not
    meter: LossMeter = field(default_factory=LossMeter)  # the loss and terms, on the device until read
    checked_step: int = 0  # the last step whose loss was read finite (nothing saved after a non-finite one)
    heard: float | None = None  # perf_counter() of the stage's last heartbeat line (None: none yet)

    @property
    def loss(self) -> float:
        return self.meter.loss


def _open_stage(run: Run, index: int, state: dict | None) -> _StageRun:
    stage, pairs, opts = run.stages[index], run.pairs[index], run.options
    run.student.heads.use(stage.head, seed=opts.seed + index)
    if stage.fresh_head and run.position.stage_step == 0:  # not when resuming mid-stage: the head is trained
        run.student.heads.reset(seed=opts.seed + index)
    kept = sorted({p.kept for p in pairs})
    ranks = run.ranks
    stream = StoreStream(run.feed.store, batch_size=ranks.local_batch(run.batch_size), seed=opts.seed,
                         shuffle=True, buffer_shards=opts.buffer_shards, workers=opts.workers,
                         read_ahead=opts.read_ahead, rank=ranks.rank, world_size=ranks.world_size,
                         drop_last=ranks.distributed,
                         names=run.feed.names(stage, kept))
    total = math.ceil(stage.epochs * len(stream))
    if opts.max_steps is not None:
        total = min(total, opts.max_steps)
    modules = run.student.modules(stage.trains)
    optimizer = _adamw(param_groups(modules, opts.weight_decay), stage.lr, run.device)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule_factor(stage.schedule, total,
                                                                             stage.warmup_ratio))
    if state is not None and state["position"]["stage_index"] == index:
        if state["position"]["stage_step"] > 0:  # mid-stage: continue the very same stage
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            stream.load_state_dict(state["stream"])
            run.precision.load_state_dict(state.get("scaler"))
        if ranks.main:  # the checkpoint holds rank 0's RNG; the others keep their own seed's
            set_rng_state(state["rng"])
    maker = run.feed.maker(stage, kept, run.device, stream)
    run.student.runner = ranks.wrap(run.student.model) if "student" in stage.trains else None
    sr = _StageRun(stage, pairs, total, len(stream), modules, optimizer, scheduler, stream, maker,
                   checked_step=run.position.stage_step)
    sr.compute = _forward_losses(run, sr)
    return sr


def _adamw(groups: list[dict], lr: float, device: str) -> torch.optim.Optimizer:
    """AdamW; on CUDA the fused kernel (one launch for every parameter, and under fp16 the loss scaler's
    inf check without a host sync). The CPU keeps the default implementation: the same bits as ever."""
    fused = torch.device(device).type == "cuda"
    return torch.optim.AdamW(groups, lr=lr, **({"fused": True} if fused else {}))


def _forward_losses(run: Run, sr: _StageRun) -> Callable[[dict], tuple]:
    """batch -> (loss, terms): the student's forward and the stage's loss terms, under the run's precision;
    torch.compile'd with --compile (on CUDA with "reduce-overhead" also captured as CUDA graphs)."""
    student, stage, pairs, precision, count = run.student, sr.stage, sr.pairs, run.precision, run.ranks.mean_count

    def compute(batch: dict) -> tuple:
        with precision.autocast():  # fp32: nothing; bf16 / fp16: the forward and the terms (which sum in float32)
            out = student.forward(batch, stage.outputs)
            return weighted_sum(stage.terms, TermInputs(out, batch, pairs, student.projection, count))

    if run.options.compile is None:
        return compute
    return torch.compile(compute, mode=run.options.compile)


def _step(run: Run, sr: _StageRun, batch: dict) -> None:
    """One optimizer step. Nothing here reads a device value (no host sync): the loss and its terms go
    to the stage's meter, read on the steps that log, evaluate or checkpoint (_read)."""
    precision = run.precision
    loss, terms = sr.compute(batch)
    sr.optimizer.zero_grad(set_to_none=True)
    precision.backward(loss)
    run.ranks.average_grads([m for m in sr.modules if m is not run.student.model])
    if run.options.max_grad_norm:
        precision.unscale(sr.optimizer)
        torch.nn.utils.clip_grad_norm_([p for m in sr.modules for p in m.parameters()], run.options.max_grad_norm)
    precision.step(sr.optimizer)
    sr.scheduler.step()
    sr.meter.add(loss, terms)


def _read(run: Run, sr: _StageRun, saving: bool = False) -> tuple[float, dict[str, float]]:
    """The last step's loss and terms (under torchrun the mean of the ranks', the loss of the global batch).
    A non-finite loss at any step since the last reading stops the run before anything is logged, evaluated
    or saved after it, so the last checkpoint and best/ stay the last good ones; before a save (`saving`)
    the trained weights are checked too (an infinite learning rate makes them inf with a finite loss).
    Every rank reads at the same steps (a collective under torchrun); the weights are the same on all."""
    reading = sr.meter.read(run.ranks.mean)
    if not reading.finite or saving and not _finite_weights(sr):
        what = "loss" if not reading.finite else "weights"
        first, step = sr.checked_step + 1, run.position.stage_step
        when = f"at its step {step}" if first == step else f"between its steps {first} and {step}"
        raise NonFiniteLoss(
            f"the training {what} of stage {sr.stage.name} became NaN or infinite {when} (lr {sr.stage.lr:g}): "
            "training stopped, nothing saved after it (the last checkpoint and best/ are kept); lower the "
            "learning rate or check the options (--temperature, ...)")
    sr.checked_step = run.position.stage_step
    return reading.loss, reading.terms


def _finite_weights(sr: _StageRun) -> bool:
    """Every trained parameter finite: one reduction and one read, on the steps that save only."""
    flags = [torch.isfinite(p).all() for m in sr.modules for p in m.parameters() if p.requires_grad]
    return bool(torch.stack(flags).all()) if flags else True


@dataclass(frozen=True)
class _Due:
    """What is due after an optimizer step: a metrics record, an evaluation, a checkpoint."""

    log: bool
    evaluate: bool
    save: bool

    @property
    def read(self) -> bool:
        """The loss is read from the device (the same steps on every rank: a collective under torchrun)."""
        return self.log or self.evaluate or self.save


def _due(opts: TrainOptions, step: int, total: int, select_best: bool) -> _Due:
    """What the stage's `step` (of `total`) owes: a log every --log-every steps and at the last, an evaluation every
    --eval-every steps of a stage that keeps the best, a checkpoint every --checkpoint-every (the last step has its
    own, at the stage's end)."""
    last = step >= total
    evaluate = bool(select_best and opts.eval_every and step % opts.eval_every == 0)
    return _Due(step % opts.log_every == 0 or last, evaluate and not last,
                step % opts.checkpoint_every == 0 and not last)


def _after_step(run: Run, sr: _StageRun, record: dict) -> None:
    """Logging, evaluation and checkpoints due after an optimizer step (the loss read first: _read)."""
    pos = run.position
    due = _due(run.options, pos.stage_step, sr.total, sr.stage.select_best)
    if due.read:
        record["loss"], record["terms"] = _read(run, sr, saving=due.evaluate or due.save)
    if due.log:
        run.metrics_log.write(record)
        _heartbeat(run, sr, record, pos.stage_step >= sr.total)
    if due.evaluate:
        run.evaluate(sr.stage)
    if due.save and run.ranks.main:
        run.checkpoints.save((pos, run.student, run.keeper), run.stage_results, sr.optimizer, sr.scheduler, sr.stream)
    if run.on_step is not None:
        run.on_step(record)


def _heartbeat(run: Run, sr: _StageRun, record: dict, last: bool) -> None:
    """A line on stdout at a stage's first logged step, then at most every --heartbeat seconds, and at its
    last step: a run in a log file or a notebook shows it is alive, not only the progress bar on a terminal."""
    now = time.perf_counter()
    due = sr.heard is None or last or now - sr.heard >= run.options.heartbeat
    if not due or not run.ranks.main:
        return
    sr.heard = now
    pos = run.position
    left = (sr.total - pos.stage_step) * pos.stage_seconds / max(pos.stage_step, 1)
    run.log(f"stage {sr.stage.name}: step {pos.stage_step}/{sr.total}, loss {record['loss']:.4g}, "
            f"{record['examples_per_s']:.1f} examples/s, {_duration(left)} left")


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _epoch(run: Run, sr: _StageRun, bar) -> bool:
    """Steps until the stream's epoch ends or the stage's steps are done; True when the epoch ended."""
    pos = run.position
    epoch = sr.stream.epoch
    tick = time.perf_counter()
    for raw in sr.stream:
        batch = sr.maker(raw)
        _step(run, sr, batch)
        now = time.perf_counter()
        pos.advance(int(batch["input_ids"].shape[0]) * run.ranks.world_size, now - tick)
        rate = pos.stage_examples / max(pos.stage_seconds, 1e-9)
        # "loss" and "terms" are filled in (read from the device) on the steps that log, evaluate or save
        record = {"type": "train", "stage": sr.stage.name, "step": pos.global_step, "stage_step": pos.stage_step,
                  "epoch": epoch, "loss": None, "terms": None, "lr": sr.scheduler.get_last_lr()[0],
                  "examples_per_s": rate}
        _after_step(run, sr, record)
        bar.update(1)
        if record["loss"] is not None:
            bar.set_postfix(loss=f"{record['loss']:.4g}", ex_s=f"{rate:.1f}")
        tick = time.perf_counter()
        if pos.stage_step >= sr.total:
            return sr.stream.batches_done >= len(sr.stream)
    return True


def _short_of(run: Run, sr: _StageRun) -> str:
    """What to pass when the stage's epochs end before --max-steps (it caps the steps, it adds none)."""
    wanted = run.options.max_steps
    if wanted is None or wanted <= sr.total or not sr.steps_per_epoch:
        return ""
    return (f" (its epochs end before --max-steps {wanted}: pass --epochs {math.ceil(wanted / sr.steps_per_epoch)} "
            "to train that many steps)")


def _stage_line(run: Run, sr: _StageRun) -> str:
    """The line a stage starts with: its epochs, steps, learning rate and loss."""
    stage = sr.stage
    schedule = {"constant": "constant", "linear": "linear decay"}.get(stage.schedule, "warmup + linear decay")
    terms = " + ".join(f"{t.weight:g} {t.name}" for t in stage.terms)
    return (f"stage {stage.name}: {stage.epochs:g} epochs x {sr.steps_per_epoch} steps (batch {run.batch_size}) -> "
            f"{sr.total} steps, lr {stage.lr:g} {schedule}; loss {terms}{_short_of(run, sr)}")


def run_stage(run: Run, index: int, state: dict | None) -> None:
    sr = _open_stage(run, index, state)
    stage, pos = sr.stage, run.position
    if state is not None:
        run.log(f"resuming from {run.checkpoints.path}: stage {stage.name}, step {pos.stage_step} of the stage "
                f"(step {pos.stage_step} of {sr.total}; global step {pos.global_step})")
    if pos.stage_step == 0:
        run.log(_stage_line(run, sr))
    bar = tqdm(total=sr.total, initial=pos.stage_step, desc=f"train {stage.name}", unit="step",
               disable=not (run.options.progress and run.ranks.main) or None)
    run.student.model.train()
    try:
        while pos.stage_step < sr.total:
            sr.stream.set_epoch(sr.stream.epoch)
            ended = _epoch(run, sr, bar)
            if stage.select_best and ended and pos.stage_step < sr.total:
                _read(run, sr, saving=True)  # nothing is saved after a non-finite loss
                run.evaluate(stage)  # end of an epoch
            if sr.steps_per_epoch == 0:
                break
    finally:
        bar.close()
        sr.maker.close()
        run.student.runner = None
    _end_stage(run, index, sr)


def _end_stage(run: Run, index: int, sr: _StageRun) -> None:
    stage, pos = sr.stage, run.position
    _read(run, sr, saving=True)  # the final loss; nothing is saved after a non-finite one
    if stage.select_best:
        run.evaluate(stage)
    run.stage_results[stage.name] = {
        "steps": pos.stage_step, "epochs": stage.epochs, "steps_per_epoch": sr.steps_per_epoch, "lr": stage.lr,
        "final_loss": sr.loss, "examples": pos.stage_examples, "seconds": pos.stage_seconds,
        "examples_per_s": pos.stage_examples / pos.stage_seconds if pos.stage_seconds else None,
    }
    run.metrics_log.write({"type": "stage_end", "stage": stage.name, "step": pos.global_step,
                           **run.stage_results[stage.name]})
    if index == len(run.stages) - 1:
        run.student.heads.use(run.student.heads.own)
        if not (run.keeper.best and run.keeper.best.get("saved")) and run.ranks.main:
            run.keeper.save(run.student, pos.global_step, "final model (no dev evaluation chose a best one)")
    pos.next_stage()
    if run.ranks.main:
        run.checkpoints.save((pos, run.student, run.keeper), run.stage_results)


def run_stages(run: Run, state: dict | None) -> None:
    """Run the remaining stages (from the checkpoint's position when `state` is given)."""
    for index in range(run.position.stage_index, len(run.stages)):
        run_stage(run, index, state)
        state = None
