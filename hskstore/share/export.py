"""A store in the loaders teams already use: a Parquet file, and a `datasets.IterableDataset`.

One row per example, one column per store array, named by its path with "/" as "_"
(`layers/0/positions` -> `layers_0_positions`); per-row arrays become (nested) fixed-size lists:

- each kept layer's values are *decoded* to float32, [N^L, N^W] in index order (the kept
  activations; int8/int4/mxfp4 codes times their scales), so the `scale` arrays are not
  exported; `masks` stay bit-packed uint8 [N^L, ceil(d/8)] (numpy packbits order) and say
  which of the d activations each value is (`hskstore.format.codec.dense` rebuilds the dense vectors);
- float16 arrays (attention rows) become float32 (Parquet readers differ on half floats);
- everything else (ids, label, logits, positions, scores, masked-LM arrays) keeps its dtype, `text_hash`
  uint64 included, in the Parquet file and in the `datasets.IterableDataset` alike.

For torch, `iterable_dataset(url, signed_hash=True)` gives `text_hash` as int64 with the same bits
(`.view(np.uint64)` gives the hash back): torch has no uint64 tensors and `datasets` refuses to narrow one
(`with_format("torch")` fails with "Overflow when unpacking long long" on a hash of 2^63 or more). It is an
explicit choice, so the default types are the Parquet file's.

Every shard is read digest-checked. The file is written under a temporary name beside OUT and
renamed in, following the output rule for files (`hskstore.io.outputs.claim_file_output`); its schema
metadata (`hsk_export`, JSON) names the store's content address, its label names, its config and the
teacher layer each `layers_<i>_*` column holds, so the file is self-describing without the store.
pyarrow is an hskstore dependency; `datasets` is imported only by `iterable_dataset`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..format import codec
from ..io.location import atomic_file
from ..io.outputs import claim_file_output
from ..io.reader import HSKStore, open_store

EXPORT_KEY = b"hsk_export"


def column_name(array: str) -> str:
    return array.replace("/", "_")


def shard_columns(store: HSKStore, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The exported columns of one shard's arrays: values decoded, scales folded in, float16 widened."""
    n_width = store.metadata.layout.n_width
    values = store.metadata.selection.get("value_dtype")  # the store's codec, by name
    out = {}
    for name, array in data.items():
        if name.endswith("/scale"):
            continue  # folded into the decoded values
        if name.startswith("layers/") and name.endswith("/values"):
            scale = data.get(name[: -len("values")] + "scale")
            array = codec.decode_values(values, array, scale, n_width)[..., :n_width].astype(np.float32)
        elif array.dtype == np.float16:
            array = array.astype(np.float32)
        out[column_name(name)] = array
    return out


def _arrow(array: np.ndarray) -> pa.Array:
    out = pa.array(np.ascontiguousarray(array).reshape(-1))
    for size in reversed(array.shape[1:]):
        out = pa.FixedSizeListArray.from_arrays(out, size)
    return out


def arrow_table(columns: dict[str, np.ndarray], metadata: dict | None = None) -> pa.Table:
    table = pa.table({name: _arrow(array) for name, array in columns.items()})
    return table.replace_schema_metadata({EXPORT_KEY: json.dumps(metadata or {}).encode()})


def _export_metadata(store: HSKStore) -> dict:
    meta = store.metadata
    # layers_<i> -> its teacher layer (H_0 the embeddings): the column names only count kept layers
    layers = {column_name(layer.name): {"teacher_layer": layer.teacher_layer, "ranking_layer": layer.ranking_layer}
              for layer in store.layers}
    labels = meta.task.labels
    return {"content_address": store.content_address, "objective": store.objective, "task": meta.task.name,
            "split": meta.task.split, "labels": list(labels) if labels else None,
            "regression": meta.task.regression, "rows": len(store), "hidden_size": store.hidden_size,
            "config": meta.selection.get("config"), "value_dtype": meta.selection.get("value_dtype"),
            "layers": layers, "teacher_weights_hash": meta.teacher.weights_hash,
            "values": "decoded float32 [N^L, N^W] per kept layer; masks bit-packed (numpy packbits)"}


def arrow_schema(store: HSKStore) -> pa.Schema:
    """The export's schema (from the first shard's first row: shapes are fixed per store)."""
    first = store.read(slice(0, min(1, len(store))))
    return arrow_table(shard_columns(store, first), _export_metadata(store)).schema


@dataclass(frozen=True)
class ExportResult:
    path: str
    rows: int
    columns: int
    bytes: int


def is_export(path) -> bool:
    """Whether a file is a Parquet file `export_parquet` wrote (the only file --overwrite replaces)."""
    try:
        return EXPORT_KEY in (pq.read_schema(path).metadata or {})
    except Exception:  # not Parquet at all
        return False


def export_parquet(url: str, out: str, *, overwrite: bool = False, progress=None) -> ExportResult:
    """Write the complete store at url as one Parquet file `out` (one row per example)."""
    path = claim_file_output(out, "parquet export", is_export, overwrite=overwrite)
    store = open_store(url)  # refuses incomplete and edited stores
    shards = range(store.n_shards)
    with atomic_file(path) as (file, _), pq.ParquetWriter(file, arrow_schema(store)) as writer:
        for shard in progress(shards) if progress else shards:
            columns = shard_columns(store, store.read_shard(shard, verify=True))
            writer.write_table(arrow_table(columns, _export_metadata(store)))
    schema = pq.read_schema(path)
    return ExportResult(str(path), len(store), len(schema.names), path.stat().st_size)


# Columns `signed_hash` gives as int64 with the same bits: torch has no uint64 tensors.
_AS_INT64 = ("text_hash",)


def _signed(columns: dict[str, np.ndarray], signed: bool) -> dict[str, np.ndarray]:
    if not signed:
        return columns
    return {name: array.view(np.int64) if name in _AS_INT64 and array.dtype == np.uint64 else array
            for name, array in columns.items()}


def rows(url: str, signed_hash: bool = False) -> Iterator[dict[str, np.ndarray]]:
    """The store's examples in order, as the iterable dataset's columns (every shard digest-checked)."""
    store = open_store(url)
    for shard in range(store.n_shards):
        columns = _signed(shard_columns(store, store.read_shard(shard, verify=True)), signed_hash)
        n = len(next(iter(columns.values())))
        for i in range(n):
            yield {name: array[i] for name, array in columns.items()}


def iterable_dataset(url: str, *, signed_hash: bool = False):
    """A `datasets.IterableDataset` over the store (decoded rows, digest-checked), typed exactly like the Parquet
    export (`text_hash` uint64). `signed_hash=True` gives `text_hash` as int64 with the same bits, which torch
    needs; `.with_format("torch")` asks for that itself (hskstore.share.hf_rows.StoreRows).
    """
    import datasets  # only here: hskstore itself does not need datasets

    from hskstore.share.hf_rows import store_rows_class

    store = open_store(url)
    first = shard_columns(store, store.read(slice(0, min(1, len(store)))))

    def arguments(signed: bool) -> dict:
        features = datasets.Features.from_arrow_schema(arrow_table(_signed(first, signed)).schema)
        return {"generator": rows, "features": features, "gen_kwargs": {"url": str(url), "signed_hash": signed}}

    made = datasets.IterableDataset.from_generator(**arguments(signed_hash))
    made.__class__ = store_rows_class()  # the same object, with the with_format that knows text_hash
    made.hsk_signed_twin = None if signed_hash else arguments(True)
    return made
