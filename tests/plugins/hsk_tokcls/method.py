"""The method `tokcls-kd`: per-token KD from a token-classification store (torch-free, as hsk's methods are).

One stage: KL(teacher || student) per real word-piece, over the stored labels plus the mass of the others (a
top-k store) or over every label (a full store), averaged over the tokens (TinyBERT's and TextBrewer's
prediction-layer loss for NER, per token). The names it adds to hsk's vocabularies are declared here, on the
import that registers the method; the loss is implemented in hsk_tokcls.compute.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.registry import (
    Context,
    Method,
    MethodError,
    Stage,
    Term,
    declare_head,
    declare_loss_term,
    declare_store_read,
)

from .store_kind import NAME

LOSS = declare_loss_term("tokcls_kl", "per word-piece KL to a token-classification store's label distribution, the "
                         "labels outside its top-k as one bucket (tokcls-kd, hsk-tokcls)")
HEAD = declare_head(NAME, "a token classifier's label logits at every word-piece (tokcls-kd, hsk-tokcls)")
READ = declare_store_read(NAME, "a token-classification store's word-pieces and per-token label log-probs "
                          "(`hsk dump --objective tokcls`, hsk-tokcls)")


@dataclass
class TokClsKDOptions:
    epochs: float = 1.0
    lr: float = 1e-3
    warmup_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.epochs < 0 or self.lr <= 0 or not 0 <= self.warmup_ratio < 1:
            raise MethodError(f"epochs >= 0, lr > 0, 0 <= warmup_ratio < 1, got {self.epochs}, {self.lr}, "
                              f"{self.warmup_ratio}")


def _build(o: TokClsKDOptions, ctx: Context) -> list[Stage]:
    return [Stage(name=NAME, epochs=o.epochs, lr=o.lr, terms=(Term("kd", LOSS),), schedule="warmup-linear",
                  warmup_ratio=o.warmup_ratio, reads=(READ,), head=HEAD)]


TOKCLS_KD = Method(
    name="tokcls-kd", summary="token-classification KD: per word-piece KL to the stored label distribution",
    store_needs="a token-classification store: `hsk dump --objective tokcls` (hsk-tokcls)",
    paper="Jiao et al., 'TinyBERT' (2020); Yang et al., 'TextBrewer' (2020): NER distillation",
    options=TokClsKDOptions, build=_build, kinds=(NAME,))
