"""The intermediate-layer loss of causal-LM runs (`hsk train --method clm-kd --set layer_weight=W` on a store
dumped with `--hidden-layers`): which student layer learns which stored teacher layer, the stored states made
ready on the device, and the projection where the widths differ.

The stored vectors (hskstore.format.clm_layers) go to the device as their codec's bytes, are decoded there by the
codec's torch twin and rotated back (h = h' R): the student's hidden states are compared with the teacher's own,
so a first<k> student (the teacher's width) needs no projection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from hskstore.format.clm_layers import LAYERS, LAYERS_SCALE, LayerStates
from hskstore.format.config import ConfigError
from pipelines.core import codecs_torch
from pipelines.dump.clm_hidden import rotation_matrix
from pipelines.train.losses.pairs import LayerPair

LAYER_TERMS = ("clm_layer_mse", "clm_layer_cos")  # the terms that read the pairs (pipelines/methods/clm_kd.py)


def parse_layer_map(text: str) -> dict[int, int]:
    """`--set layer_map=1:8,2:16` -> {teacher layer: student layer} (a one-line ConfigError otherwise)."""
    pairs: dict[int, int] = {}
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        student, sep, teacher = part.partition(":")
        if not sep or not (student.strip().isdigit() and teacher.strip().isdigit()):
            raise ConfigError(f"--set layer_map={text}: pass STUDENT:TEACHER layer pairs separated by commas, e.g. "
                              "1:8,2:16")
        if int(teacher) in pairs:
            raise ConfigError(f"--set layer_map={text}: teacher layer {teacher} is named twice")
        pairs[int(teacher)] = int(student)
    return pairs


def clm_layer_pairs(states: LayerStates, n_student: int, layer_map: str, loss: str, projection: bool,
                    log: Callable[[str], Any] = lambda _: None) -> list[LayerPair]:
    """The pairs of the stage's layer term: `layer_map` (STUDENT:TEACHER, each teacher layer stored), or every
    stored teacher layer j paired with student layer round(j * S / L) (S, L: the student's and teacher's
    depths), distinct student layers."""
    stored = list(states.layers)
    if layer_map:
        chosen = parse_layer_map(layer_map)
        missing = [j for j in chosen if j not in stored]
        if missing:
            raise ConfigError(f"--set layer_map={layer_map}: teacher layer {missing[0]} is not in the store (it keeps "
                              f"layers {','.join(map(str, stored))})")
        how = "--set layer_map"
    else:
        chosen = {j: round(j * n_student / states.teacher_layers) for j in stored}
        how = f"stored teacher layer j <- student layer round(j * {n_student} / {states.teacher_layers})"
    bad = [s for s in chosen.values() if not 0 <= s <= n_student]
    if bad:
        raise ConfigError(f"--set layer_map={layer_map}: student layer {bad[0]} is outside 0..{n_student} (the "
                          "student's hidden states)")
    if len(set(chosen.values())) != len(chosen):
        raise ConfigError(f"stored teacher layers {','.join(map(str, chosen))} map onto student layers "
                          f"{','.join(map(str, chosen.values()))}, some twice: name one pair per student layer with "
                          "--set layer_map=STUDENT:TEACHER,...")
    pairs = [LayerPair(j, s, "tokens", loss, 1.0, "W" if projection else None, stored.index(j))
             for j, s in sorted(chosen.items())]
    log(f"layer pairs ({how}): " + ", ".join(f"student {p.student_layer} <- teacher {p.teacher_layer}"
                                               + (" via W" if projection else "") for p in pairs))
    return pairs


def layer_projection(states: LayerStates, student_width: int) -> nn.Linear | None:
    """W: Linear(d_S -> d_T) when the student's width is not the teacher's, else None."""
    return None if student_width == states.width else nn.Linear(student_width, states.width)


class LayerBatch:
    """A batch's stored layer states on the device: `layer_states` [B, P, L, d] (unrotated, float32),
    `layer_positions` [B, P] (block positions; 0 where not real) and `layer_valid` [B, P]."""

    def __init__(self, states: LayerStates, block_size: int, device: str):
        self.states, self.device = states, device
        self.rotation = rotation_matrix(states.width, states.rotation_seed, device)
        self.positions = torch.as_tensor(states.positions(block_size), device=device)

    def __call__(self, raw: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        values = torch.as_tensor(raw[LAYERS], device=self.device)
        scale = raw.get(LAYERS_SCALE)
        scale = None if scale is None else torch.as_tensor(scale, device=self.device)
        rotated = codecs_torch.get(self.states.codec).decode(values, scale, self.states.width)
        length = torch.as_tensor(raw["length"].astype(np.int64), device=self.device)
        valid = self.positions[None, :] < length[:, None]
        return {"layer_states": rotated @ self.rotation, "layer_valid": valid,
                "layer_positions": torch.where(valid, self.positions[None, :], 0)}
