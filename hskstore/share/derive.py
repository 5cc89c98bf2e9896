"""Write the store of a smaller config from a larger one, without the teacher (DESIGN.md, "The store").

Every selection step of a dump is nested, so a smaller config is a sub-selection of a larger one:

- depth: "keep N^D layers" keeps the *last* N^D entries (`layermap.kept_entries`), so the
  smaller store's layers are a suffix of the larger store's layers (same reference student,
  L_top and ranking map). Explicit-layer stores keep their last N^D' layers.
- length: positions are stored in rank order and ranking ties go to the lower position, so the
  top N^L' tokens are the first N^L' slots (scores likewise).
- width: mag keeps the top N^W by |fp16 value| with ties to the lower index, and the dump ranks
  the very fp16 values the store keeps, so the top N^W' of the kept values is the top N^W' of
  the whole vector. rand is the prefix of one seeded permutation. uniform index sets of two
  widths are not nested: only the same width can be derived.
- values: precision only goes down, float16 -> int8 -> int4 or mxfp4, each step exactly as the
  dump encodes: a codec is quantised through its chain (hskstore.codecs: the dump's 4-bit codes are
  themselves quantised from its int8 values, so int8 -> int4 here equals a direct int4 dump); only
  a lossless store (float16) can re-rank a narrower width, quantised ones keep only codes.
- attention rows (TinyBERT): one row per kept token slot, in the slots' order, so the first N^L'
  rows are kept; they are copied, or dropped with `attention_rows=False`.

The result is array for array the store a direct dump at the smaller config writes (same
checksums); only `derived_from` and the creation time differ. Work is streamed shard by shard
through `StoreWriter` with the source's layout, so memory does not grow with the store and an
interrupted derive resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable

import numpy as np

from .. import codecs
from ..errors import CorruptStoreError, StoreExistsError
from ..format import codec
from ..format.config import VALUES, ConfigError, HSKConfig, Selection, check_choices
from ..format.digest import array_checksum
from ..format.meta import StoreMeta
from ..format.schema import PROGRESS_DIGESTS, attention_row_layers, layer_names
from ..io.outputs import STORE, claim_output
from ..io.reader import HSKStore, open_store
from ..io.writer import writing
from ..method.layermap import select_depth
from ..method.selection import static_width_indices, width_mask

# Bookkeeping of the source that must not leak into the derived store (the writer recomputes it).
_SOURCE_ONLY = ("checksums", "inputs_hash", "complete", "identity", "created", "software_version",
                "format_version", "derived_from", "manifest", "stored_bytes")
# Arrays that do not depend on the selection: copied verbatim.
_ROW_ARRAYS = ("row", "text_hash", "label", "logits", "input_ids", "token_type_ids", "length")


@dataclasses.dataclass(frozen=True)
class DerivePlan:
    """What one derive does: source layer of each output layer, and the width/value transform."""

    selection: Selection
    source_layers: tuple[str, ...]  # source group name of output layers/0, layers/1, ...
    n_tokens: int
    src_width: int
    new_width: int
    src_dtype: str
    new_dtype: str


def _check_values(where: str, src: Selection, new_dtype: str, narrower: bool) -> None:
    """Precision only goes down (along the target codec's chain); only a lossless store re-ranks a narrower width."""
    check_choices([("value dtype", new_dtype, VALUES.values)])
    if not codecs.can_convert(src.value_dtype, new_dtype):
        raise ConfigError(f"{where}: {src.value_dtype} values cannot become {new_dtype} (the precision is gone); "
                          "derive from the float16 store instead")
    if narrower and not codecs.get(src.value_dtype).lossless:
        raise ConfigError(
            f"{where}: an {src.value_dtype} store keeps only quantised codes, which cannot re-rank a narrower "
            "width exactly; derive from the float16 store instead"
        )



def _attention_heads(src: Selection, where: str, attention_rows: bool | None) -> int:
    """The derived store's attention head count: the source's (kept, the default) or 0 (dropped)."""
    if attention_rows and not src.attention_rows:
        raise ConfigError(f"{where} keeps no attention rows: dump the source with --attention-rows")
    return 0 if attention_rows is False else src.attention_heads


def plan_derive(
    source: HSKStore, config: HSKConfig, value_dtype: str | None = None, attention_rows: bool | None = None
) -> DerivePlan:
    """Check that `config` can be derived from `source` and say how; raises ConfigError otherwise.

    attention_rows: None keeps the source's attention rows when it has them, False drops them, True
    requires them.
    """
    src = source.selection
    where = f"source store {source.url} (config {src.config}, {src.width_strategy} width, {src.value_dtype})"
    if src.config.logits_only:
        raise ConfigError(f"{where} holds logits only: nothing to derive HSK from; dump a store with HSK")
    new_dtype = value_dtype or src.value_dtype
    if config.n_layers > src.config.n_layers:
        raise ConfigError(f"{where} keeps {src.config.n_layers} layers; cannot derive N^D={config.n_layers}: "
                          "dump a larger config instead")
    if config.n_tokens > src.config.n_tokens:
        raise ConfigError(f"{where} keeps {src.config.n_tokens} tokens per layer; cannot derive "
                          f"N^L={config.n_tokens}: dump a larger config instead")
    src_width = src.n_width
    new_width = config.n_width(src.hidden_size)
    if not config.logits_only:
        if new_width > src_width:
            raise ConfigError(f"{where} keeps N^W={src_width} of {src.hidden_size} activations; cannot "
                              f"derive W={config.width:g} (N^W={new_width}): dump a larger config instead")
        if new_width < src_width and src.width_strategy == "uniform":
            raise ConfigError(
                f"{where}: uniform masks of two widths are not nested (indices round(i*d/N^W)), so "
                f"N^W={new_width} cannot be derived from N^W={src_width}; dump that width directly"
            )
    _check_values(where, src, new_dtype, new_width < src_width)

    # Depth: the kept entries of a smaller N^D are the last ones, so take the suffix.
    nd, src_nd = config.n_layers, src.config.n_layers
    first = src_nd - nd
    teacher_layers = tuple(src.teacher_layers[first:])
    ranking_layers = tuple(src.ranking_layers[first:])
    entries = None if src.student_entries is None else tuple(src.student_entries[first:])
    if src.student_entries is not None and nd > 0:
        # The suffix must be what the layer map itself gives at N^D' (same S, L_top, ranking map).
        layers, direct_entries, ranking = select_depth(
            nd, src.teacher_num_layers, ref_student_layers=src.ref_student_layers, l_top=src.l_top,
            ranking_map=src.ranking_map,
        )
        direct = (tuple(layers), tuple(direct_entries or ()), tuple(ranking))
        if direct != (teacher_layers, entries, ranking_layers):
            raise CorruptStoreError(
                f"{where}: its recorded layers {list(src.teacher_layers)} (entries "
                f"{list(src.student_entries)}) do not follow its own layer map; the metadata is inconsistent"
            )
    selection = dataclasses.replace(
        src, config=config, teacher_layers=teacher_layers, ranking_layers=ranking_layers,
        student_entries=entries, value_dtype=new_dtype,
        attention_heads=_attention_heads(src, where, attention_rows) if nd > 0 else 0,
    )
    source_layers = tuple(layer_names(src_nd)[first:])
    return DerivePlan(selection, source_layers, config.n_tokens, src_width, new_width, src.value_dtype,
                      new_dtype)


def _narrow(values16: np.ndarray, src_mask: np.ndarray, valid: np.ndarray, plan: DerivePlan) -> np.ndarray:
    """Which of the N^W kept values of each vector survive at N^W': a mask over the compact values.

    Values are stored in index order, so the compact vector ranks like the dense zero-filled
    vector restricted to the source mask: the lower compact index is the lower dense index.
    """
    sel = plan.selection
    if sel.width_strategy == "mag":
        return width_mask(values16, plan.new_width, "mag", valid=valid)
    # rand: the narrower index set is a prefix of the same seeded permutation, hence a subset.
    d = sel.hidden_size
    src_idx = static_width_indices(sel.width_strategy, d, plan.src_width, sel.width_seed)
    new_idx = static_width_indices(sel.width_strategy, d, plan.new_width, sel.width_seed)
    if not np.isin(new_idx, src_idx).all():  # cannot happen for rand; guards a future static mask
        raise ConfigError(
            f"{sel.width_strategy} masks of widths {plan.new_width} and {plan.src_width} are not nested"
        )
    expected = np.zeros(d, dtype=bool)
    expected[src_idx] = True
    if not (src_mask[valid] == expected).all():
        raise CorruptStoreError("stored masks differ from the static width mask: the store is damaged")
    return np.broadcast_to(np.isin(src_idx, new_idx), values16.shape) & valid[..., None]


def _requantize(data: dict[str, np.ndarray], src_name: str, nl: int, plan: DerivePlan) -> dict[str, np.ndarray]:
    """Values (and scales) of the same kept values in a lower precision, exactly as the dump encodes them."""
    values = data[f"{src_name}/values"][:, :nl]
    scale = data[f"{src_name}/scale"][:, :nl] if f"{src_name}/scale" in data else None
    if plan.src_dtype != plan.new_dtype:  # the rest of the dump's chain, from the source's decoded values
        source = codecs.get(plan.src_dtype)
        decoded = source.decode(values, scale, plan.src_width)
        values, scale = codecs.get(plan.new_dtype).requantize(plan.src_dtype, decoded)
    return {"values": values} if scale is None else {"values": values, "scale": scale}


def derive_layer(
    data: dict[str, np.ndarray], src_name: str, dst_name: str, plan: DerivePlan
) -> dict[str, np.ndarray]:
    """The arrays of one output layer from the arrays of one source layer (rows of one shard)."""
    nl, d = plan.n_tokens, plan.selection.hidden_size
    positions = data[f"{src_name}/positions"][:, :nl]
    out = {
        f"{dst_name}/positions": positions,
        f"{dst_name}/scores": data[f"{src_name}/scores"][:, :nl],
    }
    packed = data[f"{src_name}/masks"][:, :nl]
    if plan.new_width == plan.src_width:
        out[f"{dst_name}/masks"] = packed
        out.update({f"{dst_name}/{k}": v for k, v in _requantize(data, src_name, nl, plan).items()})
        return out

    values = data[f"{src_name}/values"][:, :nl]  # float16: only float16 stores narrow (plan_derive)
    valid = positions >= 0
    src_mask = codec.unpack_mask(packed, d)
    counts = src_mask.sum(axis=-1)
    if not np.array_equal(counts, np.where(valid, plan.src_width, 0)):
        raise CorruptStoreError(f"{src_name}/masks do not keep N^W={plan.src_width} values per kept token: "
                                "the store is damaged")
    keep = _narrow(values, src_mask, valid, plan)  # [n, N^L', N^W] over the compact values
    new_values, scale = codec.encode_values(values, keep, plan.new_width, plan.new_dtype)
    new_mask = np.zeros_like(src_mask)
    new_mask[src_mask] = keep[src_mask.any(axis=-1)].reshape(-1)  # compact -> dense indices
    out[f"{dst_name}/values"] = new_values
    out[f"{dst_name}/masks"] = codec.pack_mask(new_mask)
    if scale is not None:
        out[f"{dst_name}/scale"] = scale
    return out


def derive_shard(data: dict[str, np.ndarray], plan: DerivePlan) -> dict[str, np.ndarray]:
    """All output arrays of one shard from the source arrays of the same rows."""
    out = {name: data[name] for name in _ROW_ARRAYS}
    dst_names = layer_names(plan.selection.config.n_layers)
    for src_name, dst_name in zip(plan.source_layers, dst_names, strict=True):
        out.update(derive_layer(data, src_name, dst_name, plan))
    with_rows = attention_row_layers(plan.selection.to_dict())
    for src_name, dst_name in zip(plan.source_layers, dst_names, strict=True):
        if dst_name in with_rows:  # rows follow the token slots: the first N^L' are kept
            out[f"{dst_name}/attention"] = data[f"{src_name}/attention"][:, :, : plan.n_tokens]
    return out


def _check_source_checksums(source: HSKStore) -> None:
    """The per-shard digests must add up to the recorded checksums (cheap: no data read)."""
    digests = source.group[PROGRESS_DIGESTS][:]
    recorded = source.meta.get("checksums", {})
    for i, name in enumerate(source.specs):
        if recorded.get(name) != array_checksum([bytes(d) for d in digests[:, i]]):
            raise CorruptStoreError(
                f"{source.url}: array {name} does not match its recorded checksum; the source store is "
                "damaged: re-copy it or dump again"
            )


def _same_location(a: str, b: str) -> bool:
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def derive(
    source_url: str,
    config: HSKConfig | str,
    out_url: str,
    *,
    value_dtype: str | None = None,
    overwrite: bool = False,
    progress: Callable[[Iterable[int]], Iterable[int]] | None = None,
    attention_rows: bool | None = None,
    log: Callable[[str], object] | None = None,
) -> dict:
    """Write at `out_url` the store of `config` derived from `source_url`, without the teacher.

    `value_dtype` defaults to the source's. Refuses (ConfigError) configs the source cannot give,
    and (reader errors) incomplete or corrupt sources. Resumes an interrupted derive of the same
    source and config at `out_url`. `progress` wraps the iterable of shard indices still to write
    (e.g. `tqdm`); `log` gets the writer's messages (lease taken over, already complete).
    `attention_rows`: None keeps the source's TinyBERT attention rows, False drops them, True
    requires them. Returns the derived store's metadata. Follows the output rule
    (hskstore.io.outputs) and holds the writer lease.
    """
    from .. import __version__

    config = HSKConfig.parse(config) if isinstance(config, str) else config
    if _same_location(str(source_url), str(out_url)):
        raise StoreExistsError(f"--out {out_url} is the source store itself: choose another output")
    claim_output(str(out_url), STORE, overwrite=overwrite)  # refuse a foreign output before any work
    source = open_store(source_url)  # refuses incomplete, truncated and edited stores
    source.refuse_derive()  # a kind derive cannot shrink (a masked-LM store) says so in one line
    _check_source_checksums(source)
    plan = plan_derive(source, config, value_dtype, attention_rows)

    src_meta = source.metadata
    meta = {k: v for k, v in source.meta.items() if k not in _SOURCE_ONLY}
    meta["selection"] = plan.selection.to_dict()
    # Same shard rows: source shard i becomes output shard i, so a resume knows what is left.
    meta["layout"] = dataclasses.replace(src_meta.layout, n_width=plan.new_width).to_dict()
    derived_from = {
        "url": source.url,
        "identity": src_meta.identity,
        "config": str(source.config),
        "value_dtype": source.selection.value_dtype,
        "created": src_meta.created,
        "checksums": dict(src_meta.checksums),
        "content_address": source.content_address,
        # lineage: what was asked of the derive (attention_rows None: the source's rows kept when it has them)
        "options": {"config": str(config), "value_dtype": value_dtype, "attention_rows": attention_rows},
    }
    if src_meta.derived_from:
        derived_from["derived_from"] = src_meta.derived_from  # keep the chain back to the dump
    meta["derived_from"] = derived_from

    with writing(out_url, StoreMeta.parse(meta), overwrite=overwrite, software_version=__version__,
                 log=log) as writer:
        recorded = writer.metadata.derived_from or {}
        same_source = (recorded.get("identity"), recorded.get("checksums")) == (
            derived_from["identity"], derived_from["checksums"])
        if not same_source:
            # The identity fields match, but the store there came from other source data.
            raise StoreExistsError(
                f"{out_url} holds a derive from another source ({recorded.get('url')}): "
                "pass overwrite=True (--overwrite) to replace it, or choose another output"
            )
        if writer.complete:
            if log is not None:
                log(f"{out_url} is already complete, nothing to do")
            return writer.meta
        # Read (and verify) only what the output needs: dropped layers are never decoded.
        names = [n for n in source.specs if n in _ROW_ARRAYS or n.rsplit("/", 1)[0] in plan.source_layers]
        if not plan.selection.attention_rows:
            names = [n for n in names if not n.endswith("/attention")]
        pending = writer.pending_shards()
        for shard in progress(pending) if progress is not None else pending:
            data = source.read_shard(shard, verify=True, names=names)  # a corrupt shard is refused unwritten
            writer.write_shard(shard, derive_shard(data, plan))
        return writer.finalize().to_dict()
