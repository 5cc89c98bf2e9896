"""hskstore: the on-disk format of an hsk feature store (numpy/zarr only; no torch needed).

    from hskstore import open_store
    store = open_store("sst2.zarr")          # refuses incomplete stores
    shard = store.read_shard(0)              # dict of arrays, checked against its digests
    dense = store.dense(shard, store.layers[0])   # [n, N^L, d] zero-filled teacher vectors

For analysis, hskstore.io.view gives every kept layer's dense vectors for chosen rows as numpy arrays
(`dense_view`) or an xarray.Dataset (`dense_dataset`); docs/guide/zarr-tools.md opens a store with
zarr and xarray alone.
"""

from importlib import import_module
from typing import TYPE_CHECKING

from .version import __version__

# Names resolved on first use (PEP 562), so `import hskstore.errors` or `hskstore.format.config` does not load
# zarr: the CLI imports those to parse arguments and refuse bad ones before anything heavy loads.
_EXPORTS = {
    "ConfigError": "format.config", "HSKConfig": "format.config", "Selection": "format.config",
    "CorruptStoreError": "errors", "IncompleteStoreError": "errors", "ProvenanceError": "errors",
    "StoreError": "errors", "StoreExistsError": "errors", "UnverifiedStoreError": "errors", "UserError": "errors",
    "LeaseHeldError": "io.lease", "OutputError": "io.outputs",
    "HSKStore": "io.reader", "KeptLayer": "io.reader", "MLMStore": "io.mlm_store", "TaskStore": "io.reader",
    "open_store": "io.reader", "StoreMeta": "format.meta",
}

if TYPE_CHECKING:
    from .errors import (
        CorruptStoreError,
        IncompleteStoreError,
        ProvenanceError,
        StoreError,
        StoreExistsError,
        UnverifiedStoreError,
        UserError,
    )
    from .format.config import ConfigError, HSKConfig, Selection
    from .format.meta import StoreMeta
    from .io.lease import LeaseHeldError
    from .io.mlm_store import MLMStore
    from .io.outputs import OutputError
    from .io.reader import HSKStore, KeptLayer, TaskStore, open_store


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hskstore' has no attribute {name!r}")
    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)


__all__ = [
    "ConfigError", "CorruptStoreError", "HSKConfig", "HSKStore", "IncompleteStoreError", "KeptLayer", "LeaseHeldError",
    "MLMStore", "OutputError", "ProvenanceError", "Selection", "StoreError", "StoreExistsError", "StoreMeta",
    "TaskStore", "UnverifiedStoreError", "UserError", "__version__", "open_store",
]
