"""On-device decoding of a StoreStream batch: its arrays travel to the training device as their stored
bytes (on CUDA through reused pinned buffers, `PinnedStaging`) and are widened and decoded there into the
tensors a step reads (`decode_batch`; the teacher vectors by `dense_targets`).

    for batch in stream:
        t = decode_batch(batch, store.layers, store.hidden_size, "cuda", store.selection.value_dtype)
"""

from __future__ import annotations

import numpy as np
import torch

from pipelines.core import codecs_torch
from pipelines.train.data.stream import TRIMMED


def _widen(tensor: torch.Tensor, stored: np.dtype) -> torch.Tensor:
    """uint16 token ids travel as int16 (2 bytes each); widened on the device (& undoes the sign)."""
    return tensor.long() & 0xFFFF if stored == np.uint16 else tensor


def _as_torch(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array.view(np.int16) if array.dtype == np.uint16 else array)


class PinnedStaging:
    """A batch's arrays to a CUDA device as their stored bytes, in one copy that does not block the host.

    The arrays are packed (16-byte aligned) into one pinned host buffer and sent with one non_blocking
    copy; the device tensors are views of the one device buffer, in the stored dtypes, decoded there. The
    pinned buffers are reused, `slots` of them in turn: a buffer is refilled only once the copy out of it
    has finished (a CUDA event, long past by then: the steps between), so no batch is pinned afresh.
    `pin=False` (tests, on CPU) stages through ordinary memory, the same packing and views."""

    ALIGN = 16

    def __init__(self, device, *, pin: bool = True, slots: int = 2):
        self.device = torch.device(device)
        self._pin = pin
        self._buffers: list[torch.Tensor | None] = [None] * slots
        self._copied: list = [None] * slots  # per buffer: the event after the last copy out of it
        self._turn = 0

    def _buffer(self, nbytes: int) -> tuple[int, torch.Tensor]:
        i = self._turn
        self._turn = (i + 1) % len(self._buffers)
        if self._copied[i] is not None:
            self._copied[i].synchronize()  # waits on that copy only, not on the device's compute
        if self._buffers[i] is None or self._buffers[i].numel() < nbytes:
            self._buffers[i] = torch.empty(nbytes + nbytes // 4, dtype=torch.uint8, pin_memory=self._pin)
        return i, self._buffers[i]

    def send(self, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """name -> the array on the device (uint16 as int16: see `_widen`), through one pinned buffer."""
        offsets, end = {}, 0
        for name, array in arrays.items():
            offsets[name] = end
            end += -(-array.nbytes // self.ALIGN) * self.ALIGN
        i, host = self._buffer(end)
        staged = host.numpy()
        for name, array in arrays.items():
            at = offsets[name]
            staged[at : at + array.nbytes] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        sent = host[:end].to(self.device, non_blocking=True, copy=True)
        if self.device.type == "cuda":
            self._copied[i] = torch.cuda.Event()
            self._copied[i].record()
        out = {}
        for name, array in arrays.items():
            dtype = _as_torch(array[:0]).dtype
            out[name] = sent[offsets[name] : offsets[name] + array.nbytes].view(dtype).view(array.shape)
        return out


def _on_device(batch: dict, names: list[str], device, staging: PinnedStaging | None) -> dict[str, torch.Tensor]:
    """The named arrays of a batch on `device`, in their stored dtypes (uint16 as int16). CPU: the numpy
    memory itself; CUDA: the stored bytes through pinned buffers (`staging`, else one made for this batch)."""
    device = torch.device(device)
    if device.type == "cuda":
        return (staging or PinnedStaging(device, slots=1)).send({n: batch[n] for n in names})
    if staging is not None:
        return staging.send({n: batch[n] for n in names})
    return {n: _as_torch(batch[n]).to(device) for n in names}


# bit b of byte value v, most significant first (np.packbits' order): [256, 8]
_BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).astype(bool)
_LUTS: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}


def _luts(device: torch.device, n_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per byte value: its popcount [256, 1], and per bit its rank among the byte's set bits, or
    n_width for a clear bit (which then points into the zero tail of the source)."""
    key = (str(device), n_width)
    if key not in _LUTS:
        rank = np.cumsum(_BYTE_BITS, axis=1) - _BYTE_BITS
        code = np.where(_BYTE_BITS, rank, n_width).astype(np.int64)
        pop = _BYTE_BITS.sum(axis=1, keepdims=True).astype(np.int64)
        _LUTS[key] = torch.from_numpy(pop).to(device), torch.from_numpy(code).to(device)
    return _LUTS[key]


def dense_targets(values: torch.Tensor, packed: torch.Tensor, hidden_size: int,
                  scale: torch.Tensor | None = None, *, codec: str) -> torch.Tensor:
    """Zero-filled teacher vectors [..., d] float32; the torch twin of hskstore.format.codec.dense. `codec`: the
    store's value codec by name (its torch twin decodes, pipelines/core/codecs_torch.py).

    Values are stored in index order under the mask, so the j-th set bit of a vector takes value j.
    On an accelerator, `dense_by_gather` (no host sync); on CPU, where a sync is free and gathers
    through [..., d] int64 indices are not, `dense_by_scatter`. Both give the same bits.
    """
    if packed.device.type == "cpu":
        return dense_by_scatter(values, packed, hidden_size, scale, codec=codec)
    return dense_by_gather(values, packed, hidden_size, scale, codec=codec)


def dense_by_gather(values: torch.Tensor, packed: torch.Tensor, hidden_size: int,
                    scale: torch.Tensor | None = None, *, codec: str) -> torch.Tensor:
    """dense_targets without a host sync (for GPUs). Instead of unpacking bits and scattering
    through a boolean mask (a host sync, and several passes over [..., d]), each mask byte looks up
    its popcount and its bits' ranks in 256-entry tables; a cumsum over bytes gives each byte's
    first value, and one gather fills the output, clear bits reading a zero tail. Unused token
    slots (no bits) come out all zero.
    """
    decoded = codecs_torch.get(codec).decode(values, scale)
    n_width = decoded.shape[-1]
    pop, code = _luts(packed.device, n_width)
    lead, n_bytes = packed.shape[:-1], packed.shape[-1]
    flat = packed.reshape(-1).long()
    # index_select, not code[idx]: advanced indexing is several times slower on CPU
    counts = pop.index_select(0, flat).view(*lead, n_bytes)
    first = counts.cumsum(-1) - counts  # values stored before each byte
    slot = code.index_select(0, flat).view(*lead, n_bytes, 8).add_(first.unsqueeze(-1))
    source = torch.zeros((*lead, 2 * n_width + 1), dtype=torch.float32, device=decoded.device)
    source[..., :n_width] = decoded
    return source.gather(-1, slot.flatten(-2)[..., :hidden_size])


_POPCOUNT = _BYTE_BITS.sum(axis=1).astype(np.uint8)


def _popcount(packed: np.ndarray) -> np.ndarray:
    """Set bits per vector of packed masks [..., bytes] (np.bitwise_count from numpy 2, 8 bytes at a time
    where they align; a table before)."""
    if not hasattr(np, "bitwise_count"):
        return np.take(_POPCOUNT, packed).sum(-1, dtype=np.int64)
    if packed.shape[-1] % 8 == 0 and packed.flags.c_contiguous:
        packed = packed.view(np.uint64)
    return np.bitwise_count(packed).sum(-1, dtype=np.int64)


def _set_bits(masks: np.ndarray, hidden_size: int) -> np.ndarray:
    """Flat indices of the set bits of packed masks [..., bytes] in [..., d] (padding bits cut)."""
    if masks.shape[-1] * 8 == hidden_size and masks.flags.c_contiguous:
        return np.flatnonzero(np.unpackbits(masks.reshape(-1)).view(bool))
    return np.flatnonzero(np.unpackbits(masks, axis=-1, count=hidden_size).view(bool))


def _kept_values(values: torch.Tensor, scale: torch.Tensor | None, counts: np.ndarray,
                 n_lead: int, codec: str) -> tuple[torch.Tensor, np.ndarray | None]:
    """The used vectors' values decoded, each cut to its bit count ([n used, count] when the counts are
    all alike, else flat), and which vectors are used (None: all)."""
    rows = values.reshape(-1, values.shape[-1])
    scale = None if scale is None else scale.reshape(-1, *scale.shape[n_lead:])
    used = None
    if not counts.all():  # unused token slots: their values are not decoded
        used = counts > 0
        rows, scale, counts = rows[torch.from_numpy(used)], None if scale is None else scale[used], counts[used]
    decoded = codecs_torch.get(codec).decode(rows, scale)
    if len(counts) and (counts == counts[0]).all():  # every used vector keeps N^W values: a slice
        return decoded[:, : int(counts[0])], used
    return decoded[torch.from_numpy(np.arange(decoded.shape[-1]) < counts[:, None])], used


def dense_by_scatter(values: torch.Tensor, packed: torch.Tensor, hidden_size: int,
                     scale: torch.Tensor | None = None, *, codec: str) -> torch.Tensor:
    """dense_targets for CPU tensors, through numpy (zero-copy): the flat indices of the set bits
    (unpackbits and flatnonzero, several times faster than torch's nonzero on CPU), the used vectors'
    values decoded and cut to their bit counts, one scatter into zeros; no [..., d] int64 pass. A store
    that keeps every value (N^W = d) needs no scatter: the used vectors' values are the vectors."""
    masks = packed.numpy()
    lead = masks.shape[:-1]
    counts = _popcount(masks).reshape(-1)
    kept, used = _kept_values(values, scale, counts, len(lead), codec)
    out = np.zeros((*lead, hidden_size), dtype=np.float32)
    if kept.ndim == 2 and kept.shape[1] == hidden_size and hidden_size % 8 == 0:  # no padding bits counted
        vectors = out.reshape(-1, hidden_size)
        if used is None:
            vectors[...] = kept.numpy()
        else:
            vectors[used] = kept.numpy()
    else:
        out.reshape(-1)[_set_bits(masks, hidden_size)] = kept.numpy().reshape(-1)
    return torch.from_numpy(out)


def _target_names(batch: dict, store_layers: list) -> list[str]:
    """The arrays of a batch that decode_batch reads, in a fixed order."""
    names = [n for n in (*TRIMMED, "length", "label", "logits") if n in batch]
    for layer in store_layers:
        name = layer if isinstance(layer, str) else layer.name
        names += [f"{name}/{part}" for part in ("positions", "values", "masks", "scale", "attention")
                  if f"{name}/values" in batch and f"{name}/{part}" in batch]
    return names


def decode_batch(batch: dict, store_layers: list, hidden_size: int, device, codec: str,
                 staging: PinnedStaging | None = None) -> dict[str, torch.Tensor]:
    """Move a StoreStream batch to `device` and decode its teacher targets there (`codec`: the store's
    value codec by name, `selection.value_dtype`). The arrays travel as their stored bytes (on CUDA
    through `staging`'s reused pinned buffers, one non-blocking copy) and are widened and decoded on
    the device.

    Returns input_ids, token_type_ids, attention_mask (long), labels (long, -1 = no gold label; float
    for regression, NaN = none), logits (float) and, per kept layer i (the i of "layers/i"):
    positions_i long [B, N^L] (0 where unused), valid_i bool [B, N^L], dense_i float [B, N^L, d].
    Arrays missing from the batch (a stream built with `names`) are skipped.
    """
    names = _target_names(batch, store_layers)
    sent = _on_device(batch, names, device, staging)
    moved = {n: _widen(sent[n], batch[n].dtype) for n in names}
    out = _example_targets(moved, batch)
    for layer in store_layers:
        name = layer if isinstance(layer, str) else layer.name
        if f"{name}/values" in moved:
            out.update(_layer_targets(moved, name, hidden_size, codec))
    return out


def _example_targets(moved: dict[str, torch.Tensor], batch: dict) -> dict[str, torch.Tensor]:
    """The per-example tensors: input_ids, token_type_ids, attention_mask, labels and logits (those stored)."""
    out: dict[str, torch.Tensor] = {}
    for name in TRIMMED:
        if name in moved:
            out[name] = moved[name].long()
    if "length" in moved:
        width = out["input_ids"].shape[1] if "input_ids" in out else int(batch["length"].max())
        length = moved["length"].long()
        out["attention_mask"] = (torch.arange(width, device=length.device)[None, :] < length[:, None]).long()
    if "label" in moved:
        label = moved["label"]
        out["labels"] = label.float() if label.is_floating_point() else label.long()
    if "logits" in moved:
        out["logits"] = moved["logits"].float()
    return out


def _layer_targets(moved: dict[str, torch.Tensor], name: str, hidden_size: int, codec: str) -> dict[str, torch.Tensor]:
    """One kept layer's tensors, keyed by its index i (the i of "layers/i"): positions_i, valid_i, attention_i
    (when stored) and dense_i."""
    i = name.rsplit("/", 1)[-1]
    positions = moved[f"{name}/positions"].long()
    out = {f"valid_{i}": positions >= 0, f"positions_{i}": positions.clamp(min=0)}
    if f"{name}/attention" in moved:  # TinyBERT rows [B, heads, N^L, T], fp16 in the store
        out[f"attention_{i}"] = moved[f"{name}/attention"].float()
    out[f"dense_{i}"] = dense_targets(moved[f"{name}/values"], moved[f"{name}/masks"], hidden_size,
                                      moved.get(f"{name}/scale"), codec=codec)
    return out
