"""A command-line flag declared on a typed options field: the field is the option, its metadata the flag.

A run kind's options are dataclasses (pipelines/kinds/<kind>.py): each field whose metadata holds a `Flag`
is a flag of the command that builds them (`hsk dump`, `hsk teacher`, `hsk eval`); pipelines.cli.generated
turns the fields into Typer options. Torch-free: the CLI reads these before torch is imported.

    @dataclass(frozen=True)
    class ClmDumpOptions:
        block_size: int = flag(256, "tokens per block (documents packed, EOS between).", section=LM)

A field without a Flag is filled by the command itself (or left at its default).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Flag:
    """How a field is spelt on the command line and where `--help` lists it."""

    help: str
    decls: tuple[str, ...] = ()  # e.g. ("--task", "-t"); () is --field-name
    section: str | None = None  # the `--help` heading; None: the kind's own heading


def flag(default: Any, help: str, *decls: str, section: str | None = None) -> Any:
    """A dataclass field that is also a command-line flag."""
    return dataclasses.field(default=default, metadata={"flag": Flag(help, decls, section)})


def flag_of(field: dataclasses.Field) -> Flag | None:
    return field.metadata.get("flag")


def flag_fields(options: type) -> list[tuple[dataclasses.Field, type]]:
    """The fields of an options dataclass that are flags, with their resolved types."""
    hints = typing.get_type_hints(options)
    return [(f, hints[f.name]) for f in dataclasses.fields(options) if flag_of(f) is not None]


def flag_name(field: dataclasses.Field) -> str:
    """The flag's first long name, as `--help` shows it."""
    declared = flag_of(field)
    longs = [d for d in (declared.decls if declared else ()) if d.startswith("--")]
    return longs[0].split("/")[0] if longs else "--" + field.name.replace("_", "-")


def build(options: type, values: dict[str, object], refuse: Callable[[str, str], Exception]) -> object:
    """`options` from the given `values` (the fields not given keep their defaults). A name that is not a field
    is refused with `refuse(name, field list)`."""
    known = {f.name for f in dataclasses.fields(options)}
    for name in values:
        if name not in known:
            raise refuse(name, ", ".join(sorted(known)))
    return options(**values)


def plain_type(hint: object) -> object:
    """`X | None` -> X (a flag's value type; None stays its default)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if len(args) == 1 and type(None) in typing.get_args(hint) else hint


def coerce(options: type, name: str, text: str, error: Callable[[str], Exception]) -> object:
    """A `--set NAME=VALUE` string as the type of the field `name` of `options`."""
    hints = typing.get_type_hints(options)
    if name not in hints:
        known = ", ".join(f.name for f in dataclasses.fields(options))
        raise error(f"--set {name}: {options.__name__} has no field {name!r}; its fields: {known}")
    kind = plain_type(hints[name])
    if text.lower() == "none" and kind is not hints[name]:
        return None
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("true", "1", "yes")
        return kind(text)
    except (TypeError, ValueError):
        raise error(f"--set {name}={text}: cannot read {text!r} as {getattr(kind, '__name__', kind)}") from None
