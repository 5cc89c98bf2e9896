"""The store's arrays: names, shapes, dtypes, chunking and codecs, all derived from its metadata.

docs/STORE_FORMAT.md is the human-readable contract; this module is the executable one. Writer,
reader, derive and verify all take their array list from `array_specs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
from zarr.codecs import BloscCodec, BloscShuffle

from .. import codecs
from . import kinds
from .config import HSKConfig, Selection
from .meta import TASK, Layout

FORMAT_VERSION = 4  # what this hsk writes (docs/STORE_FORMAT.md)
# What it reads: version 1 has no manifest (metadata not covered) and no 4-bit values, version 2 no
# dimension names or array attributes, version 3 a manifest over compressed sizes and codecs (`hsk upgrade`
# brings each to this version).
READABLE_VERSIONS = (1, 2, 3, 4)
MANIFEST_SINCE = 2  # the first version whose complete stores carry a manifest
DIMENSIONS_SINCE = 3  # the first version whose arrays carry `dimension_names` and attributes
ADDRESS_SINCE = 4  # the first version whose manifest any writer of the same data reproduces (canonical JSON)
META_KEY = "hsk"
PROGRESS_DONE = "_progress/done"
PROGRESS_DIGESTS = "_progress/digests"
DIGEST_BYTES = 16
MASK_CLEVEL = 5  # zstd level of task stores' masks (level 9 until the dump had to keep up with a GPU)

# The per-row arrays of a task store, and the groups below the root (each other kind lists its own).
TASK_ROW_ARRAYS = ("row", "text_hash", "label", "logits", "input_ids", "token_type_ids", "length")
LAYERS_GROUP, PROGRESS_GROUP = "layers", "_progress"


def top_level_entries() -> frozenset[str]:
    """Every name a store of any kind that loads can hold at its root (zarr.json, arrays, groups): a broken kind
    package is skipped (the commands that open its stores name it)."""
    return frozenset({"zarr.json", PROGRESS_GROUP}).union(*(kind.root_entries for kind in kinds.loadable()))


@dataclass(frozen=True)
class ArraySpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    shard_rows: int
    chunk_rows: int
    bitshuffle: bool = True
    clevel: int = 3
    dims: tuple[str, ...] = ()  # zarr `dimension_names` (format 3); () writes none
    attributes: dict = field(default_factory=dict, hash=False)  # the array's zarr attributes (format 3)

    def create(self, group) -> None:
        tail = self.shape[1:]
        shuffle = BloscShuffle.bitshuffle if self.bitshuffle else BloscShuffle.shuffle
        group.create_array(
            self.name,
            shape=self.shape,
            dtype=self.dtype,
            chunks=(self.chunk_rows, *tail),
            shards=(self.shard_rows, *tail),
            compressors=BloscCodec(cname="zstd", clevel=self.clevel, shuffle=shuffle),
            fill_value=0,
            dimension_names=self.dims or None,
            attributes=self.attributes or None,
        )


def layer_names(n_layers: int) -> list[str]:
    """Kept layers are groups layers/0 .. layers/ND-1, in the order of the selection's teacher layers."""
    return [f"layers/{i}" for i in range(n_layers)]


def attention_row_layers(selection: dict) -> list[str]:
    """Kept layers that carry `attention` rows: all above the embeddings, when the store keeps them.

    The optional arrays are keyed by the selection's `attention_heads` (absent or 0: none). The
    embedding output (teacher layer 0) has no attention of its own, so it never gets rows.
    """
    if not selection.get("attention_heads"):
        return []
    names = layer_names(len(selection["teacher_layers"]))
    return [name for name, j in zip(names, selection["teacher_layers"], strict=True) if j >= 1]


def ids_dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= np.iinfo(np.uint16).max + 1 else "int32"


def array_specs(meta: dict) -> list[ArraySpec]:
    """Every data array of a store described by `meta` (progress bookkeeping excluded), by its kind, each with
    its dimension names and attributes (what a store of format DIMENSIONS_SINCE or later writes)."""
    kind = kinds.kind_of(meta)
    return [kind.describe(spec, meta) for spec in kind.array_specs(meta)]


# --- what generic Zarr tools show: dimension names and attributes -----------------------------------------
# Axis names shared by every array that has the axis (xarray aligns arrays of a group by them): per array of a
# task store, by its name's last part, the names of the axes after `rows`, a one-line description, the section
# of docs/STORE_FORMAT.md that says how to read it, and units. Each other kind declares its own.
SPEC_DOC = "docs/STORE_FORMAT.md"
ROWS = "rows"
_ARRAYS, _CODECS, _ATTENTION = "#arrays", "#codecs", "#optional-attention-rows-hsk-dump-attention-rows"
_DESCRIBED: dict[str, tuple[tuple[str, ...], str, str, str | None]] = {
    "row": ((), "row index in the source split", _ARRAYS, None),
    "text_hash": ((), "first 8 bytes (little-endian) of BLAKE2b-512 over the row's text fields joined by a tab",
                  _ARRAYS, None),
    "label": ((), "gold label; -1 (integer) or NaN (float) for none", _ARRAYS, None),
    "logits": (("classes",), "teacher logits from its classification head", _ARRAYS, "logit"),
    "input_ids": (("tokens",), "teacher tokenizer ids, padded with the pad id to max_length", _ARRAYS, None),
    "token_type_ids": (("tokens",), "segment ids", _ARRAYS, None),
    "length": ((), "real tokens of the row, [CLS] and [SEP] included", _ARRAYS, "tokens"),
    "positions": (("kept_tokens",), "kept token positions, by descending ranking score; -1 = unused slot",
                  _ARRAYS, "token index"),
    "scores": (("kept_tokens",), "ranking score of each kept position ([CLS]-row attention, head-averaged); "
               "0 in unused slots", _ARRAYS, None),
    "values": (("kept_tokens", "kept_width"), "kept activations of each kept token vector, in increasing index "
               "order, as the value codec stores them", _CODECS, None),
    "scale": (("kept_tokens",), "the value codec's scale of each kept token vector", _CODECS, None),
    "masks": (("kept_tokens", "mask_bytes"), "which of the d activations are kept: numpy packbits over d, "
              "big-endian bit order; all zero in unused slots", _ARRAYS, None),
    "attention": (("heads", "kept_tokens", "tokens"), "pre-softmax attention scores of each kept token over "
                  "every key position; 0 for padded keys and unused slots", _ATTENTION, "pre-softmax score"),
}
# What a plain-Zarr reader cannot see: zarr reads a lost chunk as the fill value, silently.
INTEGRITY = "a missing chunk reads as 0 in plain Zarr: check with `hsk verify` or the shard digests"
# A codec whose values array does not hold one element per kept value packs codes into bytes.
_PACKED_AXIS, _GROUP_AXIS = "value_bytes", "scale_groups"
_PROBE_WIDTH = 64


def task_entry(name: str) -> tuple[tuple[str, ...], str, str, str | None]:
    """(axes after rows, description, section, units) of a task store's array `name` (a kept layer's by its
    last part)."""
    return _DESCRIBED[name.rsplit("/", 1)[-1]]


def described_as(spec: ArraySpec, entry: tuple[tuple[str, ...], str, str, str | None],
                 codec: dict | None = None) -> ArraySpec:
    """`spec` with the dimension names and attributes of its `entry` (axes after rows, description, section,
    units); `codec`: how to decode it, attributes between the integrity line and the units."""
    dims, text, section, units = entry
    attributes = {"description": text, "spec": SPEC_DOC + section, "integrity": INTEGRITY, **(codec or {})}
    if units:
        attributes["units"] = units
    return replace(spec, dims=(ROWS, *dims), attributes=attributes)


def _codec_axes(leaf: str, value_dtype: str, dims: tuple[str, ...]) -> tuple[str, ...]:
    """The value codec decides the last axis of `values` (kept values, or bytes of packed codes) and whether
    `scale` has one (a scale per group of kept values) or none (one per vector): read from its declared
    arrays at a width where the two differ."""
    declared = codecs.get(value_dtype).arrays(_PROBE_WIDTH)
    if leaf == "values" and declared["values"][0] != (_PROBE_WIDTH,):
        return (dims[0], _PACKED_AXIS)
    if leaf == "scale" and declared["scale"][0]:
        return (*dims, _GROUP_AXIS)
    return dims


def described(spec: ArraySpec, meta: dict) -> ArraySpec:
    """A task store's `spec` with its dimension names and attributes (description, codec, spec section, units)."""
    leaf = spec.name.rsplit("/", 1)[-1]
    dims, text, section, units = task_entry(spec.name)
    codec = {}
    if leaf in ("values", "scale"):
        dims = _codec_axes(leaf, meta["selection"]["value_dtype"], dims)
        codec["codec"] = meta["selection"]["value_dtype"]  # hskstore.codecs.get(codec).decode
    if leaf == "masks":
        codec = {"codec": "packbits", "hidden_size": meta["selection"]["hidden_size"]}
    return described_as(spec, (dims, text, section, units), codec)


# The progress arrays (the writer's bookkeeping, outside array_specs): dimension names and attributes.
PROGRESS_DESCRIBED = {
    PROGRESS_DONE: (("shards",), {"description": "1 once the shard's arrays and digests are written",
                                  "spec": SPEC_DOC + _ARRAYS}),
    PROGRESS_DIGESTS: (("shards", "arrays", "digest_bytes"), {
        "description": "BLAKE2b with digest_size=16 of each shard of each data array, arrays in digest order",
        "spec": SPEC_DOC + "#shard-digests"}),
}


def task_array_specs(meta: dict) -> list[ArraySpec]:
    """A task store: the inputs, labels and logits, and per kept layer its HSK (docs/STORE_FORMAT.md)."""
    layout = meta["layout"]
    n, rows, chunk = layout["n_rows"], layout["shard_rows"], layout["chunk_rows"]
    length = meta["max_length"]
    sel = meta["selection"]
    config = HSKConfig.parse(sel["config"])
    n_layers, n_tokens = config.n_layers, config.n_tokens
    hidden = sel["hidden_size"]
    n_width = layout["n_width"]

    def spec(name: str, tail: tuple[int, ...], dtype: str, clevel: int = 3) -> ArraySpec:
        # Bytes that are codes (masks, int8 and 4-bit values) compress better whole than bit-shuffled
        # (benchmarks/store/mask_codecs.py, value_codecs.py); byte shuffle is a no-op on 1-byte items.
        return ArraySpec(name, (n, *tail), dtype, rows, chunk, bitshuffle=np.dtype(dtype).itemsize > 1,
                         clevel=clevel)

    specs = [
        spec("row", (), "int64"),
        spec("text_hash", (), "uint64"),
        spec("label", (), "float32" if meta["task"]["regression"] else "int16"),
        spec("logits", (meta["teacher"]["num_labels"],), "float32"),
        spec("input_ids", (length,), ids_dtype(meta["tokenizer"]["vocab_size"])),
        spec("token_type_ids", (length,), "uint8"),
        spec("length", (), "int16"),
    ]
    values = codecs.get(sel["value_dtype"]).arrays(n_width)
    for layer in layer_names(n_layers):
        specs += [
            spec(f"{layer}/positions", (n_tokens,), "int16"),
            spec(f"{layer}/scores", (n_tokens,), "float32"),
            spec(f"{layer}/values", (n_tokens, *values["values"][0]), values["values"][1]),
            # zstd level 5: within 4% of level 9's bytes at W = 0.2 for a twentieth of the CPU
            # (benchmarks/store/mask_codecs.py); earlier stores hold level 9, which a reader decodes the same way
            spec(f"{layer}/masks", (n_tokens, (hidden + 7) // 8), "uint8", clevel=MASK_CLEVEL),
        ]
        if "scale" in values:
            specs.append(spec(f"{layer}/scale", (n_tokens, *values["scale"][0]), values["scale"][1]))
    for layer in attention_row_layers(sel):  # TinyBERT: [heads, N^L, T] pre-softmax scores, fp16
        specs.append(spec(f"{layer}/attention", (sel["attention_heads"], n_tokens, length), "float16"))
    return specs


kinds.register(kinds.StoreKind(
    TASK, "a fine-tuned classifier's logits and hidden-state knowledge (`hsk dump --task`)", task_array_specs,
    described, frozenset({*TASK_ROW_ARRAYS, LAYERS_GROUP}), "hskstore.io.reader:TaskStore", trains=("task",),
    selection_type=Selection, category="text-classification", labelled=True))


def n_shards(meta: dict) -> int:
    layout = meta["layout"]
    return -(-layout["n_rows"] // layout["shard_rows"])


def shard_bounds(meta: dict, shard: int) -> tuple[int, int]:
    layout = meta["layout"]
    start = shard * layout["shard_rows"]
    return start, min(start + layout["shard_rows"], layout["n_rows"])


def make_layout(n_rows: int, n_width: int, shard_rows: int = 1024, chunk_rows: int | None = None) -> dict:
    """Layout.of as its mapping (hskstore.format.meta)."""
    return Layout.of(n_rows, n_width, shard_rows, chunk_rows).to_dict()
