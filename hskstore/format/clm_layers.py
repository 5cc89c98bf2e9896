"""The intermediate layers of a causal-LM store (`hsk dump --objective clm --hidden-layers 4,8`): the teacher's
hidden states of chosen layers at every `stride`-th position of each block, through a value codec
(docs/STORE_FORMAT.md, "Intermediate layers of causal-LM stores").

Layer j is the teacher's `hidden_states[j]` of a forward with output_hidden_states (0: the embeddings' output,
j: the j-th decoder layer's; the last is the one the architecture returns there, post-norm for Llama).
Positions are chosen by stride, not by the seeds' length ranking (a causal LM's blocks are all full): block
position t is kept when t % stride == 0, so a row keeps ceil(block_size / stride) of them, its padding (t at or
past its length) zeros. Each vector is stored rotated, h' = R h (R the seeded randomized Hadamard rotation of
hskstore.format.clm.rotation, seed `rotation_seed`), as the final-hidden-state support stores h: the few
massive outlier dimensions of LLM residual streams are spread over the width before a 4-bit codec quantizes
them; a reader gets h back as h' R (R orthogonal).

Arrays: `clm/layers` [rows, positions, layers, codec values of width] and, for a scaled codec,
`clm/layers_scale` [rows, positions, layers, scale groups]. Pure numpy, shared by the dump and the readers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import codecs
from .config import ConfigError
from .domain import MAX_WIDTH, Arrays, Breach, DomainCheck, first_problem, int_within, is_int
from .schema import SPEC_DOC, ArraySpec

LAYERS, LAYERS_SCALE = "clm/layers", "clm/layers_scale"
LAYER_ARRAYS = (LAYERS, LAYERS_SCALE)
LAYERS_SECTION = SPEC_DOC + "#intermediate-layers-hsk-dump-hidden-layers"
MAX_LAYERS = 4096  # teacher depth bound of a selection read back (far above any model's)


def parse_layers(text: str) -> tuple[int, ...]:
    """`--hidden-layers 4,8` -> (4, 8): distinct non-negative integers, increasing (a one-line ConfigError
    naming the value otherwise). Whether the teacher has them is checked once it is loaded (`LayerStates.make`)."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or not all(p.isascii() and p.isdigit() for p in parts):
        raise ConfigError(f"--hidden-layers {text!r}: pass teacher layer numbers separated by commas, e.g. 4,8 "
                          "(0: the embeddings' output, j: the j-th layer's)")
    layers = tuple(sorted({int(p) for p in parts}))
    if len(layers) != len(parts):
        raise ConfigError(f"--hidden-layers {text!r}: name each layer once")
    return layers


@dataclass(frozen=True)
class LayerStates:
    """A causal-LM store's `selection.layer_states`: which teacher layers, at which positions, in which codec."""

    layers: tuple[int, ...]  # teacher hidden_states indices, increasing (0: embeddings)
    stride: int  # block positions t with t % stride == 0
    codec: str  # the value codec of the vectors
    width: int  # the teacher's hidden size
    teacher_layers: int  # the teacher's depth: layers are 0..teacher_layers
    rotation_seed: int  # R = hskstore.format.clm.rotation(width, rotation_seed)

    @classmethod
    def make(cls, layers: tuple[int, ...], stride: int, codec: str, *, width: int, depth: int, seed: int,
             block_size: int, teacher: str) -> LayerStates:
        """The selection part of a dump, refused in one line when the teacher lacks a layer or the stride does
        not fit the block."""
        bad = [j for j in layers if j > depth]
        if bad:
            raise ConfigError(f"--hidden-layers {','.join(map(str, layers))}: the teacher {teacher} has {depth} "
                              f"layers (hidden states 0..{depth}); layer {bad[0]} is not one of them: pass numbers "
                              f"from 0 to {depth}")
        check_stride(stride, block_size)
        codecs.get(codec)
        return cls(tuple(layers), int(stride), codec, int(width), int(depth), int(seed))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LayerStates:
        return cls(**{**{k: d.get(k) for k in cls.__dataclass_fields__}, "layers": tuple(d.get("layers") or ())})

    def positions(self, block_size: int) -> np.ndarray:
        """The block positions kept: 0, stride, 2 stride, ... below block_size."""
        return np.arange(0, block_size, self.stride)

    def count(self, block_size: int) -> int:
        return math.ceil(block_size / self.stride)

    def described(self) -> str:
        every = "every position" if self.stride == 1 else f"every {self.stride}th position"
        return f"teacher layers {','.join(map(str, self.layers))} at {every} ({self.codec}, rotated)"


def check_stride(stride: int, block_size: int) -> None:
    if not (is_int(stride) and 1 <= stride <= block_size):
        raise ConfigError(f"--layer-stride {stride!r}: pass a whole number from 1 (every position) to the block "
                          f"size {block_size}")


def layers_problem(ls: Any, block_size: int) -> str | None:
    """A selection's layer_states out of their domain (None: none)."""
    if ls is None:
        return None
    depth = ls.teacher_layers
    layers = ls.layers
    return first_problem((
        int_within("layer_states.teacher_layers", depth, 1, MAX_LAYERS),
        None if (isinstance(layers, tuple) and layers and all(is_int(j) for j in layers)
                 and list(layers) == sorted(set(layers)) and is_int(depth) and 0 <= layers[0]
                 and layers[-1] <= depth) else
        f"layer_states.layers {list(layers) if isinstance(layers, tuple) else layers!r} are not distinct "
        f"increasing layers in 0..{depth}",
        int_within("layer_states.stride", ls.stride, 1, block_size),
        int_within("layer_states.width", ls.width, 1, MAX_WIDTH),
        None if isinstance(ls.codec, str) and ls.codec in codecs.names() else
        f"layer_states.codec {ls.codec!r} is not a codec name",
        None if is_int(ls.rotation_seed) else f"layer_states.rotation_seed {ls.rotation_seed!r} is not an integer"))


def real_positions(ls: LayerStates, lengths: np.ndarray, block_size: int) -> np.ndarray:
    """bool [n, P]: which kept positions are real tokens of their row (t < length)."""
    return ls.positions(block_size)[None, :] < np.asarray(lengths)[:, None]


def encode_layers(states: np.ndarray, lengths: np.ndarray, ls: LayerStates, block_size: int) -> dict[str, np.ndarray]:
    """The arrays of rows' layer states: states [n, P, L, d] (already rotated, at the kept positions), the
    padding zeroed here so that its bytes never depend on the teacher."""
    real = real_positions(ls, lengths, block_size)
    states = np.where(real[..., None, None], states, 0).astype(np.float16)
    values, scale = codecs.get(ls.codec).encode(states)
    return {LAYERS: values} if scale is None else {LAYERS: values, LAYERS_SCALE: scale}


def decode_layers(data: Mapping[str, np.ndarray], ls: LayerStates) -> np.ndarray:
    """float32 [n, P, L, d]: the stored (rotated) vectors; h = decoded @ R."""
    return codecs.get(ls.codec).decode(data[LAYERS], data.get(LAYERS_SCALE), ls.width)


def layer_specs(spec: Callable[[str, tuple[int, ...], str], ArraySpec], ls: LayerStates | None,
                block_size: int) -> list[ArraySpec]:
    if ls is None:
        return []
    head = (ls.count(block_size), len(ls.layers))
    declared = codecs.get(ls.codec).arrays(ls.width)
    return [spec(LAYERS if name == "values" else LAYERS_SCALE, (*head, *shape), dtype)
            for name, (shape, dtype) in declared.items()]


def layer_checks(ls: LayerStates | None, block_size: int, length: str = "length") -> list[DomainCheck]:
    """The layer states decode to finite values, zeros at the padding; a scaled codec's scales are finite and
    non-negative."""
    if ls is None:
        return []

    def rule(data: Arrays) -> Breach | None:
        scale = data.get(LAYERS_SCALE)
        if scale is not None and scale.dtype.kind == "f" and not (np.isfinite(scale).all() and (scale >= 0).all()):
            return Breach(LAYERS_SCALE, "holds a NaN, infinite or negative scale")
        decoded = decode_layers(data, ls)
        if not np.isfinite(decoded).all():
            return Breach(LAYERS, "decodes to a NaN or infinite value")
        pad = ~real_positions(ls, data[length], block_size)
        if (decoded[pad] != 0).any():
            return Breach(LAYERS, f"holds a nonzero vector at a position at or past its row's {length} (padding)")
        return None

    needs = (LAYERS, length) + ((LAYERS_SCALE,) if "scale" in codecs.get(ls.codec).arrays(ls.width) else ())
    return [DomainCheck(needs, rule)]


# name -> (axes after rows, description): what generic Zarr tools show
LAYER_DESCRIBED: dict[str, tuple[tuple[str, ...], str]] = {
    LAYERS: (("layer_positions", "layers", "hidden"), "the teacher's hidden states of selection.layer_states.layers "
             "at block positions 0, stride, 2 stride, ..., rotated by R(width, rotation_seed), as the value codec "
             "stores them; zeros at the padding"),
    LAYERS_SCALE: (("layer_positions", "layers", "scale_groups"), "the value codec's scale of each stored vector"),
}


def layer_dims(name: str, shape: tuple[int, ...], width: int) -> tuple[str, ...]:
    """The dimension names of a layer array of `shape` (rows first): a packed codec's last axis holds bytes."""
    dims = LAYER_DESCRIBED[name][0]
    if name == LAYERS and shape[-1] != width:
        dims = (*dims[:-1], "value_bytes")
    return dims[: len(shape) - 1]
