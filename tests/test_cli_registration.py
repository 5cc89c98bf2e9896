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
