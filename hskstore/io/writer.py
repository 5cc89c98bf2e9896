"""Create, resume and finish a store, one whole shard at a time.

A shard is the unit of writing: its arrays are written whole (zarr loses data on partial-shard
writes), then its digests and its done flag. A killed writer leaves at most one shard half
written; resuming rewrites it, and since the inputs are deterministic the bytes come out the
same. The store is marked complete, with array checksums and the manifest, only after every
shard is done.

Creation is crash-safe: the first object written is the writer lease (hskstore.io.lease), which
already names the folder an hsk store; the group's zarr.json is then written with the hsk
attributes in the same write, and the arrays after it. A store whose creation was cut short
has no shard written, so the next writer simply recreates its structure.

`writing()` is what commands use: the output rule, the lease, staged overwrites. `StoreWriter`
alone (no lease) is for code that coordinates its writers itself, e.g. workers of one driver
that holds the lease and write disjoint shards.

Fault hook for tests (hskstore.io.outputs.fault): with the environment variable HSK_FAULT set to one of
FAULT_POINTS, the writer ends the process with os._exit(FAULT_EXIT) at that point, as a kill or a power cut would
(no cleanup, no finally blocks). HSK_FAULT=wait-<point>:<file> instead makes it wait at that
point until <file> exists (a writer held still, so a test can start a second one against it).
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import zarr

from ..errors import CorruptStoreError, StoreExistsError, shown
from ..format import kinds
from ..format.digest import array_checksum, shard_digest
from ..format.manifest import IDENTITY_FIELDS, MANIFEST_KEY, compute_manifest, identity, list_arrays
from ..format.meta import StoreMeta
from ..format.schema import (
    DIGEST_BYTES,
    FORMAT_VERSION,
    META_KEY,
    PROGRESS_DESCRIBED,
    PROGRESS_DIGESTS,
    PROGRESS_DONE,
    array_specs,
)
from ..format.shard_codec import ShardLayout
from .array_meta import described_manifest, write_described
from .card import CARD_NAME, read_card, store_name, stored_bytes, write_card
from .croissant import CROISSANT_NAME, read_croissant, write_croissant
from .lease import Lease, LeaseHeldError
from .lineage import data_origin
from .location import is_local, location, zarr_location
from .outputs import (
    LEASE_NAME,
    PARTIAL_FILE,
    STORE,
    claim_output,
    fault,
    output_kind,
    refuse_bundle_output,
    staged_replace,
    store_entries,
)
from .reader import HSKStore, render_card
from .zarr_adapter import put_row, put_shard

FAULT_POINTS = ("after-lease", "after-group-created", "after-array-created", "after-shard-written", "before-swap",
                "between-swap-renames", "upgrade-after-metadata")
FAULT_EXIT = 86  # what outputs.fault exits with


_fault = fault  # the hook lives with the output rule, whose swap has a fault point of its own


def as_store_meta(meta: StoreMeta | Mapping) -> StoreMeta:
    """The typed record a writer works on: a StoreMeta as given, or a metadata dict parsed once (tests, benchmarks
    and the conformance generator hand the dict over); its `raw` the dict it serialises to."""
    return StoreMeta.parse(meta.to_dict() if isinstance(meta, StoreMeta) else dict(meta))


def _wanted(meta: StoreMeta | Mapping) -> StoreMeta:
    """What the store is to record before its creation bookkeeping: this format, not complete (as compared), and
    the package of a kind that a package provides (kinds.KIND_PACKAGE)."""
    record = as_store_meta(meta)
    provider = kinds.package_record(kinds.get(record.objective))
    if provider and kinds.KIND_PACKAGE not in record.raw:
        record = StoreMeta.parse({**record.to_dict(), **provider})
    return record.updated(format_version=FORMAT_VERSION, complete=False)


def _read_meta(url: str) -> dict | None:
    """The hsk metadata at url; None when nothing (or only a half-created store) is there.

    Raises OutputError (one line) when something that is not an hsk store is there.
    """
    if output_kind(url) is None:
        return None
    try:
        group = zarr.open_group(zarr_location(url), mode="r", zarr_format=3)
    except FileNotFoundError:
        return None  # the lease alone: creation stopped before the group was written
    except Exception as exc:  # zarr.json unreadable
        raise StoreExistsError(
            f"{url} exists but is not a readable hsk store ({exc.__class__.__name__}: {exc}); "
            "choose another --out, or remove it yourself if it is yours to lose"
        ) from exc
    meta = group.attrs.asdict().get(META_KEY)
    return meta if isinstance(meta, dict) else None


# Where a model was loaded from, not what it is: with its hash recorded, the same weights found at
# another path (a teacher folder moved during a long dump) are the same teacher for a resume.
_LOCATION_KEYS = ("name", "path", "hub_id", "revision")
_CONTENT_HASH = {"teacher": "weights_hash", "tokenizer": "vocab_hash"}


def _comparable(meta: dict, key: str) -> str:
    value = meta.get(key)
    if isinstance(value, dict) and value.get(_CONTENT_HASH.get(key, "")):
        value = {k: v for k, v in value.items() if k not in _LOCATION_KEYS}
    return json.dumps(value, sort_keys=True, default=str)


def _differences(a: dict, b: dict) -> list[str]:
    return [k for k in IDENTITY_FIELDS if _comparable(a, k) != _comparable(b, k)]


# How the bytes were computed, beyond what the store describes (`meta["compute"]`, recorded by the dump at
# creation): length-bucketed batches change the padded length and so the float bits, and so do the device
# and, on CPU, torch's thread count. A resume must compute as the interrupted run did. Keys absent on
# either side (stores of an older hsk, a worker's unknown thread count) are not compared.
_COMPUTE_KEY = "compute"
_HOW_TO_PASS = {
    "max_length": "--max-length {}",
    "batch_size": "--batch-size {}",
    "device": "--device {}",
    "torch_threads": "{} torch threads (--threads {})",
}


def _compute_differences(existing: dict, meta: dict) -> list[str]:
    old, new = existing.get(_COMPUTE_KEY) or {}, meta.get(_COMPUTE_KEY) or {}
    return [k for k in sorted(old) if old.get(k) is not None and new.get(k) is not None and old[k] != new[k]]


def _resume_refusal(url: str, existing: dict, meta: dict) -> str | None:
    """One line naming the values a resume of the interrupted dump at url must be given, or None when it may."""
    diff = _differences(existing, meta)
    if diff:
        wanted = [_HOW_TO_PASS[k].format(existing[k]) for k in diff if k in _HOW_TO_PASS] + _precision(existing, meta)
        return (f"{shown(url)} holds an interrupted dump with a different {', '.join(diff)}: rerun with its original "
                f"arguments to resume it{' (' + ', '.join(wanted) + ')' if wanted else ''}, pass --overwrite to "
                "replace it, or choose another --out")
    diff = _compute_differences(existing, meta)
    if diff:
        old = existing[_COMPUTE_KEY]
        wanted = [_HOW_TO_PASS[k].format(*[old[k]] * 3) for k in diff]
        return (f"{shown(url)} holds an interrupted dump computed with {', '.join(wanted)}; its bytes depend on "
                f"{', '.join(diff)}: resume with the same, or pass --overwrite to start again")
    return None


def _existing_refusal(url: str, existing: dict, meta: dict) -> str | None:
    """Why the store already at url is not the one `meta` describes (one line), None when it may be opened or
    resumed. Only reads: `writing` asks it before the lease, so a refused rerun changes nothing there."""
    diff = _differences(existing, meta)
    if diff == ["format_version"] and (existing.get("complete") or _has_written_shards(url)):  # an older hsk's
        return _older_format(url, existing)
    if diff and existing.get("complete"):
        made = "".join(f" (made with {flag})" for flag in _precision(existing, meta))
        return (f"{shown(url)} holds a complete store with a different {', '.join(diff)}{made}: pass --overwrite to "
                "replace it, or choose another --out")
    if existing.get("complete"):
        return None
    return _resume_refusal(url, existing, meta) if _has_written_shards(url) else None


def _older_format(url: str, existing: dict) -> str:
    """The refusal for the same store written by an older hsk: upgrade a complete one, never resume another."""
    version = existing.get("format_version")
    if existing.get("complete"):
        return (f"{url} holds this store at format {version}, written by an older hsk: run `hsk upgrade {url}` "
                f"to bring it to format {FORMAT_VERSION}, or pass --overwrite to dump it again")
    return (f"{url} holds an interrupted dump of an older hsk (format {version}): finish it with that hsk, or "
            "pass --overwrite to start again")


def _precision(existing: dict, meta: dict) -> list[str]:
    """`--precision P` when the teacher's forward precision (part of its record; absent = fp32) differs."""
    old, new = ((m.get("teacher") or {}).get("precision") or "fp32" for m in (existing, meta))
    return [f"--precision {old}"] if old != new else []


def _moved(existing: dict, meta: dict) -> list[str]:
    """Lines saying which models are now loaded from elsewhere than the store records (same hashes)."""
    lines = []
    for key in _CONTENT_HASH:
        old, new = existing.get(key) or {}, meta.get(key) or {}
        if old.get("name") != new.get("name"):
            lines.append(f"the {key} is now loaded from {new.get('name')}, with the same hash as the "
                         f"{old.get('name')} this store records (the store keeps recording that)")
    return lines


def _resume_notes(url: str, existing: dict, meta: dict) -> list[str]:
    """Clean what an interrupted write left (zarr temporaries) and say what a resume finds changed."""
    removed = remove_partials(url)
    notes = [f"removed {len(removed)} temporary *.partial file(s) of an interrupted write"] if removed else []
    return notes + _moved(existing, meta)


def remove_partials(url: str) -> list[str]:
    """Delete zarr's `*.<uuid>.partial` temporaries of interrupted writes under a store (that pattern only).
    Only zarr's local store writes them: an object store's put is whole, so it is not listed for nothing."""
    if not is_local(url):
        return []
    return location(url).remove_files(lambda name: bool(PARTIAL_FILE.search(name)))


def _has_written_shards(url: str) -> bool:
    """Whether any shard of the store at url is marked written (False when its progress is unreadable)."""
    try:
        return bool(zarr.open_array(zarr_location(url), path=PROGRESS_DONE, mode="r")[:].any())
    except Exception:  # missing or damaged progress records: nothing trustworthy was written
        return False


def write_store_card(group: zarr.Group, meta: dict, names: list[str], url: str) -> str:
    """Render a finished store's card (its kind's) and write it at the store's root; returns its text."""
    return write_card(group, render_card(meta, stored_bytes(group, names), name=store_name(url)))


def _clear_structure(url: str) -> None:
    """Delete the zarr nodes a store's structure is made of (known names only; the lease stays)."""
    store = location(url)
    for name in sorted(store_entries() - {LEASE_NAME}):
        store.child(name).remove()
    remove_partials(url)


def _create_structure(url: str, record: StoreMeta) -> None:
    """Write the group (hsk attributes in the same write) and every array; keeps the writer lease."""
    meta = record.to_dict()
    group = zarr.create_group(zarr_location(url, "w-"), attributes={META_KEY: meta}, zarr_format=3)
    _fault("after-group-created")
    specs = array_specs(meta)
    for i, spec in enumerate(specs):
        spec.create(group)
        if i == 0:
            _fault("after-array-created")
    shards = record.layout.n_shards
    dims, attrs = PROGRESS_DESCRIBED[PROGRESS_DONE]
    group.create_array(PROGRESS_DONE, shape=(shards,), dtype="uint8", chunks=(1,), fill_value=0, overwrite=True,
                       dimension_names=dims, attributes=attrs)
    dims, attrs = PROGRESS_DESCRIBED[PROGRESS_DIGESTS]
    group.create_array(
        PROGRESS_DIGESTS,
        shape=(shards, len(specs), DIGEST_BYTES),
        dtype="uint8",
        chunks=(1, len(specs), DIGEST_BYTES),
        fill_value=0,
        overwrite=True,
        dimension_names=dims,
        attributes=attrs,
    )


def _structure_complete(url: str, meta: dict) -> bool:
    group = zarr.open_group(zarr_location(url), mode="r", zarr_format=3)
    names = {spec.name for spec in array_specs(meta)} | {PROGRESS_DONE, PROGRESS_DIGESTS}
    try:
        return all(isinstance(group.get(name), zarr.Array) for name in names)
    except Exception:  # a damaged array zarr.json: recreated like a missing one
        return False


class StoreWriter:
    """Writes the shards of one store; safe to use from several processes on disjoint shards.

    A context manager: leaving it (or `close()`) shuts down the thread pool shards are written with.
    `writing()` closes the writers it yields; code that makes its own closes them itself.
    """

    def __init__(self, url: str, meta: StoreMeta | Mapping, io_threads: int = 8):
        self.url = url
        self.metadata = as_store_meta(meta)
        self.group = zarr.open_group(zarr_location(url, "r+"), mode="r+")
        self.specs = array_specs(self.meta)
        self._arrays = {spec.name: self.group[spec.name] for spec in self.specs}
        # Whole shards are encoded here and stored as one object each, past zarr's per-chunk pipeline
        # (same bytes: hskstore/format/shard_codec.py); an array laid out otherwise is written through zarr.
        self._layouts = {name: ShardLayout.of(array) for name, array in self._arrays.items()}
        # Arrays of a shard are encoded and written concurrently (Blosc releases the GIL), by a pool
        # started at the first shard written (a complete store opened for its card starts none).
        self._io_threads = io_threads
        self._pool: ThreadPoolExecutor | None = None
        self._records: dict[str, zarr.Array] = {}
        self.lease: Lease | None = None  # set by `writing`

    def __enter__(self) -> StoreWriter:
        return self

    @property
    def meta(self) -> dict:
        """The metadata's serialised form (what zarr.json records), for code that takes the dict."""
        return self.metadata.to_dict()

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Shut the write pool down, once the writes in flight are done (a later write starts a new one)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _progress(self, name: str) -> zarr.Array:
        """A progress record, opened once (its rows are set by key: a resize leaves them where they are)."""
        if name not in self._records:
            self._records[name] = self.group[name]
        return self._records[name]

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._io_threads, thread_name_prefix="hsk-write")
        return self._pool

    @classmethod
    def open(
        cls, url: str, meta: StoreMeta | Mapping, *, overwrite: bool = False, software_version: str = "", log=None
    ) -> StoreWriter:
        """Start a new store at url, resume the interrupted dump of the same store there, or open the
        complete store of the same identity (`complete` is then True and nothing is left to write).

        Takes no lease (see `writing`). overwrite=True recreates a store in place; commands replace
        through `writing`, which keeps the old store until the new one is complete.
        """
        refuse_bundle_output(url)  # bundles are read-only, made by `hsk pack`
        claim_output(url, STORE, overwrite=overwrite)  # refuses anything that is not an hsk store
        record = _wanted(meta)
        existing = None if overwrite else _read_meta(url)
        if existing is not None:
            found = cls._open_existing(url, existing, record.to_dict(), log)
            if found is not None:
                return found
            # Creation was cut short (no shard written): start the structure again.
        record = record.updated(
            identity=identity(record.to_dict()),
            software_version=software_version,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        )
        if output_kind(url) is not None:
            _clear_structure(url)
        _create_structure(url, record)
        return cls(url, record)

    @classmethod
    def _open_existing(cls, url: str, existing: dict, meta: dict, log) -> StoreWriter | None:
        """The writer of the store already at url (complete, or an interrupted dump to resume); None when its
        creation was cut short before any shard; StoreExistsError when it is another store."""
        refusal = _existing_refusal(url, existing, meta)
        if refusal:
            raise StoreExistsError(refusal)
        if existing.get("complete"):
            writer = cls(url, existing)
            writer.repair_card(log)
            return writer
        diff = _differences(existing, meta)
        if diff or _compute_differences(existing, meta) or not _structure_complete(url, existing):
            return None
        for line in _resume_notes(url, existing, meta):
            if log is not None:
                log(line)
        return cls(url, existing)  # resume: keep the original creation time and identity

    @property
    def complete(self) -> bool:
        return self.metadata.complete

    def repair_card(self, log=None) -> tuple[str, ...]:
        """Write what is rendered from the metadata of a complete store that lacks it (a writer killed between
        its metadata and its card or croissant.json); the names of the files written."""
        names, meta = [spec.name for spec in self.specs], self.meta
        restored = []
        if read_card(self.group) is None:
            write_store_card(self.group, meta, names, self.url)
            restored.append(CARD_NAME)
            if log is not None:
                log(f"restored the card {CARD_NAME} of {self.url} (derived from its metadata)")
        if read_croissant(self.group) is None:
            write_croissant(self.group, meta, names, self.url)
            restored.append(CROISSANT_NAME)
            if log is not None:
                log(f"restored {CROISSANT_NAME} of {self.url} (derived from its metadata)")
        return tuple(restored)

    @property
    def n_shards(self) -> int:
        return self.metadata.layout.n_shards

    def shard_bounds(self, shard: int) -> tuple[int, int]:
        return self.metadata.layout.shard_bounds(shard)

    def done_shards(self) -> np.ndarray:
        return self.group[PROGRESS_DONE][:].astype(bool)

    def pending_shards(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(~self.done_shards())]

    def write_shard(self, shard: int, arrays: dict[str, np.ndarray]) -> None:
        """Write every array of one shard (rows shard_bounds(shard)), then mark the shard done."""
        if self.lease is not None:
            self.lease.check()  # stop before writing if another writer took the store over
        start, stop = self.shard_bounds(shard)
        missing = [s.name for s in self.specs if s.name not in arrays]
        if missing:
            raise ValueError(f"shard {shard} lacks arrays {missing}")
        data = {}
        for spec in self.specs:
            data[spec.name] = np.asarray(arrays[spec.name]).astype(spec.dtype, copy=False)
            if data[spec.name].shape != (stop - start, *spec.shape[1:]):
                raise ValueError(
                    f"{spec.name}: shard {shard} has shape {data[spec.name].shape}, expected "
                    f"{(stop - start, *spec.shape[1:])}"
                )

        def write(name: str) -> bytes:
            layout = self._layouts[name]
            if layout is None:
                self._arrays[name][start:stop] = data[name]
            else:
                put_shard(self._arrays[name], layout.key(shard), layout.encode(shard, data[name]))
            return shard_digest(data[name])

        digests = np.stack([np.frombuffer(d, dtype=np.uint8) for d in self._executor().map(write, list(data))])
        put_row(self._progress(PROGRESS_DIGESTS), shard, digests)
        put_row(self._progress(PROGRESS_DONE), shard, np.uint8(1))  # the commit: after the digests
        _fault("after-shard-written")

    def resize_rows(self, n_rows: int) -> None:
        """Give the store n_rows rows (its arrays and progress records resized, their data untouched): a store
        whose rows are counted as they are written (a streamed corpus) grows, then gets its exact count before
        its last shard is written. Only the process that drives the writers calls it, between their writes."""
        record = self.metadata.updated(layout=replace(self.metadata.layout, n_rows=int(n_rows)))
        shards = record.layout.n_shards
        for spec in self.specs:
            array = self._arrays[spec.name]
            array.resize((int(n_rows), *array.shape[1:]))
            self._layouts[spec.name] = ShardLayout.of(array)
        for name in (PROGRESS_DONE, PROGRESS_DIGESTS):
            array = self.group[name]
            array.resize((shards, *array.shape[1:]))
        self.group.attrs[META_KEY] = record.to_dict()
        self.metadata = record

    def finalize(self, **updates) -> StoreMeta:
        """Mark the store complete with per-array checksums and the manifest; every shard must be done.
        `updates`: record fields known only now (a streamed corpus's fingerprint). Returns the metadata recorded."""
        if self.lease is not None:
            self.lease.check()
        pending = self.pending_shards()
        if pending:
            raise CorruptStoreError(f"cannot finalize {self.url}: shards {pending[:10]} not written yet")
        # a worker killed mid-write (a dask dump whose shard another worker redid) leaves zarr temporaries
        remove_partials(self.url)
        digests = self.group[PROGRESS_DIGESTS][:]
        checksums = {
            spec.name: array_checksum([bytes(d) for d in digests[:, i]]) for i, spec in enumerate(self.specs)
        }
        origin = updates.pop("data_origin", None)  # recorded where finalize records it, after the sizes
        record = self.metadata.updated(**updates)
        record = record.updated(
            identity=identity(record.to_dict()),  # the same unless `updates` or resize_rows changed a field
            checksums=checksums,
            # what identifies the inputs: the checksums of the token arrays its kind names
            inputs_hash=array_checksum(
                [checksums[name].encode() for name in kinds.kind_of(self.meta).inputs if name in checksums]
            ),
            complete=True,
            # what the arrays take on storage, in the root metadata: a catalog lists it without opening the card
            stored_bytes=stored_bytes(self.group, [spec.name for spec in self.specs]),
            # lineage: the data file's sha256 (or hub id); derived stores inherit theirs
            data_origin=origin or self.metadata.data_origin or data_origin(self.metadata.dataset.source),
        )
        record = record.updated(manifest=compute_manifest(record.to_dict(), list_arrays(self.group)))
        meta = record.to_dict()
        self.group.attrs[META_KEY] = meta
        self.metadata = record
        write_store_card(self.group, meta, [spec.name for spec in self.specs], self.url)  # README.md at the root
        write_croissant(self.group, meta, [spec.name for spec in self.specs], self.url)  # croissant.json beside it
        return record


def _refuse_before_lease(url: str, meta: StoreMeta | Mapping, status: str) -> None:
    """A rerun that would be refused as another store is refused before the lease is taken: taking over a dead
    writer's lease, then releasing it, would delete its lease file (StoreWriter.open asks again under the lease)."""
    existing = _read_meta(url) if status == "resume" else None
    refusal = _existing_refusal(url, existing, _wanted(meta).to_dict()) if existing is not None else None
    if refusal:
        Lease(url).refuse_if_held()  # a live dump there: wait for it first (its --overwrite would be refused too)
        raise StoreExistsError(refusal)


@contextmanager
def writing(
    url: str, meta: StoreMeta | Mapping, *, overwrite: bool = False, software_version: str = "", log=None
) -> Iterator[StoreWriter]:
    """The writer of the store at url, under the output rule and the writer lease.

    Refuses (OutputError) a path holding anything but an hsk store, and (LeaseHeldError) a store
    another writer holds; takes over a stale lease with a message through `log`. Without overwrite
    it creates, resumes, or opens the complete store of the same identity (`writer.complete`).
    With overwrite the lease on the old store is taken first, the new store is built in a hidden
    sibling and swapped in only when the body returns: a killed overwrite leaves the old store intact.
    The body calls `writer.finalize()` itself.
    """
    url = str(url).rstrip("/")
    refuse_bundle_output(url)  # bundles are read-only, made by `hsk pack`
    status = claim_output(url, STORE, overwrite=overwrite)
    existed = location(url).exists()  # an empty folder: "new" too
    _refuse_before_lease(url, meta, status)
    lease = Lease(url, log=log).acquire()
    _fault("after-lease")
    try:
        if status != "replace":
            try:
                with StoreWriter.open(url, meta, software_version=software_version, log=log) as writer:
                    writer.lease = lease
                    yield writer
            except BaseException as exc:
                if status == "new" and _nothing_to_keep(url, exc):
                    _remove_new_store(url, existed, log)
                raise
            return
        with staged_replace(url) as staged:
            staged_lease = Lease(staged, log=log).acquire()
            try:
                with StoreWriter.open(staged, meta, software_version=software_version, log=log) as writer:
                    writer.lease = staged_lease
                    yield writer
                if not writer.complete:
                    raise CorruptStoreError(f"the new store for {url} was not finalized: the old one is kept")
                _fault("before-swap")
            except BaseException:
                staged_lease.release()
                raise
        staged_lease.moved_to(url).release()  # the swapped-in store carries our lease: drop it
    finally:
        lease.release()


def _nothing_to_keep(url: str, exc: BaseException) -> bool:
    """Whether a store this run created is worth nothing after `exc`: no shard written yet (a refusal before
    any work: an unreachable scheduler...), or its input is damaged (a rerun would stop at the same place).
    Never when another writer took the store over."""
    if isinstance(exc, LeaseHeldError):
        return False
    return isinstance(exc, CorruptStoreError) or not _has_written_shards(url)


def _remove_new_store(url: str, existed: bool, log) -> None:
    """Delete what this run created at url (inside the empty folder that was there, or the folder it made)."""
    store = location(url)
    if existed:
        for name in store.names():
            store.child(name).remove()
    else:
        store.remove_tree()
    if log is not None:
        log(f"removed the unfinished {url} this run created (nothing in it to keep)")


@dataclass(frozen=True)
class Upgrade:
    """What `upgrade` did: the store's format before, and its content address after."""

    url: str
    from_version: int
    content_address: str
    changed: bool  # False: the store already had a manifest
    restored: tuple[str, ...] = ()  # files rendered from the metadata that were missing (an upgrade killed midway)


def upgrade(url: str, *, software_version: str = "", log=None) -> Upgrade:
    """Bring a complete store written by an older hsk to format FORMAT_VERSION, its metadata covered.

    Format 1 (or a deleted manifest): nothing covers the metadata. Format 2: the arrays have no dimension
    names or attributes. Format 3: its manifest covers compressed sizes and codecs, so another writer of the same
    data cannot reproduce it (format 4's manifest, hskstore.format.manifest). Under the writer lease: every
    shard is checked against its digests and the digests against the per-array checksums (CorruptStoreError on
    any problem, nothing written); then the metadata as it is now becomes format FORMAT_VERSION with a manifest
    over the arrays as they will be, the arrays get
    their dimension names and attributes (the data is not touched), and the card is rewritten. The data chain
    is checked; metadata no manifest covered cannot be (that is what was missing): the caller tells the user
    to look.
    """
    url = str(url).rstrip("/")
    refuse_bundle_output(url)
    if output_kind(url) != STORE:
        raise StoreExistsError(f"no hsk store at {url} to upgrade")
    lease = Lease(url, log=log).acquire()
    try:
        return _upgrade(url, lease, software_version)
    finally:
        lease.release()


def _upgrade(url: str, lease: Lease, software_version: str) -> Upgrade:
    finished = _finish_cut_short(url)
    store = HSKStore(url, allow_unverified=True)
    version = store.metadata.format_version
    if finished is not None:  # the card and croissant.json still describe the store as it was
        _render(store)
        return Upgrade(url, finished, store.content_address, changed=True)
    if store.content_address is not None and version >= FORMAT_VERSION:  # nothing left but what is rendered
        restored = StoreWriter(url, store.metadata).repair_card()
        if store.meta.get("upgraded"):  # killed after its metadata: the card may still describe the old format
            restored += tuple(name for name in _stale_rendering(store) if name not in restored)
        return Upgrade(url, version, store.content_address, changed=False, restored=restored)
    problems = store.verify()
    if problems:
        raise CorruptStoreError(f"{url} is not upgraded: {problems[0]}")
    record = store.metadata.updated(format_version=FORMAT_VERSION)
    record = record.updated(
        identity=identity(record.to_dict()),  # the identity names the format: this one's, by this one's rule
        upgraded={"from_version": version, "software_version": software_version,
                  "at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")},
    )
    group = zarr.open_group(zarr_location(url, "r+"), mode="r+")
    record = record.updated(manifest=described_manifest(record.to_dict(), group))
    meta = record.to_dict()
    lease.check()
    group.attrs[META_KEY] = meta
    # A kill here leaves the arrays' zarr.json, the card and croissant.json to the rerun (_finish_cut_short).
    _fault("upgrade-after-metadata")
    write_described(group, meta)
    _render(HSKStore(url))
    return Upgrade(url, version, record.manifest, changed=True)


def _render(store: HSKStore) -> None:
    """Rewrite the card and croissant.json of an upgraded store from its metadata (after every zarr.json:
    croissant.json records the root's fingerprint)."""
    group = zarr.open_group(zarr_location(store.url, "r+"), mode="r+")
    write_store_card(group, store.meta, list(store.specs), store.url)
    write_croissant(group, store.meta, list(store.specs), store.url)


def _stale_rendering(store: HSKStore) -> tuple[str, ...]:
    """Rewrite the card and croissant.json of an upgraded store where they differ from what its metadata renders
    (an upgrade from a format whose arrays needed nothing, killed after its root metadata); the names rewritten."""
    group = zarr.open_group(zarr_location(store.url, "r+"), mode="r+")
    card, croissant = read_card(group), read_croissant(group)
    _render(store)
    return tuple(name for name, before, after in ((CARD_NAME, card, read_card(group)),
                                                  (CROISSANT_NAME, croissant, read_croissant(group)))
                 if before != after)


def _finish_cut_short(url: str) -> int | None:
    """An upgrade killed after its root metadata, before the arrays' dimension names: the manifest it recorded
    matches the arrays as they were to be. Write them; the format the store was upgraded from (None: not so)."""
    group = zarr.open_group(zarr_location(url, "r+"), mode="r+")
    meta = group.attrs.asdict().get(META_KEY)
    if not (isinstance(meta, dict) and isinstance(meta.get("upgraded"), dict) and meta.get(MANIFEST_KEY)):
        return None
    try:
        if (compute_manifest(meta, list_arrays(group)) == meta[MANIFEST_KEY]
                or described_manifest(meta, group) != meta[MANIFEST_KEY]):
            return None
    except Exception:  # metadata that cannot describe arrays: the reader says what is wrong
        return None
    write_described(group, meta)
    return meta["upgraded"].get("from_version")
