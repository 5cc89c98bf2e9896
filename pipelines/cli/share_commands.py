"""`hsk catalog`, `hsk export`: find the stores a team has, and hand one to a standard loader."""

from __future__ import annotations

import typer

from hskstore.format.config import VALUES, ConfigError

# This module's commands; pipelines.cli merges them into the `hsk` app (registration runs one way).
app = typer.Typer()

_LOCATIONS = typer.Argument(..., help="Local folders, s3:// (or other fsspec) prefixes, stores, bundles.")


@app.command()
def catalog(
    locations: list[str] = _LOCATIONS,
    # not named `task`: a filter takes any store's task ("mlm" too), not only the GLUE tasks (pipelines/cli/types.py)
    task_filter: str = typer.Option(None, "--task", help="Only stores of this task (sst2, mlm, ...)."),
    teacher: str = typer.Option(None, "--teacher", help="Only stores of this teacher: weights hash (a prefix is "
                                "enough) or part of its name."),
    config: str = typer.Option(None, "--config", help="Only stores of this config, e.g. 3,8,0.2."),
    values: str = typer.Option(None, "--values", help=f"Only stores whose values are {', '.join(VALUES.values)}."),
    derived_from: str = typer.Option(None, "--derived-from", help="Only stores derived (at any depth) from the "
                                     "store with this content address (a prefix is enough)."),
    as_json: bool = typer.Option(False, "--json", help="Print the entries as JSON (cards too with --html)."),
    html_out: str = typer.Option(None, "--html", help="Also write a self-contained HTML page of the listing here."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a catalog page hsk wrote at --html."),
) -> None:
    """List the stores and bundles under folders and prefixes, from their root metadata only (never chunks).

    Columns: content address, task, split, rows, teacher hash, config, values codec, bytes, created,
    parent (the store it was derived from), status, URL. A damaged or incomplete store is listed as
    such (`hsk verify` checks one). --html writes a static page to publish next to the bucket: a
    table sorted and filtered in the browser, each store's card, links from a store to its parent.

    Example: hsk catalog runs/ s3://team-bucket/stores --task sst2 --html runs/catalog.html
    """
    from hskstore.io.location import atomic_file
    from hskstore.io.outputs import claim_file_output
    from hskstore.share.catalog import Filters, format_table, is_catalog_page, render_html, to_json
    from hskstore.share.catalog import catalog as list_stores

    page = None
    if html_out:
        page = claim_file_output(html_out, "catalog page", is_catalog_page, overwrite=overwrite, flag="--html")
    try:
        filters = Filters(task_filter, teacher, config, values, derived_from)
        entries = list_stores(locations, filters, cards=page is not None)
    except FileNotFoundError as exc:
        raise ConfigError(f"nothing at {exc.args[0]}: give a folder, an s3:// prefix, a store or a bundle") from None
    typer.echo(to_json(entries) if as_json else format_table(entries))
    if page is not None:
        with atomic_file(page) as (f, _):  # an unpredictable temporary, renamed in; deleted on failure
            f.write(render_html(entries, title=f"hsk stores: {', '.join(locations)}").encode())
        typer.echo(f"wrote {page} ({len(entries)} entries)", err=as_json)


@app.command()
def export(
    store: str = typer.Argument(..., help="A complete store: path, fsspec URL or .hsk.zip bundle."),
    out: str = typer.Argument(..., help="The file to write (a new path; --overwrite replaces an export hsk wrote)."),
    fmt: str = typer.Option("parquet", "--format", help="Output format: parquet."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an export hsk wrote at OUT."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
) -> None:
    """Write a store as one Parquet file: one row per example, one column per array.

    Each kept layer's values are decoded to float32 fixed-size lists [NL, NW] (the kept activations,
    scales applied); masks stay bit-packed; float16 attention rows become float32. Every shard is
    checked against its digests. Readable by pyarrow, pandas and
    `datasets.load_dataset("parquet", data_files=OUT)`.

    Example: hsk export sst2.zarr --format parquet sst2.parquet
    """
    from tqdm.auto import tqdm

    from hskstore.share.export import export_parquet

    if fmt != "parquet":
        raise ConfigError(f"unknown --format {fmt!r}: hsk exports parquet")
    result = export_parquet(store, out, overwrite=overwrite,
                            progress=lambda it: tqdm(it, desc="export", unit="shard", disable=not progress))
    typer.echo(f"exported {store} -> {result.path}: {result.rows} rows, {result.columns} columns, "
               f"{result.bytes / 2**20:.2f} MiB")
