"""`hsk doctor`: versions, threads and load, GPU, hub, data folder, model packages and TinyBERT4's weights."""

from __future__ import annotations

import json

import typer

# This module's commands; pipelines.cli merges them into the `hsk` app (registration runs one way).
app = typer.Typer()

DOCTOR_HELP = """Say what this machine gives hsk, and what to change before the first command.

Versions (python, torch, transformers, zarr, hsk, ...), CPU cores, torch's threads, hsk's default
--threads per command and the machine's load, GPUs, whether the Hugging Face hub is reachable (one
3-second probe; none with HF_HUB_OFFLINE=1), where --data-dir resolves and which GLUE tasks it holds,
which optional model packages are installed, and where `--student tinybert4` would take its weights
from. Nothing is written. Lines marked '->' say what to do.

Examples:

\b
  hsk doctor --data-dir ../shared/data/glue
  hsk doctor --json
"""


@app.command(help=DOCTOR_HELP)
def doctor(
    data_dir: str = typer.Option(None, help="The glue_data folder to check [default: $HSK_DATA_DIR]."),
    as_json: bool = typer.Option(False, "--json", help="Print the findings as JSON."),
) -> None:
    from pipelines.doctor import as_json as findings_json
    from pipelines.doctor import diagnose

    findings = diagnose(data_dir)
    if as_json:
        typer.echo(json.dumps(findings_json(findings), indent=2))
        return
    width = max(len(f.name) for f in findings) + 2
    section = None
    for f in findings:
        if f.section != section:
            section = f.section
            typer.echo(f"{section}")
        typer.echo(f"  {f.name:<{width}}{f.value}")
        if f.advice:
            typer.echo(f"  {'':<{width}}-> {f.advice}")
