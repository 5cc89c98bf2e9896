"""`--help` with the options under headings: a long command's flags read as groups (what the run is, the
method's options, reading the store, online mode), not as one list of fifty.

A command declares its headings once, as a table heading -> parameter names (`sectioned(...)` gives its
command class); hsk prints plain click help (no rich), so the class lays the headings out itself, in the
table's order, each option in its declaration order; an option in no heading is listed under "Options" first.
"""

from __future__ import annotations

import click
from typer.core import TyperCommand

DEFAULT = "Options"


class SectionedCommand(TyperCommand):
    """A command whose help lists its options under the headings of `sections` (heading -> parameter names)."""

    sections: dict[str, tuple[str, ...]] = {}

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        heading_of = {name: heading for heading, names in self.sections.items() for name in names}
        grouped: dict[str, list[tuple[str, str]]] = {DEFAULT: [], **{heading: [] for heading in self.sections}}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                grouped[heading_of.get(param.name, DEFAULT)].append(record)
        for heading, records in grouped.items():
            if records:
                with formatter.section(heading):
                    formatter.write_dl(records)


def sectioned(sections: dict[str, tuple[str, ...]]) -> type[SectionedCommand]:
    """The command class of a command whose options fall under these headings."""
    return type("SectionedCommand", (SectionedCommand,), {"sections": sections})
