"""MkDocs hooks (mkdocs.yml `hooks:`): pages and files the site builds from the repository itself.

- `reference/cli.md` is generated at build time from the Typer app (`pipelines.cli.app`): every
  command's `--help`, as `hsk CMD --help` prints it. It is never written by hand, so it cannot drift.
- The figures the Benchmarks and Evidence pages show live with their benchmarks (`benchmarks/**.png`);
  they are added to the site under the same paths instead of being copied into docs/. Pages link them
  by their path in the repository (`../benchmarks/...` from docs/, which GitHub shows too); the site
  resolves those links one folder up.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
CLI_PAGE = "reference/cli.md"
WIDTH = 100  # help text wrapped as on a 100-column terminal


def _context(command, name: str, parent=None):
    # Typer ships its own click (typer._click): its command classes name their context class.
    return command.context_class(command, info_name=name, parent=parent, terminal_width=WIDTH,
                                 max_content_width=WIDTH)


def _walk(command, ctx):
    """(context, command) for `command` and every subcommand under it, in the order `hsk --help` lists them."""
    yield ctx, command
    if hasattr(command, "list_commands"):  # a group
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            yield from _walk(sub, _context(sub, name, ctx))


def cli_reference() -> str:
    """The CLI reference page: `hsk --help`, then each command's help under its own heading."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from typer.main import get_command

    from pipelines.cli import app

    root = get_command(app)
    ctx = _context(root, "hsk")
    lines = ["# CLI reference", "",
             "Generated from the `hsk` command itself (`pipelines.cli`) when this site is built: each section is",
             "what `hsk COMMAND --help` prints. Every command also takes `--help` and its short form `-h`.", ""]
    for sub_ctx, command in _walk(root, ctx):
        path = sub_ctx.command_path
        level = "#" * max(2, min(1 + path.count(" "), 4))  # hsk, hsk dump: ##; hsk student build: ###
        lines += [f"{level} `{path}` {{ #{path.replace(' ', '-')} }}", ""]
        if command.get_short_help_str(limit=WIDTH):
            lines += [command.get_short_help_str(limit=WIDTH), ""]
        lines += ["```text", command.get_help(sub_ctx).rstrip(), "```", ""]
    return "\n".join(lines)


def on_files(files: Files, config) -> Files:
    files.append(File.generated(config, CLI_PAGE, content=cli_reference()))
    for figure in sorted(ROOT.glob("benchmarks/**/*.png")):
        uri = figure.relative_to(ROOT).as_posix()
        files.append(File(uri, src_dir=str(ROOT), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Links from a page to the repository's benchmarks/ folder (one `../` more than the page's depth in
    docs/) point at the figures added by on_files."""
    up = "../" * (page.file.src_uri.count("/") + 1)
    return re.sub(r"\]\(" + re.escape(up) + r"benchmarks/", "](" + up[3:] + "benchmarks/", markdown)
