"""Distillation into a student with another tokenizer, from a causal-LM store (`hsk train --method uld | alm`;
docs/guide/lm-stores.md, "A student with another tokenizer").

Both read the store's block text, teacher token offsets and actual-token log-probs (`clm-text`): the
student re-tokenizes each block, and the two tokenizations are aligned at the byte offsets where a token of
each ends (pipelines/train/data/xtok.py). Both keep the student's own CE on its tokens, (1 - lam) CE + lam KD.

- `uld` (Boizard et al. 2024, Universal Logit Distillation): at each shared boundary, the L1 between the
  teacher's stored probabilities sorted (top-K with its tail, or a sample's counts / draws) and the student's
  top probabilities sorted; needs no id in common.
- `alm`: ALM-style chunk likelihoods (Minixhofer et al. 2025): for the text between consecutive shared
  boundaries, the teacher's log-likelihood (the stored actual-token log-probs summed over its tokens) against
  the student's (its own, summed likewise), through ALM's binarised distance KL(Bern(p_T) || Bern(p_S)); plus,
  weighted by `mined` (0 turns it off), MinED's mapping (FuseLLM): the stored support's ids mapped onto the
  student's whose strings match exactly (space markers read as spaces), KL on the mapped part. One method:
  `--set mined=0` is ALM alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from hskstore.format.config import check_between
from pipelines.registry import Context, Method, MethodError, Stage, Term, register

READS = "clm-text"


@dataclass
class XtokOptions:
    epochs: float = 1.0
    lr: float = 2e-4
    lam: float = 0.5
    warmup_ratio: float = 0.05
    max_student_tokens: int = 0  # the most student tokens per block (0: twice the store's block size)

    def __post_init__(self) -> None:
        check_between("--set lam", self.lam, 0.0, 1.0, error=MethodError)
        check_between("--set warmup_ratio", self.warmup_ratio, 0.0, 1.0, ends="[)", error=MethodError)
        if self.epochs < 0 or self.lr <= 0 or self.max_student_tokens < 0:
            raise MethodError(f"epochs >= 0, lr > 0 and max_student_tokens >= 0, got {self.epochs}, {self.lr}, "
                              f"{self.max_student_tokens}")


@dataclass
class AlmOptions(XtokOptions):
    mined: float = 1.0  # the MinED KL's weight beside the chunk loss (0: ALM alone)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mined < 0:
            raise MethodError(f"--set mined={self.mined}: pass a weight >= 0 (0 turns the MinED KL off)")


def _stage(o: XtokOptions, kd: list[Term]) -> list[Stage]:
    terms = ([Term("ce", "clm_ce", 1.0 - o.lam)] if o.lam < 1.0 else []) + (kd if o.lam > 0.0 else [])
    return [Stage(name="clm", epochs=o.epochs, lr=o.lr, terms=tuple(terms), schedule="warmup-linear",
                  warmup_ratio=o.warmup_ratio, reads=(READS,), head="clm")]


def _build_uld(o: XtokOptions, ctx: Context) -> list[Stage]:
    tail = ctx.meta.selection["support"] == "topk"  # a sampled support's counts sum to 1: no tail
    return _stage(o, [Term("kd", "uld", o.lam, (("tail", tail),))])


def _build_alm(o: AlmOptions, ctx: Context) -> list[Stage]:
    kd = [Term("alm", "alm_chunks", o.lam)]
    if o.mined > 0:
        kd.append(Term("mined", "mined_kl", o.lam * o.mined))
    return _stage(o, kd)


NEEDS = ("a causal-LM store with its block text (`hsk dump --objective clm`; stores written before the text "
         "arrays need a re-dump)")
ULD = register(Method(
    name="uld",
    summary="another tokenizer: (1 - l) CE + l ULD, the L1 of sorted teacher and student probabilities at shared "
    "byte boundaries",
    store_needs=NEEDS,
    paper="Boizard et al., 'Towards Cross-Tokenizer Distillation: the Universal Logit Distillation Loss' (2024)",
    options=XtokOptions, build=_build_uld, kinds=("clm",)))
ALM = register(Method(
    name="alm",
    summary="another tokenizer: (1 - l) CE + l (binary KL of chunk likelihoods between shared byte boundaries + "
    "mined x KL on the support mapped by exact strings)",
    store_needs=NEEDS,
    paper="Minixhofer et al., 'Universal Cross-Tokenizer Distillation via Approximate Likelihood Matching' (2025); "
    "Wan et al., 'Knowledge Fusion of Large Language Models' (FuseLLM, MinED, 2024)",
    options=AlmOptions, build=_build_alm, kinds=("clm",)))
