"""`hsk pack`, `hsk unpack`: a finished store as one file, and back."""

from __future__ import annotations

import typer

# This module's commands; pipelines.cli merges them into the `hsk` app (registration runs one way).
app = typer.Typer()


@app.command()
def pack(
    store: str = typer.Argument(..., help="A complete store: path or fsspec URL."),
    out: str = typer.Argument(..., help="The bundle to write, a local file named *.hsk.zip."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing bundle at OUT."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
) -> None:
    """Pack a complete store into one .hsk.zip bundle, which every reading command opens directly.

    The bundle is written under a temporary name, checked against the store's checksums and only
    then renamed to OUT; packing the same store twice gives the same bytes.

    Beside the bundle it writes NAME.croissant.json (Croissant 1.1): the bundle file with its sha256
    (a bundle cannot hold its own hash; the croissant.json inside it describes the store).

    Example: hsk pack sst2.zarr sst2.hsk.zip && hsk info sst2.hsk.zip
    """
    from tqdm.auto import tqdm

    from hskstore.io.croissant import claim_sibling, write_bundle_croissant
    from hskstore.share.bundle import pack as pack_store
    from hskstore.share.bundle import packed_before, refuse_remote_bundle

    refuse_remote_bundle(out)
    sibling = claim_sibling(out, overwrite=overwrite)  # refused before any work, like the bundle itself
    path = None if overwrite else packed_before(store, out)  # a rerun after the croissant.json could not be written
    if path is not None:
        typer.echo(f"{out} already holds this store, packed by an earlier run: writing its croissant.json", err=True)
    else:
        path = pack_store(
            store, out, overwrite=overwrite,
            progress=lambda keys: tqdm(keys, desc="pack", unit="object", disable=not progress or None),
        )
    write_bundle_croissant(path, sibling)
    typer.echo(f"packed {store} -> {path} ({path.stat().st_size / 2**20:.1f} MiB; read it directly: "
               f"`hsk info {path}`, `hsk train --store {path} ...`; Croissant metadata: {sibling})")


@app.command()
def unpack(
    bundle: str = typer.Argument(..., help="A .hsk.zip bundle (local path or fsspec URL)."),
    out: str = typer.Argument(..., help="The local folder to write the store to."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing store at OUT."),
) -> None:
    """Unpack a bundle into a store folder (checked before it takes its name).

    --overwrite replaces a store only while no dump writes it (its writer lease), and only once the new
    one is whole: the old store stays intact if the unpack fails or is killed.

    Example: hsk unpack sst2.hsk.zip sst2.zarr
    """
    from hskstore.share.bundle import unpack as unpack_bundle

    path = unpack_bundle(bundle, out, overwrite=overwrite, log=typer.echo)
    typer.echo(f"unpacked {bundle} -> {path}")
