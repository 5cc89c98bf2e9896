"""One setup for every kind of training run around the one loop (pipelines.train.run.loop).

`hsk train` (the task methods, and LightPAFF pre-training on a masked-LM store), `hsk teacher` and the
masked-LM teacher each prepare their own parts (source, student, stages, evaluator); what surrounds the
loop is the same for all and made here: the step's precision (and torch.compile, a TrainOptions field
the loop reads), the checkpoint with the run's identity (precision included), the resume policy of the
folder, the metrics log, and the `Run` restored from its checkpoint.

Two resume policies, by whose folder the run writes into:
- a user's run folder (`hsk train --out`): another run's checkpoint is refused in one line (the caller
  decides about finished runs: pipelines.train.run.driver);
- a command's own work folder (`hsk teacher`'s hidden sibling): another run's checkpoint is started over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipelines.core.precision import StepPrecision
from pipelines.core.run_state import MetricsLog, report_sinks
from pipelines.core.tasks import Task
from pipelines.train.options import TrainOptions
from pipelines.train.run.checkpoints import Checkpoints, RunIdentity, work_state
from pipelines.train.run.ddp import Ranks, SilentLog
from pipelines.train.run.loop import Evaluator, Feed, Keeper, Run, Student, run_stages


@dataclass
class RunFolder:
    """Where a run keeps its checkpoint and metrics.jsonl, and what a checkpoint there must share with the run
    that resumes it (the precision is added to `identity`)."""

    path: Path
    identity: RunIdentity
    state_file: str = "checkpoint/state.pt"
    own: bool = False  # the command's own work folder: another run's checkpoint is started over, not refused

    def checkpoints(self, precision: StepPrecision) -> Checkpoints:
        """The run's checkpoints, in the precision the run resolved at its start."""
        return Checkpoints(self.path / self.state_file, self.identity, precision)


def open_run(folder: RunFolder, precision: StepPrecision,
             log: Callable[[str], object]) -> tuple[Checkpoints, dict | None]:
    """The run's checkpoints and the state to continue from: in a work folder of the command's own, another
    run's checkpoint is started over; in a user's folder `Checkpoints.resume` refuses it (pipelines.train.run.driver
    calls that itself, as it also judges finished runs)."""
    checkpoints = folder.checkpoints(precision)
    if folder.own:
        return checkpoints, work_state(checkpoints, log)
    return checkpoints, None


def build_run(folder: RunFolder, checkpoints: Checkpoints, state: dict | None, *, options: TrainOptions, feed: Feed,
              task: Task | None, student: Student, stages: list, pairs: list, device: str, batch_size: int,
              evaluator: Evaluator | None, keeper: Keeper, log: Callable[[str], object],
              on_step: Callable[[dict], object] | None = None, ranks: Ranks | None = None) -> Run:
    """The loop's Run of any kind of training, restored from `state` (a checkpoint of this run) when given.
    Rank 0 alone writes metrics.jsonl (and the --report-to event files)."""
    ranks = ranks or Ranks()
    metrics_log = (MetricsLog(folder.path / "metrics.jsonl", state["progress"]["step"] if state else None,
                              report_sinks(options.report_to, folder.path)) if ranks.main else SilentLog())
    run = Run(options=options, feed=feed, task=task, student=student, stages=stages, pairs=pairs, device=device,
              batch_size=batch_size, evaluator=evaluator, keeper=keeper, checkpoints=checkpoints,
              metrics_log=metrics_log, log=log, on_step=on_step, ranks=ranks)
    if state is not None:
        run.restore(state)
    return run


def train_in_own_folder(work: Path, identity: RunIdentity, precision: StepPrecision, *,
                        state_file: str = RunFolder.state_file, log: Callable[[str], object], **parts: object) -> Run:
    """A command's run in its own work folder (`hsk teacher`'s hidden sibling), start to end: the checkpoint there
    is resumed when it is this run's (another run's is started over), then the loop runs every stage left.
    `parts`: build_run's (options, feed, task, student, stages, ...)."""
    folder = RunFolder(work, identity, state_file, own=True)
    checkpoints, state = open_run(folder, precision, log)
    run = build_run(folder, checkpoints, state, log=log, **parts)
    run_stages(run, state)
    return run
