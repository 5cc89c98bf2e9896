"""The masked-LM store kind (`objective: mlm`, LightPAFF's pre-training distillation): raw text masked as BERT
masks it and, per masked position, the teacher's top-k ids and logits and the log-sum-exp of its full
distribution (docs/STORE_FORMAT.md, "Masked-LM stores").

`selection` holds the masking (seed, rates), `top_k` (k) and `max_masked` (M, masked positions per row;
unused slots have position -1 and zeros elsewhere). Pure numpy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from . import kinds
from .domain import DomainCheck, finite, ids_below, lengths_within
from .schema import ArraySpec, described_as, ids_dtype, task_entry

MLM = "mlm"  # meta["objective"] of a masked-LM store
GROUP = "mlm"  # the per-masked-position arrays live in this group
ROW_ARRAYS = ("row", "text_hash", "input_ids", "token_type_ids", "length")
# The keys the masked-LM dump writes, in its order (to_dict with `written`): stores' bytes stay what they were.
MLM_TEACHER_KEYS = ("name", "revision", "weights_hash", "architecture", "num_layers", "hidden_size", "vocab_size")
MLM_TOKENIZER_KEYS = ("name", "vocab_hash", "vocab_size", "cls_id", "sep_id", "pad_id", "mask_id")
_SECTION = "#masked-lm-stores-objective-mlm"


UNIT = "per row: round(mask_rate * maskable tokens), at least 1"  # the rule's text in every masked-LM store


@dataclass(frozen=True)
class MaskedLMSelection:
    """A masked-LM store's selection: BERT's masking of the inputs and the teacher's top-k per position."""

    mask_rate: float
    mask_token_rate: float
    random_token_rate: float
    keep_rate: float
    mask_seed: int
    max_masked: int
    top_k: int
    unit: str = UNIT  # the masking rule, as the stores say it

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> MaskedLMSelection:
        return cls(d["mask_rate"], d["mask_token_rate"], d["random_token_rate"], d["keep_rate"], d["mask_seed"],
                   d["max_masked"], d["top_k"], d.get("unit", UNIT))

    def to_dict(self) -> dict[str, object]:
        """The stored mapping, keys in the order the dump writes them."""
        return {"mask_rate": self.mask_rate, "mask_token_rate": self.mask_token_rate,
                "random_token_rate": self.random_token_rate, "mask_seed": self.mask_seed, "keep_rate": self.keep_rate,
                "max_masked": self.max_masked, "top_k": self.top_k, "unit": self.unit}

    def label(self) -> tuple[str, None]:
        """(config, codec): how a catalog and the card's title name this selection."""
        return f"top-{self.top_k}", None

    def kept(self) -> str:
        """What the store keeps, in one clause (the card, croissant's rai:dataPreprocessingProtocol)."""
        return (f"masked as BERT does ({self.mask_rate} of tokens, seed {self.mask_seed}); top-{self.top_k} logits "
                "and log-sum-exp kept per masked position")


def array_specs(meta: Mapping[str, object]) -> list[ArraySpec]:
    """A masked-LM store: the masked inputs and, per masked position, the teacher's top-k and log-sum-exp."""
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
        spec(f"{GROUP}/positions", (m,), "int16"),
        spec(f"{GROUP}/labels", (m,), ids),  # the original token at each masked position
        spec(f"{GROUP}/kind", (m,), "uint8"),  # 1 [MASK], 2 random token, 3 kept; 0 unused slot
        spec(f"{GROUP}/topk_ids", (m, k), ids),
        spec(f"{GROUP}/topk_logits", (m, k), "float32"),
        spec(f"{GROUP}/lse", (m,), "float32"),
    ]


def domain_checks(meta: Mapping[str, object]) -> list[DomainCheck]:
    """The rules of a masked-LM store's arrays (hskstore.format.domain): its ids below the tokenizer's vocabulary,
    lengths within the rows, the teacher's logits and log-sum-exps finite."""
    vocab = meta["tokenizer"]["vocab_size"]
    return [*(ids_below(name, vocab) for name in ("input_ids", f"{GROUP}/labels", f"{GROUP}/topk_ids")),
            lengths_within("length", 0, meta["max_length"]), finite(f"{GROUP}/topk_logits"), finite(f"{GROUP}/lse")]


# name -> (axes after rows, description, section of docs/STORE_FORMAT.md, units): what generic Zarr tools show.
# The per-row arrays read as a task store's, but for the inputs, which are the masked ones.
_DESCRIBED: dict[str, tuple[tuple[str, ...], str, str, str | None]] = {
    **{name: task_entry(name) for name in ROW_ARRAYS},
    "input_ids": (("tokens",), "the masked inputs, exactly as the teacher saw them", _SECTION, None),
    f"{GROUP}/positions": (("masked",), "masked positions, increasing; -1 = unused slot", _SECTION, "token index"),
    f"{GROUP}/labels": (("masked",), "the original token id at each masked position", _SECTION, None),
    f"{GROUP}/kind": (("masked",), "1 = replaced by [MASK], 2 = by a random id, 3 = kept; 0 = unused slot", _SECTION,
                      None),
    f"{GROUP}/topk_ids": (("masked", "top_k"), "the teacher's k highest-scoring vocabulary ids, by descending logit",
                          _SECTION, None),
    f"{GROUP}/topk_logits": (("masked", "top_k"), "the logits of those ids", _SECTION, "logit"),
    f"{GROUP}/lse": (("masked",), "log-sum-exp of the teacher's logits over the whole vocabulary", _SECTION, "logit"),
}


def entry(name: str) -> tuple[tuple[str, ...], str, str, str | None]:
    """(axes after rows, description, section, units) of the array `name`."""
    return _DESCRIBED[name]


def describe(spec: ArraySpec, meta: Mapping[str, object]) -> ArraySpec:
    return described_as(spec, entry(spec.name))


KIND = kinds.register(kinds.StoreKind(
    MLM, "a masked-LM teacher's top-k per masked position (`hsk dump --objective mlm`, LightPAFF)",
    array_specs, describe, frozenset({*ROW_ARRAYS, GROUP}), "hskstore.io.mlm_store:MLMStore", trains=("mlm",),
    record_groups=frozenset({GROUP}), selection_type=MaskedLMSelection, category="fill-mask"))
