"""`hsk train` (distill a student from a store, or from a live teacher) and `hsk eval` (score any model)."""

from __future__ import annotations

import typer

from hskstore.errors import UserError
from hskstore.format.config import SHARD_ROWS, STUDENT_LAYERS, TOKENS
from pipelines import runkinds
from pipelines.cli.generated import FlagTable, common_options, kind_options
from pipelines.cli.sections import sectioned
from pipelines.core.threads import THREADS_HELP, check_threads, use_threads

# This module's commands; pipelines.cli merges them into the `hsk` app (registration runs one way).
app = typer.Typer()

TRAIN_HELP = """Distill a student from an HSK store, without the teacher, with any method (`hsk methods`).

--method mud (the default; docs/METHOD.md section 5): stage 'hsk' fits the student's hidden states to the stored teacher
knowledge (MSE, summed over kept layers, constant LR 5e-5), then stage 'pred' fits its logits to the
stored teacher logits (soft cross-entropy at --temperature, or with --alpha the KD mixture with gold
labels; MSE to the gold score for STS-B), linear LR decay. --method kd: (1-a) CE + a T^2 KL in one
stage (--epochs, --lr, --alpha, --temperature). --method pkd-skip / pkd-last: KD + --beta * Patient
KD on [CLS] vectors (a --tokens cls store). A method's options are flags (--epochs-hsk, --beta, ...)
or --set NAME=VALUE; an option the method does not have is refused. Epochs, LR and batch size
default to the paper's per-task recipe. The store is checked against the method before the first
step. Dev data comes from --data-dir, the folder the store was dumped from, $HSK_DATA_DIR or the
hub; without any, the run stops unless --no-eval. The best dev checkpoint is saved in OUT/best
(plain transformers format); OUT/metrics.jsonl logs every step and each loss term; OUT/summary.json
sums the run up. Rerunning the same command after an interruption resumes mid-stage; --no-resume
restarts an unfinished run; a finished run is replaced only with --overwrite.

Students: tinybert4 (huawei-noah/TinyBERT_General_4L_312D from the hub, --student-weights DIR or
$HSK_TINYBERT_PATH; else random init, loudly), bert<k> (the first k layers of the store's teacher,
of --teacher, or of --student-base), or any Hugging Face encoder id or folder. Token-level HSK needs
the teacher's tokenizer; logits-only methods work with any.

Examples:

\b
  hsk train --store qnli.zarr --student tinybert4 --out runs/qnli-tiny --data-dir ../shared/data/glue
  hsk train --store sst2.zarr --student bert3 --method kd --alpha 0.5 --temperature 10 --out runs/kd3
  hsk train --store sst2-cls.zarr --student bert3 --method pkd-skip --beta 500 --out runs/pkd3
  hsk train --store corpus.zarr --student bert3 --method lightpaff-pretrain --out runs/lp-pre
  hsk train --store sst2.zarr --init runs/lp-pre/best --method lightpaff --lam 0.5 --out runs/lp
  hsk train --store lm.zarr --student first2 --method clm-kd --set lam=0.5 --max-steps 500 --out runs/lm2

A causal-LM store (`hsk dump --objective clm`) trains an AutoModelForCausalLM: first<k> (the teacher's first
k layers) or any causal-LM folder with the teacher's tokenizer; --set target=live runs the store's teacher
beside it (full-vocabulary KL on the same blocks); `hsk eval OUT/best --text-file F` gives its perplexity.

Online (the same training with the teacher loaded and targets computed per batch; for comparison):

\b
  hsk train --teacher runs/teacher-sst2 --task sst2 --config 1,9,0.1 --student bert2 --out runs/online
"""

EVAL_HELP = """Evaluate a saved model (OUT/best of `hsk train`, or any hub classifier) on a task's dev data.

MNLI reports matched and mismatched accuracy; metrics follow GLUE (docs/METHOD.md section 10).

Examples:

\b
  hsk eval runs/qnli-tiny/best --task qnli --data-dir ../shared/data/glue
  hsk eval runs/sst2/best --task sst2 --eval-limit 200 --json
  hsk eval runs/lm-student/best --text-file test.txt --block-size 256     # a causal LM: perplexity
  hsk eval runs/ner/best --objective my-kind --set store=held-out.zarr     # an installed package's kind
"""


def method_options(values: dict, sets: list[str] | None) -> dict:
    """The method options given on the command line: typed flags and --set NAME=VALUE."""
    chosen = {k: v for k, v in values.items() if v is not None}
    for item in sets or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UserError(f"--set takes NAME=VALUE, got {item!r}")
        chosen[name.strip().replace("-", "_")] = value.strip()
    return chosen


def _layer_list(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise UserError(f"--layers takes comma-separated layer numbers like '2,4', got {text!r}") from None


# `hsk train --help` in groups; the options in none (what the run is: store, student, out, ...) come first
TRAIN_SECTIONS = {
    "Method options (each method takes its own: `hsk methods`)": (
        "stages", "epochs_hsk", "epochs_pred", "lr_hsk", "lr_pred", "epochs", "lr", "temperature", "alpha", "beta",
        "lam", "hsk_loss", "ptp_t1", "ptp_t2", "set_"),
    "Students": ("student_base", "student_weights"),
    "Reading the store": ("pad_to_max_length", "read_threads", "read_ahead", "shuffle_window", "expect_store"),
    "Evaluation, checkpoints and logs": (
        "eval_every", "eval_limit", "evaluate", "data_dir", "checkpoint_every", "log_every", "heartbeat", "progress",
        "report_to"),
    "Online mode (--teacher without --store: the teacher computes each batch's targets)": (
        "task", "config", "train_limit", "shard_rows", "student_layers", "l_top", "layers", "tokens",
        "attention_rows"),
}


@app.command(help=TRAIN_HELP, cls=sectioned(TRAIN_SECTIONS))
def train(
    store: str = typer.Option(None, "--store", "-s", help="Store path or fsspec URL (offline mode)."),
    student: str = typer.Option(
        ..., "--student", "--init",
        help="tinybert4, bert<k> (e.g. bert3), sps<k> (PEA-KD), or a hub id / folder (--init: the same, e.g. a "
        "lightpaff-pretrain OUT/best).",
    ),
    out: str = typer.Option(..., "--out", "-o", help="Run folder: checkpoint/, best/, metrics.jsonl, summary.json."),
    method: str = typer.Option(None, "--method", "-m", help="Distillation method (`hsk methods` lists them) "
                               "[default: the store kind's: mud (task), lightpaff-pretrain (mlm), clm-kd, s2s-kd]."),
    stages: str = typer.Option(None, help="mud: stages to run, 'hsk,pred', 'hsk' or 'pred'."),
    epochs_hsk: float = typer.Option(None, help="mud: stage 1 epochs (fractions allowed) [default: per task]."),
    epochs_pred: float = typer.Option(None, help="mud: stage 2 epochs [default: 5]."),
    lr_hsk: float = typer.Option(None, help="mud: stage 1 learning rate (constant) [default: 5e-5]."),
    lr_pred: float = typer.Option(None, help="mud: stage 2 learning rate, linear decay [default: 2e-5; MNLI 5e-5]."),
    epochs: float = typer.Option(None, help="kd, pkd-*, finetune: epochs [default: 4]."),
    lr: float = typer.Option(None, help="kd, pkd-*, finetune: learning rate, linear decay [default: per task]."),
    temperature: float = typer.Option(None, help="Softmax temperature T [mud 1, kd/pkd 10]."),
    alpha: float = typer.Option(None, help="KD mixture (1-a) CE(gold) + a T^2 KL [mud: pure soft CE; kd/pkd 0.5]."),
    beta: float = typer.Option(None, help="pkd-*: weight of the Patient KD [CLS] loss [default: 500]."),
    lam: float = typer.Option(None, help="lightpaff*: (1-l) MLE(gold) + l KL(teacher) [pretrain 1.0, lightpaff 0.5]."),
    hsk_loss: str = typer.Option(None, help="mud: stage 1 loss: mse (reference), masked-mse, pkd ([CLS] store)."),
    ptp_t1: float = typer.Option(None, help="pea: PTP confidence threshold of right predictions [default: per task]."),
    ptp_t2: float = typer.Option(None, help="pea: PTP confidence threshold of wrong predictions [default: per task]."),
    set_: list[str] = typer.Option(None, "--set", help="Any method option as NAME=VALUE (repeatable)."),  # noqa: B008
    batch_size: int = typer.Option(None, help="Batch size [default: 32; 64 for QNLI, MNLI, QQP]."),
    seed: int = typer.Option(0, help="Seed of the student init, dropout and data order."),
    device: str = typer.Option(None, help="torch device [default: cuda when available, else cpu]."),
    precision: str = typer.Option(
        "auto", help="Step precision: auto (bf16 on a GPU that has it, else fp32), fp32, bf16 or fp16 (loss "
        "scaling). Part of the run: a checkpoint resumes only in its own precision."),
    compile_: bool = typer.Option(
        False, "--compile/--no-compile", help="torch.compile the student's forward and losses (slow first steps)."),
    compile_mode: str = typer.Option(
        "default", help="With --compile: default, reduce-overhead (CUDA graphs; add --pad-to-max-length for static "
        "shapes) or max-autotune."),
    pad_to_max_length: bool = typer.Option(
        False, "--pad-to-max-length", help="Pad every batch to the store's max length (static shapes)."),
    read_threads: int = typer.Option(2, "--read-threads", help="Threads reading (and decoding) store shards."),
    read_ahead: int = typer.Option(
        0, help="Shards read ahead [default: one per --read-threads]; more hides S3 latency."),
    threads: int = typer.Option(None, "--threads", help=THREADS_HELP),
    shuffle_window: int = typer.Option(4, help="Shards whose rows are shuffled together (data order; memory)."),
    max_steps: int = typer.Option(None, help="Cap on optimizer steps per stage."),
    eval_every: int = typer.Option(None, help="Evaluate every N steps of stages that keep the best checkpoint."),
    eval_limit: int = typer.Option(None, help="Evaluate on the first N dev examples only."),
    evaluate: bool = typer.Option(True, "--eval/--no-eval", help="--no-eval: train without dev data."),
    checkpoint_every: int = typer.Option(500, help="Save a resumable checkpoint every N steps."),
    log_every: int = typer.Option(50, help="Write a metrics.jsonl record every N steps."),
    heartbeat: float = typer.Option(
        60.0, help="Print a progress line (step, loss, examples/s, time left) at most every N seconds, on steps "
        "that log (0: on every one)."),
    student_base: str = typer.Option(None, help="bert<k>: checkpoint whose first k layers start the student."),
    student_weights: str = typer.Option(None, help="Local weights folder for the student (e.g. TinyBERT4)."),
    data_dir: str = typer.Option(None, help="glue_data folder for dev data (or set HSK_DATA_DIR); else the hub."),
    expect_store: str = typer.Option(None, help="Refuse the store unless its content address is this one."),
    teacher: str = typer.Option(
        None, help="With --store: where the store's teacher is now (weights checked). Without: online mode."
    ),
    task: str = typer.Option(None, help="Online mode: the GLUE task to train on."),
    config: str = typer.Option(None, help="Online mode: ND,NL,W of the targets, e.g. 1,9,0.1."),
    train_limit: int = typer.Option(None, "--limit", help="Online mode: first N training examples."),
    shard_rows: int = typer.Option(
        SHARD_ROWS.default, help="Online mode: rows per shard (match the dump for the same order)."),
    student_layers: int = typer.Option(
        STUDENT_LAYERS.default, help="Online mode: reference student depth of the layer map (as dump)."),
    l_top: int = typer.Option(None, help="Online mode: L_top of the layer map [default: round(10/12 * L)]."),
    layers: str = typer.Option(None, help="Online mode: explicit teacher layers, e.g. 2,4 (as dump --layers)."),
    tokens: str = typer.Option(
        TOKENS.default, help=f"Online mode: token strategy (as dump --tokens: {', '.join(TOKENS.values)})."),
    attention_rows: bool = typer.Option(
        False, "--attention-rows", help="Online mode: also compute the teacher attention rows (tinybert-att)."
    ),
    resume: bool = typer.Option(
        True, help="Resume from OUT/checkpoint when there is one; --no-resume restarts an unfinished run (a finished "
        "one is replaced only with --overwrite)."),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace a finished run at OUT (trained in a hidden sibling, swapped in once "
        "complete)."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    report_to: str = typer.Option(
        "none", help="Also write the metrics as TensorBoard event files beside metrics.jsonl: none or tensorboard "
        "(needs `pip install tensorboard`)."),
) -> None:
    from hskstore.format.config import HSKConfig
    from pipelines.train.options import check_report_to

    # Arguments first, torch after: a typo is refused in a second, not after torch's import.
    parsed = HSKConfig.parse(config) if config else None
    explicit = _layer_list(layers)
    chosen = method_options(dict(stages=stages, epochs_hsk=epochs_hsk, epochs_pred=epochs_pred, lr_hsk=lr_hsk,
                                 lr_pred=lr_pred, temperature=temperature, alpha=alpha, hsk_loss=hsk_loss,
                                 epochs=epochs, lr=lr, beta=beta, ptp_t1=ptp_t1, ptp_t2=ptp_t2, lam=lam), set_)
    check_threads(threads)
    check_report_to(report_to)
    from pipelines.core.devices import pick_device
    from pipelines.core.precision import cpu_half_warning
    from pipelines.dump.stage import DumpOptions
    from pipelines.train.kinds.distill import train as run_train
    from pipelines.train.options import TrainOptions
    from pipelines.train.run.ddp import env_rank

    online_mode = bool(teacher) and not store
    online = None
    if online_mode and parsed is not None:
        online = DumpOptions.from_flags(dict(shard_rows=shard_rows, student_layers=student_layers, l_top=l_top,
                                             tokens=tokens), config=parsed, layers=explicit,
                                        attention_rows=attention_rows)
    used = use_threads(threads, "train")
    on_cpu = pick_device(device).split(":")[0] == "cpu"  # only there do a step's bits depend on the threads
    if note := cpu_half_warning(precision, pick_device(device)):
        typer.echo(note, err=True)
    options = TrainOptions(
        method=method, method_options=chosen, batch_size=batch_size, seed=seed, threads=used if on_cpu else None,
        device=device, precision=precision, compile=compile_mode if compile_ else None,
        pad_to_max_length=pad_to_max_length, workers=read_threads, buffer_shards=shuffle_window, max_steps=max_steps,
        eval_every=eval_every,
        eval_limit=eval_limit, read_ahead=read_ahead,
        evaluate=evaluate, checkpoint_every=checkpoint_every, log_every=log_every, heartbeat=heartbeat,
        student_base=student_base,
        student_weights=student_weights, data_dir=data_dir, train_limit=train_limit, online=online,
        resume=resume, overwrite=overwrite, progress=progress, expect_store=expect_store, report_to=report_to,
        teacher=None if online_mode else teacher,
    )
    summary = run_train(
        options, student=student, out_dir=out, store=store, teacher=teacher if online_mode else None, task=task,
        config=config, data_dir=data_dir, log=typer.echo,
    )
    if env_rank() != 0:  # under torchrun rank 0 reports
        return
    if summary.student_init == "random":
        typer.echo("WARNING: the student was randomly initialised (see the warnings above)", err=True)
    typer.echo(f"summary: {out}/summary.json")


METHODS_HELP = """List the distillation methods `hsk train --method` takes: one line each, and what its store must hold.

Each method is described in docs/methods/<name>.md with the paper it comes from. Methods of installed
packages (entry point group hsk.methods: docs/methods/adding-a-method.md) are listed too, with their package.
"""


@app.command("methods", help=METHODS_HELP)
def methods_cmd() -> None:
    from pipelines.methods import all_methods
    from pipelines.registry import method_faults, method_package

    methods = all_methods()
    width = max(len(m.name) for m in methods) + 2
    for m in methods:
        typer.echo(f"{m.name:<{width}}{m.summary}")
        typer.echo(f"{'':<{width}}store: {m.store_needs}")
        if method_package(m.name):
            typer.echo(f"{'':<{width}}from: {method_package(m.name)} (an installed package's hsk.methods entry point)")
    for fault in method_faults():  # a broken package fails alone: the others are listed above
        typer.echo(f"hsk: warning: {fault}", err=True)


def _eval_table() -> FlagTable:
    """`hsk eval`'s options: every kind's evaluation (pipelines/kinds/<kind>.py) and the ones they share."""
    table = FlagTable()
    table.extra("model", str, typer.Argument(..., help="Saved model folder or hub id (a sequence classifier, a "
                                             "causal LM with --text-file, a seq2seq model with --pairs-file)."))
    for kind in runkinds.builtin_kinds():
        if kind.eval_options is not None:
            table.add(kind.eval_options, kind.name, "")
    table.add(runkinds.EvalCommon, None, "")
    table.extra("objective", str, typer.Option(None, "--objective", help="The evaluation of this store kind's run "
                                               "kind (an installed package's kind) [default: the one --task, "
                                               "--text-file or --pairs-file selects]."))
    table.extra("set_", list[str], typer.Option(None, "--set", help="An option of the --objective kind's evaluation "
                                                "as NAME=VALUE (repeatable)."))
    return table


EVAL_TABLE = _eval_table()


def _evaluation(values: dict) -> runkinds.RunKind:
    """The kind whose evaluation the options select (--objective, else --task, --text-file, --pairs-file: one)."""
    if values.get("objective"):  # any kind by name, an installed package's too (its options as --set)
        kind = runkinds.get(values["objective"])
        if kind.evaluate is None:
            raise UserError(f"--objective {kind.name}: the {kind.name} kind has no evaluation of its own")
        return kind
    kinds = [k for k in runkinds.builtin_kinds() if k.evaluate is not None]
    chosen = [k for k in kinds if values.get(k.eval_by) is not None]
    if len(chosen) != 1:
        given = f"; given {' and '.join(EVAL_TABLE.flags[k.eval_by] for k in chosen)}: keep one" if chosen else ""
        raise UserError("hsk eval needs one of --task (a classifier on a task's dev data), --text-file (a causal "
                        "LM's perplexity), --pairs-file (a seq2seq model's BLEU and chrF) or --objective KIND (an "
                        f"installed package's kind){given}")
    return chosen[0]


def _eval(values: dict) -> None:
    kind = _evaluation(values)
    options = kind_options(EVAL_TABLE, kind.eval_options, kind.name, "the {} evaluation", values, runkinds.EvalCommon,
                           values.get("set_"))
    common = common_options(runkinds.EvalCommon, values)
    check_threads(common.threads)
    from pipelines.core.devices import pick_device

    use_threads(common.threads, "eval")
    kind.load("evaluate")(values["model"], options, common, pick_device(common.device), typer.echo)


eval_ = app.command("eval", help=EVAL_HELP)(EVAL_TABLE.command(_eval))
