"""The value codec seam: what a codec is (`ValueCodec`) and the registry that finds one by name.

A store names its codec once, in `selection.value_dtype`; every reader, decoder, derive step and
exporter asks `get(name)` for it and never guesses from the arrays' dtypes. Codecs are declared by
name and module (hskstore/codecs/__init__.py) and their module is imported on first lookup, so
listing the names (the CLI's `--values` choices) loads no numpy. docs/guide/adding-a-codec.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, ClassVar

from ..errors import UserError
from ..plugins import CODECS, Plugin, PluginError, plugins

if TYPE_CHECKING:
    import numpy as np

FULL = "float16"  # the precision a dump reads: every codec can be encoded (and derived) from it
Arrays = dict[str, tuple[tuple[int, ...], str]]  # array ("values", "scale") -> (shape per kept vector, dtype)


class UnknownCodecError(UserError, ValueError):
    """A value codec name that no registered codec has (`codec`: that name)."""

    def __init__(self, codec: str, message: str) -> None:
        super().__init__(message)
        self.codec = codec


class ValueCodec(ABC):
    """One value encoding of the N^W kept activations of a vector (in increasing index order).

    `quantize` turns float32 values into the stored arrays, `decode` turns them back into float32.
    `via` chains codecs: a codec quantises the decoded values of its `via` codec (int4: float16 ->
    int8 -> int4), so a store derived from a `via` store is byte for byte a direct dump. Codes are
    plain numpy; the device twin (same bytes) lives outside hskstore (pipelines/core/codecs_torch.py).
    """

    name: ClassVar[str]
    bits: ClassVar[float]  # stored bits per kept value, the scale's share included
    via: ClassVar[str | None] = None  # the codec whose decoded values this one quantises (None: float16's)
    lossless: ClassVar[bool] = False  # keeps the fp16 values themselves (only such a store re-ranks a width)

    @abstractmethod
    def arrays(self, n_width: int) -> Arrays:
        """Per kept token vector: {"values": (shape, dtype)} and, for scaled codecs, "scale"."""

    @abstractmethod
    def quantize(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """float32 values [..., N^W] -> (stored values, stored scale or None)."""

    @abstractmethod
    def decode(self, values: np.ndarray, scale: np.ndarray | None, n_width: int | None = None) -> np.ndarray:
        """Stored values -> float32 [..., N^W]; without N^W, every code the bytes hold (padding decodes too)."""

    def encode(self, values16: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """fp16 kept values [..., N^W] -> the stored arrays, through the `via` chain as the dump encodes."""
        return self.requantize(FULL, values16.astype("float32"))

    def requantize(self, source: str, decoded: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The stored arrays of values that `source` decoded to, walking the `via` chain down from it."""
        if self.via is None or self.via == source:
            return self.quantize(decoded)
        parent = chained(self.via)
        return self.quantize(parent.decode(*parent.requantize(source, decoded), decoded.shape[-1]))

    def chain(self) -> tuple[str, ...]:
        """This codec and the codecs it is quantised through, down to float16: what it can be derived from."""
        names = [self.name]
        while (via := chained(names[-1]).via) is not None:
            names.append(via)
        return tuple(dict.fromkeys([*names, FULL]))


@dataclass(frozen=True)
class Declared:
    """A codec known by name before its module loads: the CLI lists it and its help without numpy."""

    name: str
    module: str  # the module (under hskstore.codecs, or absolute) whose CODEC is the instance
    help: str  # what `--values` says of it ("" when the name says it)
    alone: bool = True  # a user may choose it on its own; False: only a basis writes it (int8u: hidden:fit's indices)


_DECLARED: dict[str, Declared] = {}
_LOADED: dict[str, ValueCodec] = {}
_INSTALLED: dict[str, Plugin] = {}  # codec name -> the `hsk.codecs` entry point that declares it
_CLASHES: dict[str, Plugin] = {}  # names an installed package declares that hsk already has
_PLUGINS_FOUND = False


def declare(name: str, module: str, help: str = "", alone: bool = True) -> None:
    """Register a codec by name; its module is imported (and its CODEC checked) on first `get`. `alone=False`:
    a codec of values another step scales first (no --values, hidden:CODEC or --layer-codec offers it)."""
    _DECLARED[name] = Declared(name, module, help, alone)


def register(codec: ValueCodec, help: str = "") -> None:
    """Register an already built codec instance (e.g. from a plugin or a test)."""
    _DECLARED.setdefault(codec.name, Declared(codec.name, type(codec).__module__, help))
    _LOADED[codec.name] = codec


def find_plugins() -> None:
    """Declare the codecs of installed packages (entry point group `hsk.codecs`, hskstore.plugins), once.

    Only the entry points' metadata is read here: a plugin's module is imported on the first `get` of
    its name, like a built-in codec's, so a broken one fails only the commands that use it. An entry
    point names its codec (`int3 = "my_pkg.int3"`): a module whose CODEC is the instance, or a
    `module:attribute` that is. A name hsk already has is refused when looked up."""
    global _PLUGINS_FOUND
    if _PLUGINS_FOUND:
        return
    _PLUGINS_FOUND = True
    for plugin in plugins(CODECS):
        if plugin.name in _DECLARED:
            _CLASHES[plugin.name] = plugin
        else:
            _DECLARED[plugin.name] = Declared(plugin.name, plugin.value, f"from {plugin.package}")
            _INSTALLED[plugin.name] = plugin


def names() -> tuple[str, ...]:
    """Registered codec names, in registration order (float16 first: the default), installed ones last."""
    find_plugins()
    return tuple(_DECLARED)


def choices() -> tuple[str, ...]:
    """The codecs a user may choose on their own (`--values`, `hidden:CODEC`, `--layer-codec`, `--logprobs`)."""
    return tuple(d.name for d in declared() if d.alone)


def chosen(name: str, flag: str) -> ValueCodec:
    """The codec a user chose with `flag`; a one-line UnknownCodecError for one that only a basis writes."""
    codec = get(name)
    if not _DECLARED[name].alone:
        raise UnknownCodecError(name, f"{flag} {name}: {name} stores values another step has scaled "
                                f"({_DECLARED[name].help}); choose one of {', '.join(choices())}")
    return codec


def declared() -> tuple[Declared, ...]:
    find_plugins()
    return tuple(_DECLARED.values())


def get(name: str) -> ValueCodec:
    """The codec registered as `name`; UnknownCodecError (a user error) for any other name, and PluginError
    for a name that an installed package declares too (which of the two the user means is unclear)."""
    find_plugins()
    if name in _CLASHES:
        plugin = _CLASHES[name]
        raise PluginError(f"the {CODECS} extension {name!r} of {plugin.package} ({plugin.value}) names a value "
                          f"codec hsk already has; uninstall {plugin.package.split()[0]}")
    return chained(name)


def chained(name: str) -> ValueCodec:
    """The codec a `via` chain names: hsk's own where a package clashes with it, so that a clashing package
    fails only the commands that name its codec (int4 still quantises through hsk's int8)."""
    if name not in _LOADED:
        find_plugins()
        if name not in _DECLARED:
            raise UnknownCodecError(name, f"unknown value dtype {name!r}; choose one of {', '.join(_DECLARED)}")
        _LOADED[name] = _installed(name) if name in _INSTALLED else _built_in(name)
    return _LOADED[name]


def _built_in(name: str) -> ValueCodec:
    where = _DECLARED[name].module
    codec = import_module(where if "." in where else f"{__package__}.{where}").CODEC
    if codec.name != name:
        raise TypeError(f"module {where} declares codec {codec.name!r}, registered as {name!r}")
    return codec


def _installed(name: str) -> ValueCodec:
    plugin = _INSTALLED[name]
    loaded = plugin.load()  # PluginError, naming the package, when its import fails
    codec = getattr(loaded, "CODEC", loaded)
    if not isinstance(codec, ValueCodec) or codec.name != name:
        what = f"codec {codec.name!r}" if isinstance(codec, ValueCodec) else f"a {type(codec).__name__}"
        raise PluginError(f"the {CODECS} extension {name!r} of {plugin.package} ({plugin.value}) gives {what}, not "
                          f"a ValueCodec named {name!r} (docs/guide/adding-a-codec.md); update or uninstall "
                          f"{plugin.package.split()[0]}")
    return codec


def can_convert(source: str, target: str) -> bool:
    """Precision only goes down: `target` is `source`, or quantised (through its chain) from it."""
    return source in get(target).chain()
