"""Open a store, check it, read examples or whole shards, and rebuild dense teacher vectors."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from ..codecs import UnknownCodecError
from ..errors import CorruptStoreError, IncompleteStoreError, StoreError, UnverifiedStoreError, printable, shown
from ..format import codec, kinds
from ..format.config import ConfigError, HSKConfig, Selection
from ..format.digest import array_checksum, shard_digest
from ..format.domain import DomainCheck, first_breach
from ..format.manifest import MANIFEST_KEY, compute_manifest, list_arrays
from ..format.meta import TASK, StoreMeta
from ..format.schema import (
    DIGEST_BYTES,
    DIMENSIONS_SINCE,
    MANIFEST_SINCE,
    META_KEY,
    PROGRESS_DESCRIBED,
    PROGRESS_DIGESTS,
    PROGRESS_DONE,
    READABLE_VERSIONS,
    ArraySpec,
    array_specs,
    layer_names,
    n_shards,
    shard_bounds,
)
from ..format.shard_codec import ShardLayout
from ..plugins import PluginError
from . import info
from .access import raise_if_access
from .card import render_card  # noqa: F401 (where writers and tests have taken it from)
from .location import is_local, local_path, object_reader, url_problem, zarr_location
from .outputs import recover_swap
from .zarr_adapter import read_many, read_shards

_REQUIRED = ("task", "dataset", "teacher", "tokenizer", "max_length", "selection", "layout")
_MAX_ROWS = 2**40  # far above any real split; keeps an edited n_rows from making loops run for hours
# The explicit opt-in to read a complete store whose metadata no manifest covers (format 1, or a
# deleted manifest): set to 1, every reading command reads such a store as it is (docs/STORE_FORMAT.md).
ALLOW_UNVERIFIED_ENV = "HSK_ALLOW_UNVERIFIED"


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_layout(meta: dict) -> list[ArraySpec]:
    """The array specs of `meta`, after checking that its layout numbers can describe a store at all.

    Raises CorruptStoreError with one line naming the first bad key (fast: no array is read).
    """
    missing = [key for key in _REQUIRED if key not in meta]
    if missing:
        raise CorruptStoreError(f"metadata lacks {', '.join(missing)}")
    layout = meta["layout"]
    if not isinstance(layout, dict):
        raise CorruptStoreError("metadata 'layout' is not a mapping")
    n = layout.get("n_rows")
    if not (isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= _MAX_ROWS):
        raise CorruptStoreError(f"layout.n_rows {n!r} is not a row count")
    for key in ("shard_rows", "chunk_rows"):
        if not _positive_int(layout.get(key)):
            raise CorruptStoreError(f"layout.{key} {layout.get(key)!r} is not a positive integer")
    if layout["shard_rows"] % layout["chunk_rows"]:
        raise CorruptStoreError("layout.shard_rows is not a multiple of layout.chunk_rows")
    if not (isinstance(layout.get("n_width"), int) and layout["n_width"] >= 0):
        raise CorruptStoreError(f"layout.n_width {layout.get('n_width')!r} is not a width")
    return _described_arrays(meta)


def _described_arrays(meta: dict) -> list[ArraySpec]:
    """The array specs of `meta` by its kind: damage refused in one line, an installed kind's failure blamed on
    its package, a kind or codec this hsk lacks named."""
    try:
        return array_specs(meta)
    except kinds.UnknownKindError as exc:  # not damage: a kind this hsk does not know
        raise StoreError(str(exc)) from None
    except (UnknownCodecError, PluginError):  # not damage either: the message names the package to install or fix
        raise
    except (Exception, SystemExit) as exc:  # ConfigError is a ValueError
        package = _package_of(meta)
        if package is not None:  # an installed kind's array_specs: its bug or this store's damage, said both ways
            raise PluginError(f"the store kind {meta.get('objective')!r} of {package} cannot describe this store's "
                              f"arrays ({exc.__class__.__name__}: {printable(exc)}): the package has a bug or the "
                              f"store is damaged; update or uninstall {package.split()[0]}, or re-copy the "
                              "store") from None
        if not isinstance(exc, (KeyError, TypeError, ValueError)):
            raise
        raise CorruptStoreError(f"metadata cannot describe the arrays ({exc.__class__.__name__}: {exc})") from None


def _package_of(meta: dict) -> str | None:
    """The installed package whose kind the metadata names (None: hsk's own kind, or no kind at all)."""
    try:
        return kinds.kind_of(meta).package
    except Exception:
        return None


def _expected_shapes(meta: dict, specs: list[ArraySpec]) -> dict[str, tuple]:
    """name -> (shape, dtype, shard shape or None) that the metadata implies, progress arrays included."""
    rows, shards = meta["layout"]["shard_rows"], n_shards(meta)
    out = {s.name: (s.shape, s.dtype, (rows, *s.shape[1:])) for s in specs}
    out[PROGRESS_DONE] = ((shards,), "uint8", None)
    out[PROGRESS_DIGESTS] = ((shards, len(specs), DIGEST_BYTES), "uint8", None)
    return out


def _first_difference(names, attributes, dims: tuple, declared: dict) -> tuple[str | None, object, object]:
    """(field, found, declared) of the first way an array's description differs from the declared one."""
    if tuple(names or ()) != tuple(dims):
        return "dimension_names", None if names is None else list(names), list(dims)
    attributes = dict(attributes or {})
    for key in sorted(set(attributes) | set(declared)):
        if attributes.get(key) != declared.get(key):
            return f"attributes.{key}", attributes.get(key), declared.get(key)
    return None, None, None


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _missing_store(url: str) -> StoreError:
    """Why zarr found no store at url: a file (examples are input to `hsk dump`), a folder of something
    else, or nothing at all."""
    path = local_path(url) if is_local(url) else None
    if path is not None and path.is_file():
        return StoreError(f"{shown(url)} is a file, not an hsk store (a folder `hsk dump` writes): a CSV or TSV of "
                          "examples is an input of `hsk dump --data-file`; pass the store's folder")
    if path is not None and path.is_dir():
        return StoreError(f"{shown(url)} is a folder but not an hsk store (no zarr.json in it): pass the folder "
                          "`hsk dump --out` wrote")
    return StoreError(f"no store at {shown(url)}: check the path (make one with `hsk dump`)")


def open_group(url: str, *, recover: bool = True) -> tuple[zarr.Group, dict]:
    """The root group of the store at url and its hsk metadata, refusing what is no readable hsk store.
    `recover` (the store the user named): first finish what an interrupted overwrite of it left."""
    problem = url_problem(url)
    if problem:
        raise StoreError(problem)
    if recover:
        recover_swap(url, only_if_missing=True)  # an --overwrite killed between its renames: the old store is back
    try:  # the store its Location makes: a folder's or URL's, a bundle's zip reader
        group = zarr.open_group(zarr_location(url), mode="r")
        meta = group.attrs.asdict().get(META_KEY)
    except FileNotFoundError:
        raise _missing_store(url) from None
    except StoreError:  # the Location's own refusal (no bundle there)
        raise
    except Exception as exc:
        raise_if_access(exc, url)  # a healthy store behind a wrong secret or endpoint is not damaged
        raise CorruptStoreError(
            f"{url} cannot be opened as a zarr store ({exc}): it is damaged"
        ) from exc
    if group.metadata.zarr_format != 3:
        raise StoreError(f"{url} is a Zarr v{group.metadata.zarr_format} group; hsk stores are Zarr "
                         "v3: make one with `hsk dump`")
    if not isinstance(meta, dict):
        raise StoreError(f"{url} is a zarr group but not an hsk store (no '{META_KEY}' metadata)")
    if meta.get("format_version") not in READABLE_VERSIONS:
        raise StoreError(
            f"{url} has store format version {meta.get('format_version')!r}; this hsk reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}: upgrade hsk (pip install -U hsk) or re-dump"
        )
    return group, meta


@dataclass(frozen=True)
class KeptLayer:
    """One stored layer: where its arrays live and which teacher states they hold."""

    name: str  # group path, e.g. "layers/0"
    teacher_layer: int
    ranking_layer: int
    student_entry: int | None


class HSKStore:
    """A read-only, verified view of an hsk store (local path or fsspec URL): integrity, shards, digests.

    `open_store` gives it as its kind's class (hskstore.format.kinds): TaskStore, or the reader each other kind
    declares (MLMStore, ClmStore, ...); each owns what differs between them (its selection, `hsk info` report,
    what derive accepts, what a trainer may read). `meta` is the metadata dict as stored, `metadata` its
    typed view (hskstore.format.meta.StoreMeta).
    """

    objective = ""  # the kind's name in meta["objective"] (hskstore.format.meta)
    selection: Selection | None = None  # a task store's; the other kinds name their record after what it holds
    selection_record: Any  # the selection as its kind's record (kinds.StoreKind.selection_type)
    # Stage.reads a trainer may ask of this kind of store (pipelines.train.data.sources maps them to arrays)
    reads: frozenset[str] = frozenset()

    def __new__(cls, url: str, **options):
        """HSKStore(url) itself gives the store as its kind (as open_store does); a kind's class, that kind."""
        if cls is not HSKStore:
            return super().__new__(cls)
        opened = open_group(str(url), recover=options.get("recover", True))
        store = super().__new__(store_type(opened[1]))
        store._opened = opened  # __init__ reads it instead of opening the group again
        return store

    def __init__(self, url: str, *, allow_incomplete: bool = False, allow_unverified: bool = False,
                 recover: bool = True):
        """Open and check the store at url: its metadata against its arrays, and for a complete store the chain
        manifest -> per-array checksums -> stored shard digests (the chunks are checked against those digests
        as they are read). allow_unverified (or HSK_ALLOW_UNVERIFIED=1) reads a complete store whose metadata
        no manifest covers, which is refused otherwise (UnverifiedStoreError naming `hsk upgrade`)."""
        self.url = str(url)
        self.group, meta = self.__dict__.pop("_opened", None) or open_group(self.url, recover=recover)
        self.meta = meta
        try:
            specs = check_layout(meta)
        except CorruptStoreError as exc:
            raise CorruptStoreError(f"{self.url}: {exc}: the store is damaged; re-copy it or dump again") from None
        except UnknownCodecError as exc:  # made with a codec from a package that is not installed here
            raise StoreError(f"{self.url}: its values use the value codec {exc.codec!r}, which no installed package "
                             f"provides: install the package that provides {exc.codec!r} (entry point group "
                             "hsk.codecs) and run again") from None
        self.specs = {s.name: s for s in specs}
        self._arrays: dict = {}  # opened array handles, reused across reads
        self._formats: dict[str, ShardLayout | None] = {}  # per array: decoded by hsk (read_shards) or by zarr
        self._objects = object_reader(self.url)  # the Location's own shard-object reads (a local folder's)
        members = self._members()
        self._check_arrays(members)
        if meta.get("complete"):
            self._check_covered(members, allow_unverified or os.environ.get(ALLOW_UNVERIFIED_ENV) == "1")
        self._check_described(members)  # after the manifest: an interrupted `hsk upgrade` is told to rerun
        if not meta.get("complete") and not allow_incomplete:
            raise IncompleteStoreError(
                f"{self.url} is incomplete ({self._done_count()}/{self.n_shards} shards written): its dump was "
                "interrupted. Rerun the same `hsk dump` command to finish it."
            )
        self.metadata, self.selection_record = self._typed(meta)

    def _typed(self, meta: dict) -> tuple[StoreMeta, Any]:
        """The typed view of the metadata (self.meta stays the serialised dict) and the selection as its kind's
        record (a task store's HSK choices, a masked-LM store's masking, ...); damage refused in one line."""
        try:
            metadata = StoreMeta.parse(meta)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptStoreError(f"{self.url}: metadata is damaged ({exc.__class__.__name__}: {exc}): re-copy "
                                    "it or dump again") from None
        try:
            return metadata, metadata.selection_record
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptStoreError(f"{self.url}: metadata 'selection' is damaged ({exc}): re-copy it or dump "
                                    "again") from None

    def _members(self) -> dict[str, zarr.Array]:
        try:
            return list_arrays(self.group)
        except Exception as exc:
            raise_if_access(exc, self.url)
            raise CorruptStoreError(f"{self.url}: array metadata cannot be read ({exc}): the store is "
                                    "damaged") from None

    def _check_arrays(self, members: dict[str, zarr.Array]) -> None:
        """Every array the metadata implies exists with the rows, shards and widths it implies."""
        expected = _expected_shapes(self.meta, list(self.specs.values()))
        missing = [name for name in expected if name not in members]
        if missing:
            raise CorruptStoreError(
                f"{self.url} lacks arrays {missing[:5]}: the store is truncated or damaged"
            )
        for name, (shape, dtype, shards) in expected.items():
            arr = members[name]
            found = (tuple(arr.shape), str(arr.dtype), None if shards is None else tuple(arr.shards or ()))
            if found != (tuple(shape), dtype, shards):
                raise CorruptStoreError(
                    f"{self.url}: array {name} is {found[1]} {list(found[0])} (shards {found[2]}) but the metadata "
                    f"says {dtype} {list(shape)} (shards {shards}): the store is damaged; re-copy it or dump again"
                )

    def _check_described(self, members: dict[str, zarr.Array]) -> None:
        """Format 3 on: each array's dimension names and attributes are the ones the schema declares for this
        store. The manifest covers them, but whoever edits one can recompute it: a generic Zarr tool would then
        read another codec or other axes than hsk does. The texts are fixed by the conformance vectors, so an
        exact comparison refuses no store an earlier hsk wrote."""
        if self.meta.get("format_version", 0) < DIMENSIONS_SINCE:
            return  # format 2 has neither; `hsk upgrade` writes them
        declared = {name: (spec.dims, spec.attributes) for name, spec in self.specs.items()}
        declared.update(PROGRESS_DESCRIBED)
        for name, (dims, attributes) in declared.items():
            found = members[name].metadata
            field, got, want = _first_difference(found.dimension_names, found.attributes, dims, attributes)
            if field is not None:
                raise CorruptStoreError(
                    f"{self.url}: array {name} has {field} {_short(got)} but the store's metadata declares "
                    f"{_short(want)}: its "
                    "description was edited; re-copy the store or dump again")

    def _check_covered(self, members: dict[str, zarr.Array], allow_unverified: bool) -> None:
        """A complete store: its metadata matches its manifest, and its shard digests its checksums."""
        recorded = self.meta.get(MANIFEST_KEY)
        if recorded is None:
            if not allow_unverified:
                version = self.meta.get("format_version")
                why = "store format 1" if version < MANIFEST_SINCE else "its manifest is missing"
                raise UnverifiedStoreError(
                    f"{self.url}: no manifest covers its metadata ({why}), so an edit to it would go unnoticed: "
                    f"check it with `{ALLOW_UNVERIFIED_ENV}=1 hsk info {self.url}`, then run `hsk upgrade {self.url}` "
                    f"(or set {ALLOW_UNVERIFIED_ENV}=1 to read it unverified)"
                )
        elif recorded != compute_manifest(self.meta, members):
            rerun = f"; or, if an `hsk upgrade` of it was interrupted, rerun `hsk upgrade {self.url}`" \
                if self.meta.get("upgraded") else ""
            raise CorruptStoreError(
                f"{self.url}: its metadata does not match its manifest {str(recorded)[:23]}...: attributes or array "
                f"metadata were edited or damaged; re-copy the store or dump again{rerun}"
            )
        problems = self._checksum_problems()
        if problems:
            raise CorruptStoreError(
                f"{self.url}: {problems[0]}: the shard digests in {PROGRESS_DIGESTS} were edited or damaged; "
                "re-copy the store or dump again"
            )

    @property
    def content_address(self) -> str | None:
        """`sha256:` manifest of a complete store: one digest naming its metadata and (via checksums) data.

        None for a format-1 store (its metadata is not covered) or an incomplete one.
        """
        if not self.meta.get("complete") or self.meta.get("format_version", 0) < MANIFEST_SINCE:
            return None
        return self.meta.get(MANIFEST_KEY)

    def _done_count(self) -> str:
        try:
            return str(int(self._done().sum()))
        except Exception:
            return "?"

    def _done(self) -> np.ndarray:
        return self.group[PROGRESS_DONE][:].astype(bool)

    # --- description -------------------------------------------------------------------------
    @property
    def n_shards(self) -> int:
        return n_shards(self.meta)  # the dict: also read before `metadata` is parsed (an incomplete store)

    def __len__(self) -> int:
        return self.meta["layout"]["n_rows"]

    @property
    def config(self) -> HSKConfig | None:
        return None

    @property
    def hidden_size(self) -> int:
        return self.metadata.teacher.hidden_size

    @property
    def layers(self) -> list[KeptLayer]:
        return []

    # --- what differs between kinds --------------------------------------------------------------
    def storage_report(self) -> dict:
        """What `hsk info` counts: bytes per array, per example and per unit of this kind's knowledge."""
        raise NotImplementedError

    def format_report(self, report: dict) -> str:
        """`hsk info`'s text for `report`."""
        raise NotImplementedError

    def refuse_derive(self) -> None:
        """Raise ConfigError when `hsk derive` cannot make smaller stores of this one."""

    def refuse_task_training(self) -> None:
        """Raise ConfigError when the task methods (`hsk train`) cannot distil from this store."""

    derives_by_support = False  # `hsk derive --support` makes smaller ones (hskstore.share.support_derive)

    def refuse_support_derive(self) -> None:
        """Raise ConfigError unless a smaller store of this kind comes by support (`hsk derive --support`)."""
        if self.derives_by_support:
            return
        raise ConfigError(f"{self.url} is a {self.objective} store: --support derives causal-LM stores; derive a task "
                          "store with --config ND,NL,W")

    def shard_bounds(self, shard: int) -> tuple[int, int]:
        return shard_bounds(self.meta, shard)

    # --- reading -----------------------------------------------------------------------------
    def _array(self, name: str) -> zarr.Array:
        if name not in self._arrays:
            self._arrays[name] = self.group[name]
        return self._arrays[name]

    def _checked(self, names: list[str], data: list) -> dict[str, np.ndarray]:
        for name, value in zip(names, data):
            if isinstance(value, BaseException):
                raise CorruptStoreError(f"{self.url}: cannot read {name} ({value}); the store is damaged") from value
        return dict(zip(names, data))

    def read(self, index, names: list[str] | None = None) -> dict[str, np.ndarray]:
        """Arrays for rows `index` (an int, slice or sorted index array): {name: data}."""
        names = names or list(self.specs)
        # All arrays at once: on object storage the requests overlap instead of queueing (issue 23).
        return self._checked(names, read_many([self._array(name) for name in names], index))

    def _read_whole(self, shard: int, names: list[str], out: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        """One shard of `names`: one object per array, decoded by hsk when every array has the layout
        hsk writes (zarr's read of a shard's inner chunks costs more CPU than decompressing them)."""
        for name in names:
            if name not in self._formats:
                self._formats[name] = ShardLayout.of(self._array(name))
        formats = [self._formats[name] for name in names]
        start, stop = self.shard_bounds(shard)
        if out is not None:
            self._check_out(out, names, stop - start)
        if any(f is None for f in formats):
            return self._read_copied(slice(start, stop), names, out)
        into = None if out is None else [out[name] for name in names]
        return self._checked(names, read_shards([self._array(n) for n in names], formats, shard, stop - start, into,
                                                       self._objects))

    def _read_copied(self, rows: slice, names: list[str], out: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        """zarr's read of the rows, copied into `out` when given."""
        data = self.read(rows, names)
        if out is None:
            return data
        for name in names:
            out[name][...] = data[name]
        return {name: out[name] for name in names}

    def _check_out(self, out: dict[str, np.ndarray], names: list[str], rows: int) -> None:
        for name in names:
            spec, arr = self.specs[name], out.get(name)
            shape = (rows, *spec.shape[1:])
            if arr is None or arr.shape != shape or arr.dtype != np.dtype(spec.dtype) or not arr.flags.c_contiguous:
                raise ValueError(f"out[{name!r}] must be a C-contiguous {spec.dtype} array of shape {shape}")

    def __getitem__(self, index) -> dict[str, np.ndarray]:
        return self.read(index)

    def __iter__(self):
        for shard in range(self.n_shards):
            data = self.read_shard(shard)
            for i in range(len(data["row"])):
                yield {k: v[i] for k, v in data.items()}

    def read_shard(
        self, shard: int, *, verify: bool = True, names: list[str] | None = None,
        out: dict[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """All rows of one shard; with verify, each array is checked against its stored digest. With
        `out` ({name: C-contiguous array of the shard's rows}), the data is decoded into those arrays
        and they are returned (a reader filling a preallocated buffer saves a copy)."""
        start, stop = self.shard_bounds(shard)
        names = names or list(self.specs)
        data = self._read_whole(shard, names, out)
        if verify:
            try:
                digests = self._array(PROGRESS_DIGESTS)[shard]
            except Exception as exc:
                raise CorruptStoreError(
                    f"{self.url}: the digests of shard {shard} cannot be read ({exc.__class__.__name__}); the store "
                    "is corrupted. Re-copy it or dump again."
                ) from None
            order = list(self.specs)
            for name in names:
                if shard_digest(data[name]) != bytes(digests[order.index(name)]):
                    raise CorruptStoreError(
                        f"{self.url}: array {name} rows {start}:{stop} do not match their checksum; the store "
                        "is corrupted. Re-copy it or dump again."
                    )
            self._check_domain(shard, data)
        return data

    def domain_checks(self) -> list[DomainCheck]:
        """The rules its arrays' values obey (hskstore.format.domain), checked on every verified shard read; a
        kind's reader lists its kind's (none here)."""
        return []

    def _check_domain(self, shard: int, data: dict[str, np.ndarray]) -> None:
        if "_domain" not in self.__dict__:
            self._domain = self.domain_checks()
        breach = first_breach(data, self._domain)
        if breach is not None:
            start, stop = self.shard_bounds(shard)
            raise CorruptStoreError(
                f"{self.url}: array {breach.array} of shard {shard} (rows {start}:{stop}) {breach.rule}: no hsk "
                "dump writes that; the store is forged or damaged. Re-copy it or dump again."
            )

    def dense(self, data: dict[str, np.ndarray], layer: KeptLayer | str) -> np.ndarray:
        """Zero-filled teacher vectors [n, N^L, d] float32 of a kept layer (docs/METHOD.md section 3)."""
        name = layer if isinstance(layer, str) else layer.name
        return codec.dense(self.selection.value_dtype, data[f"{name}/values"], data[f"{name}/masks"],
                           self.hidden_size, data.get(f"{name}/scale"))

    # --- checking ----------------------------------------------------------------------------
    def verify(self, progress=None) -> list[str]:
        """Every problem found (empty when the store is complete and intact).

        A complete store is checked shard by shard whatever its done flags say; flags that disagree
        with `complete: true` are themselves a problem.
        """
        problems = []
        complete = bool(self.meta.get("complete"))
        try:
            done = self._done()
        except Exception as exc:
            problems.append(f"progress records ({PROGRESS_DONE}) cannot be read ({exc.__class__.__name__})")
            done = np.full(self.n_shards, complete)
        if not complete:
            problems.append(f"incomplete: {int(done.sum())}/{self.n_shards} shards written")
        elif not done.all():
            shown = [int(i) for i in np.flatnonzero(~done)[:10]]
            problems.append(f"progress records disagree with complete: true: shards {shown} are marked unwritten")
        for shard in (progress or (lambda x: x))(range(self.n_shards)):
            if not (complete or done[shard]):
                continue  # reported once above as incomplete
            try:
                self.read_shard(shard, verify=True)
            except CorruptStoreError as exc:
                problems.append(str(exc))
            except Exception as exc:  # an undecodable digest record, say
                raise_if_access(exc, self.url)
                problems.append(f"shard {shard} cannot be checked ({exc.__class__.__name__}: {exc})")
        if complete:
            problems += self._checksum_problems()
        return problems

    def _checksum_problems(self) -> list[str]:
        checksums = self.meta.get("checksums")
        if not isinstance(checksums, dict):
            return ["no per-array checksums recorded although the store is complete"]
        try:
            digests = self.group[PROGRESS_DIGESTS][:]
        except Exception as exc:
            return [f"shard digests ({PROGRESS_DIGESTS}) cannot be read ({exc.__class__.__name__})"]
        problems = []
        for i, name in enumerate(self.specs):
            if checksums.get(name) != array_checksum([bytes(d) for d in digests[:, i]]):
                problems.append(f"array {name}: shard digests do not add up to the recorded checksum")
        return problems


class TaskStore(HSKStore):
    """A task store: a fine-tuned classifier's logits and hidden-state knowledge over a task's rows."""

    objective = TASK
    reads = frozenset({"logits", "labels", "layers", "attention"})

    @property
    def selection(self) -> Selection:
        return self.selection_record

    @property
    def config(self) -> HSKConfig:
        return self.selection.config

    @property
    def hidden_size(self) -> int:
        return self.selection.hidden_size

    @property
    def layers(self) -> list[KeptLayer]:
        sel = self.selection
        entries = sel.student_entries or [None] * len(sel.teacher_layers)
        return [
            KeptLayer(name, t, r, e)
            for name, t, r, e in zip(
                layer_names(len(sel.teacher_layers)), sel.teacher_layers, sel.ranking_layers, entries
            )
        ]

    def storage_report(self) -> dict:
        return info.task_storage_report(self)

    def format_report(self, report: dict) -> str:
        return info.format_task_report(self, report)


def store_type(meta: StoreMeta | dict) -> type[HSKStore]:
    """The store class that metadata (typed, or the stored dict) describes: its kind's reader
    (hskstore.format.kinds)."""
    kind = kinds.get(meta.objective) if isinstance(meta, StoreMeta) else kinds.kind_of(meta)
    return kind.reader_class()


def open_store(url: str, *, allow_incomplete: bool = False, allow_unverified: bool = False) -> HSKStore:
    """The store at url, verified (HSKStore), as its kind: a TaskStore, or its kind's reader (an MLMStore, ...)."""
    return HSKStore(url, allow_incomplete=allow_incomplete, allow_unverified=allow_unverified)
