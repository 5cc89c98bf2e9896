"""Croissant 1.1 metadata (MLCommons, JSON-LD): `croissant.json` at a store's root, beside its card.

Rendered at finalize from the checksummed metadata, like the card: what dataset tooling reads to
find, describe and cite a store. It says

- who and what: name, description, licence (what `hsk dump --license` recorded, else "unknown",
  said plainly), creators (`hsk dump --creator`, else an explicit "not recorded"), creation date,
  the store's content address as its `identifier`;
- where the bytes are (`distribution`): the root `zarr.json` with its sha256 (the file that holds
  the content address) and the set of array files. A bundle cannot hold its own sha256, so the
  croissant.json inside a bundle is the store's (by content address), and `hsk pack` writes a
  sibling `NAME.croissant.json` whose distribution is the bundle file with its sha256, the store's
  files contained in it (`bundle_croissant`);
- what a record holds (`recordSet`): one record set per array family (per-row inputs, teacher
  logits, each kept layer's positions/scores/values/masks/scales, attention rows, masked-LM
  arrays), each field with its dtype and per-row shape;
- where it came from (Responsible-AI fields): "teacher outputs of T over dataset X revision Y".

Zarr is no format Croissant's loaders read, so fields name their array's path in the store and
point at the array files as their source; readers use hskstore or zarr (see the card).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import zarr

from ..format import kinds
from ..format.digest import fingerprint
from ..format.schema import ArraySpec, array_specs
from .card import front_matter, selection_text, shareable, store_name, stored_bytes
from .location import atomic_file
from .outputs import remove_dead_temporaries
from .reader import HSKStore
from .zarr_adapter import get_bytes, set_bytes

CROISSANT_NAME = "croissant.json"
CONFORMS_TO = "http://mlcommons.org/croissant/1.1"
UNKNOWN_LICENSE = "unknown: the licence of this store was not recorded (hsk dump --license)"
ROOT_ID, ARRAYS_ID, BUNDLE_ID = "zarr-root", "zarr-array-files", "bundle"

# The @context of Croissant 1.1 (the keys of mlcroissant's standard context, in its spelling).
CONTEXT = {
    "@language": "en", "@vocab": "https://schema.org/", "sc": "https://schema.org/",
    "cr": "http://mlcommons.org/croissant/", "rai": "http://mlcommons.org/croissant/RAI/",
    "dct": "http://purl.org/dc/terms/", "arrayShape": "cr:arrayShape", "citeAs": "cr:citeAs", "column": "cr:column",
    "conformsTo": "dct:conformsTo", "containedIn": "cr:containedIn", "data": {"@id": "cr:data", "@type": "@json"},
    "dataType": {"@id": "cr:dataType", "@type": "@vocab"}, "equivalentProperty": "cr:equivalentProperty",
    "examples": {"@id": "cr:examples", "@type": "@json"}, "extract": "cr:extract", "field": "cr:field",
    "fileProperty": "cr:fileProperty", "fileObject": "cr:fileObject", "fileSet": "cr:fileSet", "format": "cr:format",
    "includes": "cr:includes", "isArray": "cr:isArray", "isLiveDataset": "cr:isLiveDataset", "jsonPath": "cr:jsonPath",
    "key": "cr:key", "md5": "cr:md5", "parentField": "cr:parentField", "path": "cr:path", "recordSet": "cr:recordSet",
    "references": "cr:references", "regex": "cr:regex", "repeated": "cr:repeated", "replace": "cr:replace",
    "samplingRate": "cr:samplingRate", "separator": "cr:separator", "source": "cr:source", "subField": "cr:subField",
    "transform": "cr:transform",
}

_DTYPES = {
    "float16": "cr:Float16", "float32": "cr:Float32", "float64": "cr:Float64", "int8": "cr:Int8",
    "int16": "cr:Int16", "int32": "cr:Int32", "int64": "cr:Int64", "uint8": "cr:UInt8", "uint16": "cr:UInt16",
    "uint32": "cr:UInt32", "uint64": "cr:UInt64",
}

_PARTS = {  # what each array holds, by its last path part
    "row": "row index of the example within the source split",
    "text_hash": "first 8 bytes of blake2b over the example's texts (joins stored rows to data by content)",
    "label": "gold label (-1 or NaN: none)",
    "logits": "the teacher's output logits",
    "input_ids": "token ids as the teacher saw them",
    "token_type_ids": "segment ids",
    "length": "tokens before padding",
    "positions": "token positions kept, in rank order (-1: unused slot)",
    "scores": "ranking score of each kept token",
    "values": "kept activations of each kept token, in index order",
    "masks": "bit-packed mask (numpy packbits, big-endian bit order) of the kept activation indices",
    "scale": "quantisation scale(s) of the values",
    "attention": "pre-softmax attention scores of the kept tokens' query rows [heads, NL, T]",
    "kind": "masking kind: 1 [MASK], 2 random token, 3 kept; 0 unused slot",
    "topk_ids": "the teacher's top-k vocabulary ids at each masked position",
    "topk_logits": "the teacher's top-k logits at each masked position",
    "lse": "log-sum-exp of the teacher's full distribution at each masked position",
}


@dataclass(frozen=True)
class BundleFile:
    """A bundle as Croissant's distribution names it: the file (relative URL), its sha256 and size."""

    name: str
    sha256: str
    size: int


def family(name: str, groups: frozenset[str] = frozenset()) -> str:
    """The record set an array belongs to: per-row inputs, logits, one per kept layer, attention, or one of
    the `groups` its kind lists as record sets of their own (StoreKind.record_groups: the masked-LM arrays)."""
    group, nested, _ = name.partition("/")
    if nested and group in groups:
        return group
    if name.endswith("/attention"):
        return "attention_rows"
    if name.startswith("layers/"):
        return name.rsplit("/", 1)[0]
    return "teacher_logits" if name == "logits" else "examples"


def _field(spec: ArraySpec, meta: dict) -> dict:
    part = spec.name.rsplit("/", 1)[-1]
    what = _PARTS.get(part, spec.name)
    if part == "values":
        what += f" (stored as {meta['selection'].get('value_dtype')}; `hsk export` writes them decoded)"
    field = {
        "@type": "cr:Field", "@id": spec.name, "name": spec.name.replace("/", "_"),
        "description": f"Zarr v3 array `{spec.name}` ({spec.dtype}, shape {list(spec.shape)}): {what}.",
        "dataType": _DTYPES.get(spec.dtype, "sc:Text"),
        "source": {"fileSet": {"@id": ARRAYS_ID}, "extract": {"fileProperty": "content"}},
    }
    if len(spec.shape) > 1:
        field.update(isArray=True, arrayShape=",".join(str(n) for n in spec.shape[1:]))
    return field


def record_sets(meta: dict) -> list[dict]:
    """One record set per array family, each field with its dtype and per-row shape."""
    sets: dict[str, list[dict]] = {}
    groups = kinds.kind_of(meta).record_groups
    for spec in array_specs(meta):
        sets.setdefault(family(spec.name, groups), []).append(_field(spec, meta))
    rows = meta["layout"]["n_rows"]
    return [{"@type": "cr:RecordSet", "@id": key, "name": key.replace("/", "_"),
             "description": f"{key}: {len(fields)} array(s) over {rows} rows (one record per example)",
             "field": fields} for key, fields in sets.items()]


def _license(meta: dict) -> str:
    return (meta.get("sharing") or {}).get("license") or UNKNOWN_LICENSE


def _creators(meta: dict) -> list[dict]:
    names = (meta.get("sharing") or {}).get("creators") or []
    if not names:
        return [{"@type": "sc:Organization", "name": "not recorded (hsk dump --creator)"}]
    return [{"@type": "sc:Person", "name": str(name)} for name in names]


def collection_text(meta: dict) -> str:
    """"teacher outputs of T over dataset X revision Y": the store's data source in one sentence."""
    teacher, data = meta["teacher"], meta["dataset"]
    origin = meta.get("data_origin") or {}
    revision = origin.get("revision") or ", ".join(f"sha256:{f['sha256'][:16]}..." for f in origin.get("files", []))
    rev = teacher.get("revision")
    return (f"Teacher outputs of {teacher['name']}{f'@{rev}' if rev else ''} (weights {teacher.get('weights_hash')}) "
            f"over dataset {data.get('source')} revision {revision or 'not recorded'} "
            f"(examples fingerprint {data.get('fingerprint')}; {meta['layout']['n_rows']} rows), computed once "
            f"by hsk {meta.get('software_version', '?')}.")


def _rai(meta: dict) -> dict:
    how = selection_text(meta)[2]  # the kind's selection record says what it keeps
    fields = {
        "rai:dataCollection": collection_text(meta),
        "rai:dataCollectionType": "Machine-generated: outputs of a teacher model",
        "rai:dataPreprocessingProtocol": f"Tokenized to at most {meta.get('max_length')} tokens; {how}.",
        "rai:dataUseCases": "Teacher-free knowledge distillation of BERT-like students (`hsk train --store`).",
        "rai:dataLimitations": "Carries the teacher's errors and the source dataset's coverage; the texts "
                               "themselves are not stored, only token ids.",
        "rai:dataBiases": f"Inherits the biases of the source dataset ({meta['dataset'].get('source')}) and "
                          f"of the teacher ({meta['teacher']['name']}).",
    }
    return fields


def _distribution(meta: dict, root_sha256: str, bundle: BundleFile | None) -> list[dict]:
    inside = {"containedIn": {"@id": BUNDLE_ID}} if bundle else {}
    files = [
        {"@type": "cr:FileObject", "@id": ROOT_ID, "name": ROOT_ID, "contentUrl": "zarr.json",
         "encodingFormat": "application/json", "sha256": root_sha256,
         "description": f"The store's root metadata (Zarr v3 group; attribute `hsk`), content address "
                        f"{meta.get('manifest')}: it covers every array's metadata and checksums.", **inside},
        {"@type": "cr:FileSet", "@id": ARRAYS_ID, "name": ARRAYS_ID, "encodingFormat": "application/octet-stream",
         "includes": "**/c/**", "description": "Zarr v3 sharded chunks (Blosc zstd) of the arrays; each field "
                                               "names its array's path.", **inside},
    ]
    if bundle:
        files.insert(0, {"@type": "cr:FileObject", "@id": BUNDLE_ID, "name": bundle.name, "contentUrl": bundle.name,
                         "encodingFormat": "application/zip", "sha256": bundle.sha256,
                         "contentSize": f"{bundle.size} B",
                         "description": "The store as one zip (hsk pack): open it directly with hskstore.open_store."})
    return files


def render_croissant(meta: dict, size: int | None, name: str, root_sha256: str,
                     bundle: BundleFile | None = None) -> dict:
    """The Croissant 1.1 JSON-LD document of a complete store (or, with `bundle`, of its bundle)."""
    meta = shareable(meta)  # no local paths in what is shared (hskstore.io.card)
    fields = front_matter(meta, size)
    address = meta.get("manifest")
    doc = {
        "@context": CONTEXT, "@type": "sc:Dataset", "conformsTo": CONFORMS_TO,
        "name": bundle.name if bundle else name,
        "description": f"{fields['pretty_name']}: an offline feature store for teacher-free knowledge distillation "
                       f"written by hsk ({fields['rows']} rows, {size} bytes). {collection_text(meta)}",
        "identifier": address,
        "license": _license(meta),
        "creator": _creators(meta),
        "url": bundle.name if bundle else name,
        "datePublished": meta.get("created"),
        "version": f"{meta.get('format_version', 0)}.0.0",
        "keywords": fields["tags"],
        "citeAs": f"@misc{{hsk_store, title={{{fields['pretty_name']}}}, note={{hsk store {address}}}}}",
        "isBasedOn": _based_on(meta),
        "distribution": _distribution(meta, root_sha256, bundle),
        "recordSet": record_sets(meta),
        **_rai(meta),
    }
    return doc


def _based_on(meta: dict) -> list[str]:
    """The store's sources: the parent store it was derived from (content address), the data and the teacher."""
    out = []
    if meta.get("derived_from"):
        out.append(str(meta["derived_from"].get("content_address") or meta["derived_from"].get("identity")))
    out.append(str(meta["dataset"].get("source")))
    out.append(str(meta["teacher"].get("hub_id") or meta["teacher"]["name"]))
    return out


def _get(group: zarr.Group, key: str) -> bytes | None:
    return get_bytes(group, key)


def write_croissant(group: zarr.Group, meta: dict, names: list[str], url: str) -> dict:
    """Render the croissant.json of a finished store (after its zarr.json) and write it at the root."""
    root = _get(group, "zarr.json") or b""
    doc = render_croissant(meta, stored_bytes(group, names), store_name(url), fingerprint(root).removeprefix("sha256:"))
    set_bytes(group, CROISSANT_NAME, dumps(doc).encode())
    return doc


def read_croissant(group: zarr.Group) -> dict | None:
    """The croissant.json of a store, or None (incomplete, written by an older hsk, or not a JSON object: it is
    rendered from the metadata, outside every checksum, so a damaged one is rendered again, never fatal)."""
    raw = _get(group, CROISSANT_NAME)
    try:
        doc = None if raw is None else json.loads(raw)
    except ValueError:  # not JSON, or not UTF-8
        return None
    return doc if isinstance(doc, dict) else None


def dumps(doc: dict) -> str:
    return json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n"


def sibling_name(bundle: Path) -> Path:
    """`sst2.hsk.zip` -> `sst2.croissant.json`, next to the bundle."""
    stem = bundle.name
    for suffix in (".hsk.zip", ".zip"):
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    return bundle.with_name(f"{stem}.{CROISSANT_NAME}")


def bundle_croissant(bundle: Path, group: zarr.Group, meta: dict) -> dict:
    """The Croissant document of a bundle file: its sha256 and size, the store's files contained in it."""
    import hashlib

    h = hashlib.sha256()
    with open(bundle, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    names = [spec.name for spec in array_specs(meta)]
    file = BundleFile(bundle.name, h.hexdigest(), bundle.stat().st_size)
    root = _get(group, "zarr.json") or b""
    return render_croissant(meta, stored_bytes(group, names), bundle.name,
                            fingerprint(root).removeprefix("sha256:"), bundle=file)


def _is_croissant_file(path: Path) -> bool:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("conformsTo") == CONFORMS_TO and "hsk" in (doc.get("keywords") or [])


def claim_sibling(bundle: str | Path, *, overwrite: bool) -> Path:
    """The sibling croissant.json path of a bundle about to be packed; refuses (one line) what must not be replaced."""
    from ..errors import StoreExistsError

    path = sibling_name(Path(bundle))
    remove_dead_temporaries(str(path))
    if path.exists() or path.is_symlink():
        if path.is_symlink() or not _is_croissant_file(path):  # first: --overwrite would refuse it too
            raise StoreExistsError(f"{path} exists and is not an hsk bundle's croissant.json: it is never "
                                   "replaced; choose another bundle name")
        if not overwrite:
            raise StoreExistsError(f"{path} exists (the bundle's Croissant metadata goes there): pass --overwrite "
                                   "to replace it, or choose another bundle name")
    return path


def write_bundle_croissant(bundle: str | Path, sibling: Path) -> dict:
    """Write the Croissant document of a finished bundle to `sibling` (via a temporary, renamed into place)."""
    store = HSKStore(str(bundle))
    doc = bundle_croissant(Path(bundle), store.group, store.meta)
    with atomic_file(sibling) as (f, _):
        f.write(dumps(doc).encode())
    return doc
