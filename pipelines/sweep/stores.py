"""The stores a sweep trains from: where derived stores live, each derived once under a file lock, and
their storage numbers (cached beside them).

Every derived store of a source lives in `<work_dir>/stores/<source identity>/`, shared by every run
and every sweep that needs it: a complete store derived from the same source is reused, an interrupted
derive of it resumes, anything else there is replaced. Only `ensure_store` writes stores; the executors
(`pipelines.sweep.execute`) call it before the runs fan out, so two runs never derive one store at once.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zarr

from hskstore.format.config import HSKConfig
from hskstore.format.meta import StoreMeta
from hskstore.format.schema import META_KEY
from hskstore.io.info import storage_report
from hskstore.io.location import atomic_file, file_lock, zarr_location
from hskstore.io.reader import open_store
from hskstore.share.derive import derive
from pipelines.sweep.spec import SweepSpec


@dataclass(frozen=True)
class StoreSize:
    """What the results table records about a run's store (from hskstore.io.info.storage_report)."""

    total_bytes: int
    bytes_per_example: float
    rows: int


def store_dir(spec: SweepSpec) -> Path:
    """Where the stores derived from this source live (one folder per source identity)."""
    return Path(spec.work_dir) / "stores" / spec.source_meta().identity.split(":")[-1][:16]


def store_path(spec: SweepSpec, store_config: str, value_dtype: str | None) -> Path:
    cfg = HSKConfig.parse(store_config)
    if cfg.logits_only:
        return store_dir(spec) / "logits.zarr"
    return store_dir(spec) / f"{str(cfg).replace(',', '_')}-{value_dtype}.zarr"


def _read_meta(url: str) -> StoreMeta | None:
    """A store's metadata without opening it as an HSKStore (no array listing); None when unreadable."""
    try:
        return StoreMeta.parse(zarr.open_group(zarr_location(url), mode="r").attrs.asdict()[META_KEY])
    except Exception:  # nothing there, or not a readable store: derive over it
        return None


def ensure_store(spec: SweepSpec, store_config: str | None, value_dtype: str | None, *,
                 log: Callable[[str], object] | None = None) -> str:
    """The url of the store a run trains from: the source, or a derived store (derived unless complete)."""
    if store_config is None:
        return spec.source
    out = store_path(spec, store_config, value_dtype)
    source = spec.source_meta()
    # two sweeps (or workers) sharing a work_dir never derive one store at once
    with file_lock(out.with_name(out.name + ".lock")):
        meta = _read_meta(str(out))
        recorded = (meta.derived_from if meta else None) or {}
        same_source = (recorded.get("identity"), recorded.get("checksums")) == (source.identity, source.checksums)
        if meta is not None and meta.complete and same_source:
            return str(out)  # reuse
        if log is not None:
            log(f"derive {store_config} ({value_dtype or 'logits only'}) -> {out}")
        # An interrupted derive of the same source resumes; anything else there is replaced.
        overwrite = meta is not None and (meta.complete or not same_source)
        derive(spec.source, store_config, str(out), value_dtype=value_dtype, overwrite=bool(overwrite))
    return str(out)




def _write_json_atomic(path: Path, obj: object) -> None:
    with atomic_file(path) as (f, _):
        f.write(json.dumps(obj, indent=2, default=str).encode())


def store_size(spec: SweepSpec, url: str) -> StoreSize:
    """The size of a store a run trained from."""
    numbers = store_storage(spec, url)
    return StoreSize(int(numbers["total_bytes"]), float(numbers["bytes_per_example"]), int(numbers["rows"]))


def store_storage(spec: SweepSpec, url: str) -> dict:
    """storage_report numbers of a store, cached next to the derived stores (it reads every positions array)."""
    meta = _read_meta(url)
    name = "source" if url == spec.source else Path(url).name.removesuffix(".zarr")
    cache = store_dir(spec) / f"{name}.storage.json"
    stamp = {"identity": meta and meta.identity, "created": meta and meta.created}
    if cache.exists():
        with contextlib.suppress(ValueError, OSError, KeyError):
            cached = json.loads(cache.read_text())
            if cached.get("stamp") == stamp:
                return cached["report"]
    store = open_store(url)
    report = storage_report(store)
    numbers = {k: v for k, v in report.items() if k != "arrays"}
    numbers["rows"] = len(store)
    cache.parent.mkdir(parents=True, exist_ok=True)
    _write_json_atomic(cache, {"stamp": stamp, "report": numbers})
    return numbers
