"""The decoded view for analysis: per example and kept layer, the dense teacher vectors a task store holds.

    from hskstore import open_store
    from hskstore.io.view import dense_view, dense_dataset
    store = open_store("sst2.zarr")
    view = dense_view(store, slice(0, 100))   # numpy: view.hidden [100, N^D, N^L, d] float32
    ds = dense_dataset(store, slice(0, 100))  # the same as an xarray.Dataset (needs `pip install xarray`)

Rows are read shard by shard through `read_shard`, so every value is checked against its stored digest;
the vectors are `codec.dense` of the stored arrays: zeros where the mask drops an activation and in
unused token slots (position -1).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module

import numpy as np

from ..format.config import ConfigError
from .reader import HSKStore

DIMS = ("rows", "layer", "kept_tokens", "hidden")  # the axes of `DenseView.hidden` (`dense_dataset`'s names)


@dataclass(frozen=True)
class DenseView:
    """Dense teacher vectors of some rows of a task store, every kept layer stacked.

    `hidden[i, k, s]` is the d-dimensional vector of the token at `positions[i, k, s]` of store row
    `index[i]` (source row `row[i]`) in teacher layer `teacher_layers[k]`.
    """

    index: np.ndarray  # [n] int64: the store rows read, increasing
    row: np.ndarray  # [n] int64: their row index in the source split (the store's `row` array)
    teacher_layers: tuple[int, ...]  # [N^D]: the teacher hidden state of each kept layer (0: embeddings)
    positions: np.ndarray  # [n, N^D, N^L] int16: kept token positions, -1 in unused slots
    hidden: np.ndarray  # [n, N^D, N^L, d] float32: the dense vectors, zero-filled


def _rows(store: HSKStore, index) -> np.ndarray:
    """Store rows `index` (an int, a slice, or indices) as increasing int64 indices; IndexError when outside."""
    n = len(store)
    if isinstance(index, slice):
        return np.arange(n, dtype=np.int64)[index]
    rows = np.atleast_1d(np.asarray(index, dtype=np.int64))
    if rows.size and (rows.min() < -n or rows.max() >= n):
        raise IndexError(f"rows {index!r} are outside the store's {n} rows")
    return np.unique(np.where(rows < 0, rows + n, rows))


def dense_view(store: HSKStore, index: int | slice | np.ndarray | list[int] = slice(None)) -> DenseView:
    """The dense vectors of every kept layer for store rows `index` (default: all), read and verified shard by
    shard. Raises ConfigError for a store that keeps no hidden vectors (a masked-LM store)."""
    if not store.layers:
        raise ConfigError(f"{store.url} keeps no hidden-state vectors (a masked-LM or logits-only store)")
    rows = _rows(store, index)
    names = ["row"] + [f"{layer.name}/{part}" for layer in store.layers for part in _parts(store)]
    shard_rows = store.meta["layout"]["shard_rows"]
    parts: list[dict[str, np.ndarray]] = []
    for shard in np.unique(rows // shard_rows):
        data = store.read_shard(int(shard), names=names)
        local = rows[rows // shard_rows == shard] - int(shard) * shard_rows
        parts.append({name: value[local] for name, value in data.items()})
    data = {name: _concat([p[name] for p in parts], store, name, len(rows)) for name in names}
    return DenseView(
        index=rows,
        row=data["row"].astype(np.int64),
        teacher_layers=tuple(layer.teacher_layer for layer in store.layers),
        positions=np.stack([data[f"{layer.name}/positions"] for layer in store.layers], axis=1),
        hidden=np.stack([store.dense(data, layer) for layer in store.layers], axis=1),
    )


def _parts(store: HSKStore) -> list[str]:
    """The arrays of a kept layer that dense vectors are built from (`scale` in quantised stores only)."""
    return [part for part in ("positions", "values", "masks", "scale") if f"layers/0/{part}" in store.specs]


def _concat(parts: list[np.ndarray], store: HSKStore, name: str, n: int) -> np.ndarray:
    if parts:
        return np.concatenate(parts)
    spec = store.specs[name]
    return np.zeros((n, *spec.shape[1:]), dtype=spec.dtype)  # no rows asked for


def dense_dataset(store: HSKStore, index: int | slice | np.ndarray | list[int] = slice(None)):
    """`dense_view` as an xarray.Dataset: `hidden` [rows, layer, kept_tokens, hidden] float32 and `positions`
    [rows, layer, kept_tokens] int16, with coordinates `rows` (store row), `row` (source row) and `layer`
    (teacher layer). xarray is optional: ImportError naming `pip install xarray` without it."""
    try:
        xr = import_module("xarray")
    except ImportError:
        raise ImportError("dense_dataset needs xarray: pip install xarray (or use dense_view for numpy)") from None
    view = dense_view(store, index)
    return xr.Dataset(
        {"hidden": (DIMS, view.hidden, {"description": "dense teacher vectors, zero where not kept"}),
         "positions": (DIMS[:3], view.positions, {"description": "kept token positions; -1 = unused slot"})},
        coords={"rows": view.index, "row": ("rows", view.row), "layer": list(view.teacher_layers)},
        attrs={"store": store.url, "content_address": store.content_address or "",
               "config": store.meta["selection"].get("config", "")},
    )
