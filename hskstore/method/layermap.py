"""Depth: which teacher layers serve which student entries (docs/METHOD.md sections 1 and 2).

Student entries are [emb, 1..S]; teacher hidden states are H_0 (embeddings) .. H_L.
"""

from __future__ import annotations

from ..format.config import ConfigError


def layer_map(n_student: int, l_top: int) -> list[int]:
    """g(s, L_top) = round(s * L_top / S) for s = 0..S, Python's round (half to even), as the reference."""
    return map_entries(range(n_student + 1), n_student, l_top)


def map_entries(entries, n_student: int, l_top: int) -> list[int]:
    """g(s, L_top) of the given entries s only (a deep reference student is not walked entry by entry)."""
    if n_student < 1 or l_top < 1:
        raise ConfigError(f"layer map needs S >= 1 and L_top >= 1, got S={n_student}, L_top={l_top}")
    return [round(s * l_top / n_student) for s in entries]


def default_l_top(teacher_layers: int) -> int:
    """The paper found L_top=10 of 12 most stable; scale that to the teacher's depth."""
    return max(1, round(10 * teacher_layers / 12))


def kept_entries(n_keep: int, n_student: int, teacher_layers: int | None = None) -> list[int]:
    """'Keep N^D layers' keeps the last N^D student entries; the embedding only when N^D = S + 1."""
    if teacher_layers is not None and n_keep > teacher_layers + 1:  # no deeper student can help (dump refuses it)
        raise ConfigError(
            f"N^D={n_keep} layers asked for, but a {teacher_layers}-layer teacher has only {teacher_layers + 1} "
            f"hidden states (embeddings + {teacher_layers} layers): keep at most N^D={teacher_layers + 1} (with "
            f"--student-layers {teacher_layers}, or --layers listing them)"
        )
    if n_keep > n_student + 1:
        raise ConfigError(
            f"N^D={n_keep} layers asked for, but a {n_student}-layer reference student has only "
            f"{n_student + 1} entries (embeddings + {n_student} layers): pass --student-layers {n_keep - 1} (or more), "
            f"or --layers with {n_keep} teacher layers, or keep at most N^D={n_student + 1}"
        )
    return list(range(n_student + 1 - n_keep, n_student + 1))


def ranking_layer_map(n_student: int, teacher_layers: int) -> list[int]:
    """Attention layer ranking the tokens of each student entry (the reference's att_ttop12 map).

    The L_top = L map, with entry 0 (embeddings) ranked by the first attention layer.
    S=4, L=12 gives 1, 3, 6, 9, 12.
    """
    return [max(1, g) for g in layer_map(n_student, teacher_layers)]


def select_depth(
    n_keep: int,
    teacher_num_layers: int,
    *,
    ref_student_layers: int | None = 4,
    l_top: int | None = None,
    explicit_layers: list[int] | None = None,
    ranking_map: str = "ltop12",
) -> tuple[list[int], list[int] | None, list[int]]:
    """Return (teacher layers kept, reference student entries or None, ranking attention layers)."""
    if n_keep == 0:
        return [], ([] if explicit_layers is None else None), []
    if explicit_layers is not None:
        layers = _explicit_layers(n_keep, teacher_num_layers, explicit_layers)
        # Without a student map the only sensible ranking is the layer's own attention.
        return layers, None, [max(1, j) for j in layers]
    if ref_student_layers is None:
        raise ConfigError("give a reference student depth or an explicit list of teacher layers")
    l_top = default_l_top(teacher_num_layers) if l_top is None else l_top
    if not 1 <= l_top <= teacher_num_layers:
        raise ConfigError(f"L_top={l_top} must be between 1 and the teacher's {teacher_num_layers} layers")
    entries = kept_entries(n_keep, ref_student_layers, teacher_num_layers)
    layers = map_entries(entries, ref_student_layers, l_top)
    return layers, entries, _ranking(entries, layers, ref_student_layers, teacher_num_layers, ranking_map)


def _ranking(entries: list[int], layers: list[int], ref_student_layers: int, teacher_num_layers: int,
             ranking_map: str) -> list[int]:
    """The attention layers that rank the kept tokens: ranking_layer_map's for the kept entries ("ltop12"), or
    the kept layers' own."""
    if ranking_map == "ltop12":
        return [max(1, g) for g in map_entries(entries, ref_student_layers, teacher_num_layers)]
    return [max(1, j) for j in layers]


def _explicit_layers(n_keep: int, teacher_num_layers: int, explicit_layers: list[int]) -> list[int]:
    """--layers sorted and deduplicated, refused unless it names N^D layers of the teacher."""
    layers = sorted(set(explicit_layers))
    if len(layers) != n_keep:
        raise ConfigError(
            f"--layers lists {len(layers)} distinct layers but the config keeps N^D={n_keep}"
        )
    bad = [j for j in layers if not 0 <= j <= teacher_num_layers]
    if bad:
        raise ConfigError(
            f"--layers {bad} outside 0..{teacher_num_layers} for a {teacher_num_layers}-layer teacher"
        )
    return layers


def check_chosen_depth(n_keep: int, teacher_num_layers: int, chosen: int, l_top: int | None,
                       kept: list[int]) -> None:
    """Refuse a reference student depth the user chose deeper than the teacher: its map keeps teacher layers
    more than once, and the store would hold copies, not the layers it names. The advice is the deepest depth
    up to the teacher's that keeps N^D distinct layers (else the teacher's depth)."""
    if chosen <= teacher_num_layers:
        return
    l_top = default_l_top(teacher_num_layers) if l_top is None else l_top
    fits = [s for s in range(max(1, n_keep - 1), teacher_num_layers + 1)
            if len(set(layer_map(s, l_top)[s + 1 - n_keep:])) == n_keep]
    raise ConfigError(
        f"--student-layers {chosen} is deeper than the teacher's {teacher_num_layers} layers"
        f"{f' (its map keeps teacher layers {kept}: copies)' if len(set(kept)) < len(kept) else ''}: pass "
        f"--student-layers {fits[-1] if fits else teacher_num_layers}"
    )


def student_to_store_layers(
    n_student: int, stored_entries: list[int], ref_student_layers: int, teacher_layers: int | None = None
) -> dict[int, int]:
    """Which student entry meets which stored entry when the student's depth differs from the reference.

    The student's top layers map onto the stored ones: reference entry s (of S_ref) is served to
    student entry round(s * S / S_ref), so the top entry always meets the top stored layer.
    Returns {stored reference entry: student entry}.
    """
    out = {}
    for s in stored_entries:
        out[s] = round(s * n_student / ref_student_layers)
    if len(set(out.values())) != len(out):
        # The advice must work: the most stored layers (a suffix, as derive keeps) that map one to one.
        fits = max(
            k for k in range(len(stored_entries) + 1)
            if len({round(s * n_student / ref_student_layers) for s in stored_entries[len(stored_entries) - k:]}) == k
        )
        # a dump for this student's depth is advised only where the dump takes it (not deeper than the teacher)
        redump = (f", or dump for this student with --student-layers {n_student}"
                  if teacher_layers is None or n_student <= teacher_layers else "")
        raise ConfigError(
            f"a {n_student}-layer student cannot take the {len(stored_entries)} stored layers "
            f"{stored_entries} (of a {ref_student_layers}-layer reference) one to one: derive at most {fits} "
            f"layer{'s' if fits != 1 else ''} (hsk derive STORE --config {fits},NL,W){redump}"
        )
    return out
