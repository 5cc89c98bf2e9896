"""Commands whose options are generated from typed dataclasses: each run kind's flags declared in its own module.

`hsk dump`, `hsk teacher` and `hsk eval` take the flags of the options every kind shares (pipelines.runkinds:
DumpCommon, ...) and of each built-in kind's options dataclass (pipelines/kinds/<kind>.py, pipelines.core.flags).
Typer reads a command's options from `inspect.signature`, so the command gets a generated `__signature__`; the
`--help` headings come from each field's `Flag.section` (or its kind's heading). A flag given on the command line
that the selected kind does not declare is refused in one line naming the kinds it belongs to; the selected kind's
options dataclass is built from the flags given (the others keep the dataclass's defaults, which may differ per
kind: --batch-size is 64 for a task dump and 8 for a causal-LM dump). A kind of an installed package (entry point
group hsk.run_kinds) has no flags here, so that `hsk` never imports a plugin to start: its options are given as
`--set NAME=VALUE`, read as its fields' types.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import typer

from hskstore.errors import UserError
from pipelines.core.flags import Flag, build, coerce, flag_fields, flag_name, flag_of, plain_type

DEFAULT = ""  # the section of the options listed first, under "Options"


@dataclass
class FlagTable:
    """The options of a generated command: its parameters, the kinds that declare each, its `--help` headings."""

    params: dict[str, inspect.Parameter] = field(default_factory=dict)
    owners: dict[str, list[str]] = field(default_factory=dict)  # name -> kinds declaring it ([]: every kind's)
    flags: dict[str, str] = field(default_factory=dict)  # name -> its flag as `--help` shows it
    sections: dict[str, list[str]] = field(default_factory=dict)

    def add(self, options: type, owner: str | None, heading: str) -> None:
        """The flag fields of `options` (`owner`: the kind that declares them; None: every kind)."""
        for f, hint in flag_fields(options):
            if owner is not None:
                self.owners.setdefault(f.name, []).append(owner)
            if f.name in self.params:
                continue  # declared by an earlier kind: its declaration is the option
            declared: Flag = flag_of(f)
            self.params[f.name] = inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, annotation=plain_type(hint),
                default=typer.Option(f.default, *declared.decls, help=declared.help))
            self.flags[f.name] = flag_name(f)
            section = heading if declared.section is None else declared.section
            if section != DEFAULT:
                self.sections.setdefault(section, []).append(f.name)

    def extra(self, name: str, annotation: object, default: object, section: str = DEFAULT) -> None:
        """An option the command declares itself (its selector, --set), or an argument."""
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if isinstance(default, typer.models.ArgumentInfo) else (
            inspect.Parameter.KEYWORD_ONLY)
        self.params[name] = inspect.Parameter(name, kind, annotation=annotation, default=default)
        if section != DEFAULT:
            self.sections.setdefault(section, []).append(name)

    def headings(self, first: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """The `--help` table: the headings in `first` in that order, then the others as they came."""
        order = [h for h in dict.fromkeys(first) if h in self.sections]
        order += [h for h in self.sections if h not in order]
        return {h: tuple(self.sections[h]) for h in order}

    def command(self, body: Callable[[dict[str, object]], None]) -> Callable[..., None]:
        """A function Typer reads as a command with these options, calling body(values)."""
        # arguments first; the click context tells a flag given from one left at its default
        context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
        params = sorted([context, *self.params.values()], key=lambda p: p.kind)

        def run(**values: object) -> None:
            body(values)

        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run


def given_names(values: dict[str, object]) -> set[str]:
    """The options given on the command line (not left at their defaults)."""
    ctx = values.get("ctx")
    if ctx is None:  # called from Python: whatever is not None was given
        return {name for name, value in values.items() if value is not None}
    # by the source's name: Typer vendors its own click, whose enum is not click's
    sources = {name: ctx.get_parameter_source(name) for name in values}
    return {name for name, source in sources.items() if getattr(source, "name", None) == "COMMANDLINE"}


def kind_options(table: FlagTable, options: type, kind: str, selector: str, values: dict[str, object],
                 common: type, sets: list[str] | None = None) -> object:
    """The options dataclass of the selected `kind` from the flags given; one given for another kind is refused
    (`selector` names a kind in the refusal: "--objective {}")."""
    own = {f.name for f in dataclasses.fields(options)}
    shared = {f.name for f in dataclasses.fields(common)}
    chosen = {}
    for name in sorted(given_names(values) & set(table.owners)):
        if name in own:
            chosen[name] = values[name]
        elif name not in shared:
            owners = selector.format(" and ".join(table.owners[name]))
            raise UserError(f"{table.flags[name]} is an option of {owners}, not of {selector.format(kind)}: drop it")
    for item in sets or []:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise UserError(f"--set takes NAME=VALUE, got {item!r}")
        key = name.strip().replace("-", "_")
        chosen[key] = coerce(options, key, text.strip(), UserError)
    return build(options, chosen, lambda name, known: UserError(f"{name}: not an option of {kind}; its: {known}"))


def common_options(common: type, values: dict[str, object]) -> object:
    return common(**{f.name: values[f.name] for f in dataclasses.fields(common) if f.name in values})
