"""`hsk train`'s flags as typed fields (pipelines.core.flags): the run's own, and the method options every kind's
methods share. A kind's own flags (its methods' options, the task kind's online mode) are declared in its module
(pipelines/kinds/<kind>.py: `RunKind.method_flags`, `RunKind.train_options`); pipelines.cli.train_commands builds
the command from all of them. Torch-free: the CLI reads these before torch is imported.

    common = TrainCommon(student="bert3", out="runs/x", store="sst2.zarr")
    options = common.options({"epochs": 2.0}, threads=None)   # -> pipelines.train.options.TrainOptions
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipelines.core.flags import flag
from pipelines.core.threads import THREADS_HELP
from pipelines.runkinds import METHOD

if TYPE_CHECKING:  # built when a run starts: `hsk dump` and `hsk --help` import no training code
    from pipelines.train.options import TrainOptions

# `hsk train --help` headings ("": listed first, under "Options": what the run is)
TOP = ""
STUDENTS = "Students"
READING = "Reading the store"
EVAL = "Evaluation, checkpoints and logs"


@dataclass(frozen=True)
class TrainCommon:
    """The `hsk train` flags of every run: its source, student and folder, how it steps, reads, evaluates, logs."""

    store: str | None = flag(None, "Store path or fsspec URL (offline mode).", "--store", "-s", section=TOP)
    student: str = flag(..., "tinybert4, bert<k> (e.g. bert3), sps<k> (PEA-KD), or a hub id / folder (--init: the "
                        "same, e.g. a lightpaff-pretrain OUT/best).", "--student", "--init", section=TOP)
    out: str = flag(..., "Run folder: checkpoint/, best/, metrics.jsonl, summary.json.", "--out", "-o", section=TOP)
    method: str | None = flag(None, "Distillation method (`hsk methods` lists them) [default: the store kind's: mud "
                              "(task), lightpaff-pretrain (mlm), clm-kd, s2s-kd].", "--method", "-m", section=TOP)
    batch_size: int | None = flag(None, "Batch size [default: 32; 64 for QNLI, MNLI, QQP].", section=TOP)
    seed: int = flag(0, "Seed of the student init, dropout and data order.", section=TOP)
    device: str | None = flag(None, "torch device [default: cuda when available, else cpu].", section=TOP)
    precision: str = flag("auto", "Step precision: auto (bf16 on a GPU that has it, else fp32), fp32, bf16 or fp16 "
                          "(loss scaling). Part of the run: a checkpoint resumes only in its own precision.",
                          section=TOP)
    compile: bool = flag(False, "torch.compile the student's forward and losses (slow first steps).",
                         "--compile/--no-compile", section=TOP)
    compile_mode: str = flag("default", "With --compile: default, reduce-overhead (CUDA graphs; add "
                             "--pad-to-max-length for static shapes) or max-autotune.", section=TOP)
    pad_to_max_length: bool = flag(False, "Pad every batch to the store's max length (static shapes).",
                                   "--pad-to-max-length", section=READING)
    read_threads: int = flag(2, "Threads reading (and decoding) store shards.", "--read-threads", section=READING)
    read_ahead: int = flag(0, "Shards read ahead [default: one per --read-threads]; more hides S3 latency.",
                           section=READING)
    threads: int | None = flag(None, THREADS_HELP, "--threads", section=TOP)
    shuffle_window: int = flag(4, "Shards whose rows are shuffled together (data order; memory).",
                               section=READING)
    max_steps: int | None = flag(None, "Cap on optimizer steps per stage.", section=TOP)
    eval_every: int | None = flag(None, "Evaluate every N steps of stages that keep the best checkpoint.",
                                  section=EVAL)
    eval_limit: int | None = flag(None, "Evaluate on the first N dev examples only.", section=EVAL)
    evaluate: bool = flag(True, "--no-eval: train without dev data.", "--eval/--no-eval", section=EVAL)
    checkpoint_every: int = flag(500, "Save a resumable checkpoint every N steps.", section=EVAL)
    log_every: int = flag(50, "Write a metrics.jsonl record every N steps.", section=EVAL)
    heartbeat: float = flag(60.0, "Print a progress line (step, loss, examples/s, time left) at most every N "
                            "seconds, on steps that log (0: on every one).", section=EVAL)
    student_base: str | None = flag(None, "bert<k>: checkpoint whose first k layers start the student.",
                                    section=STUDENTS)
    student_weights: str | None = flag(None, "Local weights folder for the student (e.g. TinyBERT4).",
                                       section=STUDENTS)
    data_dir: str | None = flag(None, "glue_data folder for dev data (or set HSK_DATA_DIR); else the hub.",
                                section=EVAL)
    expect_store: str | None = flag(None, "Refuse the store unless its content address is this one.",
                                    section=READING)
    teacher: str | None = flag(None, "With --store: where the store's teacher is now (weights checked). Without: "
                               "online mode.", section=TOP)
    resume: bool = flag(True, "Resume from OUT/checkpoint when there is one; --no-resume restarts an unfinished run "
                        "(a finished one is replaced only with --overwrite).", section=TOP)
    overwrite: bool = flag(False, "Replace a finished run at OUT (trained in a hidden sibling, swapped in once "
                           "complete).", "--overwrite", section=TOP)
    progress: bool = flag(True, "Show a progress bar.", section=EVAL)
    report_to: str = flag("none", "Also write the metrics as TensorBoard event files beside metrics.jsonl: none or "
                          "tensorboard (needs `pip install tensorboard`).", section=EVAL)

    @property
    def online(self) -> bool:
        """--teacher without --store: the teacher computes each batch's targets."""
        return bool(self.teacher) and not self.store

    def source(self) -> RunSource:
        """Where the targets come from; the kinds' own flags add theirs (the task of an online run, ...)."""
        return RunSource(self.store, self.teacher if self.online else None)

    def options(self, method_options: dict[str, object], threads: int | None) -> TrainOptions:
        """The run's TrainOptions (`threads`: the torch CPU threads set for a CPU run, recorded; else None)."""
        from pipelines.train.options import TrainOptions

        return TrainOptions(
            method=self.method, method_options=method_options, batch_size=self.batch_size, seed=self.seed,
            threads=threads, device=self.device, precision=self.precision,
            compile=self.compile_mode if self.compile else None, pad_to_max_length=self.pad_to_max_length,
            workers=self.read_threads, buffer_shards=self.shuffle_window, max_steps=self.max_steps,
            eval_every=self.eval_every, eval_limit=self.eval_limit, read_ahead=self.read_ahead,
            evaluate=self.evaluate, checkpoint_every=self.checkpoint_every, log_every=self.log_every,
            heartbeat=self.heartbeat, student_base=self.student_base, student_weights=self.student_weights,
            data_dir=self.data_dir, resume=self.resume, overwrite=self.overwrite, progress=self.progress,
            expect_store=self.expect_store, report_to=self.report_to, teacher=None if self.online else self.teacher)


@dataclass(frozen=True)
class MethodCommon:
    """The `hsk train` flags of method options that the methods of several kinds share (each method takes the
    fields its options dataclass has; pipelines.registry refuses the others)."""

    epochs: float | None = flag(None, "kd, pkd-*, finetune: epochs [default: 4].", section=METHOD)
    lr: float | None = flag(None, "kd, pkd-*, finetune: learning rate, linear decay [default: per task].",
                            section=METHOD)
    temperature: float | None = flag(None, "Softmax temperature T [mud 1, kd/pkd 10].", section=METHOD)
    lam: float | None = flag(None, "lightpaff*: (1-l) MLE(gold) + l KL(teacher) [pretrain 1.0, lightpaff 0.5].",
                             section=METHOD)


@dataclass
class RunSource:
    """Where a run's targets come from: a store (offline), or a live teacher (online) on a task's data."""

    store: str | None = None
    teacher: str | None = None  # online mode's teacher (None with a store: TrainOptions.teacher says where it moved)
    task: str | None = None
    config: str | None = None  # online mode: ND,NL,W of the targets
