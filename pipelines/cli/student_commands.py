"""`hsk student build`: students made from a teacher's own parameters (ROSITA); `hsk student lm`: a small causal LM
over a tokenizer of the user's choice. Both for `hsk train --student DIR`."""

from __future__ import annotations

import typer

from hskstore.format.config import ConfigError, check_at_least

# This module's commands; pipelines.cli merges them into the `hsk` app (registration runs one way).
app = typer.Typer()

student_app = typer.Typer(
    help="Build students that `hsk train --student DIR` distils.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(student_app, name="student")

KINDS = ("rosita",)

BUILD_HELP = """Build a student by pruning a fine-tuned BERT teacher (ROSITA) and save it to OUT.

Keeps the teacher's bottom --student-layers layers; per layer, the --heads attention heads and --ffn FFN
neurons of highest importance |w| * sum|dL/dw| (L: the teacher's own task loss, cross-entropy to
the gold labels, MSE for STS-B), the gradients accumulated over one epoch of the training data with
the teacher frozen; and factorises the word embedding by SVD at rank --emb-rank (0 keeps it).
Prints the parameter counts before and after.

OUT holds the student as built (hsk's `hsk_bert` model class: pruned heads, factorised embedding),
which `hsk train --student OUT` distils; OUT/plain holds the same function as a standard
BertForSequenceClassification that plain transformers loads; OUT/README.md says which is which.

Example (MiniLM-L6-H384 teacher: 6 layers, 12 heads, FFN 1536, d 384):

\b
  hsk student build rosita --teacher runs/teacher-sst2 --task sst2 --student-layers 3 --heads 4 --ffn 384 \\
      --emb-rank 128 --data-dir ../shared/data/glue --limit 4000 --out runs/rosita3
"""


@student_app.command("build", help=BUILD_HELP)
def build(
    kind: str = typer.Argument(..., help="Which student to build: rosita."),
    teacher: str = typer.Option(..., "--teacher", help="Fine-tuned BERT classifier (folder or hub id)."),
    task: str = typer.Option(..., "--task", "-t", help="GLUE task whose training data scores importance."),
    layers: int = typer.Option(..., "--student-layers", help="The student's depth: the teacher's bottom N layers."),
    heads: int = typer.Option(..., help="Attention heads kept per layer."),
    ffn: int = typer.Option(..., help="FFN neurons kept per layer."),
    emb_rank: int = typer.Option(..., help="Rank of the SVD-factorised word embedding (0: keep it whole)."),
    out: str = typer.Option(..., "--out", "-o", help="Folder for the student."),
    data_dir: str = typer.Option(None, help="Local glue_data folder (or set HSK_DATA_DIR); else the HF hub."),
    data_file: str = typer.Option(None, help="Your own labelled csv/tsv/json/parquet file instead."),
    train_limit: int = typer.Option(None, "--limit", help="Score importance on the first N training examples only."),
    batch_size: int = typer.Option(32, help="Batch size of the gradient pass."),
    max_length: int = typer.Option(None, help="Max tokens [default: the task's]."),
    device: str = typer.Option(None, help="torch device [default: cuda when available, else cpu]."),
    overwrite: bool = typer.Option(False, help="Replace an existing student folder at OUT."),
) -> None:
    from pipelines.core.devices import pick_device
    from pipelines.train.students.rosita import RositaShape, build_rosita, describe_counts

    if kind.strip().lower() not in KINDS:
        raise ConfigError(f"unknown student kind {kind!r}: pass one of {', '.join(KINDS)}")
    for flag, value, low in (("--batch-size", batch_size, 1), ("--limit", train_limit, 1),
                             ("--max-length", max_length, 2)):
        check_at_least(flag, value, low)
    summary = build_rosita(
        teacher,
        task,
        RositaShape(layers=layers, heads=heads, ffn=ffn, emb_rank=emb_rank),
        out,
        data_dir=data_dir,
        data_file=data_file,
        train_limit=train_limit,
        batch_size=batch_size,
        max_length=max_length,
        device=str(pick_device(device)),
        overwrite=overwrite,
        log=typer.echo,
    )
    typer.echo(describe_counts(summary))
    typer.echo(f"student saved to {out} (plain transformers export: {out}/plain); distil it with "
               f"hsk train --student {out} --store ...")


LM_HELP = """Make a small random causal LM over a tokenizer of your choice and save it to OUT: a student for
`hsk train --method uld | alm` (its tokenizer need not be the store's teacher's).

The tokenizer is --tokenizer (a folder, a hub id, 'minilm' for MiniLM's WordPiece vocabulary, 'smollm2'), or
a byte-level BPE of --vocab-size trained on --train-tokenizer FILE (one document per line) with the
`tokenizers` library. The model is a Llama-shaped decoder (--student-layers, --hidden, --heads, --ffn) over it.

Example:

\b
  hsk student lm --train-tokenizer corpus.txt --vocab-size 8000 --student-layers 2 --hidden 128 --out runs/bpe8k
  hsk train --store corpus.zarr --student runs/bpe8k --method alm --out runs/alm
"""


@student_app.command("lm", help=LM_HELP)
def lm(
    out: str = typer.Option(..., "--out", "-o", help="Folder for the student (model and tokenizer)."),
    tokenizer: str = typer.Option(None, "--tokenizer", help="An existing tokenizer: folder, hub id, minilm, smollm2."),
    train_tokenizer: str = typer.Option(None, "--train-tokenizer", help="Train a byte-level BPE on this text file."),
    vocab_size: int = typer.Option(8192, "--vocab-size", help="The trained BPE's vocabulary size."),
    layers: int = typer.Option(2, "--student-layers", help="The student's depth: decoder layers."),
    hidden: int = typer.Option(64, "--hidden", help="Hidden width."),
    heads: int = typer.Option(4, "--heads", help="Attention heads."),
    ffn: int = typer.Option(256, "--ffn", help="FFN width."),
    max_positions: int = typer.Option(1024, "--max-positions", help="The longest block it takes."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random initialisation."),
    overwrite: bool = typer.Option(False, help="Replace an existing student folder at OUT."),
) -> None:
    from pipelines.train.run.lm_eval import read_documents
    from pipelines.train.students.causal import CausalShape, build_causal_student

    corpus = read_documents(train_tokenizer) if train_tokenizer else None
    made = build_causal_student(out, CausalShape(layers, hidden, heads, ffn, max_positions), tokenizer=tokenizer,
                                corpus=corpus, vocab_size=vocab_size, seed=seed, overwrite=overwrite)
    typer.echo(f"student saved to {made['out']}: {made['parameters']:,} parameters, vocabulary {made['vocab_size']} "
               f"({made['tokenizer']}); distil it with hsk train --student {made['out']} --method uld|alm --store ...")
