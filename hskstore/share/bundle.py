"""Bundles: a finished store as one `.hsk.zip` file, to hand over, archive or publish.

A bundle is a plain zip of the store's objects (stored, not recompressed: the chunks already are),
with fixed timestamps and sorted names, so packing the same store twice gives the same file. It is
written once, to a hidden temporary name next to the output, checked with the store's own
checksums, and renamed into place: never rewritten in place, never left half written under its
name. Readers open a bundle directly, read-only (zarr's ZipStore, over an fsspec file for a
bundle behind a URL such as s3://bucket/sst2.hsk.zip); `unpack` turns it back into a folder.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import fsspec
import zarr

from ..errors import CorruptStoreError, StoreError, StoreExistsError
from ..format.schema import META_KEY
from ..io.lease import Lease
from ..io.location import BUNDLE_SUFFIX, atomic_file, is_bundle, is_local, zarr_location, zip_problem
from ..io.outputs import (
    STORE,
    OutputError,
    output_kind,
    recover_swap,
    remove_dead_temporaries,
    remove_tree,
    staged_replace,
)
from ..io.reader import HSKStore
from ..io.zarr_adapter import get_bytes, list_keys

_EPOCH = (1980, 1, 1, 0, 0, 0)  # the zip format's first representable time: no build time in the bytes
__all__ = ["BUNDLE_SUFFIX", "is_bundle", "pack", "packed_before", "refuse_remote_bundle", "store_keys", "unpack",
           "zarr_location"]


def _packable(key: str) -> bool:
    """Store objects only: no hidden files (a writer's lease) and no zarr temporaries (`*.partial`)."""
    return not key.endswith(".partial") and not any(part.startswith(".") for part in key.split("/"))


def store_keys(group: zarr.Group) -> list[str]:
    """Every object key under a group, relative to it, sorted."""
    return list_keys(group)


def _read(group: zarr.Group, key: str) -> bytes:
    data = get_bytes(group, key)
    if data is None:
        raise CorruptStoreError(f"object {key} vanished while packing: is a writer still at work?")
    return data


def refuse_remote_bundle(out: str | os.PathLike) -> None:
    """A bundle is written to a local file (a zip is written with seeks, then renamed into place): a URL is refused
    in one line saying how to put it there."""
    if not is_local(str(out)):
        name = str(out).rstrip("/").rsplit("/", 1)[-1] or f"store{BUNDLE_SUFFIX}"
        raise StoreError(f"{out}: hsk pack writes a local file, not a URL: pack to a local path, then copy it and its "
                         f"croissant.json there (e.g. `hsk pack STORE {name}`, then `aws s3 cp` or fsspec); "
                         "readers open a bundle at a URL directly")


def pack(store_url: str, out: str | os.PathLike, *, overwrite: bool = False, progress=None) -> Path:
    """Write the complete store at store_url as the bundle `out` (a local file); returns its path.

    Refuses incomplete stores and an existing `out` unless overwrite. The bundle is checked (every
    shard against its digests) before it takes its name; a damaged source is refused.
    """
    refuse_remote_bundle(out)
    out = Path(out)
    if not is_bundle(str(out)):
        raise StoreError(f"a bundle's name ends in .zip (e.g. {out.name}{BUNDLE_SUFFIX}): got {out}")
    # What --overwrite would refuse is refused first: the advice to pass it must work when followed.
    if out.exists() and not _is_bundle_file(out):
        raise StoreExistsError(f"{out} exists and is not an hsk bundle: it is never replaced; choose another name")
    if out.exists() and not overwrite:
        raise StoreExistsError(f"{out} exists: pass --overwrite to replace it, or choose another name")
    remove_dead_temporaries(str(out))
    source = HSKStore(store_url)  # refuses incomplete stores, and stores holding links, pipes or devices
    keys = [k for k in store_keys(source.group) if _packable(k)]
    with atomic_file(out, suffix=".zip") as (file, tmp):
        with zipfile.ZipFile(file, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            for key in progress(keys) if progress else keys:
                info = zipfile.ZipInfo(key, date_time=_EPOCH)
                info.external_attr = 0o644 << 16
                zf.writestr(info, _read(source.group, key))
        file.flush()
        problems = HSKStore(str(tmp)).verify()
        if problems:
            raise CorruptStoreError(f"{store_url} is damaged, not packed: {problems[0]}")
    return out


def packed_before(store_url: str, out: str | os.PathLike) -> Path | None:
    """The bundle at `out` when it is this very store packed by an earlier `hsk pack` (same content address,
    every shard intact): a pack stopped after the bundle took its name, before the croissant.json beside it
    (a full disk), is finished by its rerun instead of being refused. None otherwise."""
    out = Path(out)
    if not _is_bundle_file(out):
        return None
    try:
        address = HSKStore(store_url).content_address
        bundle = HSKStore(str(out))
    except StoreError:
        return None
    if address is None or bundle.content_address != address or bundle.verify():
        return None
    return out


def _is_bundle_file(path: Path) -> bool:
    """A zip whose root zarr.json is an hsk store's (damaged or not: --overwrite may replace it)."""
    try:
        with zipfile.ZipFile(path) as zf:
            root = json.loads(zf.read("zarr.json"))
        return META_KEY in root.get("attributes", {})
    except (OSError, KeyError, ValueError, AttributeError, zipfile.BadZipFile):
        return False


def _is_store_folder(path: Path) -> bool:
    """Whether `path` holds an hsk store (its zarr.json read as a metadata file: never through a link)."""
    try:
        return output_kind(str(path)) == STORE
    except OutputError:
        return False


def _extract(bundle: str, folder: str) -> None:
    try:
        with fsspec.open(bundle, "rb") as raw, zipfile.ZipFile(raw) as zf:
            problem = zip_problem(zf)
            if problem:
                raise CorruptStoreError(f"{bundle} is not a trustworthy bundle, not unpacked: {problem}")
            zf.extractall(folder)  # zipfile drops absolute paths and `..`, and makes no links: all lands in folder
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError) as exc:  # a bad CRC...
        raise CorruptStoreError(f"{bundle} is damaged, not unpacked ({exc}): re-copy it or pack it again") from None


def unpack(bundle: str, out: str | os.PathLike, *, overwrite: bool = False, log=None) -> Path:
    """Extract a bundle into the local folder `out` (checked before it takes its name); returns it.

    Replacing a store takes its writer lease first (refused while a dump writes it), then builds the new
    one in a hidden sibling and swaps it in (hskstore.io.outputs.staged_replace): the old store stays whole
    until the new one is, even if the unpack is killed.
    """
    out = Path(out)
    recover_swap(str(out))
    if out.exists() and not _is_store_folder(out):  # first: --overwrite would refuse it too
        raise StoreExistsError(f"{out} exists and is not an hsk store: it is never replaced; choose another folder")
    if out.exists() and not overwrite:
        raise StoreExistsError(f"{out} exists: pass --overwrite to replace it, or choose another folder")
    HSKStore(bundle)  # a readable, complete bundle (the message says what is wrong)
    lease = Lease(str(out), log=log).acquire() if out.exists() else None
    try:
        with staged_replace(str(out)) as staged:
            try:
                _extract(bundle, staged)
                problems = HSKStore(staged).verify()
                if problems:
                    raise CorruptStoreError(f"{bundle} is damaged, not unpacked: {problems[0]}")
                if lease is not None:
                    lease.check()  # still ours: nobody took the store over while we extracted
            except BaseException:
                remove_tree(staged)
                raise
    finally:
        if lease is not None:
            lease.release()
    return out
