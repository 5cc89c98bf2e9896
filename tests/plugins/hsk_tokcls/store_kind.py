"""The format half of the token-classification kind (`objective: tokcls`): pure numpy, as hskstore's are.

Per row: the word-pieces as the teacher saw them (input_ids, token_type_ids, length) and, per real position
(padding left zero), the teacher's label distribution: `tokcls/logprobs` [T, K] log-probabilities and, on a
top-k store, `tokcls/ids` [T, K] the label ids they belong to, by descending probability (the mass of the other
labels is 1 - the sum). A full store keeps every label's, in label order (K = the number of labels, no ids).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from hskstore.format import kinds
from hskstore.format.domain import Breach, DomainCheck, finite, ids_below, lengths_within
from hskstore.format.schema import INTEGRITY, ROWS, ArraySpec, ids_dtype, task_entry

NAME = "tokcls"  # meta["objective"]
GROUP = "tokcls"  # the per-token arrays live in this group
ROW_ARRAYS = ("row", "text_hash", "input_ids", "token_type_ids", "length")
SUPPORTS = ("topk", "full")
SPEC = "hsk-tokcls (tests/plugins/hsk_tokcls/store_kind.py)"


@dataclass(frozen=True)
class TokClsSelection:
    """What a token-classification store keeps per word-piece: the top-k labels' or every label's log-prob."""

    support: str  # "topk" or "full"
    top_k: int  # K: labels kept per token (the number of labels on a full store)
    labels: tuple[str, ...]  # the teacher's label names, by id

    def __post_init__(self) -> None:
        if self.support not in SUPPORTS:
            raise ValueError(f"support {self.support!r} is not one of {', '.join(SUPPORTS)}")
        if not 1 <= self.top_k <= len(self.labels) or (self.support == "full" and self.top_k != len(self.labels)):
            raise ValueError(f"top_k {self.top_k} does not fit {len(self.labels)} labels on a {self.support} store")

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> TokClsSelection:
        return cls(str(d["support"]), int(d["top_k"]), tuple(d["labels"]))

    def to_dict(self) -> dict[str, object]:
        return {"support": self.support, "top_k": self.top_k, "labels": list(self.labels)}

    def label(self) -> tuple[str, None]:
        """(config, codec) as a catalog lists it and the card's title names it."""
        return (f"top-{self.top_k}" if self.support == "topk" else "full"), None

    def kept(self) -> str:
        """What the store keeps, in one clause (the card, croissant.json)."""
        which = f"the top {self.top_k}" if self.support == "topk" else "all"
        return f"per word-piece, the log-probabilities of {which} of the teacher's {len(self.labels)} labels"


def array_specs(meta: Mapping[str, object]) -> list[ArraySpec]:
    layout, sel = meta["layout"], TokClsSelection.from_dict(meta["selection"])
    n, rows, chunk, t = layout["n_rows"], layout["shard_rows"], layout["chunk_rows"], meta["max_length"]

    def spec(name: str, tail: tuple[int, ...], dtype: str) -> ArraySpec:
        return ArraySpec(name, (n, *tail), dtype, rows, chunk)

    specs = [spec("row", (), "int64"), spec("text_hash", (), "uint64"),
             spec("input_ids", (t,), ids_dtype(meta["tokenizer"]["vocab_size"])), spec("token_type_ids", (t,), "uint8"),
             spec("length", (), "int16"), spec(f"{GROUP}/logprobs", (t, sel.top_k), "float32")]
    if sel.support == "topk":
        specs.append(spec(f"{GROUP}/ids", (t, sel.top_k), "uint8"))
    return specs


_DESCRIBED = {
    f"{GROUP}/logprobs": (("tokens", "labels"), "the teacher's log-probability of each kept label, per word-piece "
                          "(0 past the row's length)", "log-probability"),
    f"{GROUP}/ids": (("tokens", "labels"), "the kept labels' ids, by descending probability", None),
}


def describe(spec: ArraySpec, meta: Mapping[str, object]) -> ArraySpec:
    """The spec with its dimension names and attributes (the row arrays read as a task store's)."""
    if spec.name in ROW_ARRAYS:
        dims, text, _, units = task_entry(spec.name)
    else:
        dims, text, units = _DESCRIBED[spec.name]
    attributes = {"description": text, "spec": SPEC, "integrity": INTEGRITY, **({"units": units} if units else {})}
    return replace(spec, dims=(ROWS, *dims), attributes=attributes)


def log_probabilities(name: str) -> DomainCheck:
    """Every value of `name` is a log-probability: at most 0 (and finite: `finite`)."""

    def rule(data: Mapping[str, np.ndarray]) -> Breach | None:
        if data[name].size and float(data[name].max()) > 0:
            return Breach(name, f"holds {float(data[name].max())}, above 0: not a log-probability")
        return None

    return DomainCheck((name,), rule)


def domain_checks(meta: Mapping[str, object]) -> list[DomainCheck]:
    sel = TokClsSelection.from_dict(meta["selection"])
    checks = [ids_below("input_ids", meta["tokenizer"]["vocab_size"]), lengths_within("length", 0, meta["max_length"]),
              finite(f"{GROUP}/logprobs"), log_probabilities(f"{GROUP}/logprobs")]
    return [*checks, ids_below(f"{GROUP}/ids", len(sel.labels))] if sel.support == "topk" else checks


KIND = kinds.StoreKind(
    NAME, "a token classifier's label distribution per word-piece (hsk-tokcls: `hsk dump --objective tokcls`)",
    array_specs, describe, frozenset({*ROW_ARRAYS, GROUP}), "hsk_tokcls.reader:TokClsStore", trains=(NAME,),
    record_groups=frozenset({GROUP}), selection_type=TokClsSelection, category="token-classification")
