"""Selection and encoding on the teacher's device, in torch: the same bytes as the numpy reference.

`hskstore.method.selection` and `hskstore.codecs` (numpy) stay the reference that `derive` and the readers
use (value codes: each codec's torch twin, pipelines/core/codecs_torch.py); this module computes the
same arrays from a ProbeOutput without moving hidden states to the host: eligibility, ranking scores,
top-N^L positions (stable: descending score, then ascending position), gathering, width masks, value
codes and packed masks, batched over the batch and every
kept layer. Only the selected arrays leave the device (`HostCopies`).

Bit-exactness rules followed below (each checked against the reference in tests/test_select_torch.py):
- divisions are tensor / tensor, never tensor / Python scalar: CUDA turns the latter into a
  multiplication by the reciprocal, which rounds differently from numpy's division;
- head means add the heads one by one, as numpy's reduction over a non-innermost axis does;
- -0.0 is folded into +0.0 before sorting (a radix sort on the device would order them);
- powers of two are built from their bits, not by exp2;
- torch.round and numpy.rint both round half to even; fp32 -> fp16 casts are IEEE on both.
One step stays on the host: post-softmax scores use numpy's float32 exp, a SIMD approximation no
torch kernel reproduces bit for bit, so the [CLS] rows (heads x T floats per example and ranking
layer, not the hidden states) go to the host for it and the scores come back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from hskstore.format.config import Selection
from hskstore.format.schema import layer_names
from hskstore.method.selection import attention_scores, static_width_indices
from pipelines.core import codecs_torch
from pipelines.core.codecs_torch import cached, const  # constants made once per device (no blocking copy)
from pipelines.dump.attention_scores import query_key_scores
from pipelines.dump.probe import ProbeOutput

FP16_MAX = float(np.finfo(np.float16).max)
# On a CPU "device" two steps run as numpy on the tensors' own memory (same keys, same results):
# the stable sort of the ranking and the mag mask's partition, several times faster there than
# torch's kernels. Tests switch this off to check the device kernels on the CPU too.
NUMPY_KERNELS_ON_CPU = True




# --- length selection ---------------------------------------------------------------------------------
def eligible_tokens(input_ids: torch.Tensor, lengths: torch.Tensor, sep_id: int | None, exclude_sep: bool):
    """hskstore.method.selection.eligible_tokens on tensors: real tokens, without [SEP] when asked."""
    eligible = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :] < lengths[:, None]
    if exclude_sep:
        if sep_id is None:
            from hskstore.format.config import ConfigError

            raise ConfigError("excluding [SEP] needs a tokenizer with a sep token")
        eligible &= input_ids != sep_id
    return eligible


def pre_softmax_scores(cls_rows: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Head mean of the raw [CLS] rows [B, H, T] -> [B, T] float32, -inf on padding (the reference's order)."""
    rows = cls_rows.float()
    valid = torch.arange(rows.shape[-1], device=rows.device)[None, :] < lengths[:, None]
    total = rows[:, 0].clone()
    for h in range(1, rows.shape[1]):  # numpy adds the heads in order; a tree sum would round differently
        total += rows[:, h]
    mean = total / const(rows.shape[1], total)
    return torch.where(valid, mean, const(-math.inf, mean))


def ranking_scores(cls_rows: torch.Tensor, lengths: torch.Tensor, lengths_np: np.ndarray, kind: str):
    if kind == "pre-softmax":
        return pre_softmax_scores(cls_rows, lengths)
    # post-softmax: numpy's exp (see the module docstring), on [B, H, T] rows only
    scores = attention_scores(cls_rows.float().cpu().numpy(), lengths_np, kind)
    return torch.from_numpy(scores).to(cls_rows.device)


def rank_tokens(scores: torch.Tensor, eligible: torch.Tensor, n_tokens: int, strategy: str):
    """hskstore.method.selection.rank_tokens on tensors: (positions [B, N^L] int16, scores [B, N^L] float32)."""
    batch, length = scores.shape
    inf = const(math.inf, scores)
    if strategy in ("att", "att-nosep"):
        key = torch.where(eligible, -scores, inf) + 0.0  # + 0.0 folds -0.0 into +0.0: equal keys stay equal
    elif strategy == "left":
        key = torch.where(eligible, torch.arange(length, device=scores.device, dtype=torch.float32)[None, :], inf)
    elif strategy == "cls":
        key = torch.full((batch, length), math.inf, device=scores.device)
        key[:, 0] = torch.where(eligible[:, 0], const(0.0, scores), inf)
    else:
        from hskstore.format.config import ConfigError

        raise ConfigError(f"unknown token strategy {strategy!r}")
    if key.device.type == "cpu" and NUMPY_KERNELS_ON_CPU:  # numpy's stable argsort is the faster on the host
        order = torch.from_numpy(np.argsort(key.numpy(), axis=1, kind="stable")[:, :n_tokens])
    else:
        order = torch.sort(key, dim=1, stable=True).indices[:, :n_tokens]
    taken = eligible.gather(1, order)
    if order.shape[1] < n_tokens:  # texts padded to fewer positions than N^L
        pad = n_tokens - order.shape[1]
        order = torch.nn.functional.pad(order, (0, pad))
        taken = torch.nn.functional.pad(taken, (0, pad), value=False)
    positions = torch.where(taken, order, -1).to(torch.int16)
    kept = torch.where(taken, scores.gather(1, order), const(0.0, scores))
    return positions, kept


# --- width masks ----------------------------------------------------------------------------------------
def _mag_keys(vectors: torch.Tensor) -> torch.Tensor:
    """fp16 |v| bits above the reversed index: one unique int32 key per activation, ties to the lower index.

    15 bits of |v| above 16 of index: fits int32 for d <= 65536 (the reference uses int64, same order).
    """
    d = vectors.shape[-1]
    bits = (vectors.to(torch.float16).view(torch.int16).to(torch.int32) & 0x7FFF) << 16
    return bits | (d - 1 - torch.arange(d, device=vectors.device, dtype=torch.int32))


def kept_indices(vectors: torch.Tensor, n_width: int, strategy: str, seed: int) -> torch.Tensor:
    """Indices [..., N^W] (increasing) of the activations each vector keeps (hskstore.method.selection.width_mask)."""
    d = vectors.shape[-1]
    if strategy != "mag":
        idx = cached(("static", strategy, d, n_width, seed), vectors.device,
                      lambda: torch.from_numpy(static_width_indices(strategy, d, n_width, seed)))
        return idx.expand(*vectors.shape[:-1], n_width)
    if n_width >= d:
        return torch.arange(d, device=vectors.device).expand(*vectors.shape[:-1], d)
    key = _mag_keys(vectors)
    if key.device.type == "cpu" and NUMPY_KERNELS_ON_CPU:
        # The CPU is the host: numpy's partition finds each vector's N^W-th largest key (keys are unique), and the
        # keys at or above it, read in index order, are the kept indices already sorted: 1.5x argpartition + sort.
        keys = key.numpy()
        threshold = np.partition(keys, d - n_width, axis=-1)[..., d - n_width, None]
        return torch.from_numpy(np.nonzero(keys >= threshold)[-1].reshape(*keys.shape[:-1], n_width))
    top = torch.topk(key, n_width, dim=-1, sorted=False).indices
    return torch.sort(top, dim=-1).values


def _width_on_host(vectors: torch.Tensor, valid: torch.Tensor, n_width: int, strategy: str,
                   seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept fp16 values [..., N^W], packed mask [..., d/8]) of vectors on the CPU, in numpy: the same bytes as
    `kept_indices`, `mask_from_indices` and `pack_mask`, without indices for the mask (a vector's kept
    activations are the keys at or above its N^W-th largest) or torch's bit packing (35x numpy.packbits)."""
    d = vectors.shape[-1]
    v16 = vectors.to(torch.float16).numpy()
    if strategy != "mag" or n_width >= d:
        idx = kept_indices(vectors, n_width, strategy, seed).numpy()
        kept = np.zeros(d, dtype=bool)
        kept[idx.reshape(-1, idx.shape[-1])[0]] = True  # the same indices for every vector
        values, mask = np.take(v16, idx[(0,) * (idx.ndim - 1)], axis=-1), np.broadcast_to(kept, v16.shape)
    else:
        # one unique key per activation as in _mag_keys: |v| bits (fp16) above the reversed index
        keys = ((v16.view(np.uint16) & 0x7FFF).astype(np.int32) << 16) | (d - 1 - np.arange(d, dtype=np.int32))
        mask = keys >= np.partition(keys, d - n_width, axis=-1)[..., d - n_width, None]
        # exactly N^W per vector, in index order: the flat positions read in order are the kept values
        values = v16.reshape(-1)[np.flatnonzero(mask)].reshape(*v16.shape[:-1], n_width)
    ok = valid.numpy()[..., None]
    values = np.where(ok, values, np.float16(0))
    return torch.from_numpy(values), torch.from_numpy(np.packbits(mask & ok, axis=-1))


def mask_from_indices(idx: torch.Tensor, d: int, valid: torch.Tensor) -> torch.Tensor:
    mask = torch.zeros((*idx.shape[:-1], d), dtype=torch.bool, device=idx.device)
    mask.scatter_(-1, idx, True)
    return mask & valid[..., None]


_BIT_WEIGHTS = (128, 64, 32, 16, 8, 4, 2, 1)  # numpy.packbits, bitorder="big"


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """[..., d] bool -> [..., ceil(d/8)] uint8, byte for byte numpy.packbits(mask, axis=-1)."""
    d = mask.shape[-1]
    bits = torch.nn.functional.pad(mask.to(torch.uint8), (0, -d % 8))
    weights = cached(("bits",), mask.device, lambda: torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8))
    return (bits.view(*mask.shape[:-1], -1, 8) * weights).sum(-1, dtype=torch.uint8)


# --- attention rows -------------------------------------------------------------------------------------
def attention_rows(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, lengths: torch.Tensor,
                   num_heads: int, max_length: int) -> torch.Tensor:
    """pipelines.dump.targets.attention_rows, kept on the device: float16 [B, heads, N^L, max_length]."""
    b, t = k.shape[:2]
    idx = positions.clamp(min=0).to(torch.int64)
    rows = q[torch.arange(b, device=q.device)[:, None], idx]  # the kept rows only
    scores = query_key_scores(rows, k, num_heads)  # the reference's own function: the same bits on any device
    keys = torch.arange(t, device=k.device)[None, :] < lengths[:, None]
    keep = (positions >= 0)[:, None, :, None] & keys[:, None, None, :]
    kept = torch.where(keep, scores.clamp(-FP16_MAX, FP16_MAX), const(0.0, scores)).to(torch.float16)
    return torch.nn.functional.pad(kept, (0, max_length - t))


# --- one batch ------------------------------------------------------------------------------------------
@dataclass
class _Ranked:
    positions: torch.Tensor
    scores: torch.Tensor


def _rows(hidden: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """hidden[b, idx[b, n]] -> [B, N^L, d]: from the flattened [B * T, d] when that is a view (faster on CPU
    than indexing, itself faster than a gather through an expanded [B, N^L, d] index); the same values either way."""
    b, t, d = hidden.shape
    if not hidden.is_contiguous():  # flattening would copy every row
        return hidden[torch.arange(b, device=idx.device)[:, None], idx]
    flat = (torch.arange(b, device=idx.device)[:, None] * t + idx).reshape(-1)
    return hidden.view(b * t, d).index_select(0, flat).view(b, -1, d)


def _layer_arrays(probe: ProbeOutput, selection: Selection, teacher_layer: int, ranked: _Ranked) -> dict:
    hidden = probe.hidden[teacher_layer]
    idx = ranked.positions.clamp(min=0).to(torch.int64)
    vectors = _rows(hidden, idx).float()
    valid = ranked.positions >= 0
    n_width = selection.n_width
    if vectors.device.type == "cpu" and NUMPY_KERNELS_ON_CPU:
        values16, packed = _width_on_host(vectors, valid, n_width, selection.width_strategy, selection.width_seed)
    else:
        kept = kept_indices(vectors, n_width, selection.width_strategy, selection.width_seed)
        packed = pack_mask(mask_from_indices(kept, vectors.shape[-1], valid))
        values16 = torch.where(valid[..., None], vectors.gather(-1, kept).to(torch.float16),
                               torch.zeros((), dtype=torch.float16, device=vectors.device))
    values, scale = codecs_torch.get(selection.value_dtype).encode(values16)
    arrays = {"positions": ranked.positions, "scores": ranked.scores, "values": values, "masks": packed}
    if scale is not None:
        arrays["scale"] = scale
    return arrays


@torch.inference_mode()
def select_batch(
    probe: ProbeOutput,
    input_ids: np.ndarray,
    lengths: np.ndarray,
    selection: Selection,
    sep_id: int | None,
    max_length: int | None = None,
) -> dict[str, torch.Tensor]:
    """pipelines.dump.targets.encode_batch computed on the probe's device: the same arrays, as tensors there."""
    if selection.attention_rows and max_length is None:
        raise ValueError("select_batch: a selection with attention rows needs the store's max_length")
    out = {"logits": probe.logits.float()}
    if selection.config.logits_only:
        return out
    device = probe.logits.device
    ids = torch.from_numpy(np.ascontiguousarray(input_ids)).to(device, non_blocking=True)
    lens = torch.from_numpy(np.asarray(lengths).astype(np.int64)).to(device, non_blocking=True)
    eligible = eligible_tokens(ids, lens, sep_id, exclude_sep=selection.token_strategy == "att-nosep")
    ranked: dict[int, _Ranked] = {}
    for name, teacher_layer, ranking_layer in zip(
        layer_names(len(selection.teacher_layers)), selection.teacher_layers, selection.ranking_layers
    ):
        if ranking_layer not in ranked:  # layers ranked by the same attention share the ranking
            scores = ranking_scores(probe.cls_scores[ranking_layer], lens, lengths, selection.attention_scores)
            ranked[ranking_layer] = _Ranked(*rank_tokens(scores, eligible, selection.config.n_tokens,
                                                          selection.token_strategy))
        for part, array in _layer_arrays(probe, selection, teacher_layer, ranked[ranking_layer]).items():
            out[f"{name}/{part}"] = array
        if selection.attention_rows and teacher_layer >= 1:
            q, k = probe.qk[teacher_layer]
            out[f"{name}/attention"] = attention_rows(q, k, ranked[ranking_layer].positions, lens,
                                                      selection.attention_heads, max_length)
    return out


# --- the way to the host ----------------------------------------------------------------------------------
@dataclass
class HostCopies:
    """Reused pinned host buffers the selected arrays are copied into without waiting (CUDA).

    `slots` sets of buffers rotate, so a batch's copy never lands in buffers the host still reads:
    the dump keeps at most two batches in flight (one being placed, one copying). On the CPU the
    tensors already are host memory: `start` hands their numpy views back, no copy and no event.
    """

    slots: int = 3
    _buffers: list[dict[str, torch.Tensor]] = field(default_factory=list)
    _turn: int = 0

    def start(self, arrays: dict[str, torch.Tensor]) -> tuple[dict[str, object], torch.cuda.Event | None]:
        first = next(iter(arrays.values()))
        if first.device.type != "cuda":
            return {name: t.numpy() for name, t in arrays.items()}, None
        if not self._buffers:
            self._buffers = [{} for _ in range(self.slots)]
        slot = self._buffers[self._turn % self.slots]
        self._turn += 1
        views = {}
        for name, t in arrays.items():
            buf = slot.get(name)
            if buf is None or buf.shape[0] < t.shape[0] or buf.shape[1:] != t.shape[1:] or buf.dtype != t.dtype:
                buf = slot[name] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            views[name] = buf[: t.shape[0]].copy_(t, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return views, done


def host_arrays(views: dict[str, object], done: torch.cuda.Event | None) -> dict[str, np.ndarray]:
    """The copied arrays as numpy (views of the pinned buffers: read them before the slot comes round again)."""
    if done is not None:
        done.synchronize()
    return {name: v.numpy() if isinstance(v, torch.Tensor) else v for name, v in views.items()}


def encode_batch_on_device(probe: ProbeOutput, *args) -> dict[str, np.ndarray]:
    """`select_batch` with its results brought to the host in fresh arrays (online training's targets)."""
    return {name: t.cpu().numpy() for name, t in select_batch(probe, *args).items()}
