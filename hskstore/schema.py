"""The store's arrays: names, shapes, dtypes, chunking and codecs, all derived from its metadata.

docs/STORE_FORMAT.md is the human-readable contract; this module is the executable one. Writer,
reader, derive and verify all take their array list from `array_specs`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from zarr.codecs import BloscCodec, BloscShuffle

from . import codecs
from .config import HSKConfig
from .meta import MLM, TASK, Layout, objective_of

FORMAT_VERSION = 2  # what this hsk writes (docs/STORE_FORMAT.md)
READABLE_VERSIONS = (1, 2)  # what it reads: version 1 has no manifest (metadata not covered) and no 4-bit values
MANIFEST_SINCE = 2  # the first version whose complete stores carry a manifest
META_KEY = "hsk"
PROGRESS_DONE = "_progress/done"
PROGRESS_DIGESTS = "_progress/digests"
DIGEST_BYTES = 16
MASK_CLEVEL = 5  # zstd level of task stores' masks (level 9 until the dump had to keep up with a GPU)

# The per-row arrays of each store kind, and the groups below the root: the one list of a store's names.
TASK_ROW_ARRAYS = ("row", "text_hash", "label", "logits", "input_ids", "token_type_ids", "length")
MLM_ROW_ARRAYS = ("row", "text_hash", "input_ids", "token_type_ids", "length")
LAYERS_GROUP, MLM_GROUP, PROGRESS_GROUP = "layers", "mlm", "_progress"


def top_level_entries() -> frozenset[str]:
    """Every name a store of either kind can hold at its root (zarr.json, arrays, groups)."""
    return frozenset({"zarr.json", *TASK_ROW_ARRAYS, *MLM_ROW_ARRAYS, LAYERS_GROUP, MLM_GROUP, PROGRESS_GROUP})


@dataclass(frozen=True)
class ArraySpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    shard_rows: int
    chunk_rows: int
    bitshuffle: bool = True
    clevel: int = 3

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
    """Every data array of a store described by `meta` (progress bookkeeping excluded), by its kind."""
    return _SPECS_OF_KIND.get(objective_of(meta), task_array_specs)(meta)


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
        # (benchmarks/mask_codecs.py, value_codecs.py); byte shuffle is a no-op on 1-byte items.
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
            # (benchmarks/mask_codecs.py); earlier stores hold level 9, which a reader decodes the same way
            spec(f"{layer}/masks", (n_tokens, (hidden + 7) // 8), "uint8", clevel=MASK_CLEVEL),
        ]
        if "scale" in values:
            specs.append(spec(f"{layer}/scale", (n_tokens, *values["scale"][0]), values["scale"][1]))
    for layer in attention_row_layers(sel):  # TinyBERT: [heads, N^L, T] pre-softmax scores, fp16
        specs.append(spec(f"{layer}/attention", (sel["attention_heads"], n_tokens, length), "float16"))
    return specs


def mlm_array_specs(meta: dict) -> list[ArraySpec]:
    """A masked-LM store: the masked inputs and, per masked position, the teacher's top-k and log-sum-exp.

    meta["selection"] holds the masking (seed, rates), `top_k` (k) and `max_masked` (M, masked
    positions per row; unused slots have position -1 and zeros elsewhere).
    """
    layout, sel = meta["layout"], meta["selection"]
    n, rows, chunk = layout["n_rows"], layout["shard_rows"], layout["chunk_rows"]
    ids = ids_dtype(meta["tokenizer"]["vocab_size"])
    m, k = sel["max_masked"], sel["top_k"]

    def spec(name: str, tail: tuple[int, ...], dtype: str) -> ArraySpec:
        return ArraySpec(name, (n, *tail), dtype, rows, chunk)

    return [
        spec("row", (), "int64"),
        spec("text_hash", (), "uint64"),
        spec("input_ids", (meta["max_length"],), ids),  # as the teacher saw them: masked
        spec("token_type_ids", (meta["max_length"],), "uint8"),
        spec("length", (), "int16"),
        spec("mlm/positions", (m,), "int16"),
        spec("mlm/labels", (m,), ids),  # the original token at each masked position
        spec("mlm/kind", (m,), "uint8"),  # 1 [MASK], 2 random token, 3 kept; 0 unused slot
        spec("mlm/topk_ids", (m, k), ids),
        spec("mlm/topk_logits", (m, k), "float32"),
        spec("mlm/lse", (m,), "float32"),
    ]


_SPECS_OF_KIND = {TASK: task_array_specs, MLM: mlm_array_specs}


def n_shards(meta: dict) -> int:
    layout = meta["layout"]
    return -(-layout["n_rows"] // layout["shard_rows"])


def shard_bounds(meta: dict, shard: int) -> tuple[int, int]:
    layout = meta["layout"]
    start = shard * layout["shard_rows"]
    return start, min(start + layout["shard_rows"], layout["n_rows"])


def make_layout(n_rows: int, n_width: int, shard_rows: int = 1024, chunk_rows: int | None = None) -> dict:
    """Layout.of as its mapping (hskstore.meta)."""
    return Layout.of(n_rows, n_width, shard_rows, chunk_rows).to_dict()
