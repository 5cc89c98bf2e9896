"""`hsk dump`, `hsk info`, `hsk verify`, `hsk upgrade`: make a store, describe it, check it, cover an old one."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import typer

from hskstore.errors import UserError
from hskstore.format.config import (
    BATCH_SIZE,
    ENGINE,
    L_TOP,
    MASK_SEED,
    MAX_LENGTH,
    MLM_BOUNDS,
    PRECISION,
    RANKING,
    SCORES,
    SHARD_ROWS,
    STUDENT_LAYERS,
    TOKENS,
    TOP_K,
    VALUES,
    WIDTH,
    WIDTH_SEED,
    ConfigError,
    HSKConfig,
)
from pipelines.cli.sections import sectioned
from pipelines.core.threads import THREADS_HELP, check_threads, use_threads

# This module's commands; pipelines.cli merges them into the `hsk` app (registration runs one way).
app = typer.Typer()

DUMP_HELP = """Run a fine-tuned teacher once over a task split and write an HSK store.

The store keeps the teacher's logits and the hidden-state knowledge (HSK) selected by --config
ND,NL,W: ND layers (the last ND entries of a reference student's layer map), NL tokens per
example (ranked by [CLS] attention, [SEP] excluded by default) and a fraction W of each kept
vector's activations (largest magnitudes). '0,0,0' keeps logits only.

An interrupted dump resumes where it stopped when you rerun the same command; rerunning a
finished one says "already complete, nothing to do". --out must be new, an empty folder or an
hsk store: hsk never writes into any other folder or file. One writer at a time: a second
`hsk dump` on the same --out stops with a line naming the process that holds it.

Scaling out: --workers N runs the dump on a local dask cluster of N processes, --scheduler
tcp://HOST:PORT on a running one. Each worker loads the teacher once and computes and writes
whole shards; a worker that dies has its shard recomputed by another; the bytes are those of a
single-process dump with the same torch threads per process (--threads: per worker there). One GPU per
worker: with --device cuda, dask-cuda's LocalCUDACluster when installed, else worker k uses cuda:k.

Memory: one shard being tokenized, one computed and one written (two at once on a GPU),
whatever the number of examples; the heap is trimmed once per shard. On CPU, glibc's allocator lets
the resident set of a long torch forward loop creep up (fragmentation: +9-13% from 2,000 to 16,000
rows); MALLOC_MMAP_THRESHOLD_=524288 in the environment keeps it flat (+2-4%) for about a quarter
less throughput (benchmarks/dump/dump_heap_ab.sh).

Examples:

\b
  hsk dump --task sst2 --teacher runs/teacher-sst2 --config 3,8,0.2 --student-layers 2 \\
      --data-dir ../shared/data/glue
  hsk dump --task qnli --teacher my-org/bert-qnli --config 1,9,0.1 --values int8 --out qnli-small.zarr
  hsk dump --task qnli --teacher my-org/bert-qnli --config 3,8,0.2 --workers 4 --device cuda   # 4 GPUs

Masked-LM store (LightPAFF): --objective mlm runs a BertForMaskedLM teacher (e.g. from `hsk teacher
--objective mlm`) over raw text with BERT's masking (15%; 80% [MASK], 10% random, 10% kept; seeded by
--mask-seed) and keeps, per masked position, the top --top-k ids and logits and the full log-sum-exp:

\b
  hsk dump --objective mlm --text-file corpus.txt --teacher runs/mlm-teacher --top-k 64 --out corpus.zarr

Causal-LM store: --objective clm runs any AutoModelForCausalLM over raw text (one document per line, packed
into --block-size blocks with EOS between) and keeps, per position, its next-token distribution on a sparse
--support: topk:K (ids and log-probs; the tail mass is 1 - their sum) or sample:N (RS-KD: N draws, distinct
ids and counts). `hsk derive --support` makes smaller ones; `hsk train --method clm-kd` trains from them:

\b
  hsk dump --objective clm --text-file corpus.txt --teacher my-org/my-lm --support topk:32 --out lm.zarr
  hsk dump --objective clm --text-file corpus.txt --teacher my-org/my-lm --support sample:50 --out lm-s50.zarr
"""


def _int_list(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise UserError(f"--layers takes comma-separated layer numbers like '4,8,12', got {text!r}") from None


# `hsk dump --help` in groups; the options in none (task, teacher, out, data) come first
DUMP_SECTIONS = {
    "The knowledge of a task store (--task --config)": (
        "student_layers", "l_top", "layers", "tokens", "ranking", "scores", "width", "width_seed", "values",
        "attention_rows", "max_length", "allow_task_mismatch"),
    "Language-model stores (--objective mlm, clm or seq2seq)": (
        "objective", "text_file", "support", "decode", "supports_on", "max_target", "prompt", "logprobs", "block_size",
        "positions", "sample_seed", "limit_tokens", "top_k", "mask_seed"),
    "The teacher's forward and the writing": (
        "batch_size", "shard_rows", "device", "selection_engine", "precision", "threads", "write_processes", "workers",
        "scheduler", "progress", "overwrite"),
    "Sharing (recorded in the store's card and Croissant)": ("license", "creator"),
}


@app.command(help=DUMP_HELP, cls=sectioned(DUMP_SECTIONS))
def dump(
    task: str = typer.Option(
        None, "--task", "-t", help="GLUE task (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli)."
    ),
    config: str = typer.Option(None, "--config", "-c", help="ND,NL,W e.g. 3,8,0.2 (layers, tokens, width ratio)."),
    teacher: str = typer.Option(
        None,
        "--teacher",
        help="Fine-tuned sequence-classification checkpoint: hub id or folder "
        "[default: runs/teacher-<task>, where `hsk teacher` saves].",
    ),
    out: str = typer.Option(None, "--out", "-o", help="Store path or fsspec URL [default: <task>.zarr]."),
    split: str = typer.Option("train", help="Split to dump: train, dev, dev_matched, dev_mismatched."),
    data_dir: str = typer.Option(None, help="Local glue_data folder (or set HSK_DATA_DIR); else the HF hub."),
    data_file: str = typer.Option(None, help="Your own csv/tsv/json/parquet file instead of GLUE."),
    text_columns: str = typer.Option(None, help="Text columns of --data-file, e.g. 'question,sentence'."),
    label_column: str = typer.Option(None, help="Gold label column of --data-file (optional)."),
    limit: int = typer.Option(None, help="Dump only the first N examples."),
    student_layers: int = typer.Option(STUDENT_LAYERS.default, STUDENT_LAYERS.flag, help=STUDENT_LAYERS.help),
    l_top: int = typer.Option(L_TOP.default, L_TOP.flag, help=L_TOP.help),
    layers: str = typer.Option(None, help="Explicit teacher layers instead of a layer map, e.g. '2,4,6'."),
    tokens: str = typer.Option(TOKENS.default, TOKENS.flag, help=TOKENS.help),
    ranking: str = typer.Option(RANKING.default, RANKING.flag, help=RANKING.help),
    scores: str = typer.Option(SCORES.default, SCORES.flag, help=SCORES.help),
    width: str = typer.Option(WIDTH.default, WIDTH.flag, help=WIDTH.help),
    width_seed: int = typer.Option(WIDTH_SEED.default, WIDTH_SEED.flag, help=WIDTH_SEED.help),
    values: str = typer.Option(VALUES.default, VALUES.flag, help=VALUES.help),
    attention_rows: bool = typer.Option(
        False,
        "--attention-rows",
        help="Also keep, per kept layer above the embeddings, the pre-softmax attention scores of the kept "
        "tokens' query rows [heads, NL, T] (fp16): what `hsk train --method tinybert-att` reads.",
    ),
    max_length: int = typer.Option(MAX_LENGTH.default, MAX_LENGTH.flag, help=MAX_LENGTH.help),
    batch_size: int = typer.Option(BATCH_SIZE.default, BATCH_SIZE.flag, help=BATCH_SIZE.help),
    shard_rows: int = typer.Option(SHARD_ROWS.default, SHARD_ROWS.flag, help=SHARD_ROWS.help),
    device: str = typer.Option(None, help="torch device [default: cuda when available, else cpu]."),
    selection_engine: str = typer.Option(ENGINE.default, ENGINE.flag, help=ENGINE.help),
    precision: str = typer.Option(PRECISION.default, PRECISION.flag, help=PRECISION.help),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace an hsk store at --out (swapped in once the new one is complete)."
    ),
    allow_task_mismatch: bool = typer.Option(
        False,
        "--allow-task-mismatch",
        help="Use a teacher whose label names or task say it was fine-tuned for another task (recorded in the store).",
    ),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    objective: str = typer.Option("task", help="task (a fine-tuned classifier's store), mlm (masked-LM top-k), "
                                  "clm (a causal LM's next-token distributions) or seq2seq (pairs: the teacher's "
                                  "output and per-target-token distributions)."),
    text_file: str = typer.Option(None, help="--objective mlm/clm: raw text, one example (document) per line."),
    support: str = typer.Option("topk:64", help="--objective clm/seq2seq: per position, topk:K (the K most "
                                "probable ids and their log-probs; the tail mass is 1 - their sum) or sample:N (N "
                                "draws from the teacher, RS-KD: distinct ids and counts); clm also takes "
                                "hidden[:CODEC] (the final hidden state through a value codec, Hadamard-rotated, "
                                "and the LM head once: the full distribution); seq2seq also takes none (the "
                                "teacher's output alone)."),
    decode: str = typer.Option("none", help="--objective seq2seq: also store the teacher's own output for each "
                               "source (sequence-level KD): greedy or beam:N (no sampling, no length penalty)."),
    supports_on: str = typer.Option(None, help="--objective seq2seq: the target the supports sit on, reference or "
                                    "teacher [default: teacher with --decode, else reference]."),
    max_target: int = typer.Option(64, help="--objective seq2seq: target tokens kept per pair (and the most the "
                                   "teacher generates); --max-length bounds the source."),
    prompt: str = typer.Option(None, help="--objective seq2seq with a decoder-only teacher: the prompt template, "
                               "{source} where the source goes [default: '{source}\\n']."),
    logprobs: str = typer.Option("float16", help="--objective clm with topk: the value codec of the log-probs "
                                 "(float16, int8, int4, mxfp4, nf3, nf4)."),
    block_size: int = typer.Option(256, help="--objective clm: tokens per block (documents packed, EOS between)."),
    positions: float = typer.Option(1.0, help="--objective clm: the fraction of positions that keep a support, "
                                    "those of highest teacher entropy (selective KD); 1 keeps all."),
    sample_seed: int = typer.Option(0, help="--objective clm with sample:N: the draws of block r come from a "
                                    "generator seeded (seed, r); with hidden: the rotation's seed."),
    limit_tokens: int = typer.Option(None, help="--objective clm: dump only the first N tokens of the corpus."),
    top_k: int = typer.Option(TOP_K.default, TOP_K.flag, help=TOP_K.help),
    mask_seed: int = typer.Option(MASK_SEED.default, MASK_SEED.flag, help=MASK_SEED.help),
    workers: int = typer.Option(
        None, help="Dump on a local dask cluster of N processes, each computing and writing whole shards "
        "(one GPU per worker with --device cuda)."),
    scheduler: str = typer.Option(
        None, help="Dump on a running dask cluster (tcp://HOST:PORT); every worker must reach the teacher, "
        "the data it is sent and --out."),
    threads: int = typer.Option(
        None, "--threads", help=f"{THREADS_HELP} With --workers/--scheduler: per worker process [default: cores / "
        "workers]; equal threads give a single-process dump's bytes."),
    write_processes: int = typer.Option(
        0, "--write-processes", help="Processes that compress and write shards, beside the one that runs the "
        "teacher (0: its threads). For a GPU host with many cores, where the writes' Python part would otherwise "
        "share one GIL with tokenizing and the GPU's launches; the same bytes either way."),
    license: str = typer.Option(
        None, "--license", help="The store's licence (e.g. an SPDX id such as cc-by-4.0), from what the teacher's "
        "and the data's licences allow; recorded in the metadata and croissant.json [default: unknown, said so]."),
    creator: str = typer.Option(
        None, "--creator", help="Who made the store (a person or team; several separated by ';'); in croissant.json."),
) -> None:
    given = dict(locals())  # the options as typed: each objective's dump (DUMPS) reads those it takes
    # Arguments are checked before torch is imported: a typo costs a second, not the import (up to a minute).
    given["layers"] = _int_list(layers)
    check_threads(threads)
    sharing = _sharing(license, creator)
    _dump_of(objective)(given, sharing)


def _dump_of(objective: str) -> Callable[[dict, dict], None]:
    if objective not in DUMPS:
        raise ConfigError(f"unknown --objective {objective!r}: pass {', '.join(DUMPS)}")
    return DUMPS[objective]


def _pick_device(o: dict) -> str:
    from pipelines.core.devices import pick_device

    return pick_device(o["device"])


def _dump_task(o: dict, sharing: dict) -> None:
    """A task store: a fine-tuned classifier's logits and the HSK of --config."""
    parsed = HSKConfig.parse(o["config"]) if o["config"] else None
    if not o["task"] or not o["config"]:
        raise ConfigError("hsk dump needs --task and --config (or --objective mlm with --text-file for an MLM store)")
    from pipelines.core.precision import cpu_half_warning
    from pipelines.core.tasks import get_task
    from pipelines.dump.stage import DumpOptions

    # the declared flags (--tokens, --width, ...) by their declarations; the rest by name
    options = DumpOptions.from_flags(
        o, config=parsed, layers=o["layers"], attention_rows=o["attention_rows"], device=_pick_device(o),
        overwrite=o["overwrite"], progress=o["progress"], allow_task_mismatch=o["allow_task_mismatch"],
        write_processes=o["write_processes"], extra_meta=sharing)
    options.validate()  # before anything else: a bad value never costs a loaded teacher or a store
    if note := cpu_half_warning(o["precision"], options.device):
        typer.echo(note, err=True)
    task = get_task(o["task"]).name
    teacher = _task_teacher(task, o["teacher"])
    out = o["out"] or f"{task}.zarr"
    data = dict(split=o["split"], data_dir=o["data_dir"], data_file=o["data_file"], limit=o["limit"],
                label_column=o["label_column"],
                text_columns=o["text_columns"].split(",") if o["text_columns"] else None)
    _run_task_dump(task, options, teacher, out, o["workers"], o["scheduler"], o["threads"], data)


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


def _run_task_dump(task: str, options, teacher: str, out: str, workers: int | None, scheduler: str | None,
                   threads: int | None, data: dict) -> None:
    """A task dump in this process, or on a dask cluster (--workers/--scheduler)."""
    if workers is not None or scheduler is not None:
        from pipelines.dump.distributed import dump_distributed

        if options.write_processes:
            raise ConfigError("--write-processes and --workers/--scheduler: each dask worker already writes its own "
                              "shards; drop --write-processes")
        dump_distributed(task, options, teacher=teacher, out=out, workers=workers, scheduler=scheduler,
                         threads_per_worker=threads, log=typer.echo, **data)
    else:
        from pipelines.dump.stage import dump as run_dump

        use_threads(threads, "dump")  # recorded in the store's compute record (CPU bytes depend on it)
        run_dump(task, options, teacher=teacher, out=out, log=typer.echo, **data)
    typer.echo(f"done: {out} (see `hsk info {out}`)")


def _sharing(license: str | None, creator: str | None) -> dict:
    """What `--license`/`--creator` put in the metadata (key `sharing`); nothing when neither is given."""
    if license is not None and not license.strip():
        raise ConfigError("--license needs a value (e.g. cc-by-4.0, or leave it out: the store then says unknown)")
    creators = [name.strip() for name in (creator or "").split(";") if name.strip()]
    if not license and not creators:
        return {}
    return {"sharing": {"license": license.strip() if license else None, "creators": creators}}


def _dump_mlm(o: dict, sharing: dict) -> None:
    from pipelines.dump.mlm import Masking, dump_mlm, load_corpus

    device = _pick_device(o)
    if o["precision"] not in ("auto", "fp32"):  # not silently ignored: the MLM dump's forward is fp32
        raise ConfigError(f"--precision {o['precision']}: a masked-LM dump (--objective mlm) runs its teacher in fp32")
    for bound in MLM_BOUNDS:  # before the teacher loads, as for a task dump
        bound.check(o[bound.field])
    if not o["teacher"] or not o["out"]:
        raise ConfigError("an MLM dump needs --teacher (a BertForMaskedLM, e.g. from `hsk teacher --objective mlm`) "
                          "and --out")
    use_threads(o["threads"], "dump")
    corpus = load_corpus(o["text_file"], o["data_file"], o["text_columns"], o["limit"])
    dump_mlm(o["teacher"], o["out"], corpus, top_k=o["top_k"], masking=Masking(mask_seed=o["mask_seed"]),
             max_length=o["max_length"] or 128, batch_size=o["batch_size"], shard_rows=o["shard_rows"], device=device,
             overwrite=o["overwrite"], progress=o["progress"], log=typer.echo, extra_meta=sharing)
    typer.echo(f"done: {o['out']} (see `hsk info {o['out']}`)")


def _lm_sizes(o: dict, batch_size: int, shard_rows: int) -> tuple[int, int]:
    """--batch-size and --shard-rows, or an LM dump's own defaults where they were left at a task dump's."""
    return (o["batch_size"] if o["batch_size"] != BATCH_SIZE.default else batch_size,
            o["shard_rows"] if o["shard_rows"] != SHARD_ROWS.default else shard_rows)


def _support(text: str, optional: bool = False):
    from hskstore.format.clm import Support

    return None if optional and text.strip() == "none" else Support.parse(text)


def _dump_clm(o: dict, sharing: dict) -> None:
    from hskstore.format.clm import check_positions
    from pipelines.dump.clm import ClmRequest, dump_clm
    from pipelines.dump.mlm import load_corpus

    device = _pick_device(o)
    request = ClmRequest(_support(o["support"]), o["logprobs"], o["block_size"], o["positions"], o["sample_seed"],
                         o["limit_tokens"], *_lm_sizes(o, 8, 64), o["precision"])
    check_positions(request.positions)
    request.check()
    if not o["teacher"] or not o["out"]:
        raise ConfigError("a causal-LM dump needs --teacher (an AutoModelForCausalLM folder or hub id) and --out")
    use_threads(o["threads"], "dump")
    corpus = load_corpus(o["text_file"], o["data_file"], o["text_columns"], o["limit"])
    dump_clm(o["teacher"], o["out"], corpus, request, device=device, overwrite=o["overwrite"], progress=o["progress"],
             log=typer.echo, extra_meta=sharing)
    typer.echo(f"done: {o['out']} (see `hsk info {o['out']}`)")


def _dump_seq2seq(o: dict, sharing: dict) -> None:
    from pipelines.dump.seq2seq import Seq2seqRequest, dump_seq2seq, load_pairs, typed_prompt

    device = _pick_device(o)
    request = Seq2seqRequest(_support(o["support"], optional=True), o["decode"], o["supports_on"], o["logprobs"],
                             o["max_length"] or 128, o["max_target"], typed_prompt(o["prompt"]), o["positions"],
                             o["sample_seed"],
                             *_lm_sizes(o, 8, 256), o["precision"])
    request.check()
    if not o["teacher"] or not o["out"]:
        raise ConfigError("a seq2seq dump needs --teacher (an encoder-decoder or causal-LM folder or hub id) and --out")
    use_threads(o["threads"], "dump")
    pairs = load_pairs(task=o["task"], split=o["split"], data_dir=o["data_dir"], data_file=o["data_file"],
                       text_columns=o["text_columns"], limit=o["limit"])
    dump_seq2seq(o["teacher"], o["out"], pairs, request, device=device, overwrite=o["overwrite"],
                 progress=o["progress"], log=typer.echo, extra_meta=sharing)
    typer.echo(f"done: {o['out']} (see `hsk info {o['out']}`)")


# --objective -> its dump: (the options as typed, the sharing metadata) -> None
DUMPS = {"task": _dump_task, "mlm": _dump_mlm, "clm": _dump_clm, "seq2seq": _dump_seq2seq}


@app.command()
def info(
    store: str = typer.Argument(..., help="Store path, fsspec URL or .hsk.zip bundle."),
    as_json: bool = typer.Option(False, "--json", help="Print the full report and metadata as JSON."),
    card: bool = typer.Option(False, "--card", help="Print the store's card (its README.md) instead."),
) -> None:
    """Describe a store: config, provenance, rows, and what it costs (bytes per array, example, kept value)."""
    from hskstore.errors import printable
    from hskstore.io.card import CARD_NAME, read_card, store_name
    from hskstore.io.info import format_report, storage_report
    from hskstore.io.lineage import chain, format_chain
    from hskstore.io.reader import open_store, render_card

    s = open_store(store, allow_incomplete=True)
    text = read_card(s.group)
    if card:
        if text is None:  # written at finalize: an incomplete store, or one from an older hsk
            typer.echo(f"note: {store} has no {CARD_NAME} yet; this card is rendered from its metadata", err=True)
            text = render_card(s.meta, name=store_name(store))
        # The card file is outside every checksum (anyone can edit it): never let its bytes drive the terminal.
        typer.echo(printable(text, keep_newlines=True), nl=False)
        return
    report = storage_report(s)
    ancestors = chain(s.url, s.meta)  # lineage: root metadata of each reachable ancestor only
    if as_json:
        doc = {"content_address": s.content_address, "meta": s.meta, "storage": report, "card": text,
               "lineage": [dataclasses.asdict(a) for a in ancestors]}
        typer.echo(json.dumps(doc, indent=2, default=str))
    else:
        typer.echo(format_report(s, report))
        typer.echo(f"card           {CARD_NAME} in the store (`hsk info --card {store}` prints it)" if text else
                   "card           none yet (written when the store is finalized)")
        if ancestors:  # lineage: the stores this one was derived from, nearest first
            typer.echo("\n".join(["", "derived from (nearest first)", *format_chain(ancestors)]))


@app.command()
def verify(store: str = typer.Argument(..., help="Store path, fsspec URL or .hsk.zip bundle.")) -> None:
    """Check that a store is complete and every shard matches its checksums.

    Exit status: 0 the store is complete and every shard matches; 1 it is incomplete or damaged (each
    problem is printed); 2 there is no readable hsk store at STORE (nothing there, not a store, or
    metadata that cannot be read, or edited so that it no longer matches the store's manifest, or
    shard digests that do not add up to its checksums, or no manifest at all: see `hsk upgrade`).
    """
    from tqdm.auto import tqdm

    from hskstore.io.reader import open_store

    s = open_store(store, allow_incomplete=True)
    problems = s.verify(progress=lambda it: tqdm(it, desc="verify", unit="shard", disable=None))
    if problems:
        for p in problems:
            typer.echo(f"PROBLEM: {p}", err=True)
        raise typer.Exit(code=1)
    if s.content_address is None:
        typer.echo(f"note: no manifest covers the metadata of {store} (read with HSK_ALLOW_UNVERIFIED=1): only its "
                   f"data was checked; `hsk upgrade {store}` covers it")
    else:
        typer.echo(f"ok: metadata matches the manifest {s.content_address}")
    typer.echo(f"ok: {store} is complete; {s.n_shards} shards, {len(s)} rows match their checksums")


@app.command()
def upgrade(store: str = typer.Argument(..., help="A complete store folder or fsspec URL (not a bundle).")) -> None:
    """Bring a store written by an older hsk to the current format, its metadata covered by a manifest.

    A store of format 1, or one whose manifest is missing, is refused by every reading command: nothing
    would notice an edit to its metadata (labels, teacher, selection). A format-2 store is read as it is,
    but its arrays have no dimension names or attributes (xarray cannot open it). `hsk upgrade` takes
    the store's writer lease, checks every shard against its digests and the digests against the
    per-array checksums, then writes format-3 metadata with a manifest, each array's dimension names
    and attributes (no data is rewritten) and the card. It cannot tell whether uncovered metadata was
    edited before: look at `HSK_ALLOW_UNVERIFIED=1 hsk info STORE` first.

    Example: hsk upgrade old-sst2.zarr && hsk verify old-sst2.zarr
    """
    from hskstore import __version__
    from hskstore.io.writer import upgrade as upgrade_store

    done = upgrade_store(store, software_version=__version__, log=typer.echo)
    if not done.changed:
        if done.restored:  # an upgrade killed after its metadata, before what is rendered from it
            restored = " and ".join(done.restored)
            typer.echo(f"{store} already has a manifest ({done.content_address}); restored {restored} (rendered "
                       "from its metadata)")
        else:
            typer.echo(f"{store} already has a manifest ({done.content_address}): nothing to do")
        return
    typer.echo(f"upgraded {store} from format {done.from_version}: its data matches its checksums, and its "
               f"metadata as it is now is covered by the manifest {done.content_address}")
    typer.echo("check that `hsk info` shows what you expect (labels, teacher, selection): an edit made before "
               "the upgrade is covered too; pin the address with `hsk train --expect-store`")
