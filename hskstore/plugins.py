"""Extensions from other packages: Python entry points, one group per extension point.

A package extends hsk by declaring an entry point in its own pyproject.toml; installing it is all the
user does (docs/methods/adding-a-method.md):

    [project.entry-points."hsk.methods"]
    cosine-kd = "my_package.cosine_kd"          # a module that calls pipelines.registry.register(...)

Groups: `hsk.methods` (distillation methods; pipelines.registry loads them the first time a method is
looked up that is not built in, or when all are listed) `hsk.codecs` (value codecs: hskstore.codecs
finds them from their metadata when its names are listed and imports one on its first lookup) and
`hsk.store_kinds` (store kinds: hskstore.format.kinds imports them when a kind it does not know is asked for) and
`hsk.run_kinds` (a store kind's compute: pipelines.runkinds imports the one entry point named after the kind asked
for, and no other). An entry
point names a module, whose import registers what it holds, or a module attribute, which the registry of
its group registers. This module only finds and imports them: torch-free, as all of hskstore.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from .errors import UserError, printable

METHODS = "hsk.methods"
CODECS = "hsk.codecs"
STORE_KINDS = "hsk.store_kinds"
RUN_KINDS = "hsk.run_kinds"
GROUPS = (METHODS, CODECS, STORE_KINDS, RUN_KINDS)


class PluginError(UserError):
    """An installed extension cannot be loaded (one line naming its package and what to do)."""


@dataclass(frozen=True)
class Plugin:
    group: str
    name: str  # the entry point's name
    value: str  # module or module:attribute
    package: str  # the distribution that declares it, with its version

    def load(self) -> object:
        """Import the entry point; a failure names the package that declared it."""
        try:
            return metadata.EntryPoint(self.name, self.value, self.group).load()
        except (Exception, SystemExit) as exc:  # an extension's own bug (its import may even exit): update or remove it
            raise PluginError(
                f"the {self.group} extension {self.name!r} of {self.package} ({self.value}) cannot be loaded: "
                f"{type(exc).__name__}: {printable(exc)}. Update or uninstall {self.package.split()[0]}"
            ) from exc


def plugins(group: str) -> list[Plugin]:
    """The entry points installed for `group`, in name order (one per name: the first found on sys.path)."""
    if group not in GROUPS:
        raise ValueError(f"unknown extension group {group!r}; known: {', '.join(GROUPS)}")
    found: dict[str, Plugin] = {}
    for ep in metadata.entry_points(group=group):
        dist = getattr(ep, "dist", None)
        package = f"{dist.metadata['Name']} {dist.version}" if dist is not None else "an unknown package"
        found.setdefault(ep.name, Plugin(group, ep.name, ep.value, package))
    return [found[name] for name in sorted(found)]


def plugin(group: str, name: str) -> Plugin | None:
    """The entry point called `name` in `group` (None: no installed package declares one); nothing is imported."""
    return next((p for p in plugins(group) if p.name == name), None)
