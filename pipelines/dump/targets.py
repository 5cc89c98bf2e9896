"""From one teacher forward to the encoded HSK of a batch: the arrays a store row holds.

The dump writes these; online training computes them the same way, so both see identical targets.
"""

from __future__ import annotations

import numpy as np
import torch

from hskstore.format import codec
from hskstore.format.config import Selection
from hskstore.format.schema import layer_names
from hskstore.method.selection import attention_scores, eligible_tokens, rank_tokens, width_mask
from pipelines.dump.attention_scores import query_key_scores
from pipelines.dump.probe import ProbeOutput


def gather_tokens(hidden: torch.Tensor, positions: np.ndarray) -> np.ndarray:
    """hidden [B, T, d] at positions [B, N^L] (-1 -> position 0, masked later) -> float32 numpy."""
    idx = torch.from_numpy(np.maximum(positions, 0).astype(np.int64)).to(hidden.device)
    picked = hidden.gather(1, idx[..., None].expand(-1, -1, hidden.shape[-1]))
    return picked.float().cpu().numpy()


FP16_MAX = float(np.finfo(np.float16).max)


def attention_rows(
    q: torch.Tensor, k: torch.Tensor, positions: np.ndarray, lengths: np.ndarray, num_heads: int, max_length: int
) -> np.ndarray:
    """TinyBERT's targets: pre-softmax attention scores of the kept tokens' query rows.

    q, k [B, t, d] (one layer's query and key projections, t <= max_length); positions [B, N^L]
    (-1 = unused slot). Returns float16 [B, heads, N^L, max_length]: q_p . k_j / sqrt(d_head) per
    head, zero for padded keys (j >= length), keys beyond t and unused slots; clipped to the fp16 range.
    """
    b, t, d = k.shape
    n = positions.shape[1]
    idx = torch.from_numpy(np.maximum(positions, 0).astype(np.int64)).to(q.device)
    rows = q.gather(1, idx[..., None].expand(-1, -1, d))  # [B, N^L, d]
    scores = query_key_scores(rows, k, num_heads)  # the same bits on every device
    keep = (positions >= 0)[:, None, :, None] & (np.arange(t)[None, :] < lengths[:, None])[:, None, None, :]
    out = np.zeros((b, num_heads, n, max_length), dtype=np.float16)
    out[..., :t] = np.where(keep, np.clip(scores.cpu().numpy(), -FP16_MAX, FP16_MAX), 0.0)
    return out


def encode_batch(
    probe: ProbeOutput,
    input_ids: np.ndarray,
    lengths: np.ndarray,
    selection: Selection,
    sep_id: int | None,
    max_length: int | None = None,
) -> dict[str, np.ndarray]:
    """Logits and, per kept layer, positions / scores / values / masks (/ scale) for one batch.

    A selection with attention rows adds `attention` per kept layer above the embeddings, padded
    to `max_length` keys (the store's T): it must then be given.
    """
    if selection.attention_rows and max_length is None:
        raise ValueError("encode_batch: a selection with attention rows needs the store's max_length")
    out = {"logits": probe.logits.float().cpu().numpy()}
    if selection.config.logits_only:
        return out
    eligible = eligible_tokens(
        input_ids, lengths, sep_id, exclude_sep=selection.token_strategy == "att-nosep"
    )
    ranked: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for name, teacher_layer, ranking_layer in zip(
        layer_names(len(selection.teacher_layers)), selection.teacher_layers, selection.ranking_layers
    ):
        if ranking_layer not in ranked:  # layers ranked by the same attention share the ranking
            raw = probe.cls_scores[ranking_layer].float().cpu().numpy()
            scores = attention_scores(raw, lengths, selection.attention_scores)
            ranked[ranking_layer] = rank_tokens(
                scores, eligible, selection.config.n_tokens, selection.token_strategy
            )
        positions, kept_scores = ranked[ranking_layer]
        vectors = gather_tokens(probe.hidden[teacher_layer], positions)
        mask = width_mask(
            vectors,
            selection.n_width,
            selection.width_strategy,
            seed=selection.width_seed,
            valid=positions >= 0,
        )
        values, scale = codec.encode_values(vectors, mask, selection.n_width, selection.value_dtype)
        out[f"{name}/positions"] = positions
        out[f"{name}/scores"] = kept_scores
        out[f"{name}/values"] = values
        out[f"{name}/masks"] = codec.pack_mask(mask)
        if scale is not None:
            out[f"{name}/scale"] = scale
        if selection.attention_rows and teacher_layer >= 1:
            q, k = probe.qk[teacher_layer]
            out[f"{name}/attention"] = attention_rows(q, k, positions, lengths, selection.attention_heads, max_length)
    return out
