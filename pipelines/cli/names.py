"""One name per concept across `hsk`'s commands, and the old names kept working as hidden aliases.

The concepts and their one name each (tests/test_cli_options.py checks every command against this):

- rows of the input a command reads: `--limit` (dump, train online, teacher, student build); the dev rows
  evaluated: `--eval-limit` (train, teacher, sweep, eval); quickstart's two inputs: `--teacher-limit`,
  `--dump-limit`;
- `--workers`: dask worker processes (dump, sweep); a training run's store readers are `--read-threads`;
- torch's CPU threads: `--threads` (per worker process with dask);
- the store a command reads: `--store` where it is an option (train, sweep), STORE where it is the argument;
- the student's depth: `--student-layers` (dump, train online, student build); `--layers` always names
  teacher layers ('2,4,6');
- `--seed` defaults to 0 (`--seeds` in the sweep: "0").

An alias is accepted by the parser and left out of `--help`: scripts written against an older hsk keep
running, and a newcomer sees one name.
"""

from __future__ import annotations

from typing import Any

# Typer vendors its own click: its commands and options are recognised by what they have, not by click's classes.

# command path -> {old name: the concept's one name}
ALIASES: dict[str, dict[str, str]] = {
    "dump": {"--threads-per-worker": "--threads"},
    "train": {"--train-limit": "--limit", "--workers": "--read-threads"},
    "teacher": {"--train-limit": "--limit"},
    "student build": {"--train-limit": "--limit", "--layers": "--student-layers"},
    "quickstart": {"--teacher-examples": "--teacher-limit", "--dump-examples": "--dump-limit"},
    "eval": {"--limit": "--eval-limit"},
    "sweep": {"--source": "--store"},
}

HELP_NAMES = ["-h", "--help"]  # the app's context_settings: every command inherits them


def commands(group: Any, prefix: str = "") -> dict[str, object]:
    """Every leaf command of `group` (a click group) by its path ('dump', 'student build')."""
    out: dict[str, object] = {}
    for name, command in group.commands.items():
        path = f"{prefix} {name}".strip()
        if hasattr(command, "commands"):
            out.update(commands(command, path))
        else:
            out[path] = command
    return out


def options(command: Any) -> list[Any]:
    """A click command's options (not its arguments)."""
    return [p for p in command.params if p.param_type_name == "option"]


def _hide_in_help(option: Any, aliases: list[str]) -> None:
    """Accept `aliases` for `option` while its help line shows only its own names."""
    shown = list(option.opts)
    option.opts.extend(aliases)
    help_record = option.get_help_record

    def without_aliases(ctx: Any):
        accepted, option.opts = option.opts, shown
        try:
            return help_record(ctx)
        finally:
            option.opts = accepted

    option.get_help_record = without_aliases  # type: ignore[method-assign]


def add_aliases(group: Any) -> Any:
    """Give every option in ALIASES its old names back (hidden); a name ALIASES expects and no command has
    is a mistake in this table, so it fails loudly (the test suite runs it)."""
    found = commands(group)
    for path, renames in ALIASES.items():
        named = {opt: p for p in options(found[path]) for opt in p.opts}
        for old, new in renames.items():
            if old in named:
                raise RuntimeError(f"hsk {path}: {old} is both an option and an alias of {new}")
            _hide_in_help(named[new], [old])
    return group
