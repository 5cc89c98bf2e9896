"""The task kind's compute: a fine-tuned classifier's logits and hidden-state knowledge (`--objective task`).

Its dump runs the classifier over a task split (pipelines.dump.stage, or pipelines.dump.distributed on a dask
cluster), its run plan is pipelines.train.kinds.task, its teacher is fine-tuned by pipelines.train.kinds.teacher
and its models are scored on the task's dev data (pipelines.train.run.evaluate).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from hskstore.errors import UserError
from hskstore.format.config import (
    BATCH_SIZE,
    ENGINE,
    L_TOP,
    MAX_LENGTH,
    PRECISION,
    RANKING,
    SCORES,
    SHARD_ROWS,
    STUDENT_LAYERS,
    TOKENS,
    VALUES,
    WIDTH,
    WIDTH_SEED,
    ConfigError,
    HSKConfig,
)
from pipelines.core.flags import flag
from pipelines.runkinds import FORWARD, METHOD, TOP, DumpCommon, EvalCommon, Log, RunKind, TeacherCommon, warn

if TYPE_CHECKING:  # what the dump and train read (imported when they run: `hsk dump` imports no training code)
    from pipelines.dump.stage import DumpOptions
    from pipelines.train.options import TrainOptions
    from pipelines.train_flags import RunSource

HEADING = "The knowledge of a task store (--task --config)"


@dataclass(frozen=True)
class TaskDumpOptions:
    """`hsk dump --objective task`: the task split to run, the knowledge to keep (--config) and how."""

    task: str | None = flag(None, "GLUE task (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli).", "--task", "-t",
                            section=TOP)
    config: str | None = flag(None, "ND,NL,W e.g. 3,8,0.2 (layers, tokens, width ratio).", "--config", "-c",
                              section=TOP)
    split: str = flag("train", "Split to dump: train, dev, dev_matched, dev_mismatched.", section=TOP)
    data_dir: str | None = flag(None, "Local glue_data folder (or set HSK_DATA_DIR); else the HF hub.", section=TOP)
    data_file: str | None = flag(None, "Your own csv/tsv/json/parquet file instead of GLUE.", section=TOP)
    text_columns: str | None = flag(None, "Text columns of --data-file, e.g. 'question,sentence'.", section=TOP)
    label_column: str | None = flag(None, "Gold label column of --data-file (optional).", section=TOP)
    limit: int | None = flag(None, "Dump only the first N examples.", section=TOP)
    student_layers: int | None = flag(STUDENT_LAYERS.default, STUDENT_LAYERS.help, STUDENT_LAYERS.flag)
    l_top: int | None = flag(L_TOP.default, L_TOP.help, L_TOP.flag)
    layers: str | None = flag(None, "Explicit teacher layers instead of a layer map, e.g. '2,4,6'.")
    tokens: str = flag(TOKENS.default, TOKENS.help, TOKENS.flag)
    ranking: str = flag(RANKING.default, RANKING.help, RANKING.flag)
    scores: str = flag(SCORES.default, SCORES.help, SCORES.flag)
    width: str = flag(WIDTH.default, WIDTH.help, WIDTH.flag)
    width_seed: int = flag(WIDTH_SEED.default, WIDTH_SEED.help, WIDTH_SEED.flag)
    values: str = flag(VALUES.default, VALUES.help, VALUES.flag)
    attention_rows: bool = flag(False, "Also keep, per kept layer above the embeddings, the pre-softmax attention "
                                "scores of the kept tokens' query rows [heads, NL, T] (fp16): what `hsk train "
                                "--method tinybert-att` reads.", "--attention-rows")
    max_length: int | None = flag(MAX_LENGTH.default, MAX_LENGTH.help, MAX_LENGTH.flag)
    allow_task_mismatch: bool = flag(False, "Use a teacher whose label names or task say it was fine-tuned for "
                                     "another task (recorded in the store).", "--allow-task-mismatch")
    batch_size: int = flag(BATCH_SIZE.default, BATCH_SIZE.help, BATCH_SIZE.flag, section=FORWARD)
    shard_rows: int = flag(SHARD_ROWS.default, SHARD_ROWS.help, SHARD_ROWS.flag, section=FORWARD)
    selection_engine: str = flag(ENGINE.default, ENGINE.help, ENGINE.flag, section=FORWARD)
    precision: str = flag(PRECISION.default, PRECISION.help, PRECISION.flag, section=FORWARD)
    write_processes: int = flag(0, "Processes that compress and write shards, beside the one that runs the teacher "
                                "(0: its threads). For a GPU host with many cores, where the writes' Python part "
                                "would otherwise share one GIL with tokenizing and the GPU's launches; the same bytes "
                                "either way.", "--write-processes", section=FORWARD)
    workers: int | None = flag(None, "Dump on a local dask cluster of N processes, each computing and writing whole "
                               "shards (one GPU per worker with --device cuda).", section=FORWARD)
    scheduler: str | None = flag(None, "Dump on a running dask cluster (tcp://HOST:PORT); every worker must reach "
                                 "the teacher, the data it is sent and --out.", section=FORWARD)

    def layer_list(self) -> list[int] | None:
        if not self.layers:
            return None
        try:
            return [int(x) for x in self.layers.split(",")]
        except ValueError:
            raise UserError(f"--layers takes comma-separated layer numbers like '4,8,12', got {self.layers!r}"
                            ) from None

    def data(self) -> dict[str, object]:
        """The keyword arguments of the dump's data loading."""
        return dict(split=self.split, data_dir=self.data_dir, data_file=self.data_file, limit=self.limit,
                    label_column=self.label_column,
                    text_columns=self.text_columns.split(",") if self.text_columns else None)


def dump(options: TaskDumpOptions, common: DumpCommon, log: Log) -> None:
    """A task store: a fine-tuned classifier's logits and the HSK of --config."""
    layers = options.layer_list()
    parsed = HSKConfig.parse(options.config) if options.config else None
    if not options.task or not parsed:
        raise ConfigError("hsk dump needs --task and --config (or --objective mlm with --text-file for an MLM store)")
    from pipelines.core.devices import pick_device
    from pipelines.core.precision import cpu_half_warning
    from pipelines.core.tasks import get_task
    from pipelines.dump.stage import DumpOptions

    # the declared flags (--tokens, --width, ...) by their declarations; the rest by name
    stage = DumpOptions.from_flags(
        vars(options), config=parsed, layers=layers, attention_rows=options.attention_rows,
        device=pick_device(common.device), overwrite=common.overwrite, progress=common.progress,
        allow_task_mismatch=options.allow_task_mismatch, write_processes=options.write_processes,
        extra_meta=common.sharing())
    stage.validate()  # before anything else: a bad value never costs a loaded teacher or a store
    if note := cpu_half_warning(options.precision, stage.device):
        warn(note)
    task = get_task(options.task).name
    teacher = _task_teacher(task, common.teacher)
    out = common.out or f"{task}.zarr"
    _run(task, stage, teacher, out, options, common.threads, log)


def _task_teacher(task: str, teacher: str | None) -> str:
    """--teacher, or where `hsk teacher --task TASK` saves (refused in one line when nothing is there)."""
    from pipelines.core.tasks import default_teacher_dir

    if teacher is not None:
        return teacher
    teacher = default_teacher_dir(task)
    if not Path(teacher).is_dir():
        raise ConfigError(
            f"no --teacher given and no teacher at {Path(teacher).absolute()}: fine-tune one with `hsk teacher "
            f"--task {task}` (it saves there), or pass --teacher CHECKPOINT (a hub id or a folder)"
        )
    return teacher


def _run(task: str, stage: DumpOptions, teacher: str, out: str, options: TaskDumpOptions, threads: int | None,
         log: Log) -> None:
    """A task dump in this process, or on a dask cluster (--workers/--scheduler)."""
    from pipelines.core.threads import use_threads

    if options.workers is not None or options.scheduler is not None:
        from pipelines.dump.distributed import dump_distributed

        if options.write_processes:
            raise ConfigError("--write-processes and --workers/--scheduler: each dask worker already writes its own "
                              "shards; drop --write-processes")
        dump_distributed(task, stage, teacher=teacher, out=out, workers=options.workers, scheduler=options.scheduler,
                         threads_per_worker=threads, log=log, **options.data())
    else:
        from pipelines.dump.stage import dump as run_dump

        use_threads(threads, "dump")  # recorded in the store's compute record (CPU bytes depend on it)
        run_dump(task, stage, teacher=teacher, out=out, log=log, **options.data())
    log(f"done: {out} (see `hsk info {out}`)")


@dataclass(frozen=True)
class TaskTeacherOptions:
    """`hsk teacher --objective task`: fine-tune a classifier on a GLUE task (or your labelled file)."""

    task: str | None = flag(None, "GLUE task to fine-tune on.", "--task", "-t")
    data_dir: str | None = flag(None, "Local glue_data folder (or set HSK_DATA_DIR); else the HF hub.")
    data_file: str | None = flag(None, "Your own labelled csv/tsv/json/parquet file.")
    max_length: int | None = flag(None, "Max tokens [default: the task's].")
    train_limit: int | None = flag(None, "Use only the first N training examples.", "--limit")
    eval_limit: int | None = flag(None, "Evaluate on only the first N dev examples.")


def teacher(options: TaskTeacherOptions, common: TeacherCommon, device: str, log: Log) -> None:
    from pipelines.core.tasks import default_teacher_dir, get_task
    from pipelines.train.kinds.teacher import fine_tune_teacher

    if not options.task:
        raise ConfigError("hsk teacher needs --task (or --objective mlm --text-file FILE for an MLM teacher)")
    fine_tune_teacher(  # it says "teacher saved to OUT (best epoch N: dev ...)"
        get_task(options.task), common.base, common.out or default_teacher_dir(options.task),
        data_dir=options.data_dir, data_file=options.data_file, epochs=common.epochs, lr=common.lr,
        batch_size=common.batch_size, max_length=options.max_length, train_limit=options.train_limit,
        eval_limit=options.eval_limit, seed=common.seed, device=device, precision=common.precision,
        overwrite=common.overwrite, progress=common.progress, log=log)


@dataclass(frozen=True)
class TaskEvalOptions:
    """`hsk eval MODEL --task T`: a classifier on a task's dev data."""

    task: str | None = flag(None, "GLUE task the model was trained for.", "--task", "-t")
    split: str = flag("dev", "dev (all dev splits; MNLI: matched and mismatched), or one split.")
    data_dir: str | None = flag(None, "glue_data folder (or set HSK_DATA_DIR); else the HF hub.")
    max_length: int | None = flag(None, "Max tokens per example [default: 64 for CoLA/SST-2, else 128].")
    allow_task_mismatch: bool = flag(False, "Evaluate a model whose labels or task say it was made for another "
                                     "task.", "--allow-task-mismatch")


def evaluate(model: str, options: TaskEvalOptions, common: EvalCommon, device: str, log: Log) -> None:
    import json

    from pipelines.train.run.evaluate import evaluate_model

    result = evaluate_model(model, options.task, split=options.split, data_dir=options.data_dir,
                            batch_size=common.batch_size, max_length=options.max_length, device=device,
                            limit=common.limit, allow_task_mismatch=options.allow_task_mismatch,
                            progress=True)  # on a terminal only
    if common.as_json:
        log(json.dumps(result, indent=2))
        return
    if result["task_fit"] == "mismatch allowed":
        warn(f"WARNING: {model} was made for another task; evaluated on {result['task']} as asked")
    for name, metrics in result["splits"].items():
        shown = "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
        log(f"{result['task']}/{name}: {shown}")


# `hsk train --help`'s heading of the online mode's flags
ONLINE = "Online mode (--teacher without --store: the teacher computes each batch's targets)"


@dataclass(frozen=True)
class TaskMethodFlags:
    """The `hsk train` flags of the task methods' options (mud, kd, pkd-*, pea, tinybert-att, lightpaff): each
    method takes the fields its options dataclass has (pipelines.methods); the others are refused."""

    stages: str | None = flag(None, "mud: stages to run, 'hsk,pred', 'hsk' or 'pred'.", section=METHOD)
    epochs_hsk: float | None = flag(None, "mud: stage 1 epochs (fractions allowed) [default: per task].",
                                    section=METHOD)
    epochs_pred: float | None = flag(None, "mud: stage 2 epochs [default: 5].", section=METHOD)
    lr_hsk: float | None = flag(None, "mud: stage 1 learning rate (constant) [default: 5e-5].", section=METHOD)
    lr_pred: float | None = flag(None, "mud: stage 2 learning rate, linear decay [default: 2e-5; MNLI 5e-5].",
                                 section=METHOD)
    alpha: float | None = flag(None, "KD mixture (1-a) CE(gold) + a T^2 KL [mud: pure soft CE; kd/pkd 0.5].",
                               section=METHOD)
    beta: float | None = flag(None, "pkd-*: weight of the Patient KD [CLS] loss [default: 500].", section=METHOD)
    hsk_loss: str | None = flag(None, "mud: stage 1 loss: mse (reference), masked-mse, pkd ([CLS] store).",
                                section=METHOD)
    ptp_t1: float | None = flag(None, "pea: PTP confidence threshold of right predictions [default: per task].",
                                section=METHOD)
    ptp_t2: float | None = flag(None, "pea: PTP confidence threshold of wrong predictions [default: per task].",
                                section=METHOD)


@dataclass(frozen=True)
class TaskTrainOptions:
    """`hsk train`'s online mode (--teacher without --store): the task whose data the live teacher runs on and the
    dump's choices it computes the targets with (as `hsk dump` would, so that the data order is the same)."""

    task: str | None = flag(None, "Online mode: the GLUE task to train on.")
    config: str | None = flag(None, "Online mode: ND,NL,W of the targets, e.g. 1,9,0.1.")
    train_limit: int | None = flag(None, "Online mode: first N training examples.", "--limit")
    shard_rows: int = flag(SHARD_ROWS.default, "Online mode: rows per shard (match the dump for the same order).")
    student_layers: int | None = flag(STUDENT_LAYERS.default, "Online mode: reference student depth of the layer map "
                                      "(as dump).")
    l_top: int | None = flag(None, "Online mode: L_top of the layer map [default: round(10/12 * L)].")
    layers: str | None = flag(None, "Online mode: explicit teacher layers, e.g. 2,4 (as dump --layers).")
    tokens: str = flag(TOKENS.default, f"Online mode: token strategy (as dump --tokens: {', '.join(TOKENS.values)}).")
    attention_rows: bool = flag(False, "Online mode: also compute the teacher attention rows (tinybert-att).",
                                "--attention-rows")

    def __post_init__(self) -> None:  # read when made, before torch is imported: a typo costs a second
        if self.config:
            HSKConfig.parse(self.config)
        TaskDumpOptions(layers=self.layers).layer_list()

    def apply(self, options: TrainOptions, source: RunSource) -> tuple[TrainOptions, RunSource]:
        """The run's options and source with these: the task (checked against a store's), and online the dump's
        choices the teacher computes the targets with."""
        parsed = HSKConfig.parse(self.config) if self.config else None
        layers = TaskDumpOptions(layers=self.layers).layer_list()
        source = replace(source, task=self.task, config=self.config)
        online = None
        if source.teacher is not None and parsed is not None:
            from pipelines.dump.stage import DumpOptions

            online = DumpOptions.from_flags(dict(shard_rows=self.shard_rows, student_layers=self.student_layers,
                                                 l_top=self.l_top, tokens=self.tokens), config=parsed,
                                            layers=layers, attention_rows=self.attention_rows)
        return replace(options, train_limit=self.train_limit, online=online), source


RUN_KIND = RunKind(
    name="task", summary="a fine-tuned classifier's logits and hidden-state knowledge",
    dump="pipelines.kinds.task:dump", dump_options=TaskDumpOptions, heading=HEADING,
    prepare="pipelines.train.kinds.distill:prepare_task", default_method="mud",
    teacher="pipelines.kinds.task:teacher", teacher_options=TaskTeacherOptions,
    evaluate="pipelines.kinds.task:evaluate", eval_options=TaskEvalOptions, eval_by="task",
    method_flags=TaskMethodFlags, train_options=TaskTrainOptions, train_heading=ONLINE,
)
