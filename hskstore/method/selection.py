"""Length and width selection (docs/METHOD.md sections 2 and 3) as pure numpy functions.

The dump, `derive` and online training all call these, so a store and an on-the-fly target
always agree. Ties are broken towards the lower index everywhere (stable sorts), which makes a
smaller selection an exact prefix/subset of a larger one.
"""

from __future__ import annotations

import numpy as np

from ..format.config import ConfigError


def eligible_tokens(
    input_ids: np.ndarray, lengths: np.ndarray, sep_id: int | None, exclude_sep: bool
) -> np.ndarray:
    """Positions that may be selected: real tokens, without [SEP] when asked (found per example)."""
    positions = np.arange(input_ids.shape[1])[None, :]
    eligible = positions < np.asarray(lengths)[:, None]
    if exclude_sep:
        if sep_id is None:
            raise ConfigError("excluding [SEP] needs a tokenizer with a sep token")
        eligible &= input_ids != sep_id
    return eligible


def attention_scores(cls_rows: np.ndarray, lengths: np.ndarray, kind: str) -> np.ndarray:
    """Ranking scores [B, T] from the per-head [CLS] query rows [B, heads, T] of pre-softmax scores.

    pre-softmax (reference code): the head average of the raw scores. post-softmax (paper text):
    the head average of each head's attention distribution over the real tokens. Padding gets -inf.
    """
    valid = (np.arange(cls_rows.shape[-1])[None, :] < np.asarray(lengths)[:, None])[:, None, :]
    rows = np.where(valid, cls_rows.astype(np.float32), -np.inf)
    if kind == "pre-softmax":
        scores = rows.mean(axis=1)
    elif kind == "post-softmax":
        e = np.exp(rows - rows.max(axis=-1, keepdims=True))
        scores = (e / e.sum(axis=-1, keepdims=True)).mean(axis=1)
    else:
        raise ConfigError(f"unknown attention score kind {kind!r}")
    return np.where(valid[:, 0], scores, -np.inf).astype(np.float32)


def rank_tokens(
    scores: np.ndarray, eligible: np.ndarray, n_tokens: int, strategy: str
) -> tuple[np.ndarray, np.ndarray]:
    """Pick N^L token positions per example, ordered by descending score (ties: lower position first).

    Returns positions [B, N^L] int16 (-1 where a text has fewer eligible tokens) and their scores
    [B, N^L] float32 (0 where unused). Strategies: att / att-nosep rank by score (the caller
    decides eligibility); left keeps the first positions; cls keeps position 0 only.
    """
    batch, length = scores.shape
    if strategy in ("att", "att-nosep"):
        key = np.where(eligible, -scores, np.inf)
    elif strategy == "left":
        key = np.where(eligible, np.arange(length, dtype=np.float32)[None, :], np.inf)
    elif strategy == "cls":
        key = np.full((batch, length), np.inf, dtype=np.float32)
        key[:, 0] = np.where(eligible[:, 0], 0.0, np.inf)
    else:
        raise ConfigError(f"unknown token strategy {strategy!r}")
    order = np.argsort(key, axis=1, kind="stable")[:, :n_tokens]
    if order.shape[1] < n_tokens:  # texts padded to fewer positions than N^L
        order = np.pad(order, ((0, 0), (0, n_tokens - order.shape[1])))
    taken = np.take_along_axis(eligible, order, axis=1)
    if taken.shape[1] > length:
        taken[:, length:] = False
    positions = np.where(taken, order, -1).astype(np.int16)
    kept_scores = np.where(taken, np.take_along_axis(scores, order, axis=1), 0.0).astype(np.float32)
    return positions, kept_scores


def static_width_indices(strategy: str, hidden_size: int, n_width: int, seed: int = 0) -> np.ndarray:
    """The index set of a static mask, in increasing order.

    uniform: round(i * d / N^W), i = 0..N^W-1 (not nested across widths);
    rand: the first N^W entries of one seeded permutation (nested: a narrower width is a subset).
    """
    if strategy == "uniform":
        idx = np.round(np.arange(n_width) * hidden_size / n_width).astype(np.int64)
    elif strategy == "rand":
        idx = np.random.default_rng(seed).permutation(hidden_size)[:n_width]
    else:
        raise ConfigError(f"{strategy!r} is not a static width mask")
    return np.sort(idx)


def width_mask(
    vectors: np.ndarray, n_width: int, strategy: str, *, seed: int = 0, valid: np.ndarray | None = None
) -> np.ndarray:
    """Boolean mask [..., d] keeping exactly N^W activations of every valid vector.

    mag: the N^W largest |v| of each vector, magnitudes taken on the fp16 values the store keeps
    (so a store can re-derive it), ties to the lower index. Invalid vectors get an empty mask.
    """
    d = vectors.shape[-1]
    if strategy == "mag":
        if n_width >= d:
            mask = np.ones(vectors.shape, dtype=bool)
        else:
            # One unique integer key per activation: fp16 |v| bits (monotone for v >= 0) above the
            # reversed index, so ties go to the lower index and a partial sort is exact.
            bits = np.abs(vectors.astype(np.float16)).view(np.uint16).astype(np.int64)
            key = (bits << 16) | (d - 1 - np.arange(d))
            kth = np.partition(key, d - n_width, axis=-1)[..., d - n_width : d - n_width + 1]
            mask = key >= kth
    else:
        mask = np.zeros(vectors.shape, dtype=bool)
        mask[..., static_width_indices(strategy, d, n_width, seed)] = True
    if valid is not None:
        mask &= valid[..., None]
    return mask
