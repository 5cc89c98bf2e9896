"""Encode kept activations compactly and decode them back to dense, zero-filled teacher vectors.

Masks: which of the d activations a vector keeps, np.packbits over d (big-endian bit order).

Values: the N^W kept activations of a vector, in increasing index order, encoded by the store's
value codec, looked up by the name the store records (`selection.value_dtype`) in hskstore.codecs:
float16, int8, int4, mxfp4 (each module says its layout). Precision only goes down: a store can be
derived into a codec whose chain holds its own (`hskstore.codecs.can_convert`).
"""

from __future__ import annotations

import numpy as np

from .. import codecs


# --- masks ------------------------------------------------------------------------------------------
def pack_mask(mask: np.ndarray) -> np.ndarray:
    """[..., d] bool -> [..., ceil(d/8)] uint8."""
    return np.packbits(mask, axis=-1)


def unpack_mask(packed: np.ndarray, hidden_size: int) -> np.ndarray:
    """[..., ceil(d/8)] uint8 -> [..., d] bool."""
    return np.unpackbits(packed, axis=-1, count=hidden_size).astype(bool)


# --- encode / decode --------------------------------------------------------------------------------
def encode_values(
    vectors: np.ndarray, mask: np.ndarray, n_width: int, value_dtype: str
) -> tuple[np.ndarray, np.ndarray | None]:
    """Gather the masked activations of [..., d] vectors into [..., N^W] (index order) and encode them.

    Vectors with an empty mask (unused token slots) get zeros.
    """
    lead = vectors.shape[:-1]
    values16 = np.zeros((*lead, n_width), dtype=np.float16)
    full = mask.sum(axis=-1) == n_width
    if full.any():
        values16[full] = vectors[full][mask[full]].astype(np.float16).reshape(-1, n_width)
    return encode_kept(values16, value_dtype)


def encode_kept(values16: np.ndarray, value_dtype: str) -> tuple[np.ndarray, np.ndarray | None]:
    """fp16 kept values [..., N^W] -> (stored values, scale or None) in the codec named `value_dtype`."""
    return codecs.get(value_dtype).encode(values16)


def decode_values(
    value_dtype: str, values: np.ndarray, scale: np.ndarray | None, n_width: int | None = None
) -> np.ndarray:
    """Stored values of the codec named `value_dtype` -> float32 [..., N^W]. Packed codecs need N^W:
    without it every code the bytes hold is decoded (padding too, which no mask bit points at)."""
    return codecs.get(value_dtype).decode(values, scale, n_width)


def dense(
    value_dtype: str, values: np.ndarray, packed_mask: np.ndarray, hidden_size: int, scale: np.ndarray | None = None
) -> np.ndarray:
    """Reconstruct the zero-filled teacher vectors [..., d] float32 (docs/METHOD.md section 3)."""
    mask = unpack_mask(packed_mask, hidden_size)
    out = np.zeros(mask.shape, dtype=np.float32)
    full = mask.any(axis=-1)
    n_width = int(mask.sum(axis=-1).max(initial=0))  # every used slot keeps N^W values
    out[mask] = decode_values(value_dtype, values, scale, n_width)[..., :n_width][full].reshape(-1)
    return out
