"""A run from a task store (or a live teacher standing in for one): the task kind's `prepare` for `hsk train`.

`prepare_task` checks everything before the first step: the source (store or teacher), the method's stages
against the store (pipelines.methods), the student, its tokenizer against the store's, the layer pairs of every
stage (pipelines.train.losses.pairs) and the dev data (pipelines.train.data.dev). The driver
(pipelines.train.run.driver) does the rest, as for every kind: the run folder, checkpoints, resume, the one loop
and the summary.

Offline and online runs share everything but where the targets come from. Online mode builds an
in-memory source with the store's layout (same rows, same shards) and streams it with the same
StoreStream, so the data order is the same; the teacher then computes each batch's targets with
the dump's own code, cast to the store's dtypes and decoded by the same decode_batch. For the same
seed, offline and online losses agree to fp16 precision.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from hskstore.format.config import ConfigError, Selection
from hskstore.format.meta import StoreMeta
from pipelines.core.models import ModelLoadError
from pipelines.core.tasks import Task
from pipelines.methods import Context, get_method
from pipelines.registry import Method, MethodError, Stage, check_reads
from pipelines.train.data.dev import find_dev
from pipelines.train.data.sources import (
    TaskSource,
    check_expected_store,
    check_provenance,
    open_offline,
    open_online,
    student_encoding,
)
from pipelines.train.losses.pairs import PKD_RULES, LayerPair, layer_pairs
from pipelines.train.options import TrainOptions, run_options
from pipelines.train.run.checkpoints import RunIdentity
from pipelines.train.run.ddp import Ranks
from pipelines.train.run.driver import Notes, RunRequest
from pipelines.train.run.loop import Evaluator, RunParts, Student, TaskFeed
from pipelines.train.students.build import StudentInfo, build_student, student_depth
from pipelines.train.students.heads import Heads

_TEACHER_LAYERS = re.compile(r"(bert|sps)\d+")  # students made of the store teacher's first layers


def _plan(options: TrainOptions, source: TaskSource, notes: Notes, student: str) -> tuple[Method, object, list[Stage]]:
    """The method, its options and its stages, checked against the store before anything trains."""
    method = get_method(options.method)
    method_options = method.make_options(options.method_options)
    ctx = Context(source.task, source.selection, source.metadata, student=student,
                  student_layers=_depth(student, options.student_weights),
                  stored_targets=source.stored_targets())
    stages = method.stages(method_options, ctx)
    for msg in ctx.warnings:
        notes(msg)
    return method, method_options, stages


def run_problems(task: Task, selection: Selection, meta: StoreMeta, *, student: str, method: str,
                 method_options: dict, student_weights: str | None = None) -> list[str]:
    """Everything that stops a run on its store, found before anything is built: the method against
    the store (Method.stages: its check) and every stage's layer pairs for the student's depth
    (pairs.layer_pairs), each in the words `hsk train` refuses with. All problems at once, so one
    round of fixes is enough; `hsk train` and `hsk sweep` (for every planned run) call it."""
    m = get_method(method)
    try:
        check_reads(m, meta.objective, "the store")
    except MethodError as exc:
        return [str(exc)]
    opts = m.make_options(method_options)
    depth = student_depth(student, student_weights)
    ctx = Context(task, selection, meta, student=student, student_layers=depth)
    problems: list[str] = []
    try:
        stages = m.stages(opts, ctx)
    except MethodError as exc:
        problems.append(str(exc))
        try:  # the layer map can still be checked: every problem in one round (the [CLS] advice already is)
            stages = [st for st in m.build(opts, ctx) if st.pairs not in PKD_RULES]
        except ConfigError:
            stages = []
    for stage in stages:
        try:
            layer_pairs(stage.pairs, selection, depth, loss=stage.pair_loss or "", projection=False)
        except ConfigError as exc:
            problems.append(str(exc))
    return list(dict.fromkeys(problems))


def _depth(student: str, weights: str | None) -> int | None:
    try:
        return student_depth(student, weights)
    except ModelLoadError:
        return None  # building the student says why, in its own words


def _check_run(student: str, options: TrainOptions, source: TaskSource) -> None:
    """Refuse a run its store cannot serve, every problem in one line, before the student is built."""
    try:
        problems = run_problems(source.task, source.selection, source.metadata, student=student, method=options.method,
                                method_options=options.method_options, student_weights=options.student_weights)
    except ModelLoadError:
        return  # the student cannot be looked up: building it says why, in its own words
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} problems, fix them all: " + "; ".join(f"({i}) {p}" for i, p in
                                                                       enumerate(problems, 1)))


def _student(student: str, options: TrainOptions, source: TaskSource, stages: list[Stage], notes: Notes):
    """Build the student (seeded: the same student offline and online) and check it against the store."""
    torch.manual_seed(options.seed)
    np.random.seed(options.seed)
    random.seed(options.seed)
    task, sel = source.task, source.selection
    with_pairs = any(s.pairs for s in stages) and not sel.config.logits_only
    teacher = source.teacher_path(options.teacher)
    model, info = _build(student, options, teacher, task.num_labels, sel.hidden_size if with_pairs else None)
    for msg in info.warnings:
        notes.log(f"WARNING: {msg}")
    notes.items += info.warnings
    if task.labels:
        model.config.id2label = dict(enumerate(task.labels))
        model.config.label2id = {name: i for i, name in enumerate(task.labels)}
    positions = getattr(model.config, "max_position_embeddings", 1 << 30)
    if source.metadata.max_length > positions:
        raise ConfigError(f"the store's max length {source.metadata.max_length} exceeds the student's {positions} "
                          "positions")
    return model, info


def _build(student: str, options: TrainOptions, teacher: str, num_labels: int, teacher_width: int | None):
    """build_student; a bert<k> / sps<k> whose teacher cannot be found says which flag to pass."""
    try:
        return build_student(student, num_labels=num_labels, teacher_hidden_size=teacher_width,
                             base=options.student_base or teacher, weights=options.student_weights,
                             tokenizer_fallback=teacher)
    except ModelLoadError as exc:
        if options.student_base or options.teacher or not _TEACHER_LAYERS.fullmatch(student.strip().lower()):
            raise
        if Path(teacher).expanduser().is_dir():  # the teacher is where the store says: the problem is the student
            raise
        raise ModelLoadError(
            f"{student} starts from the first layers of the store's teacher, recorded at {teacher}, which cannot "
            f"be loaded ({exc}). If the teacher moved, pass --teacher DIR (where it is now; its weights are checked "
            "against the store's hash), or start from another checkpoint with --student-base"
        ) from exc


def _pairs(stages: list[Stage], source: TaskSource, info: StudentInfo, log: Callable) -> list[list[LayerPair]]:
    return [
        layer_pairs(stage.pairs, source.selection, info.num_layers, loss=stage.pair_loss or "",
                    projection=info.projection is not None and "projection" in stage.trains, log=log)
        for stage in stages
    ]


def _identity(options: TrainOptions, student: str, source: TaskSource, batch_size: int, method: Method,
              method_options: object) -> RunIdentity:
    """What a checkpoint must share with the run that resumes it (its store's inputs and selection too)."""
    return RunIdentity(method.name, method.option_dict(method_options), student,
                       source.content_address or str(source.store.url), source.mode, batch_size, run_options(options),
                       source.metadata.inputs, source.metadata.selection)


def _open_source(r: RunRequest) -> TaskSource:
    """The store to train from (checked against --expect-store), or the live teacher (online)."""
    if r.teacher is not None and r.task is None:
        raise ConfigError("online training (--teacher) needs --task")
    if r.store is None:
        return open_online(r.teacher, r.task, r.config, r.options, r.data_dir, r.log)
    source = open_offline(r.store, r.task)
    check_expected_store(source, r.options.expect_store)
    return source


def prepare_task(request: RunRequest) -> RunParts:
    """A run from a task store (or a live teacher): the method's plan, the student, its layer pairs, dev data."""
    options, student, data_dir, device, log, notes = (request.options, request.student, request.data_dir,
                                                      request.device, request.log, request.notes)
    source = _open_source(request)
    _check_run(student, options, source)
    method, method_options, stages = _plan(options, source, notes, student)
    dev = find_dev(source.task, source.metadata, data_dir, options.eval_limit, evaluate=options.evaluate, warn=notes)
    model, info = _student(student, options, source, stages, notes)
    pairs = _pairs(stages, source, info, log)
    student_inputs = _student_inputs(source, info, pairs, data_dir, notes, log)
    batch_size = options.batch_size or source.task.batch_size
    _check_ranks(request.ranks, batch_size, source)
    projection = info.projection.to(device) if info.projection is not None else None
    evaluator = Evaluator(source.task, dev.examples, info.tokenizer, source.metadata.max_length,
                          options.eval_batch_size, device, progress=options.progress and request.ranks.main)
    return RunParts(source, method, method_options, stages, Student(model.to(device), info, projection, Heads(model)),
                    pairs, TaskFeed(source, options.pad_to_max_length, student_inputs), evaluator, batch_size,
                    _identity(options, student, source, batch_size, method, method_options), dev)


def _student_inputs(source: TaskSource, info: StudentInfo, pairs: list[list[LayerPair]], data_dir: str | None,
                    notes: Notes, log: Callable[[str], object]) -> dict | None:
    """The student's own encoding of the rows when its tokenizer is not the store's (logits-only KD)."""
    token_level = any(p.feature == "tokens" for stage_pairs in pairs for p in stage_pairs)
    if check_provenance(source, info, token_level=token_level, log=log):
        return None
    notes.items.append("student tokenizer differs from the store's: logits-only KD on re-tokenized texts")
    return student_encoding(source, info.tokenizer, data_dir, log)


def _check_ranks(ranks: Ranks, batch_size: int, source: TaskSource) -> None:
    """Refuse a global batch or a store that cannot be split over the ranks, before anything is written."""
    ranks.local_batch(batch_size)
    if ranks.world_size > source.store.n_shards:
        raise ConfigError(f"{source.store.url} has {source.store.n_shards} shards, fewer than the "
                          f"{ranks.world_size} ranks: dump it with smaller --shard-rows, or use fewer ranks")


