"""`hsk`'s commands are registered one way: pipelines.cli imports each command module and merges its
Typer; no command module imports pipelines.cli (no file cycle), and `hsk --help` lists every command
in the same order as before."""

from __future__ import annotations

import ast
from pathlib import Path

import pipelines.cli as cli
from pipelines.cli import main

COMMANDS = ["pack", "unpack", "catalog", "export", "dump", "info", "verify", "upgrade", "train", "methods", "eval",
            "derive", "sweep", "report", "teacher", "quickstart", "student", "doctor"]


def _imports_of(path: Path) -> set[str]:
    """Modules a file imports, relative ones resolved against pipelines.cli."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = "pipelines.cli" if node.level == 1 else "pipelines" if node.level == 2 else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            out |= {module} if node.module else {f"{module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_no_command_module_imports_the_cli_package():
    folder = Path(cli.__file__).parent
    modules = sorted(folder.glob("*_commands.py"))
    assert len(modules) == 8
    for path in modules:
        imported = _imports_of(path)
        assert "pipelines.cli" not in imported and "pipelines.cli.app" not in imported, path.name


def test_help_lists_every_command_in_order(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    lines = out.split("Commands:")[1].splitlines()
    names = [line.split()[0] for line in lines if line.startswith("  ") and not line.startswith("   ")]
    assert names == COMMANDS


def test_long_commands_list_their_options_under_headings(capsys):
    """`hsk train --help` and `hsk dump --help` group their options: every name in a command's table is one of
    its options (a typo would drop an option into the first group), and each option sits under its heading."""
    import typer

    from pipelines.cli.store_commands import DUMP_SECTIONS
    from pipelines.cli.train_commands import TRAIN_SECTIONS

    group = typer.main.get_command(cli.app)
    for command, sections, flag in (("train", TRAIN_SECTIONS, "--attention-rows"), ("dump", DUMP_SECTIONS,
                                                                                    "--support")):
        params = {p.name for p in group.commands[command].params}
        assert {n for names in sections.values() for n in names} <= params, command
        assert main([command, "--help"]) == 0
        out = capsys.readouterr().out
        positions = [out.index(f"\n{heading}:\n") for heading in sections]
        assert positions == sorted(positions) and out.index("\nOptions:\n") < positions[0], command
        heading = next(h for h, names in sections.items() if flag.lstrip("-").replace("-", "_") in names)
        assert out.index(f"\n{heading}:\n") < out.index(f"  {flag}") < (
            min([p for p in positions if p > out.index(f"\n{heading}:\n")], default=len(out))), command
