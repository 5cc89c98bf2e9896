"""The results table of a sweep: one row per training run, one Parquet file, keyed by run_id.

The sweep appends a row when a run finishes; `pipelines.sweep.report` and the notebook read it.
Appends rewrite the whole file atomically (temp file in the same folder, then os.replace), so a
crash mid-write never leaves a half-written table, and a re-run of the same run_id replaces
its old row instead of counting it twice. An advisory lock serialises concurrent appenders.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from hskstore.errors import UserError
from hskstore.io.location import file_lock

KINDS = ("hsk", "pred_only", "full", "no_kd", "method")

RESULTS_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),  # unique key
        pa.field("source_store", pa.string()),  # the store the run trained from (url)
        pa.field("config", pa.string()),  # 'ND,NL,W', or 'pred-only' / 'full'
        pa.field("kind", pa.string()),  # one of KINDS ("method": a method other than mud, named in "method")
        pa.field("amount_hsk", pa.float64()),  # A = N^D * N^L * N^W / d_T, token-vector units
        pa.field("value_dtype", pa.string()),  # float16 / int8
        pa.field("store_bytes", pa.int64()),
        pa.field("bytes_per_example", pa.float64()),
        pa.field("student", pa.string()),
        pa.field("seed", pa.int64()),
        pa.field("method", pa.string()),  # pipelines.methods name (null in tables written before methods)
        pa.field("method_options", pa.string()),  # the method's resolved options, JSON
        pa.field("stages", pa.string()),  # e.g. 'hsk+pred'
        pa.field("epochs_hsk", pa.float64()),
        pa.field("epochs_pred", pa.float64()),
        pa.field("train_limit", pa.int64()),  # null: the whole split
        pa.field("metric_name", pa.string()),
        pa.field("metric", pa.float64()),
        pa.field("metrics_json", pa.string()),  # every dev metric, JSON
        pa.field("train_seconds", pa.float64()),
        pa.field("examples_per_s", pa.float64()),
        pa.field("created", pa.string()),  # ISO 8601 UTC
    ]
)


class ResultsError(UserError, ValueError):
    """A results row or file that does not fit RESULTS_SCHEMA."""


def conform(table: pa.Table) -> pa.Table:
    """Cast a table to RESULTS_SCHEMA; columns it lacks (an older file) become nulls."""
    unknown = [n for n in table.column_names if n not in RESULTS_SCHEMA.names]
    if unknown:
        raise ResultsError(f"results table has columns {unknown} that are not in RESULTS_SCHEMA")
    columns = []
    for f in RESULTS_SCHEMA:
        if f.name in table.column_names:
            columns.append(table.column(f.name).cast(f.type))
        else:
            columns.append(pa.nulls(table.num_rows, f.type))
    try:
        return pa.Table.from_arrays(columns, schema=RESULTS_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ResultsError(f"results table does not fit RESULTS_SCHEMA: {exc}") from exc


def rows_to_table(rows: list[dict]) -> pa.Table:
    """Rows (dicts keyed by RESULTS_SCHEMA names; missing keys are null) -> a conforming table."""
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    clean = []
    for i, row in enumerate(rows):
        unknown = sorted(set(row) - set(RESULTS_SCHEMA.names))
        if unknown:  # a typo in a column name would otherwise vanish silently
            raise ResultsError(f"results row {i} has unknown keys {unknown}; known: {RESULTS_SCHEMA.names}")
        if not row.get("run_id"):
            raise ResultsError(f"results row {i} has no run_id")
        if row.get("kind") is not None and row["kind"] not in KINDS:
            raise ResultsError(f"results row {i}: kind {row['kind']!r} is not one of {KINDS}")
        clean.append({"created": now, **row})
    try:
        return pa.Table.from_pylist(clean, schema=RESULTS_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ResultsError(f"results rows do not fit RESULTS_SCHEMA: {exc}") from exc


def read_results(path: str | os.PathLike) -> pa.Table:
    """The results table at `path`, cast to RESULTS_SCHEMA."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no results table at {path}: run a sweep first (it writes results.parquet)")
    try:
        table = pq.read_table(path)
    except pa.ArrowInvalid as exc:  # a damaged or foreign file: the user can act on it
        raise ResultsError(f"{path} is not a readable results table: {exc}") from None
    return conform(table)


def _write_atomic(table: pa.Table, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it owner-only; a results table is meant to be shared
        pq.write_table(table, tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def append_results(path: str | os.PathLike, rows: list[dict]) -> pa.Table:
    """Add `rows` to the table at `path` (created if missing); a row replaces any row with its run_id.

    Within `rows`, the last row of a run_id wins. Returns the table as written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = rows_to_table(rows)
    if new.num_rows == 0:
        return read_results(path) if path.exists() else new
    new_ids = new.column("run_id").to_pylist()
    last = {run_id: i for i, run_id in enumerate(new_ids)}
    new = new.take(sorted(last.values()))
    # a lock file beside the table: two appenders never read-modify-write at once
    with file_lock(path.with_name(path.name + ".lock")):
        if path.exists():
            old = read_results(path)
            keep = [i for i, run_id in enumerate(old.column("run_id").to_pylist()) if run_id not in last]
            table = pa.concat_tables([old.take(keep), new])
        else:
            table = new
        _write_atomic(table, path)
    return table
