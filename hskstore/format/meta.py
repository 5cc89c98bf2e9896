"""A store's hsk metadata as typed records, parsed once from the dict that zarr.json holds.

The dict (attribute `hsk` of the root group, docs/STORE_FORMAT.md) stays the serialised form and the
authority: its bytes are what the manifest covers. These records are how code reads it: `store.metadata`
on an opened store, `StoreMeta.parse(meta)` for a dict (an online source, a sweep's cached metadata).
Writers build the records whose `to_dict` gives the same keys in the same order as before, so stores
written through them are byte-identical. numpy-free and torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from . import kinds
from .config import PRECISION
from .domain import MAX_VOCAB, int_within
from .kinds import TASK as TASK  # re-exported: the task dump takes it with the records below
from .kinds import objective_of, records_objective


def _serialise(record: Any, written: tuple[str, ...] | None, extra: Mapping[str, object]) -> dict:
    """A reference record as its mapping: the `written` keys in that order (None included: a writer that
    records a key records it even when empty), or, when `written` is None, every field that is not None
    in declaration order. Keys that are no field (from a newer hsk) come from `extra`, the record read."""
    names = {f.name for f in fields(record) if f.name not in ("record", "written")}
    if written is None:
        written = tuple(f.name for f in fields(record) if f.name in names and getattr(record, f.name) is not None)
    return {key: getattr(record, key) if key in names else extra.get(key) for key in written}


@dataclass(frozen=True)
class Layout:
    """Rows per store, per shard (the unit of writing and streaming) and per chunk; N^W stored widths."""

    n_rows: int
    shard_rows: int
    chunk_rows: int
    n_width: int

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Layout:
        return cls(d["n_rows"], d["shard_rows"], d["chunk_rows"], d["n_width"])

    def to_dict(self) -> dict:
        return {"n_rows": self.n_rows, "shard_rows": self.shard_rows, "chunk_rows": self.chunk_rows,
                "n_width": self.n_width}

    @classmethod
    def of(cls, n_rows: int, n_width: int, shard_rows: int = 1024, chunk_rows: int | None = None) -> Layout:
        """Rows per shard (the unit of writing and of streaming) and per chunk (the unit of random reads)."""
        shard_rows = max(1, min(shard_rows, max(n_rows, 1)))
        if chunk_rows is None:
            chunk_rows = shard_rows // 4 if shard_rows % 4 == 0 and shard_rows >= 64 else shard_rows
        if shard_rows % chunk_rows:
            raise ValueError(f"shard_rows {shard_rows} must be a multiple of chunk_rows {chunk_rows}")
        return cls(n_rows, shard_rows, chunk_rows, n_width)

    @property
    def n_shards(self) -> int:
        return -(-self.n_rows // self.shard_rows)

    def shard_bounds(self, shard: int) -> tuple[int, int]:
        start = shard * self.shard_rows
        return start, min(start + self.shard_rows, self.n_rows)


@dataclass(frozen=True)
class TaskRef:
    """The task and split whose rows the store holds (a masked-LM store: task `mlm`, no labels)."""

    name: str
    split: str | None = None
    labels: list[str] | None = None
    regression: bool = False
    metric: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> TaskRef:
        return cls(d["name"], d.get("split"), d.get("labels"), bool(d.get("regression")), d.get("metric"))

    def to_dict(self) -> dict:
        return {"name": self.name, "split": self.split, "labels": list(self.labels) if self.labels else None,
                "regression": self.regression, "metric": self.metric}


@dataclass(frozen=True)
class DataRef:
    """Where the rows came from and the fingerprint of the examples (texts and labels)."""

    source: str | None
    fingerprint: str | None
    n_rows: int | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, object] | None) -> DataRef:
        d = d or {}
        return cls(d.get("source"), d.get("fingerprint"), d.get("n_rows"))

    def to_dict(self) -> dict:
        return {"source": self.source, "fingerprint": self.fingerprint, "n_rows": self.n_rows}


# The keys each dump writes, in its order (to_dict with `written`): stores' bytes stay what they were.
TASK_TEACHER_KEYS = ("name", "path", "hub_id", "revision", "weights_hash", "architecture", "num_layers",
                     "hidden_size", "num_labels", "max_positions", "task", "labels", "problem_type", "identity_from",
                     "task_fit")
FORWARD_PRECISIONS = tuple(name for name in PRECISION.values if name != "auto")  # what a store can record
TASK_TOKENIZER_KEYS = ("name", "path", "hub_id", "revision", "vocab_hash", "vocab_size", "cls_id", "sep_id",
                       "pad_id")


class _NamedRecord:
    """A named reference record read and written both ways: the fields hsk knows, the record as read
    (`record`, so keys of a newer hsk survive) and the keys it was written with (`written`, their order)."""

    @classmethod
    def from_dict(cls, d: Mapping[str, object]):
        known = {f.name for f in fields(cls)} - {"name", "record", "written"}
        return cls(d["name"], **{k: d.get(k) for k in known}, record=dict(d), written=tuple(d))

    def to_dict(self) -> dict:
        return _serialise(self, self.written, self.record)


@dataclass(frozen=True)
class TeacherRef(_NamedRecord):
    """The teacher by portable reference (path, or hub id + revision) and weights hash, and what it was
    fine-tuned for (`teacher_identity`).

    `record` is the recorded mapping as it is (model resolution and `hsk info`'s fit line read fields
    that older stores lack); `written` the keys `to_dict` writes, in order (None: every field that is
    set). A new field: add it with a None default (and to the writer's key list if every store of that
    kind records it); stores without it read as None and serialise as before.
    """

    name: str
    weights_hash: str | None = None
    architecture: str | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    num_labels: int | None = None
    vocab_size: int | None = None
    path: str | None = None
    hub_id: str | None = None
    revision: str | None = None
    max_positions: int | None = None
    task: str | None = None
    labels: list[str] | None = None
    problem_type: str | None = None
    identity_from: str | None = None
    task_fit: str | None = None
    record: Mapping[str, object] = field(default_factory=dict, repr=False, compare=False)
    # The teacher's transformers `model_type` and how its [CLS] attention rows were read
    # (pipelines/dump/scores.py), recorded where that is not the format's default reader,
    # `projections` (BERT-style query/key Linears): stores read that way, older ones included, have neither.
    model_type: str | None = None
    scores: str | None = None
    # The forward's arithmetic (`hsk dump --precision`). Recorded only when not fp32, so fp32 stores keep the
    # bytes (and content address) of stores written before the option existed.
    precision: str | None = None
    # The dtype of an LM teacher's weights as loaded (`hsk dump --dtype`), recorded only when not float32.
    dtype: str | None = None
    written: tuple[str, ...] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # info would show, and a resume compare, a forward no dump can run: a forged or garbled name is damage
        if self.precision is not None and self.precision not in FORWARD_PRECISIONS:
            raise ValueError(f"teacher.precision {self.precision!r} is not a precision hsk knows "
                             f"({', '.join(FORWARD_PRECISIONS)})")
        if self.vocab_size is not None and int_within("vocab_size", self.vocab_size, 1, MAX_VOCAB):
            raise ValueError(f"teacher.{int_within('vocab_size', self.vocab_size, 1, MAX_VOCAB)}")

    @property
    def forward_precision(self) -> str:
        """The arithmetic of the teacher's forward: the recorded precision, fp32 where none is recorded."""
        return self.precision or "fp32"

    @property
    def where(self) -> str:
        """Where to find it again: the recorded path, else the hub id, else the name."""
        return self.path or self.hub_id or self.name


@dataclass(frozen=True)
class TokenizerRef(_NamedRecord):
    """The tokenizer the inputs were encoded with: vocabulary hash and size, special ids."""

    name: str
    vocab_hash: str | None = None
    vocab_size: int | None = None
    cls_id: int | None = None
    sep_id: int | None = None
    pad_id: int | None = None
    mask_id: int | None = None
    path: str | None = None
    hub_id: str | None = None
    revision: str | None = None
    record: Mapping[str, object] = field(default_factory=dict, repr=False, compare=False)
    written: tuple[str, ...] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.vocab_size is not None and int_within("vocab_size", self.vocab_size, 1, MAX_VOCAB):
            raise ValueError(f"tokenizer.{int_within('vocab_size', self.vocab_size, 1, MAX_VOCAB)}")


# StoreMeta fields after the description, in the order the writer adds them (hskstore.io.writer): what the dump
# records (compute, sharing), then creation, then what finalize and `hsk upgrade` record; the manifest is last.
MANIFEST = "manifest"
_BOOKKEEPING = ("compute", "sharing", "derived_from", "format_version", "complete", "identity", "software_version",
                "created", "checksums", "inputs_hash", "stored_bytes", "data_origin", "upgraded", MANIFEST)
_DESCRIPTION = ("objective", "task", "dataset", "teacher", "tokenizer", "max_length", "selection", "layout")


@dataclass(frozen=True)
class StoreMeta:
    """Everything a store's metadata says, typed; `raw` is the dict itself (the serialised form).

    `selection` is kind-specific: the mapping as stored, and `selection_record` the record its kind declares
    (a task store's config.Selection, the other kinds' from their hskstore.format module).
    """

    objective: str
    task: TaskRef
    dataset: DataRef
    teacher: TeacherRef
    tokenizer: TokenizerRef
    max_length: int
    layout: Layout
    selection: Mapping[str, object]
    format_version: int | None = None
    complete: bool = False
    identity: str | None = None
    created: str | None = None
    software_version: str | None = None
    inputs_hash: str | None = None
    manifest: str | None = None
    stored_bytes: int | None = None
    checksums: Mapping[str, str] = field(default_factory=dict, repr=False)
    derived_from: Mapping[str, object] | None = field(default=None, repr=False)
    sharing: Mapping[str, object] | None = None
    compute: Mapping[str, object] | None = field(default=None, repr=False)  # what the dump ran on (threads, ...)
    data_origin: Any = None  # the data file's sha256 or hub id (lineage)
    upgraded: Mapping[str, object] | None = None  # `hsk upgrade`'s record: from which format, when, by which hsk
    raw: Mapping[str, object] = field(default_factory=dict, repr=False, compare=False)

    @property
    def selection_record(self) -> Any:
        """The selection as its kind's typed record (kinds.StoreKind.selection_type)."""
        kind = kinds.get(self.objective)
        return kind.selection_type.from_dict(self.selection) if kind.selection_type else self.selection

    @classmethod
    def parse(cls, meta: Mapping[str, object]) -> StoreMeta:
        """The typed view of a metadata dict (KeyError/TypeError when a required part is missing)."""
        return cls(
            objective=objective_of(meta), task=TaskRef.from_dict(meta["task"]),
            dataset=DataRef.from_dict(meta.get("dataset")), teacher=TeacherRef.from_dict(meta["teacher"]),
            tokenizer=TokenizerRef.from_dict(meta["tokenizer"]), max_length=meta["max_length"],
            layout=Layout.from_dict(meta["layout"]), selection=meta.get("selection") or {},
            format_version=meta.get("format_version"), complete=bool(meta.get("complete")),
            identity=meta.get("identity"), created=meta.get("created"),
            software_version=meta.get("software_version"), inputs_hash=meta.get("inputs_hash"),
            manifest=meta.get(MANIFEST), stored_bytes=meta.get("stored_bytes"),
            checksums=meta.get("checksums") or {}, derived_from=meta.get("derived_from"),
            sharing=meta.get("sharing"), compute=meta.get("compute"), data_origin=meta.get("data_origin"),
            upgraded=meta.get("upgraded"), raw=meta,
        )

    def to_dict(self) -> dict:
        """The serialised form: a record parsed from a dict gives that dict back, its keys in their order (keys of
        a newer hsk kept as read); a new record what the store describes (the objective only for a kind other
        than `task`), then the bookkeeping fields that are set, in the writer's order."""
        values = self._described()
        values.update(self._bookkeeping())
        return {name: values[name] if name in values else self.raw[name] for name in self._order(values)}

    def _order(self, values: Mapping[str, object]) -> list[str]:
        """The keys as read, then those set since in the writer's order; the manifest, which covers the rest, stays
        last when a key is added (an unchanged record keeps its keys exactly as read)."""
        added = [name for name in (*_DESCRIPTION, *_BOOKKEEPING) if name in values and name not in self.raw]
        if not added:
            return list(self.raw)
        kept = [name for name in self.raw if name != MANIFEST]
        return kept + [name for name in added if name != MANIFEST] + [MANIFEST] * (MANIFEST in values)

    def updated(self, **changes: Any) -> StoreMeta:
        """The record with these fields changed (the writer's bookkeeping), parsed back from the dict it now
        serialises to: `raw` stays the serialised form, keys of a newer hsk and their order kept."""
        return StoreMeta.parse(replace(self, **changes).to_dict())

    def _described(self) -> dict:
        values = {"task": self.task.to_dict(), "dataset": self.dataset.to_dict(), "teacher": self.teacher.to_dict(),
                  "tokenizer": self.tokenizer.to_dict(), "max_length": self.max_length,
                  "selection": dict(self.selection), "layout": self.layout.to_dict()}
        if records_objective(self.objective) or "objective" in self.raw:
            values["objective"] = self.objective
        return values

    def _bookkeeping(self) -> dict:
        """The bookkeeping fields that are set (or that the record read had, even empty). `complete` is recorded,
        False too, once a writer has given the record its format version."""
        values = {name: getattr(self, name) for name in _BOOKKEEPING}
        recorded = set(self.raw) | ({"complete"} if self.format_version is not None else set())
        return {name: dict(value) if isinstance(value, Mapping) else value for name, value in values.items()
                if value not in (None, {}, False) or name in recorded}

    @property
    def inputs(self) -> str | None:
        """What identifies the stored inputs: their checksum (finished stores), else the examples' fingerprint."""
        return self.inputs_hash or self.dataset.fingerprint
