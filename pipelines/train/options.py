"""`TrainOptions`: the run-wide choices of `hsk train` (the method's own options live with the method).

Each field says in its metadata whether it changes what a run computes (`result=True`, the default):
the sweep's run ids hash exactly those, plus the method's name and resolved options, so no list of
exclusions is kept anywhere else. Values out of range are refused, never replaced.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hskstore.format.config import ConfigError, check_at_least

if TYPE_CHECKING:  # the dump's options (torch-side); training options do not need them at runtime
    from pipelines.dump.stage import DumpOptions

# TrainOptions fields whose `hsk train` option has another name (pipelines/cli/names.py)
# Each reading thread and each shard read ahead holds a shard in memory: past these, memory runs out first.
_AT_MOST = {"workers": 256, "read_ahead": 4096, "buffer_shards": 4096}
CLI_FLAGS = {"buffer_shards": "shuffle-window", "workers": "read-threads", "train_limit": "limit", "evaluate": "eval"}


def cli_flag(name: str) -> str:
    """The `hsk train` option of a TrainOptions field (or of a method option): --max-steps for max_steps."""
    return f"--{CLI_FLAGS.get(name, name.replace('_', '-'))}"


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")  # torch.compile's modes (--compile-mode)
REPORT_TO = ("none", "tensorboard")  # --report-to: where metrics go besides metrics.jsonl (pipelines.core.run_state)
_NO = {"result": False}  # does not change what the run computes (where it runs, how it reports, ...)


@dataclass
class TrainOptions:
    # pipelines.methods registry name (`hsk methods`); None: a run that builds its own stage rather than a method's
    # (the masked-LM and causal-LM teachers of `hsk teacher`)
    method: str | None = "mud"
    method_options: dict[str, object] = field(default_factory=dict)  # fields of the method's options dataclass
    batch_size: int | None = None  # None: the task's (32; 64 for QNLI, MNLI, QQP)
    weight_decay: float = 0.01  # not on bias / LayerNorm
    max_grad_norm: float | None = 1.0  # BertAdam's default clipping in the reference code
    seed: int = 42
    buffer_shards: int = 4  # --shuffle-window: shards whose rows are shuffled together (part of the data order)
    max_steps: int | None = None  # cap on optimizer steps per stage
    eval_every: int | None = None  # steps (stages that keep the best); evaluation also runs at epoch ends
    eval_limit: int | None = None  # first N dev examples (quick runs)
    evaluate: bool = True  # False (--no-eval): train without dev data, save the last model
    train_limit: int | None = None  # online mode: first N training examples
    train_split: str = "train"  # online mode: the split to train on
    pad_to_max_length: bool = False  # pad every batch to the store's max length (benchmarks)
    student_base: str | None = field(default=None, metadata=_NO)  # bert<k>: where its layers come from
    student_weights: str | None = field(default=None, metadata=_NO)  # tinybert4 (or any student): local weights
    teacher: str | None = field(default=None, metadata=_NO)  # override of the store's teacher path (hash-checked)
    expect_store: str | None = field(default=None, metadata=_NO)  # refuse unless the store's content address
    device: str | None = field(default=None, metadata=_NO)
    # auto | fp32 | bf16 | fp16 (pipelines.core.precision). Not hashed as given ("auto" is no result): the
    # resolved precision is recorded in the run's checkpoint identity and its summary
    precision: str = field(default="auto", metadata=_NO)
    # torch.compile the student's forward and the loss terms (None: eager); "reduce-overhead" captures CUDA
    # graphs, which want static shapes (--pad-to-max-length). The same computation: not a result field
    compile: str | None = field(default=None, metadata=_NO)
    workers: int = field(default=2, metadata=_NO)  # stream prefetch threads (the CLI's --read-threads)
    # torch CPU threads the CLI set for a CPU run (None: not set, or not a CPU run): recorded in the summary
    threads: int | None = field(default=None, metadata=_NO)
    read_ahead: int = field(default=0, metadata=_NO)  # shards read ahead (0: one per thread); object stores
    log_every: int = field(default=50, metadata=_NO)
    heartbeat: float = field(default=60.0, metadata=_NO)  # seconds between progress lines on stdout (0: each log)
    checkpoint_every: int = field(default=500, metadata=_NO)
    eval_batch_size: int = field(default=64, metadata=_NO)
    data_dir: str | None = field(default=None, metadata=_NO)  # glue_data folder (else HSK_DATA_DIR, else hub)
    # online mode: the dump's choices the teacher computes targets with (None: logits only); not a training option
    online: DumpOptions | None = field(default=None, metadata=_NO)
    resume: bool = field(default=True, metadata=_NO)  # False: restart an unfinished run (never a finished one)
    overwrite: bool = field(default=False, metadata=_NO)  # replace a finished run, once the new one is complete
    progress: bool = field(default=True, metadata=_NO)
    report_to: str = field(default="none", metadata=_NO)  # besides metrics.jsonl: "tensorboard" event files

    def __post_init__(self) -> None:
        self.method_options = dict(self.method_options or {})
        at_least = {
            "batch_size": 1, "max_steps": 1, "eval_every": 1, "eval_limit": 1, "train_limit": 1,
            "buffer_shards": 1, "workers": 0, "read_ahead": 0, "log_every": 1, "checkpoint_every": 1,
            "eval_batch_size": 1, "threads": 1,
        }
        for name, low in at_least.items():
            check_at_least(cli_flag(name), getattr(self, name), low, high=_AT_MOST.get(name))
        check_report_to(self.report_to)
        if not self.heartbeat >= 0:
            raise ConfigError(f"--heartbeat must be >= 0 seconds, got {self.heartbeat}")
        self._check_choices()
        if self.weight_decay < 0 or (self.max_grad_norm is not None and self.max_grad_norm <= 0):
            raise ConfigError(
                f"weight decay must be >= 0 and max grad norm > 0 (got {self.weight_decay}, {self.max_grad_norm})"
            )


    def _check_choices(self) -> None:
        if self.compile is not None and self.compile not in COMPILE_MODES:
            raise ConfigError(f"--compile-mode {self.compile}: choose one of {', '.join(COMPILE_MODES)}")
        from pipelines.core.precision import STEP_PRECISIONS  # torch's side: imported when options are made

        if self.precision not in STEP_PRECISIONS:
            raise ConfigError(f"--precision {self.precision}: choose one of {', '.join(STEP_PRECISIONS)}")


def check_report_to(value: str) -> None:
    """--report-to: a known sink whose package is installed (checked without importing torch)."""
    if value not in REPORT_TO:
        raise ConfigError(f"--report-to {value}: choose one of {', '.join(REPORT_TO)}")
    if value == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("--report-to tensorboard needs the tensorboard package: pip install tensorboard")


def result_fields() -> list[str]:
    """The TrainOptions fields that change what a run computes (the sweep hashes them)."""
    return [f.name for f in dataclasses.fields(TrainOptions) if f.metadata.get("result", True)]


def run_options(options: TrainOptions) -> dict[str, object]:
    """The result fields beyond the method and its options (which are recorded on their own): what a
    rerun must share with a finished or checkpointed run to be that run (--max-steps, --eval-limit, ...)."""
    return {name: getattr(options, name) for name in result_fields() if name not in ("method", "method_options")}
