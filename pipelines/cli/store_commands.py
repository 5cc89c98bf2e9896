"""`hsk dump`, `hsk info`, `hsk verify`, `hsk upgrade`: make a store, describe it, check it, cover an old one."""

from __future__ import annotations

import dataclasses
import json

import typer

from pipelines import runkinds
from pipelines.cli.generated import FlagTable, common_options, kind_options
from pipelines.cli.sections import sectioned
from pipelines.core.threads import check_threads
from pipelines.kinds.lm_flags import HEADING as LM_HEADING

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
--support: topk:K (ids and log-probs; the tail mass is 1 - their sum), sample:N (RS-KD: N draws, distinct
ids and counts) or hidden:CODEC (the final hidden state and the LM head: the full distribution). `hsk derive
--support` makes smaller ones; `hsk train --method clm-kd` trains from them:

\b
  hsk dump --objective clm --text-file corpus.txt --teacher my-org/my-lm --support topk:32 --out lm.zarr
  hsk dump --objective clm --text-file corpus.txt --teacher my-org/my-lm --support sample:50 --out lm-s50.zarr
  hsk dump --objective clm --text-file corpus.txt --teacher my-org/my-lm --support hidden:int8 --out lm-h.zarr
"""


OBJECTIVE_HELP = ("The kind of store: task (a fine-tuned classifier's store), mlm (masked-LM top-k), clm (a causal "
                  "LM's next-token distributions) or seq2seq (pairs: the teacher's output and per-target-token "
                  "distributions); an installed package's kind by its name.")


def _dump_table() -> FlagTable:
    """`hsk dump`'s options: every kind's flags (pipelines/kinds/<kind>.py) and the ones all kinds share."""
    table = FlagTable()
    for kind in runkinds.builtin_kinds():
        table.add(kind.dump_options, kind.name, kind.help_heading)
    table.add(runkinds.DumpCommon, None, runkinds.FORWARD)
    table.extra("objective", str, typer.Option("task", help=OBJECTIVE_HELP), LM_HEADING)
    table.extra("set_", list[str], typer.Option(None, "--set", help="An option of the kind as NAME=VALUE "
                                                "(repeatable): how an installed package's kind takes its own."),
                runkinds.FORWARD)
    return table


DUMP_TABLE = _dump_table()
# `hsk dump --help` in groups; the options in none (task, teacher, out, data) come first
DUMP_SECTIONS = DUMP_TABLE.headings([*(k.help_heading for k in runkinds.builtin_kinds()), runkinds.FORWARD,
                                     runkinds.SHARING])


def _dump(values: dict) -> None:
    """The selected kind's dump, given its typed options (pipelines.runkinds)."""
    kind = runkinds.get(values["objective"])
    # Arguments are checked before torch is imported: a typo costs a second, not the import (up to a minute).
    options = kind_options(DUMP_TABLE, kind.dump_options, kind.name, "--objective {}", values, runkinds.DumpCommon,
                           values["set_"])
    common = common_options(runkinds.DumpCommon, values)
    check_threads(common.threads)
    common.sharing()
    kind.load("dump")(options, common, typer.echo)


dump = app.command("dump", help=DUMP_HELP, cls=sectioned(DUMP_SECTIONS))(DUMP_TABLE.command(_dump))


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
