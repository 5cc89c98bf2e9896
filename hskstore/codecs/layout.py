"""Shared layout helpers of the grouped codecs: groups of kept values under one scale, 4-bit packing."""

from __future__ import annotations

import numpy as np

GROUP = 32  # kept values per scale group


def n_groups(n_width: int, group: int = GROUP) -> int:
    return -(-n_width // group)


def grouped(values: np.ndarray, group: int = GROUP) -> np.ndarray:
    """[..., n] -> [..., G, group] float32, the last group zero-padded."""
    n = values.shape[-1]
    padded = np.zeros((*values.shape[:-1], n_groups(n, group) * group), dtype=np.float32)
    padded[..., :n] = values
    return padded.reshape(*values.shape[:-1], -1, group)


def ungrouped(codes: np.ndarray, n: int) -> np.ndarray:
    """[..., G, group] -> [..., n] (the padding cut)."""
    return codes.reshape(*codes.shape[:-2], -1)[..., :n]


def per_value(group_scale: np.ndarray, n: int, group: int = GROUP) -> np.ndarray:
    """Each group's scale repeated over its values: [..., G] -> [..., n] float32."""
    return np.repeat(group_scale.astype(np.float32), group, axis=-1)[..., :n]


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """4-bit codes [..., n] (any int dtype; the low 4 bits are kept) -> [..., ceil(n/2)] uint8.

    Value 2k in the low nibble, 2k+1 in the high nibble; an odd n leaves the last high nibble 0.
    """
    nib = (codes.astype(np.int16) & 0xF).astype(np.uint8)
    if nib.shape[-1] % 2:
        nib = np.concatenate([nib, np.zeros((*nib.shape[:-1], 1), dtype=np.uint8)], axis=-1)
    return nib[..., 0::2] | (nib[..., 1::2] << 4)


def unpack_nibbles(packed: np.ndarray, n: int | None = None) -> np.ndarray:
    """[..., ceil(n/2)] uint8 -> the 4-bit codes [..., n] uint8 (0..15); n=None: every nibble."""
    nib = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    return nib if n is None else nib[..., :n]
