"""The `hsk` command line: one Typer app, one module per stage.

Errors the user can act on (hskstore.errors.UserError: bad config, missing data, damaged store; and a
full disk...) print one line saying what to do and exit with status 2, never a traceback (set HSK_DEBUG=1
to see one). Any other exception is a bug in hsk: it keeps its traceback (exit status 1).
"""

from __future__ import annotations

import errno
import logging
import os
import sys

import typer

from hskstore.errors import UserError, printable

from . import (
    bundle_commands,
    doctor_commands,
    share_commands,
    store_commands,
    student_commands,
    sweep_commands,
    teacher_commands,
    train_commands,
)
from .names import HELP_NAMES, add_aliases
from .quiet import quiet_libraries
from .terminal import printable_streams
from .types import typed

app = typer.Typer(
    name="hsk",
    help=(
        "Offline feature store for teacher-free knowledge distillation of BERT-like models.\n\n"
        "Typical flow: `hsk teacher` (fine-tune a teacher) -> `hsk dump` (run it once, write a store) -> "
        "`hsk info` / `hsk verify` -> `hsk train` (distill any student from the store)."
    ),
    no_args_is_help=True,
    context_settings={"help_option_names": HELP_NAMES},
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

def _version(value: bool) -> None:
    if value:
        from hskstore import __version__

        typer.echo(f"hsk {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print hsk's version and exit."
    ),
) -> None:
    """Offline feature store for teacher-free knowledge distillation of BERT-like models."""


# Commands that resume where they stopped when rerun: Ctrl-C tells the user so.
RESUMABLE = {"dump", "derive", "train", "sweep"}

# The commands, in the order `hsk --help` lists them. Each module owns a Typer of its own and never
# imports this package: registration runs one way, from here.
for _module in (bundle_commands, share_commands, store_commands, train_commands, sweep_commands, teacher_commands,
                student_commands, doctor_commands):
    app.add_typer(_module.app)


def command():
    """The `hsk` click group as it runs: Typer's commands, with the old option names as hidden aliases."""
    return add_aliases(typed(app))


def _command(argv: list[str] | None) -> str | None:
    args = sys.argv[1:] if argv is None else argv
    return next((a for a in args if not a.startswith("-")), None)


def _from_ctrl_c(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _interrupted(argv: list[str] | None) -> int:
    resumable = _command(argv) in RESUMABLE
    print(f"\ninterrupted{': rerun the same command to resume' if resumable else ''}", file=sys.stderr)
    return 130


def _error(message: object) -> None:
    # Names from stores, files and checkpoints can hold control characters: never let them reach the terminal.
    print(f"hsk: error: {printable(message, keep_newlines=True)}", file=sys.stderr)


def _environment_message(exc: BaseException) -> str | None:
    """The one line for a problem of the machine a user can act on (full disk, a name too long, storage
    credentials, permission or endpoint: hskstore.io.access), None for the rest."""
    from hskstore.io.access import access_problem

    access = access_problem(exc)
    if access is not None:
        return access
    if not isinstance(exc, OSError):
        return None
    if exc.errno == errno.ENOSPC:
        return (f"disk full ({exc}). Nothing written so far is lost: free some space and rerun the same command "
                "to resume.")
    if exc.errno == errno.ENAMETOOLONG:
        name = str(exc.filename or "")
        shown = name if len(name) <= 60 else f"{name[:40]}...{name[-12:]} ({len(name)} characters)"
        return f"a file name is too long for the filesystem: {shown}; choose a shorter name"
    return None


def _in_memory_url(argv: list[str] | None) -> str | None:
    """An argument naming a memory:// URL: the filesystem of this one process, gone when hsk exits."""
    args = sys.argv[1:] if argv is None else argv
    return next((a.partition("=")[2] or a for a in args if "memory://" in a.lower()), None)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 a problem the message explains, 130 interrupted).
    Everything it prints goes through pipelines.cli.terminal: no control character reaches the terminal."""
    if sys.stdout is None or sys.stderr is None:  # started with a standard stream closed (`hsk info S >&-`)
        return _closed_stream()
    with printable_streams():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    # hsk's library loggers repeat what the commands print: one copy on the terminal is enough.
    logging.getLogger("hsk").addHandler(logging.NullHandler())
    quiet_libraries()  # transformers' own bars and load-report tables (pipelines/cli/quiet.py)
    memory = _in_memory_url(argv)
    if memory is not None:
        _error(f"{memory}: memory:// lives in the memory of one hsk process and is gone when it exits; give a "
               "local path or a storage URL such as s3://bucket/store.zarr")
        return 2
    try:
        command()(args=argv, prog_name="hsk")  # standalone: click handles --help and usage errors itself
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code == 130 and _from_ctrl_c(exc):  # Typer turns Ctrl-C into exit 130, silently
            return _interrupted(argv)
        return code
    except KeyboardInterrupt:
        return _interrupted(argv)
    except UserError as exc:
        if os.environ.get("HSK_DEBUG"):
            raise
        _error(exc)
        return 2
    except Exception as exc:  # the machine's problems are one line; anything else is a bug: its traceback is shown
        message = _environment_message(exc)
        if message is None or os.environ.get("HSK_DEBUG"):
            raise
        _error(message)
        return 2
    return 0


def _closed_stream() -> int:
    """Refuse to run at all: a command's output or its errors would be lost midway, after it changed things."""
    closed = "standard output" if sys.stdout is None else "standard error"
    if sys.stderr is not None:
        _error(f"{closed} is closed: hsk has nowhere to write; run it with {closed} open (redirect it to "
               "/dev/null to discard it)")
    return 2


def run() -> None:
    code = main()
    if code == 2 and not os.environ.get("HSK_DEBUG"):
        # After the one line that says what to do, what zarr's or an object store client's concurrent reads
        # stopped midway leave behind is noise: coroutines Python reports as "Exception ignored in ..." and
        # tasks asyncio logs as "Task exception was never retrieved" when they are collected at exit.
        sys.unraisablehook = lambda unraisable: None
        logging.getLogger("asyncio").setLevel(logging.CRITICAL + 1)
    sys.exit(code)
