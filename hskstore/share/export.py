"""A store in the loaders teams already use: a Parquet file, and a `datasets.IterableDataset`.

One row per example, one column per store array, named by its path with "/" as "_"
(`layers/0/positions` -> `layers_0_positions`); per-row arrays become (nested) fixed-size lists:

- each kept layer's values are *decoded* to float32, [N^L, N^W] in index order (the kept
  activations; int8/int4/mxfp4 codes times their scales), so the `scale` arrays are not
  exported; `masks` stay bit-packed uint8 [N^L, ceil(d/8)] (numpy packbits order) and say
  which of the d activations each value is (`hskstore.format.codec.dense` rebuilds the dense vectors);
- float16 arrays (attention rows) become float32 (Parquet readers differ on half floats);
- everything else (ids, label, logits, positions, scores, masked-LM arrays) keeps its dtype
  (`datasets`' numpy format widens integers to int64: the uint64 `text_hash` shows the same bits
  as int64; its features and the arrow/python views keep uint64).

The `datasets.IterableDataset` differs in one column: its `text_hash` is int64 with the same bits
(`.view(np.uint64)` gives the hash back), because torch has no uint64 tensors and `datasets` refuses to
narrow one (`with_format("torch")` would fail with "Overflow when unpacking long long").

Every shard is read digest-checked. The file is written under a temporary name beside OUT and
renamed in, following the output rule for files (`hskstore.io.outputs.claim_file_output`); its schema
metadata (`hsk_export`) names the store's content address. pyarrow is an hskstore dependency;
`datasets` is imported only by `iterable_dataset`.
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
    return {"content_address": store.content_address, "objective": store.objective, "task": meta.task.name,
            "split": meta.task.split, "rows": len(store), "hidden_size": store.hidden_size,
            "value_dtype": meta.selection.get("value_dtype"),
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


# Columns the iterable dataset gives as int64 with the same bits: torch has no uint64 tensors.
_AS_INT64 = ("text_hash",)


def _signed(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: array.view(np.int64) if name in _AS_INT64 and array.dtype == np.uint64 else array
            for name, array in columns.items()}


def rows(url: str) -> Iterator[dict[str, np.ndarray]]:
    """The store's examples in order, as the iterable dataset's columns (every shard digest-checked)."""
    store = open_store(url)
    for shard in range(store.n_shards):
        columns = _signed(shard_columns(store, store.read_shard(shard, verify=True)))
        n = len(next(iter(columns.values())))
        for i in range(n):
            yield {name: array[i] for name, array in columns.items()}


def iterable_dataset(url: str):
    """A `datasets.IterableDataset` over the store (decoded rows, digest-checked), typed like the Parquet export
    except `text_hash`: int64 with the same bits, so that every format works.

    For the Hugging Face Trainer: `iterable_dataset("sst2.zarr").with_format("torch")`.
    """
    import datasets  # only here: hskstore itself does not need datasets

    store = open_store(url)
    first = _signed(shard_columns(store, store.read(slice(0, min(1, len(store))))))
    features = datasets.Features.from_arrow_schema(arrow_table(first).schema)
    return datasets.IterableDataset.from_generator(rows, features=features, gen_kwargs={"url": str(url)})
