"""Store kinds, registered by name: what a store's `objective` says it is, and where each of its parts lives.

    from hskstore.format import kinds
    kind = kinds.get(meta.get("objective", "task"))
    specs = kind.array_specs(meta)          # the arrays its metadata implies
    reader = kind.reader_class()            # its hskstore.io class (info, card, catalog, derive)

A `StoreKind` declares its name (meta["objective"]), the names it may hold at a store's root, the arrays its
metadata implies, how generic Zarr tools see each array (dimension names and attributes), and its reader
class, named "module:Class" so that this layer never imports hskstore.io. The built-in kinds are declared
below by module (imported on first lookup, as the codecs are); a package adds one through the entry point
group `hsk.store_kinds`, named after its kind: a module whose import calls `register`, or a `module:attribute`
that is the StoreKind (registered here). A package's kind is imported on the first lookup of its name only, so
a broken one fails only the commands that open its stores, naming the package. docs/guide/adding-a-store-kind.md
walks through one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from ..errors import UserError, printable
from ..plugins import STORE_KINDS, Plugin, PluginError, plugins

TASK = "task"  # a store without `objective` is a task store (the first kind; the key came later)
# meta key: the distribution that provides a package's kind, recorded by the writer in that kind's stores, so that an
# hsk without the package names what to install
KIND_PACKAGE = "kind_package"


class UnknownKindError(UserError, ValueError):
    """A store kind that no registered kind has (a store from a newer hsk, or a plugin not installed)."""


@dataclass(frozen=True)
class StoreKind:
    """One kind of store: everything hsk needs to write, read, describe and check it, found by name."""

    name: str  # meta["objective"]
    summary: str  # one line for `hsk info` and the docs
    array_specs: Callable[[Mapping[str, object]], list]  # metadata -> its ArraySpecs (hskstore.format.schema)
    describe: Callable[[Any, Mapping[str, object]], Any]  # (ArraySpec, metadata) -> the spec with dims and attributes
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
    labelled: bool = False  # its task record holds a labelled task (the card shows label_names, regression, metric)

    def reader_class(self) -> type:
        module, _, name = self.reader.partition(":")
        try:
            return getattr(import_module(module), name)
        except (Exception, SystemExit) as exc:  # a package's reader that cannot be imported is its bug
            plugin = _PROVIDERS.get(self.name)
            if plugin is None:
                raise
            raise plugin_fault(plugin, f"its reader {self.reader} cannot be imported ({type(exc).__name__}: "
                               f"{printable(exc)})") from exc

    @property
    def package(self) -> str | None:
        """The installed package that provides this kind (None: hsk's own)."""
        plugin = _PROVIDERS.get(self.name)
        return None if plugin is None else plugin.package


# name -> the module whose import registers it (the built-in kinds)
_DECLARED = {TASK: "hskstore.format.schema", "mlm": "hskstore.format.mlm", "clm": "hskstore.format.clm",
             "seq2seq": "hskstore.format.seq2seq"}
_KINDS: dict[str, StoreKind] = {}
_INSTALLED: dict[str, Plugin] = {}  # kind name -> the `hsk.store_kinds` entry point that declares it
_PLUGINS_FOUND = False
_loading: Plugin | None = None  # the package whose kind is being imported (its registrations are checked)
_PROVIDERS: dict[str, Plugin] = {}  # a package's kind name -> its entry point (for errors naming the package)


def plugin_fault(plugin: Plugin, what: str) -> PluginError:
    """One line blaming an installed kind package for `what`, and saying what to do."""
    return PluginError(f"the {STORE_KINDS} extension {plugin.name!r} of {plugin.package} ({plugin.value}): {what}; "
                       f"update or uninstall {plugin.package.split()[0]}")


def register(kind: StoreKind) -> StoreKind:
    """Add a kind (a built-in one at its module's import, a plugin's from its entry point's module)."""
    if _loading is not None and kind.name in _DECLARED:
        raise plugin_fault(_loading, f"it registers the store kind {kind.name!r}, which hsk has built in")
    if kind.name in _KINDS and _KINDS[kind.name] is not kind:
        if _loading is not None:
            raise plugin_fault(_loading, f"it registers the store kind {kind.name!r}, which another package has")
        raise ValueError(f"store kind {kind.name!r} is registered twice")
    _KINDS[kind.name] = kind
    if _loading is not None:
        _PROVIDERS[kind.name] = _loading
    return kind


def _find_plugins() -> None:
    """Note the kinds of installed packages by name, once (metadata only: nothing is imported here). A name hsk
    has built in stays hsk's: a package never replaces a built-in kind."""
    global _PLUGINS_FOUND
    if not _PLUGINS_FOUND:
        _PLUGINS_FOUND = True
        _INSTALLED.update((p.name, p) for p in plugins(STORE_KINDS) if p.name not in _DECLARED)


def _load_plugin(name: str) -> None:
    """Import the package that declares the kind `name`: its module registers it, or its attribute is the kind.
    Whatever goes wrong is the package's fault, said in one line naming it (PluginError)."""
    global _loading
    plugin = _INSTALLED[name]
    for module in _DECLARED.values():  # hsk's own kinds first: the package's registrations are then its own
        import_module(module)
    _loading = plugin
    try:
        loaded = plugin.load()  # a failing import, even sys.exit: PluginError naming the package
        if isinstance(loaded, StoreKind) and _KINDS.get(loaded.name) is not loaded:
            register(loaded)  # a `module:attribute` entry point names the kind itself
    finally:
        _loading = None
    if name not in _KINDS:
        raise plugin_fault(plugin, f"it registers no store kind named {name!r} (docs/guide/adding-a-store-kind.md)")


def get(name: str) -> StoreKind:
    """The kind called `name`: a built-in one, or one an installed package declares (imported now, alone)."""
    if name not in _KINDS and name in _DECLARED:
        import_module(_DECLARED[name])
    if name not in _KINDS:
        _find_plugins()
        if name in _INSTALLED:
            _load_plugin(name)
    if name not in _KINDS:
        raise UnknownKindError(f"no store kind {name!r}: this hsk knows {', '.join(names())}; a store of another "
                               "kind needs the hsk (or the package) that wrote it")
    return _KINDS[name]


def names() -> list[str]:
    """Every kind's name: the built-in ones first (in their declared order), then the installed packages' (by
    their entry points: none is imported here)."""
    _find_plugins()
    return [*_DECLARED, *(name for name in _KINDS if name not in _DECLARED),
            *(name for name in _INSTALLED if name not in _KINDS)]


def loadable() -> list[StoreKind]:
    """Every kind that loads: the built-in ones and the installed packages' whose import works (a broken package
    is skipped here; the commands that open its stores say what is wrong with it)."""
    found = []
    for name in names():
        try:
            found.append(get(name))
        except PluginError:
            continue
    return found


def objective_of(meta: Mapping[str, object]) -> str:
    """The kind a metadata dict describes: `task` unless it says otherwise."""
    return meta.get("objective", TASK)


def records_objective(objective: str) -> bool:
    """Whether new metadata records its `objective`: every kind's but the task kind's (no key reads as task)."""
    return objective != TASK


def kind_of(meta: Mapping[str, object]) -> StoreKind:
    """The kind a metadata dict describes; one this hsk lacks is refused naming the package the store records."""
    try:
        return get(objective_of(meta))
    except UnknownKindError:
        package = meta.get(KIND_PACKAGE)
        if not isinstance(package, str) or not package.strip():
            raise
        raise UnknownKindError(f"no store kind {printable(objective_of(meta))!r}: this store's kind comes from the "
                               f"package {printable(package)}, which is not installed: install it") from None


def package_record(kind: StoreKind) -> dict[str, str]:
    """What a writer records of a kind's provider in its stores' metadata (nothing for hsk's own kinds)."""
    return {} if kind.package is None else {KIND_PACKAGE: kind.package.split()[0]}
