"""`hsk derive` (a smaller store from a larger one), `hsk sweep` (the marginal-utility experiment),
`hsk report` (its plot and table)."""

from __future__ import annotations

from pathlib import Path

import typer

from hskstore.errors import UserError
from hskstore.format.config import VALUES

from .train_commands import method_options
from .types import check_seed

# This module's commands; pipelines.cli merges them into the `hsk` app (registration runs one way).
app = typer.Typer()

DERIVE_HELP = """Write the store of a smaller config from a larger store, without the teacher.

Every selection step of a dump is nested (the last layers, the top-ranked tokens, the largest
activations), so a smaller config is a sub-selection of a larger one: the result equals, array for
array, what `hsk dump` at that config would write. --values lowers the precision, never raises it:
float16 -> int8 (about half the bytes) -> int4 or mxfp4 (4 bits, a scale per 32 values), each step
exactly as the dump encodes. An interrupted derive resumes when you rerun the same command.

Examples (from a 3,8,0.2 store):

\b
  hsk derive sst2.zarr --config 1,8,0.1 --out sst2-1_8_0.1.zarr
  hsk derive sst2.zarr --config 3,8,0.2 --values int8 --out sst2-3_8_0.2-int8.zarr
  hsk derive sst2.zarr --config 3,8,0.2 --values int4 --out sst2-3_8_0.2-int4.zarr

A causal-LM store (`hsk dump --objective clm`) derives by support: a smaller top-K (the same bytes as a
dump at that K, from a float16 store), another log-prob codec, or fewer draws of a sampled store (each
position's draws thinned at random: exact in distribution):

\b
  hsk derive corpus.zarr --support topk:8 --out corpus-top8.zarr
  hsk derive corpus.zarr --support topk:32 --logprobs int8 --out corpus-top32-int8.zarr
  hsk derive corpus-s64.zarr --support sample:16 --out corpus-s16.zarr
  hsk derive corpus-hidden.zarr --support hidden:nf4 --out corpus-hidden-nf4.zarr
  hsk derive corpus-hidden.zarr --support hidden:fit --hidden-kl 0.0086 --out corpus-hidden-fit.zarr
"""

SWEEP_HELP = """From one source store, derive a grid of configs, distill students on each, record the results.

Each run (config x value dtype x student x seed) derives its store (once, cached under
WORK_DIR/stores/), trains with `hsk train`'s code in WORK_DIR/runs/<run>/, and appends one row to
the Parquet results table as soon as it finishes. Rerun the same command after an interruption:
finished runs (same run_id: source, config, dtype, student, seed, training settings) are skipped.

Before anything runs, every planned run is checked against its store with `hsk train`'s own check
(what the method needs; the student's depth against the layer map): a sweep with runs that cannot
run refuses to start, one line each with what would fix it; --dry-run marks them in the plan.

--configs: entries separated by ';'

\b
  ND,NL,W        a config derivable from the source (each at most the source's)
  table5         configs grouped by amount of HSK, A ~ 0.1, 0.5, 1, 2, 4, ...
                 up to the source's (--per-amount configs each)
  budget:BYTES   configs whose store fits BYTES per example (uncompressed estimate)
  pred-only      logits-only KD (no HSK): the reference without hidden states
  full           the source store itself (all the HSK it keeps)
  no-kd          fine-tuning on gold labels only (alpha 0: pure cross-entropy)
  ENTRY@int8     value dtypes for one entry instead of --values,
                 e.g. '3,8,0.2@int4' or 'table5@float16+int8'

--methods: comma-separated methods (`hsk methods`). --configs are mud's grid; any other method
runs once per student and seed, on the logits-only store derived from the source when it reads
logits only (kd, finetune), else on the source itself (pkd-skip/pkd-last need a --tokens cls
source). Its options are the flags of the same name (--alpha, --temperature, --beta, --epochs,
--lr); the run_id hashes the method's name and all its resolved options.

Runs go in parallel with --workers N (a local dask cluster, one process per run, each with
cores/N torch threads) or on a running dask scheduler with --scheduler tcp://host:8786 (workers
must see the same paths). The training subset is the source store's rows: dump a subset with
`hsk dump --limit N`.

Examples:

\b
  hsk sweep --store sst2.zarr --students bert2 --seeds 0,1 --work-dir runs/sweep \\
      --epochs-hsk 2 --epochs-pred 1 --data-dir ../shared/data/glue --workers 2
  hsk sweep --store sst2.zarr --configs '1,8,0.1;3,8,0.2;pred-only' --values float16,int8 \\
      --students bert2 --max-steps 200 --dry-run

Then: hsk report runs/sweep/results.parquet --out runs/sweep/report
"""

REPORT_HELP = """Plot metric vs amount of HSK from a sweep's results table, and write the markdown table.

Writes OUT/marginal_utility.png (mean over seeds with a min-max band, reference lines for
pred-only / full / no-kd, store bytes per example below) and OUT/marginal_utility.md.
Several tables (e.g. one sweep per task): one panel per table, titled by its folder's name, dev
metric against store bytes per example (log x, min-max over seeds), and one markdown section each.

Examples:

  hsk report runs/sweep/results.parquet --out runs/sweep/report
  hsk report runs/mrpc/results.parquet runs/cola/results.parquet --out runs/tasks-report
"""


def _list(text: str, what: str) -> list[str]:
    items = [p.strip() for p in text.split(",") if p.strip()]
    if not items:
        raise UserError(f"give at least one {what}")
    return items


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in _list(text, "seed")]
    except ValueError:
        raise UserError(f"--seeds takes comma-separated integers like '0,1,2', got {text!r}") from None
    for seed in seeds:
        check_seed("--seeds", seed)
    return seeds


@app.command("derive", help=DERIVE_HELP)
def derive_cmd(
    store: str = typer.Argument(..., help="The larger store (path or fsspec URL)."),
    config: str = typer.Option(None, "--config", "-c", help="ND,NL,W of the new store, e.g. 1,9,0.1."),
    out: str = typer.Option(..., "--out", "-o", help="Path or fsspec URL of the new store."),
    values: str = typer.Option(None, help=f"Value encoding: {', '.join(VALUES.values)}, never more precise "
                               "than the source's [default: the source's]."),
    attention_rows: bool = typer.Option(
        None,
        "--attention-rows/--no-attention-rows",
        help="Keep (or drop) the source's TinyBERT attention rows [default: keep them when it has them].",
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace an hsk store at --out (swapped in once the new one is complete)."
    ),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    support: str = typer.Option(None, help="A causal-LM store's smaller support instead of --config: topk:K "
                                "(K no more than the source's), sample:N (N draws of the source's, thinned), "
                                "hidden:CODEC (a hidden-state store's states in a smaller codec) or hidden:fit (a "
                                "float16 hidden-state store's states in a fitted basis, as `hsk dump` fits it)."),
    logprobs: str = typer.Option(None, help="With --support topk:K: the log-probs' value codec [default: the "
                                 "source's]."),
    hidden_kl: float = typer.Option(0.01, help="With --support hidden:fit: the mean KL(teacher || stored) the "
                                    "fitted basis's steps are made for."),
    hidden_fit_tokens: int = typer.Option(8192, help="With --support hidden:fit: how many kept positions of the "
                                          "source's start the basis is fitted to."),
) -> None:
    from tqdm.auto import tqdm

    from hskstore.io.info import human_bytes, storage_report
    from hskstore.io.reader import open_store
    from hskstore.share.derive import derive

    def bar(shards):
        return tqdm(shards, desc="derive", unit="shard", disable=not progress or None)

    if (config is None) == (support is None):
        raise UserError("hsk derive needs --config ND,NL,W (a task store) or --support (a causal-LM store), one of "
                        "the two")
    if support is not None:
        _derive_support(store, out, support, logprobs, overwrite, bar, hidden_kl, hidden_fit_tokens)
        return
    derive(store, config, out, value_dtype=values, overwrite=overwrite, progress=bar, log=typer.echo,
           attention_rows=attention_rows)
    new, src = open_store(out), open_store(store)
    report = storage_report(new)
    src_bytes = sum(int(src.group[name].nbytes_stored()) for name in src.specs)  # no full report: cheap
    ratio = src_bytes / max(report['total_bytes'], 1)
    than = "the same size" if round(ratio, 1) <= 1.0 else f"{ratio:.1f}x larger"
    typer.echo(
        f"done: {out}  config {new.config} (A={report['amount_of_hsk']:.3g} units), {new.selection.value_dtype}: "
        f"{human_bytes(report['total_bytes'])} ({report['bytes_per_example']:.1f} B/example); source "
        f"{human_bytes(src_bytes)}, {than}. See `hsk info {out}`."
    )


def _derive_support(store: str, out: str, support: str, logprobs: str | None, overwrite: bool, bar, hidden_kl: float,
                    hidden_fit_tokens: int) -> None:
    from hskstore.io.info import storage_report
    from hskstore.io.reader import open_store
    from hskstore.share.support_derive import derive_support

    source = open_store(store)
    source.refuse_support_derive()  # a task or masked-LM store: derive it with --config
    derive_support(source, out, support=support, logprob_codec=logprobs, overwrite=overwrite, progress=bar,
                   log=typer.echo, hidden_kl=hidden_kl, hidden_fit_tokens=hidden_fit_tokens)
    new = open_store(out)
    typer.echo(f"done: {out}  {new.size_summary(storage_report(new))}. See `hsk info {out}`.")


@app.command("sweep", help=SWEEP_HELP)
def sweep_cmd(
    source: str = typer.Option(..., "--store", "-s", help="Source store, dumped once at a generous config."),
    configs: str = typer.Option(
        "table5;pred-only;full;no-kd", "--configs", "-c", help="Entries separated by ';' (see above)."
    ),
    students: str = typer.Option("bert2", help="Comma-separated students: tinybert4, bert<k>, hub id or folder."),
    seeds: str = typer.Option("0", help="Comma-separated seeds, e.g. 0,1,2."),
    values: str = typer.Option("float16", help="Value dtypes of the derived stores, e.g. float16,int4."),
    work_dir: str = typer.Option("runs/sweep", help="Folder for derived stores, run folders and results."),
    results: str = typer.Option(None, help="Results table [default: WORK_DIR/results.parquet]."),
    workers: int = typer.Option(1, help="Runs in parallel on a local dask cluster (one process each)."),
    scheduler: str = typer.Option(None, help="Address of a running dask scheduler (instead of --workers)."),
    per_amount: int = typer.Option(2, help="Configs per amount of HSK in the 'table5' grid."),
    methods: str = typer.Option("mud", help="Comma-separated methods (`hsk methods`); --configs are mud's."),
    stages: str = typer.Option("hsk,pred", help="mud: stages of HSK runs (pred-only and no-kd run 'pred')."),
    epochs_hsk: float = typer.Option(None, help="Stage 1 epochs [default: per task]."),
    epochs_pred: float = typer.Option(None, help="Stage 2 epochs [default: 5]."),
    max_steps: int = typer.Option(None, help="Cap on optimizer steps per stage."),
    batch_size: int = typer.Option(None, help="Batch size [default: per task]."),
    lr_hsk: float = typer.Option(None, help="Stage 1 learning rate [default: 5e-5]."),
    lr_pred: float = typer.Option(None, help="Stage 2 learning rate [default: per task]."),
    epochs: float = typer.Option(None, help="kd, pkd-*, finetune: epochs [default: 4]."),
    lr: float = typer.Option(None, help="kd, pkd-*, finetune: learning rate [default: per task]."),
    alpha: float = typer.Option(None, help="KD mixture weight a of every method that has one."),
    temperature: float = typer.Option(None, help="Softmax temperature T of every method that has one."),
    beta: float = typer.Option(None, help="pkd-*: weight of the [CLS] loss [default: 500]."),
    set_: list[str] = typer.Option(  # noqa: B008
        None, "--set", help="Any option of a swept method as NAME=VALUE (repeatable), e.g. ptp_epochs=1."
    ),
    eval_limit: int = typer.Option(None, help="Evaluate on the first N dev examples only."),
    evaluate: bool = typer.Option(True, "--eval/--no-eval", help="--no-eval: train without dev data."),
    teacher: str = typer.Option(None, help="Where the source store's teacher is now (bert<k>; weights checked)."),
    student_base: str = typer.Option(None, help="bert<k>: checkpoint whose first k layers start the students."),
    data_dir: str = typer.Option(None, help="Local glue_data folder (or set HSK_DATA_DIR); else the HF hub."),
    device: str = typer.Option(None, help="torch device of every run [default: cuda when available, else cpu]."),
    threads: int = typer.Option(
        None, "--threads", help="torch CPU threads of each run [default: as hsk train; with --workers, cores / "
        "workers]."),
    keep_going: bool = typer.Option(True, "--keep-going/--fail-fast", help="Go on after a failed run."),
    keep_checkpoints: bool = typer.Option(
        False, "--keep-checkpoints", help="Keep each finished run's checkpoint/ (optimizer state); best/ is kept."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the planned runs (each checked against its store) and stores; run nothing."),
) -> None:
    from pipelines.core.threads import check_threads

    check_threads(threads)
    from pipelines.sweep.check import blocked_runs, refusal
    from pipelines.sweep.execute import SweepError, run_sweep
    from pipelines.sweep.plan import plan_runs
    from pipelines.sweep.spec import SweepSpec

    train: dict = {"stages": stages}
    for key, value in [("epochs_hsk", epochs_hsk), ("epochs_pred", epochs_pred), ("max_steps", max_steps),
                       ("batch_size", batch_size), ("lr_hsk", lr_hsk), ("lr_pred", lr_pred),
                       ("eval_limit", eval_limit), ("device", device), ("epochs", epochs), ("lr", lr),
                       ("alpha", alpha), ("temperature", temperature), ("beta", beta),
                       ("teacher", teacher), ("student_base", student_base)]:
        if value is not None:
            train[key] = value
    train.update(method_options({}, set_))
    if not evaluate:
        train["evaluate"] = False
    if train["stages"] == "hsk,pred":
        del train["stages"]  # the default: keeps run_ids equal to those of an API sweep without it
    spec = SweepSpec(
        source=source, configs=configs, students=_list(students, "student"), methods=_list(methods, "method"),
        seeds=_seeds(seeds), value_dtypes=tuple(_list(values, "value dtype")),
        train=train, work_dir=work_dir, results=results, data_dir=data_dir, per_amount=per_amount,
        keep_checkpoints=keep_checkpoints, threads=threads,
    )
    runs = plan_runs(spec)
    blocked = blocked_runs(spec, runs)
    if dry_run:
        _print_plan(spec, runs, blocked)
        return
    if blocked:  # before the work folder is claimed: nothing is written, nothing runs
        for line in refusal(blocked, len(runs)).args[0].splitlines():
            typer.echo(f"hsk: error: {line}", err=True)
        raise typer.Exit(code=2)
    try:
        table = run_sweep(spec, scheduler=scheduler, workers=workers, log=typer.echo, keep_going=keep_going)
    except SweepError as exc:
        typer.echo(f"hsk: error: {exc}", err=True)
        raise typer.Exit(code=1) from None
    typer.echo(f"done: {table.num_rows} runs of this sweep in {spec.results_path}. "
               f"Plot them: hsk report {spec.results_path} --out {Path(work_dir) / 'report'}")


def _print_plan(spec, runs, blocked) -> None:
    """--dry-run: every planned run with its status, the stores, and why any run cannot run."""
    from pipelines.sweep.check import describe
    from pipelines.sweep.execute import finished_run_ids

    done = finished_run_ids(spec.results_path)
    bad = {b.run.run_id for b in blocked}
    typer.echo(f"{len(runs)} runs ({len([r for r in runs if r.run_id in done])} already in {spec.results_path}):")
    typer.echo(f"  {'run_id':<17}{'kind':<10}{'config':<12}{'values':<9}{'A':>8}  {'student':<12}seed  status")
    for r in runs:
        status = "done" if r.run_id in done else "CANNOT RUN" if r.run_id in bad else "pending"
        typer.echo(f"  {r.run_id:<17}{r.kind:<10}{r.config:<12}{r.value_dtype or '-':<9}{r.amount_hsk:>8.3g}  "
                   f"{r.student:<12}{r.seed:<6}{status}")
    _print_stores(spec, runs)
    if blocked:
        typer.echo(f"{len(blocked)} of {len(runs)} runs cannot run (the sweep would refuse to start):")
        for b in blocked:
            typer.echo(f"  {describe(b.run)}: {b.problem}")


def _print_stores(spec, runs) -> None:
    from pipelines.sweep.stores import store_path

    stores = list(dict.fromkeys(r.store_key for r in runs if r.store_key is not None))
    typer.echo(f"stores to derive or reuse ({len(stores)}):")
    for cfg, dtype in stores:
        path = store_path(spec, cfg, dtype)
        typer.echo(f"  {cfg:<12}{dtype or 'logits':<9}{path}{'  (exists)' if Path(path).exists() else ''}")


@app.command("report", help=REPORT_HELP)
def report_cmd(
    results: list[str] = typer.Argument(..., help="Results table(s) (Parquet) written by `hsk sweep`."),  # noqa: B008
    out: str = typer.Option(..., "--out", "-o", help="Folder for marginal_utility.png and .md."),
    metric: str = typer.Option(None, help="Metric to plot [default: each table's most reported one]."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a report folder at --out."),
) -> None:
    from pipelines.sweep.report import report, results_markdown

    for path in results:
        if not Path(path).exists():
            raise UserError(f"no results table at {path}: run `hsk sweep` first")
    png, md = report(results[0] if len(results) == 1 else results, out, metric=metric, overwrite=overwrite)
    for path in results:
        typer.echo(results_markdown(path))
    typer.echo(f"\nplot: {png}\nreport: {md}")
