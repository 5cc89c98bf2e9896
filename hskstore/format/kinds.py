"""Store kinds, registered by name: what a store's `objective` says it is, and where each of its parts lives.

    from hskstore.format import kinds
    kind = kinds.get(meta.get("objective", "task"))
    specs = kind.array_specs(meta)          # the arrays its metadata implies
    reader = kind.reader_class()            # its hskstore.io class (info, card, catalog, derive)

A `StoreKind` declares its name (meta["objective"]), the names it may hold at a store's root, the arrays its
metadata implies, how generic Zarr tools see each array (dimension names and attributes), and its reader
class, named "module:Class" so that this layer never imports hskstore.io. The built-in kinds are declared
below by module (imported on first lookup, as the codecs are); a package adds one through the entry point
group `hsk.store_kinds`, whose module calls `register`. docs/guide/adding-a-store-kind.md walks through one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from ..errors import UserError
from ..plugins import STORE_KINDS, plugins

TASK = "task"  # a store without `objective` is a task store (the first kind; the key came later)


class UnknownKindError(UserError, ValueError):
    """A store kind that no registered kind has (a store from a newer hsk, or a plugin not installed)."""


@dataclass(frozen=True)
class StoreKind:
    """One kind of store: everything hsk needs to write, read, describe and check it, found by name."""

    name: str  # meta["objective"]
    summary: str  # one line for `hsk info` and the docs
    array_specs: Callable[[Mapping[str, Any]], list]  # metadata -> its ArraySpecs (hskstore.format.schema)
    describe: Callable[[Any, Mapping[str, Any]], Any]  # (ArraySpec, metadata) -> the spec with dims and attributes
    root_entries: frozenset[str]  # array and group names it may hold at a store's root
    reader: str  # "module:Class": its hskstore.io reader (an HSKStore subclass)
    trains: tuple[str, ...] = ()  # the run kinds (pipelines) that train from it, for `hsk info` and the docs
    # the token arrays whose checksums make `inputs_hash` (those it has: a causal-LM store has no segment ids)
    inputs: tuple[str, ...] = ("input_ids", "token_type_ids")
    # its groups whose arrays croissant.json lists as a record set of their own, named after the group
    record_groups: frozenset[str] = frozenset()
    # its `selection` record: a class with from_dict/to_dict (None: the selection stays a mapping), and for the card,
    # croissant.json and catalogs `label()` -> (config, codec) and `kept()` -> what the store keeps, in one clause
    selection_type: type | None = None
    category: str = "other"  # its Hugging Face task category (the card's task_categories)

    def reader_class(self) -> type:
        module, _, name = self.reader.partition(":")
        return getattr(import_module(module), name)


# name -> the module whose import registers it (the built-in kinds)
_DECLARED = {TASK: "hskstore.format.schema", "mlm": "hskstore.format.mlm", "clm": "hskstore.format.clm",
             "seq2seq": "hskstore.format.seq2seq"}
_KINDS: dict[str, StoreKind] = {}
_plugins_loaded = False


def register(kind: StoreKind) -> StoreKind:
    """Add a kind (a built-in one at its module's import, a plugin's from its entry point's module)."""
    if kind.name in _KINDS and _KINDS[kind.name] is not kind:
        raise ValueError(f"store kind {kind.name!r} is registered twice")
    _KINDS[kind.name] = kind
    return kind


def _load_plugins() -> None:
    global _plugins_loaded
    if not _plugins_loaded:
        _plugins_loaded = True
        for plugin in plugins(STORE_KINDS):
            if plugin.name not in _DECLARED:  # a plugin never replaces a built-in kind
                plugin.load()


def get(name: str) -> StoreKind:
    """The kind called `name`: a built-in one, or one an installed package registers."""
    if name not in _KINDS and name in _DECLARED:
        import_module(_DECLARED[name])
    if name not in _KINDS:
        _load_plugins()
    if name not in _KINDS:
        raise UnknownKindError(f"no store kind {name!r}: this hsk knows {', '.join(names())}; a store of another "
                               "kind needs the hsk (or the package) that wrote it")
    return _KINDS[name]


def names() -> list[str]:
    """Every kind's name: the built-in ones first (in their declared order, whichever was imported first), then
    the installed packages'."""
    for name in _DECLARED:
        get(name)
    _load_plugins()
    return [*_DECLARED, *(name for name in _KINDS if name not in _DECLARED)]


def objective_of(meta: Mapping[str, Any]) -> str:
    """The kind a metadata dict describes: `task` unless it says otherwise."""
    return meta.get("objective", TASK)


def records_objective(objective: str) -> bool:
    """Whether new metadata records its `objective`: every kind's but the task kind's (no key reads as task)."""
    return objective != TASK


def kind_of(meta: Mapping[str, Any]) -> StoreKind:
    return get(objective_of(meta))
