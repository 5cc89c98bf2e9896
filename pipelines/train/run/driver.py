"""`hsk train`'s driver: one run of any method from any kind of store (or from a live teacher), start to end.

The driver holds the run folder's lease, refuses a foreign or finished --out, looks the store's kind up
(pipelines.runkinds, whose `prepare` builds the run's parts: a task store in pipelines.train.kinds.distill, the
language-model stores in their kinds' modules), resumes a checkpoint of the same run (its `RunIdentity`), runs the
stages in the one loop (pipelines.train.run.loop) and writes the summary. What differs between kinds is in their
`prepare`; the run folder, checkpoints, resume, --overwrite and the summary are the same for all.

A run writes into out_dir: checkpoint/state.pt (a rerun resumes mid-stage), best/ (the best
student, `save_pretrained` model + tokenizer, loadable with plain transformers), metrics.jsonl (one
JSON record per log or eval step, each loss term on its own) and summary.json.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from hskstore.errors import StoreError
from hskstore.format.config import ConfigError
from hskstore.io.lease import Lease
from hskstore.io.location import location
from hskstore.io.outputs import OutputError, claim_output, mark_output, staged_replace
from pipelines import runkinds
from pipelines.core.output_kinds import RUN
from pipelines.core.precision import StepPrecision
from pipelines.core.run_state import write_json
from pipelines.methods import get_method
from pipelines.registry import check_reads
from pipelines.train.data.sources import TrainingSource, run_device
from pipelines.train.options import TrainOptions, run_options
from pipelines.train.run.checkpoints import Checkpoints, RunIdentity
from pipelines.train.run.ddp import Ranks
from pipelines.train.run.loop import Keeper, Run, RunParts, run_stages
from pipelines.train.run.setup import RunFolder, build_run, open_run
from pipelines.train.run.summary import RunSummary

logger = logging.getLogger("hsk.train")

__all__ = ["RUN_KIND", "Notes", "RunRequest", "RunSummary", "TrainOptions", "train"]

RUN_KIND = RUN.name  # the output kind of a run folder (pipelines.core.output_kinds)


class Notes:
    """Warnings of a run: logged, shown, and recorded in summary.json."""

    def __init__(self, log: Callable[[str], object]):
        self.log, self.items = log, []

    def __call__(self, msg: str) -> None:
        logger.warning(msg)
        self.log(f"WARNING: {msg}")
        self.items.append(msg)


@dataclass(frozen=True)
class RunRequest:
    """What `hsk train` asks of a store kind's run plan (its RunKind's `prepare(request) -> RunParts`), every
    option already checked: the run's options, the student, where its targets come from, its ranks and device."""

    options: TrainOptions
    student: str
    store: str | None
    ranks: Ranks
    device: str
    log: Callable[[str], object]
    notes: Notes
    teacher: str | None = None  # online training (the task kind's --teacher)
    task: str | None = None
    config: str | None = None
    data_dir: str | None = None


def train(
    options: TrainOptions,
    *,
    student: str,
    out_dir: str,
    store: str | None = None,
    teacher: str | None = None,
    task: str | None = None,
    config: str | None = None,
    data_dir: str | None = None,
    log: Callable[[str], object] = print,
    on_step: Callable[[dict], object] | None = None,
) -> RunSummary:
    """Train `student` with `options.method` and return the run summary (also out_dir/summary.json).

    Offline: `store` (a path or fsspec URL); `options.teacher` may name the store's teacher when it
    moved (its weights are checked). Online: `teacher` + `task` (+ `config`, default logits only;
    `options.online` holds the other dump choices and the shard layout). `on_step` is called with
    each step's record (tests use it to interrupt a run).

    Under torchrun (pipelines.train.run.ddp) every rank calls this; rank 0 alone writes into out_dir and
    logs, and every rank returns the summary.
    """
    ranks = Ranks.from_env(options.device)
    run = dict(student=student, store=store, teacher=teacher, task=task, config=config, data_dir=data_dir,
               log=log if ranks.main else _quiet, on_step=on_step)
    try:
        with _run_lease(out_dir, options.overwrite, ranks, run["log"]) as found:
            if found == "replace":
                summary = _replace(options, ranks, out_dir, run)
            else:
                summary = _train(options, ranks, out_dir=out_dir, **run)
            ranks.barrier()  # nobody leaves while rank 0 still writes
        return summary
    finally:
        ranks.close()


@contextlib.contextmanager
def _run_lease(out_dir: str, overwrite: bool, ranks: Ranks, log: Callable[[str], object]) -> Iterator[str]:
    """Hold the run folder's writer lease (hskstore.io.lease) for the whole run, so that a second run on the same
    --out is refused before it reads or changes anything there. Yields what claim_output found ("new", "resume",
    "replace"); a foreign --out is refused before the lease file is created in it. A new folder that a refused or
    failed run leaves holding nothing is removed. Rank 0 alone holds it (the other ranks write nothing)."""
    found = claim_output(out_dir, RUN_KIND, overwrite=overwrite)
    if not ranks.main:
        yield found
        return
    lease = Lease(out_dir, log=log, kind=RUN_KIND).acquire()
    refused = False
    try:
        yield found
    except StoreError:
        refused = True  # the store was refused (a forged or damaged shard): what the run wrote holds no work
        raise
    finally:
        lease.release()
        if found == "new":
            _remove_new_folder(out_dir, refused)


def _remove_new_folder(out_dir: str, refused: bool) -> None:
    """A new run folder that a refused or failed run leaves holding nothing is removed; one whose store was refused
    before its first checkpoint holds only its marker and metrics (no work): it goes too."""
    with contextlib.suppress(OSError):
        if refused and not (Path(out_dir) / RunFolder.state_file).parent.exists():
            location(out_dir).remove_tree()
        else:
            location(out_dir).remove_empty_folder()


def _quiet(*_: object) -> None:
    pass


def _replace(options: TrainOptions, ranks: Ranks, out_dir: str, run: dict) -> RunSummary:
    """--overwrite: train afresh in a hidden sibling and swap it in once it is complete (the output rule:
    a killed overwrite leaves the old run as it was). Rank 0 alone writes; the other ranks write nothing."""
    fresh = dataclasses.replace(options, resume=False)  # overwrite stays: the old run is no obstacle
    if not ranks.main:
        return _train(fresh, ranks, out_dir=out_dir, **run)
    with staged_replace(out_dir) as staged:
        summary = _train(fresh, ranks, out_dir=staged, **run)
        summary = dataclasses.replace(summary, model_dir=str(Path(out_dir) / "best"))
        write_json(Path(staged) / "summary.json", summary.to_json())
    run["log"](f"{out_dir}: replaced by this run (--overwrite)")
    return summary


def _same_finished(out: Path, identity: RunIdentity, student: str, source: TrainingSource, method,
                   method_options, options: TrainOptions) -> bool:
    """A finished run whose checkpoint was removed (a sweep keeps only best/) is this run when its summary holds
    this run's identity (the one its checkpoint held); a summary of an older hsk, without one, when it names the same
    student, store, method, method options, run options and precision (_same_summary)."""
    try:
        done = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    if done.get("identity"):
        return done["identity"] == identity.to_json()
    return _same_summary(done, student, source, method, method_options, options, identity.precision)


def _same_summary(done: dict, student: str, source: TrainingSource, method, method_options, options: TrainOptions,
                  precision: str) -> bool:
    """An older summary (no identity) is this run's when it names the same student, store, method, method options,
    run options and precision (one written before run options were recorded is judged without them; one without a
    precision ran in fp32)."""
    wanted = json.loads(json.dumps(asdict(method_options), default=str))
    named = done.get("student") or {}  # a dict (StudentInfo.describe); a name in older pre-training summaries
    return (done.get("method") == method.name and done.get("source") == str(source.store.url)
            and (named.get("name") if isinstance(named, dict) else named) == student
            and json.loads(json.dumps(done.get("method_options"), default=str)) == wanted
            and done.get("options", run_options(options)) == run_options(options)
            and done.get("precision", "fp32") == precision)


def _resume(checkpoints: Checkpoints, options: TrainOptions, out: Path, log: Callable, same_finished: Callable,
            n_stages: int) -> tuple[dict | None, bool]:
    """(the state to continue from, whether this very run already finished); a finished run that this
    command would start over is refused (the output rule)."""
    finished = (out / "summary.json").exists()
    state = checkpoints.resume(options.resume, out, log, finished=finished)
    if state is not None:
        finished_same = state["position"]["stage_index"] >= n_stages
    else:
        finished_same = options.resume and finished and same_finished()
    _refuse_finished(out, options, finished_same)
    return state, finished_same and finished


def _refuse_finished(out: Path, options: TrainOptions, finished_same: bool) -> None:
    """A finished run is an output: only --overwrite replaces it (--no-resume restarts unfinished runs)."""
    summary = out / "summary.json"
    if options.overwrite or not summary.exists() or finished_same and options.resume:
        return
    try:
        method = json.loads(summary.read_text()).get("method", "?")
    except ValueError:
        method = "?"
    why = "--no-resume restarts only an unfinished run" if not options.resume else "this command cannot resume it"
    raise OutputError(f"{out} holds a finished run (method {method}, {summary}): {why}; pass --overwrite to "
                      "replace it (once the new run is complete), or choose another --out")


def _train(
    options: TrainOptions,
    ranks: Ranks,
    *,
    student: str,
    out_dir: str,
    store: str | None,
    teacher: str | None,
    task: str | None,
    config: str | None,
    data_dir: str | None,
    log: Callable[[str], object],
    on_step: Callable[[dict], object] | None,
) -> RunSummary:
    if (store is None) == (teacher is None):
        raise ConfigError("give either --store (offline) or --teacher with --task and --config (online)")
    kind = _store_kind(store)
    implied = options.method is None
    options = _with_method(options, kind, store)
    prepare = runkinds.get(kind).load("prepare")  # the run plan of the store's kind
    claim_output(out_dir, RUN_KIND, overwrite=False)  # refuse a foreign --out before anything else
    out = Path(out_dir)
    notes = Notes(log)
    device = ranks.device(run_device(options))
    precision = StepPrecision.resolve(options.precision, device)  # refused here, before anything loads
    parts = prepare(RunRequest(options, student, store, ranks, device, log, notes, teacher, task, config,
                               data_dir or options.data_dir))
    if implied:  # said once everything is checked: a refusal stays one line
        log(f"method: {options.method} (what a {kind} store trains with unless --method says otherwise; `hsk methods` "
            "lists them)")
    folder = RunFolder(out, parts.identity)  # the user's run folder: another run's checkpoint is refused
    checkpoints, _ = open_run(folder, precision, log)
    state, already_done = _resume(checkpoints, options, out, log, lambda: _same_finished(
        out, checkpoints.full_identity, student, parts.source, parts.method, parts.method_options, options),
        len(parts.stages))
    if ranks.main:
        mark_output(str(out), RUN_KIND, method=parts.method.name)  # everything is checked: now the folder is ours
    ranks.barrier()
    if already_done:
        log(f"{out}: this run already finished; its summary is in {out / 'summary.json'}")
        return RunSummary.read(out / "summary.json")
    if ranks.distributed:  # the same initial weights (DDP broadcasts rank 0's), but each rank its own dropout
        torch.manual_seed(options.seed + ranks.rank)
    run = build_run(folder, checkpoints, state, options=options, feed=parts.feed, task=parts.source.task,
                    student=parts.student, stages=parts.stages, pairs=parts.pairs, device=device,
                    batch_size=parts.batch_size, evaluator=parts.evaluator,
                    keeper=Keeper(out, parts.source.task, str(parts.source.store.url)), log=log, on_step=on_step,
                    ranks=ranks)
    try:
        run_stages(run, state)
    finally:
        if parts.source.teacher is not None:
            parts.source.teacher.to("cpu")
    summary = _summary(run, parts, notes.items, out)
    if ranks.main:
        write_json(out / "summary.json", summary.to_json())
    _log_done(summary, parts, log)
    return summary


def _store_kind(store: str | None) -> str:
    """The kind of the store a run reads (its metadata's objective); a live teacher's targets are a task store's."""
    if store is None:
        return "task"
    from hskstore.io.reader import open_store

    return open_store(store, allow_incomplete=True).objective


def _with_method(options: TrainOptions, kind: str, store: str | None) -> TrainOptions:
    """The options with the method that runs: --method, or the kind's default (said once the run is checked); a
    method that cannot read the store's kind is refused naming those that can."""
    if options.method is None:
        options = dataclasses.replace(options, method=runkinds.get(kind).default_method)
    check_reads(get_method(options.method), kind, store or "a live teacher's targets")
    return options


def _log_done(summary: RunSummary, parts: RunParts, log: Callable[[str], object]) -> None:
    if summary.metric is None:
        losses = {name: stage["final_loss"] for name, stage in summary.stages.items()}
        log(f"done: {summary.steps} steps, final loss {losses}; student in {summary.model_dir} ({parts.done_note})")
        return
    log(f"done: {summary.metric} {summary.score} (best student in {summary.model_dir}); "
        f"{summary.examples_per_s:.1f} examples/s")


def _summary(run: Run, parts: RunParts, warnings: list[str], out: Path) -> RunSummary:
    pos, source = run.position, parts.source
    return RunSummary(
        mode=source.mode, source=str(source.store.url),
        store_content_address=source.content_address, stores_read=source.stores_read(),
        method=parts.method.name, method_options=asdict(parts.method_options), options=run_options(run.options),
        plan=[stage.describe() for stage in run.stages], student=run.student.info.describe(),
        student_init=run.student.info.init, stages=run.stage_results, steps=pos.global_step, examples=pos.examples_seen,
        train_seconds=pos.train_seconds,
        examples_per_s=pos.examples_seen / pos.train_seconds if pos.train_seconds else 0.0,
        model_dir=str(out / "best"), store_bytes=source.bytes_read(run.names_read()), batch_size=run.batch_size,
        world_size=run.ranks.world_size, torch_threads=run.options.threads, precision=run.precision.name,
        compile=run.options.compile, warnings=warnings, identity=run.checkpoints.full_identity.to_json(),
        **_task_fields(run, parts),
    )


def _task_fields(run: Run, parts: RunParts) -> dict[str, object]:
    """The summary's fields a task run has (a masked-LM run leaves them at their defaults)."""
    if run.task is None:
        return {}
    best, pairs = run.keeper.best or {}, [p for stage_pairs in run.pairs for p in stage_pairs]
    return {
        "task": run.task.name, "metric": run.task.metric, "score": best.get("score"), "best_step": best.get("step"),
        "dev": best.get("metrics"), "dev_data": parts.dev.describe(),
        "eval_on_training_split": parts.dev.on_training_split,
        "layer_pairs": [p.describe() for p in pairs],
        "layer_map": [{"kept_layer": p.kept, "student_entry": p.student_layer, "teacher_layer": p.teacher_layer}
                      for p in dict.fromkeys(pairs)],
        "config": str(parts.source.selection.config),
    }
