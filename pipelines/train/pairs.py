"""Layer pairs: which student layer learns from which stored teacher layer, computed in ONE place.

`layer_pairs(rule, selection, n_student, ...)` returns explicit `LayerPair`s (TextBrewer's
intermediate matches: teacher layer, student layer, feature, loss, weight, projection) from the
store's layer map, the student's depth and the method's rule. A run logs them and writes them to
summary.json. Layer 0 is the embedding output on both sides; layer k the k-th block's output.

Rules:
- "store" (mud): the store's reference student entries, as they are when the student has the
  reference depth, else the student's top layers meet the stored ones (hskstore.layermap); a store
  written from an explicit layer list maps teacher layer j to round(j * S / L).
- "pkd-skip", "pkd-last" (Patient KD): student layers 1..S-1 against the teacher's I_pt
  (`pkd_teacher_layers`); the store must hold the [CLS] vectors of those layers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from hskstore.config import ConfigError, Selection
from hskstore.layermap import student_to_store_layers

RULES = ("store", "pkd-skip", "pkd-last")
PKD_RULES = ("pkd-skip", "pkd-last")


@dataclass(frozen=True)
class LayerPair:
    teacher_layer: int  # j: 0 = embeddings, k = the k-th block of the teacher
    student_layer: int  # s: index into the student's hidden states (0 = embeddings)
    feature: str  # "tokens" (HSK vectors at the stored positions) | "cls" (the [CLS] vector)
    loss: str  # the loss term that consumes this pair (pipelines.train.losses.LOSS_TERMS)
    weight: float  # weight of the pair inside that term (1: the terms sum or average pairs evenly)
    projection: str | None  # "W" (the shared Linear d_S -> d_T) or None when the widths agree
    kept: int  # index i of the stored layer (the store's layers/<i> arrays)

    def describe(self) -> dict:
        return asdict(self)


def pkd_teacher_layers(rule: str, n_teacher: int, n_student: int) -> list[int]:
    """Patient KD's I_pt for student layers 1..S-1, for any depths L >= S >= 2.

    Skip: every (L/S)-th layer, floor(k * L / S) for k = 1..S-1 (12->6: 2,4,6,8,10; 12->3: 4,8;
    6->3: 2,4; 6->2: 3). Last: the S-1 layers just below the top, L-S+1..L-1 (12->6: 7..11;
    12->3: 10,11; 6->3: 4,5; 6->2: 5). The top layer L itself is learnt through the logits.
    """
    if n_student < 2 or n_student > n_teacher:
        raise ConfigError(
            f"Patient KD pairs student layers 1..S-1 with teacher layers: it needs 2 <= S <= L "
            f"(student {n_student} layers, teacher {n_teacher})"
        )
    if rule == "pkd-skip":
        return [k * n_teacher // n_student for k in range(1, n_student)]
    if rule == "pkd-last":
        return list(range(n_teacher - n_student + 1, n_teacher))
    raise ConfigError(f"unknown Patient KD rule {rule!r}")


def pkd_dump_advice(rule: str, n_teacher: int, n_student: int | None) -> str:
    """The `hsk dump` that makes a [CLS] store for Patient KD's I_pt, computed for this teacher and
    student (for an example student of half the teacher's depth when the student is not known)."""
    depth = n_student if n_student is not None else max(2, n_teacher // 2)
    try:
        layers = ",".join(map(str, pkd_teacher_layers(rule, n_teacher, depth)))
    except ConfigError as exc:
        return str(exc)
    which = f"a {depth}-layer student" if n_student is not None else f"e.g. a {depth}-layer student"
    return (f"`hsk dump --tokens cls --layers {layers} --config {len(layers.split(','))},1,1` ({rule}'s teacher "
            f"layers for this {n_teacher}-layer teacher and {which})")


def _store_entries(sel: Selection, n_student: int) -> tuple[list[int], str]:
    if sel.student_entries is not None:
        ref = sel.ref_student_layers
        if n_student == ref:
            return list(sel.student_entries), f"the store's reference student has the student's depth ({ref})"
        m = student_to_store_layers(n_student, list(sel.student_entries), ref)
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


def _store_pairs(sel: Selection, n_student: int, loss: str, projection: str | None) -> tuple[list[LayerPair], str]:
    entries, how = _store_entries(sel, n_student)
    feature = "cls" if loss == "pkd_cls" else "tokens"
    pairs = []
    for i, (s, j) in enumerate(zip(entries, sel.teacher_layers, strict=True)):
        if not 0 <= s <= n_student:
            raise ConfigError(f"stored layer {j} maps to student entry {s}, outside 0..{n_student}")
        pairs.append(LayerPair(j, s, feature, loss, 1.0, projection, i))
    return pairs, how


def _pkd_pairs(rule: str, sel: Selection, n_student: int, loss: str, projection: str | None):
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
        if rule in ("pkd-skip", "pkd-last"):
            _pkd_pairs(rule, sel, n_student, loss, None)  # raises with the dump to make
        return []
    proj = "W" if projection else None
    if rule == "store":
        pairs, how = _store_pairs(sel, n_student, loss, proj)
    elif rule in ("pkd-skip", "pkd-last"):
        pairs, how = _pkd_pairs(rule, sel, n_student, loss, proj)
    else:
        raise ConfigError(f"unknown layer pairing rule {rule!r}; known: {', '.join(RULES)}")
    log(f"layer pairs ({how}):")
    for p in pairs:
        log(
            f"  student {'embeddings' if p.student_layer == 0 else f'layer {p.student_layer}'} <- stored teacher "
            f"{'embeddings' if p.teacher_layer == 0 else f'layer {p.teacher_layer}'} ({p.feature}, {p.loss}"
            f"{', via W' if p.projection else ''})"
        )
    return pairs
