"""The values' domain: the rules a shard's decoded arrays obey whoever wrote them (ids below the vocabulary,
lengths within their arrays, finite log-probs, ...), checked by the readers as each shard is read.

The digests and the manifest prove that a store is the one its writer sealed, not that its writer was honest:
whoever forges values can recompute both. These rules refuse what no dump writes, before a trainer indexes an
embedding with it or a loss turns it into NaN. Each store kind lists its rules (`domain_checks(selection)` in
its hskstore.format module); a rule is a `DomainCheck` naming the arrays it reads, so that a read of some
arrays runs the rules it can. Pure numpy, vectorized per shard as the digests are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

Arrays = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Breach:
    """A broken rule: the array that breaks it and the rule, in words (for one `hsk: error:` line)."""

    array: str
    rule: str


@dataclass(frozen=True)
class DomainCheck:
    """One rule over a shard's arrays: `needs` the arrays it reads (a read that lacks one skips it), `rule` the
    function that returns the Breach it finds, or None."""

    needs: tuple[str, ...]
    rule: Callable[[Arrays], Breach | None]


def first_breach(data: Arrays, checks: Iterable[DomainCheck]) -> Breach | None:
    """The first rule of `checks` that `data` breaks (rules whose arrays were not read are skipped)."""
    for check in checks:
        if all(name in data for name in check.needs):
            breach = check.rule(data)
            if breach is not None:
                return breach
    return None


def ids_below(name: str, vocab_size: int) -> DomainCheck:
    """Every id of the array `name` is a vocabulary id: 0 <= id < vocab_size."""

    def rule(data: Arrays) -> Breach | None:
        ids = data[name]
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            bad = int(ids.max()) if int(ids.max()) >= vocab_size else int(ids.min())
            return Breach(name, f"holds id {bad}, outside the vocabulary 0..{vocab_size - 1}")
        return None

    return DomainCheck((name,), rule)


def lengths_within(name: str, low: int, high: int) -> DomainCheck:
    """Every length of the array `name` is in low..high (the real tokens of a row of `high` positions)."""

    def rule(data: Arrays) -> Breach | None:
        lengths = data[name]
        if lengths.size and (int(lengths.min()) < low or int(lengths.max()) > high):
            bad = int(lengths.min()) if int(lengths.min()) < low else int(lengths.max())
            return Breach(name, f"holds length {bad}, outside {low}..{high}")
        return None

    return DomainCheck((name,), rule)


def finite(name: str) -> DomainCheck:
    """Every value of the (floating-point) array `name` is finite."""

    def rule(data: Arrays) -> Breach | None:
        values = data[name]
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            return Breach(name, "holds a NaN or infinite value")
        return None

    return DomainCheck((name,), rule)


# --- selection fields: the metadata's numbers within their domains (the selection records' from_dict) ---------
MAX_VOCAB = 2**32  # ids are stored in at most 32 bits
MAX_WIDTH = 2**24  # positions per row: far above any model's context, keeps an edited width from exhausting memory


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def int_within(field: str, value: object, low: int, high: int) -> str | None:
    """The problem of a selection field that must be an integer in low..high (None: none)."""
    if not is_int(value) or not low <= value <= high:
        return f"{field} {value!r} is not an integer in {low}..{high}"
    return None


def first_problem(problems: Iterable[str | None]) -> str | None:
    return next((p for p in problems if p), None)
