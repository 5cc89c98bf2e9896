"""`hsk train` (distill a student from a store, or from a live teacher) and `hsk eval` (score any model)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from hskstore.errors import UserError
from pipelines import runkinds
from pipelines import train_flags as flags
from pipelines.cli.generated import FlagTable, common_options, kind_options
from pipelines.cli.sections import sectioned
from pipelines.core.flags import flag_fields
from pipelines.core.threads import check_threads, use_threads
from pipelines.train_flags import MethodCommon, TrainCommon

if TYPE_CHECKING:  # what the driver returns (torch-side)
    from pipelines.train.run.summary import RunSummary

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


def _train_table() -> FlagTable:
    """`hsk train`'s options: the run's own and the shared method options (pipelines.train_flags), and each
    built-in kind's (pipelines/kinds/<kind>.py: its methods' options, its own run flags)."""
    table = FlagTable()
    table.add(TrainCommon, None, flags.TOP)
    table.add(MethodCommon, None, flags.METHOD)
    for kind in runkinds.builtin_kinds():
        if kind.method_flags is not None:
            table.add(kind.method_flags, None, flags.METHOD)
    table.extra("set_", list[str], typer.Option(None, "--set", help="Any method option as NAME=VALUE (repeatable)."),
                flags.METHOD)
    for kind in runkinds.builtin_kinds():
        if kind.train_options is not None:
            table.add(kind.train_options, None, kind.train_heading)
    return table


TRAIN_TABLE = _train_table()
# `hsk train --help` in groups; the options in none (what the run is: store, student, out, ...) come first
TRAIN_SECTIONS = TRAIN_TABLE.headings([flags.METHOD, flags.STUDENTS, flags.READING, flags.EVAL])


def _method_choices(values: dict) -> dict:
    """The method options given: the flags every kind's methods declare, and --set NAME=VALUE."""
    declared = [MethodCommon, *(k.method_flags for k in runkinds.builtin_kinds() if k.method_flags is not None)]
    named = {f.name for options in declared for f, _ in flag_fields(options)}
    return method_options({name: values[name] for name in named}, values["set_"])


def _kinds_own(values: dict) -> list:
    """Each kind's own `hsk train` options (RunKind.train_options), read (and checked) from the flags given."""
    return [common_options(k.train_options, values) for k in runkinds.builtin_kinds() if k.train_options is not None]


def _step_threads(threads: int | None, device: str) -> int | None:
    """The torch threads a CPU run records (only on the CPU do a step's bits depend on them); else None."""
    used = use_threads(threads, "train")
    return used if device.split(":")[0] == "cpu" else None


def _train(values: dict) -> None:
    from pipelines.train.options import check_report_to

    # Arguments first, torch after: a typo is refused in a second, not after torch's import.
    common = common_options(TrainCommon, values)
    chosen, own = _method_choices(values), _kinds_own(values)
    check_threads(common.threads)
    check_report_to(common.report_to)
    from pipelines.core.devices import pick_device
    from pipelines.core.precision import cpu_half_warning
    from pipelines.train.run.driver import train as run_train

    device = pick_device(common.device)
    threads = _step_threads(common.threads, device)
    if note := cpu_half_warning(common.precision, device):
        typer.echo(note, err=True)
    options, source = common.options(chosen, threads), common.source()
    for extra in own:  # each kind's own flags: the task and online choices of a live teacher, ...
        options, source = extra.apply(options, source)
    summary = run_train(options, student=common.student, out_dir=common.out, store=source.store,
                        teacher=source.teacher, task=source.task, config=source.config, data_dir=common.data_dir,
                        log=typer.echo)
    _report(summary, common.out)


def _report(summary: RunSummary, out: str) -> None:
    from pipelines.train.run.ddp import env_rank

    if env_rank() != 0:  # under torchrun rank 0 reports
        return
    if summary.student_init == "random":
        typer.echo("WARNING: the student was randomly initialised (see the warnings above)", err=True)
    typer.echo(f"summary: {out}/summary.json")


train = app.command("train", help=TRAIN_HELP, cls=sectioned(TRAIN_SECTIONS))(TRAIN_TABLE.command(_train))


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
