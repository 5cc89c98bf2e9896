"""hskstore: the on-disk format of an hsk feature store (numpy/zarr only; no torch needed).

    from hskstore import open_store
    store = open_store("sst2.zarr")          # refuses incomplete stores
    shard = store.read_shard(0)              # dict of arrays, checked against its digests
    dense = store.dense(shard, store.layers[0])   # [n, N^L, d] zero-filled teacher vectors
"""

from .config import ConfigError, HSKConfig, Selection
from .errors import (
    CorruptStoreError,
    IncompleteStoreError,
    ProvenanceError,
    StoreError,
    StoreExistsError,
    UnverifiedStoreError,
)
from .lease import LeaseHeldError
from .outputs import OutputError
from .reader import HSKStore, KeptLayer, open_store
from .version import __version__

__all__ = [
    "ConfigError", "CorruptStoreError", "HSKConfig", "HSKStore", "IncompleteStoreError", "KeptLayer",
    "LeaseHeldError", "OutputError", "ProvenanceError", "Selection", "StoreError", "StoreExistsError", "open_store",
    "UnverifiedStoreError",
    "__version__",
]
