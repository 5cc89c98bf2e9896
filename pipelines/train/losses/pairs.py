"""Layer pairs: which student layer learns from which stored teacher layer, computed in ONE place.

`layer_pairs(rule, selection, n_student, ...)` returns explicit `LayerPair`s (TextBrewer's
intermediate matches: teacher layer, student layer, feature, loss, weight, projection) from the
store's layer map, the student's depth and the method's rule. A run logs them and writes them to
summary.json. Layer 0 is the embedding output on both sides; layer k the k-th block's output.

Rules:
- "store" (mud): the store's reference student entries, as they are when the student has the
  reference depth, else the student's top layers meet the stored ones (hskstore.method.layermap); a store
  written from an explicit layer list maps teacher layer j to round(j * S / L).
- "pkd-skip", "pkd-last" (Patient KD, pipelines/methods/pkd.py): student layers 1..S-1 against the
  teacher's I_pt (`pkd_teacher_layers`); the store must hold the [CLS] vectors of those layers.

The rule names are declared in pipelines.registry.PAIR_RULES; `RULES` implements each of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from hskstore.format.config import ConfigError, Selection
from hskstore.method.layermap import student_to_store_layers
from pipelines.methods.pkd import PKD_RULES, pkd_teacher_layers


@dataclass(frozen=True)
class LayerPair:
    teacher_layer: int  # j: 0 = embeddings, k = the k-th block of the teacher
    student_layer: int  # s: index into the student's hidden states (0 = embeddings)
    feature: str  # "tokens" (HSK vectors at the stored positions) | "cls" (the [CLS] vector)
    loss: str  # the loss term that consumes this pair (pipelines.train.losses.terms.LOSS_TERMS)
    weight: float  # weight of the pair inside that term (1: the terms sum or average pairs evenly)
    projection: str | None  # "W" (the shared Linear d_S -> d_T) or None when the widths agree
    kept: int  # index i of the stored layer (the store's layers/<i> arrays)

    def describe(self) -> dict:
        return asdict(self)


def _store_entries(sel: Selection, n_student: int) -> tuple[list[int], str]:
    if sel.student_entries is not None:
        ref = sel.ref_student_layers
        if n_student == ref:
            return list(sel.student_entries), f"the store's reference student has the student's depth ({ref})"
        m = student_to_store_layers(n_student, list(sel.student_entries), ref, sel.teacher_num_layers)
        return [m[e] for e in sel.student_entries], (
            f"{n_student}-layer student mapped onto a {ref}-layer reference (top layers meet)"
        )
    entries = [round(j * n_student / sel.teacher_num_layers) for j in sel.teacher_layers]
    if len(set(entries)) != len(entries):
        # derive keeps the last ND layers: the longest suffix whose entries are distinct fits
        fits = max(m for m in range(1, len(entries) + 1) if len(set(entries[-m:])) == m)
        raise ConfigError(
            f"a {n_student}-layer student cannot take the stored teacher layers {list(sel.teacher_layers)} one "
            f"to one: derive the last {fits} (`hsk derive --config {fits},NL,W`)"
        )
    return entries, f"explicit teacher layers mapped by round(j * {n_student} / {sel.teacher_num_layers})"


def _store_pairs(rule: str, sel: Selection, n_student: int, loss: str,
                 projection: str | None) -> tuple[list[LayerPair], str]:
    entries, how = _store_entries(sel, n_student)
    feature = "cls" if loss == "pkd_cls" else "tokens"
    pairs = []
    for i, (s, j) in enumerate(zip(entries, sel.teacher_layers, strict=True)):
        if not 0 <= s <= n_student:
            raise ConfigError(f"stored layer {j} maps to student entry {s}, outside 0..{n_student}")
        pairs.append(LayerPair(j, s, feature, loss, 1.0, projection, i))
    return pairs, how


def _pkd_pairs(rule: str, sel: Selection, n_student: int, loss: str,
               projection: str | None) -> tuple[list[LayerPair], str]:
    wanted = pkd_teacher_layers(rule, sel.teacher_num_layers, n_student)
    stored = list(sel.teacher_layers)
    missing = [j for j in wanted if j not in stored]
    if missing or sel.token_strategy != "cls":
        layers = ",".join(map(str, wanted))
        raise ConfigError(
            f"{rule} with a {n_student}-layer student of a {sel.teacher_num_layers}-layer teacher needs the [CLS] "
            f"vectors of teacher layers {layers}; the store holds {sel.token_strategy} tokens of layers "
            f"{','.join(map(str, stored)) or 'none'}: dump one with `hsk dump --tokens cls --layers {layers} "
            f"--config {len(wanted)},1,1`"
        )
    pairs = [LayerPair(j, s, "cls", loss, 1.0, projection, stored.index(j)) for s, j in enumerate(wanted, 1)]
    return pairs, f"Patient KD {rule.split('-')[1]}: student layers 1..{n_student - 1} <- teacher I_pt"


# pipelines.registry.PAIR_RULES -> fn(rule, selection, student depth, loss, projection) -> (pairs, how)
RULES: dict[str, Callable[[str, Selection, int, str, str | None], tuple[list[LayerPair], str]]] = {
    "store": _store_pairs,
    "pkd-skip": _pkd_pairs,
    "pkd-last": _pkd_pairs,
}


def layer_pairs(
    rule: str | None,
    sel: Selection,
    n_student: int,
    *,
    loss: str,
    projection: bool,
    log: Callable[[str], object] = lambda _: None,
) -> list[LayerPair]:
    """The stage's layer pairs (empty for rule None or a logits-only store), each logged."""
    if rule is None or sel.config.logits_only:
        if rule in PKD_RULES:
            _pkd_pairs(rule, sel, n_student, loss, None)  # raises with the dump to make
        return []
    if rule not in RULES:
        raise ConfigError(f"unknown layer pairing rule {rule!r}; known: {', '.join(RULES)}")
    pairs, how = RULES[rule](rule, sel, n_student, loss, "W" if projection else None)
    log(f"layer pairs ({how}):")
    for p in pairs:
        log(
            f"  student {'embeddings' if p.student_layer == 0 else f'layer {p.student_layer}'} <- stored teacher "
            f"{'embeddings' if p.teacher_layer == 0 else f'layer {p.teacher_layer}'} ({p.feature}, {p.loss}"
            f"{', via W' if p.projection else ''})"
        )
    return pairs
