"""Sequence-to-sequence distillation from a seq2seq store (`hsk train --method s2s-kd`; docs/guide/lm-stores.md).

One stage: (1 - lam) CE + lam KD on a target sequence (lam 0.5 by default where the store's supports sit on
that sequence, else 0), per target token (LightPAFF's MASS objective; Kim & Rush's
word-level KD). `--set on=` picks the sequence the student learns: `reference` (the pair's target) or `teacher`
(the teacher's own output: sequence-level KD). The KD term reads the store's support, which sits on one of the
two (`selection.supports_on`), so KD needs `on` to be that one:

| store dumped with                       | `on`      | lam   | what it is                       |
|-----------------------------------------|-----------|-------|----------------------------------|
| any                                     | reference | 0     | the reference alone (no KD)      |
| `--support topk:K`                      | reference | > 0   | word-level KD                    |
| `--decode greedy`                       | teacher   | 0     | sequence-level KD                |
| `--decode greedy --support topk:K`      | teacher   | > 0   | both                             |

The loss terms are the causal-LM ones (clm_ce, clm_topk_kl, clm_sampled_ce): the run aligns the student's
logits with the target's positions (pipelines.core.pair_models), so each term sees [B, T, V] and its masks.
"""

from __future__ import annotations

from dataclasses import dataclass

from hskstore.format.config import check_between
from pipelines.methods.clm_kd import KD_TERMS
from pipelines.registry import Context, Method, MethodError, Stage, Term, register

PAPER = ("Song et al., 'LightPAFF' (2020), MASS distillation; Kim & Rush, 'Sequence-Level Knowledge Distillation' "
         "(EMNLP 2016)")
ON = ("reference", "teacher")


@dataclass
class S2SKDOptions:
    epochs: float = 1.0
    lr: float = 2e-4
    lam: float | None = None  # None: 0.5 where the store has supports on the learned target, else 0
    on: str = "auto"  # reference | teacher | auto: the sequence the store's support sits on (else its output)
    temperature: float = 1.0
    tail: bool = True
    warmup_ratio: float = 0.05

    def __post_init__(self) -> None:
        if self.lam is not None:
            check_between("--set lam", self.lam, 0.0, 1.0, error=MethodError)
        check_between("--set warmup_ratio", self.warmup_ratio, 0.0, 1.0, ends="[)", error=MethodError)
        if self.epochs < 0 or self.lr <= 0 or self.temperature <= 0:
            raise MethodError(f"epochs >= 0, lr > 0 and temperature > 0, got {self.epochs}, {self.lr}, "
                              f"{self.temperature}")
        if self.on not in (*ON, "auto"):
            raise MethodError(f"--set on={self.on}: pass reference (the pair's target) or teacher (its own output)")


def sequence_of(o: S2SKDOptions, selection: dict) -> str:
    """The target sequence the student learns: `on`, or with auto the support's, else the teacher's output if
    stored, else the reference."""
    if o.on != "auto":
        return o.on
    return selection.get("supports_on") or ("teacher" if selection.get("decoding") else "reference")


def lam_of(o: S2SKDOptions, selection: dict) -> float:
    """The KD weight: as given, or 0.5 where the store's supports sit on the learned target, else 0."""
    if o.lam is not None:
        return o.lam
    return 0.5 if selection.get("support") and selection.get("supports_on") == sequence_of(o, selection) else 0.0


def _build(o: S2SKDOptions, ctx: Context) -> list[Stage]:
    terms, lam = [], lam_of(o, ctx.meta.selection)
    if lam < 1.0:
        terms.append(Term("ce", "clm_ce", 1.0 - lam))
    if lam > 0.0:
        support = ctx.meta.selection["support"]
        options = (("tail", o.tail), ("temperature", o.temperature)) if support == "topk" else ()
        terms.append(Term("kd", KD_TERMS[support], lam, options))
    return [Stage(name="s2s", epochs=o.epochs, lr=o.lr, terms=tuple(terms), schedule="warmup-linear",
                  warmup_ratio=o.warmup_ratio, reads=("seq2seq",), head="s2s")]


def _check(o: S2SKDOptions, ctx: Context) -> str | None:
    sel = ctx.meta.selection
    if sequence_of(o, sel) == "teacher" and not sel.get("decoding"):
        return "--set on=teacher needs the teacher's output: dump with --decode greedy or beam:N"
    if o.temperature != 1.0 and (sel.get("support") != "topk" or o.tail):
        return "a temperature other than 1 needs a top-K store and --set tail=false"
    return _kd_problem(o, sel)


def _kd_problem(o: S2SKDOptions, sel: dict) -> str | None:
    """What keeps the KD term from reading the store's supports (None: nothing, or no KD term)."""
    on, lam = sequence_of(o, sel), lam_of(o, sel)
    if lam > 0 and sel.get("support") is None:
        return "KD (lam > 0) needs word-level supports: dump with --support, or train with --set lam=0"
    if lam > 0 and sel.get("supports_on") != on:
        return (f"the store's supports sit on the {sel.get('supports_on')} target, not the {on} one: --set "
                f"on={sel.get('supports_on')}, or --set lam=0 to learn the {on} target alone")
    return None


S2S_KD = register(
    Method(
        name="s2s-kd",
        summary="seq2seq distillation: (1 - l) CE + l KD per target token, on the reference or the teacher's own "
        "output (word-level, sequence-level or both)",
        store_needs="a seq2seq store: `hsk dump --objective seq2seq` (--support and/or --decode)",
        paper=PAPER,
        options=S2SKDOptions,
        build=_build,
        check=_check,
        kinds=("seq2seq",),
    )
)
