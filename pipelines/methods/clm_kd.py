"""Causal-LM distillation from a causal-LM store (`hsk train --method clm-kd`; docs/guide/lm-stores.md).

One stage: (1 - lam) CE(next token) + lam KD, LightPAFF's GPT-2 objective (l = 0.4 was its best for GPT-2
pre-training; 0.5 here, the middle). KD is what the store's support allows:

- top-K (`hsk dump --support topk:K`): KL over the K ids plus the tail bucket (`tail`, the default), or over
  the K ids renormalized (`--set tail=false`, sparse KD as other tools do it);
- sampled (`--support sample:N`): RS-KD's unbiased estimate, -sum count/N log q;
- the final hidden state (`--support hidden:CODEC`): the full-vocabulary KL against the stored head applied to
  the decoded hidden states, on the device (pipelines/train/kinds/clm.py, hidden_batch);
- `--set target=live`: the store's teacher runs beside the student and gives the full-vocabulary KL on the
  same blocks in the same order (the online reference arm: what the store's support is measured against).

On a store dumped with `--hidden-layers`, `--set layer_weight=W` adds W x a hidden-state loss (`layer_loss`: mse,
the mean squared error per element, or cosine, 1 - cosine similarity per position), summed over layer pairs, at
the stored positions: student layer s against stored teacher layer j (`--set layer_map=s:j,...`; by default
each stored j against student layer round(j * S / L)), through a learned Linear(d_S -> d_T) where the widths
differ (pipelines/train/kinds/clm_layers.py).

Its train-side pieces: the loss terms clm_ce / clm_topk_kl / clm_sampled_ce / clm_hidden_kl / clm_full_kl
(pipelines/train/losses/terms.py, maths in lm.py) and the run in pipelines/train/kinds/clm.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from hskstore.format.config import check_between
from pipelines.registry import Context, Method, MethodError, Stage, Term, register

PAPER = ("Song et al., 'LightPAFF' (2020), GPT-2 distillation; Anshumann et al., 'Sparse Logit Sampling' "
         "(RS-KD, ACL 2025) for sampled supports")
TARGETS = ("store", "live")
# the KD term of each support kind (hskstore.format.clm.SUPPORTS)
KD_TERMS = {"topk": "clm_topk_kl", "sample": "clm_sampled_ce", "hidden": "clm_hidden_kl"}
LAYER_LOSSES = {"mse": "clm_layer_mse", "cosine": "clm_layer_cos"}  # --set layer_loss -> the intermediate-layer term


@dataclass
class ClmKDOptions:
    epochs: float = 1.0
    lr: float = 2e-4
    lam: float = 0.5
    temperature: float = 1.0
    tail: bool = True
    target: str = "store"
    warmup_ratio: float = 0.05
    layer_weight: float = 0.0  # the intermediate-layer term's weight (0: none); needs a store with --hidden-layers
    layer_loss: str = "mse"
    layer_map: str = ""  # STUDENT:TEACHER,... ("": stored teacher layer j <- student layer round(j * S / L))

    def __post_init__(self) -> None:
        check_between("--set lam", self.lam, 0.0, 1.0, error=MethodError)
        check_between("--set warmup_ratio", self.warmup_ratio, 0.0, 1.0, ends="[)", error=MethodError)
        if self.epochs < 0 or self.lr <= 0 or self.temperature <= 0:
            raise MethodError(f"epochs >= 0, lr > 0 and temperature > 0, got {self.epochs}, {self.lr}, "
                              f"{self.temperature}")
        if self.target not in TARGETS:
            raise MethodError(f"--set target={self.target}: pass store (the stored support) or live (the teacher)")
        if self.layer_weight < 0 or self.layer_loss not in LAYER_LOSSES:
            raise MethodError(f"--set layer_weight={self.layer_weight} layer_loss={self.layer_loss}: pass a weight "
                              f">= 0 and a loss of {', '.join(LAYER_LOSSES)}")


def _kd_term(o: ClmKDOptions, ctx: Context) -> Term:
    support = ctx.meta.selection["support"]
    # the full distribution: the live teacher's, or the stored head's (another term name: the run loads a live
    # teacher for clm_full_kl alone)
    if o.target == "live":
        return Term("kd", "clm_full_kl", o.lam, (("temperature", o.temperature),))
    if support == "hidden":
        return Term("kd", KD_TERMS[support], o.lam, (("temperature", o.temperature),))
    if support == "topk":
        return Term("kd", KD_TERMS[support], o.lam, (("tail", o.tail), ("temperature", o.temperature)))
    return Term("kd", KD_TERMS[support], o.lam)


def _build(o: ClmKDOptions, ctx: Context) -> list[Stage]:
    terms = []
    if o.lam < 1.0:
        terms.append(Term("ce", "clm_ce", 1.0 - o.lam))
    if o.lam > 0.0:
        terms.append(_kd_term(o, ctx))
    layers = o.layer_weight > 0.0
    if layers:
        terms.append(Term("layers", LAYER_LOSSES[o.layer_loss], o.layer_weight))
    return [Stage(name="clm", epochs=o.epochs, lr=o.lr, terms=tuple(terms), schedule="warmup-linear",
                  warmup_ratio=o.warmup_ratio, reads=("clm",), head="clm",
                  outputs=("logits", "hidden_states") if layers else ("logits",),
                  trains=("student", "projection") if layers else ("student",))]


def _check(o: ClmKDOptions, ctx: Context) -> str | None:
    if ctx.meta.objective != "clm":
        return "needs a causal-LM store (`hsk dump --objective clm`)"
    support = ctx.meta.selection["support"]
    if o.layer_weight > 0 and not ctx.meta.selection.get("layer_states"):
        return ("--set layer_weight needs a store with intermediate layers: dump one with `hsk dump --objective clm "
                "--hidden-layers 4,8`")
    if o.layer_weight > 0 and o.target == "live":
        return "--set layer_weight reads the stored layers: use it with target=store"
    if o.temperature != 1.0 and o.target == "store" and support != "hidden" and (support != "topk" or o.tail):
        return ("a temperature other than 1 needs the ids' probabilities alone: --set tail=false on a top-K store, "
                "or --set target=live (a tail bucket or sampled counts have no tempered form)")
    return None


CLM_KD = register(
    Method(
        name="clm-kd",
        summary="causal-LM distillation: (1 - l) CE + l KD over the stored support (top-K + tail, or RS-KD samples), "
        "or the live teacher's full distribution (--set target=live)",
        store_needs="a causal-LM store: `hsk dump --objective clm` (top-K or sampled next-token distributions)",
        paper=PAPER,
        options=ClmKDOptions,
        build=_build,
        check=_check,
        kinds=("clm",),
    )
)
