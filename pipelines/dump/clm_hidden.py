"""The final-hidden-state support of causal-LM stores (`hsk dump --objective clm --support hidden[:codec]`).

A causal LM's logits are its head applied to its final (post-norm) hidden state h: logits = W h (+ b), then the
architecture's final softcap where it has one. The store keeps, per kept position, h' = R h (R the seeded
randomized Hadamard rotation of hskstore.format.clm.rotation, or the identity) through a value codec, and once
per store the rotated head W R^T (and the bias), so that W R^T h' = W h: the student gets the teacher's
full-vocabulary distribution offline for d x bits / 8 bytes per token. Rotating spreads the few massive outlier
dimensions of LLM hidden states over the whole width before quantizing (as QuaRot does for activations), so a
4-bit codec keeps them as well as the rest.

h is captured as the input of the model's output embeddings (a forward pre-hook), whatever the architecture
calls its final norm. Everything here runs on the teacher's device; the codecs' numpy twins encode on the host
as the top-K support's do.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hskstore import codecs
from hskstore.format.clm import (
    ClmSelection,
    PackedRows,
    block_hashes,
    encode_hidden,
    head_digest,
    kept_positions,
    rotation,
)
from hskstore.format.hidden_fit import Fit, FitEncoder, fit_head
from pipelines.core.precision import forward_precision


@dataclass(frozen=True)
class TeacherHead:
    """The teacher's LM head on its device: logits = softcap(h @ weight.T + bias) (float32)."""

    weight: torch.Tensor  # [V, d]
    bias: torch.Tensor | None  # [V]
    softcap: float | None  # final logit softcapping (Gemma 2): cap * tanh(logits / cap)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        out = h.float() @ self.weight.T
        if self.bias is not None:
            out = out + self.bias
        if self.softcap:
            out = self.softcap * torch.tanh(out / self.softcap)
        return out

    def rotated(self, r: torch.Tensor | None) -> TeacherHead:
        """The head of rotated states h' = R h: W R^T (R orthogonal, so W R^T R h = W h)."""
        return self if r is None else TeacherHead(self.weight @ r.T, self.bias, self.softcap)


def head_of(model: Any) -> TeacherHead:
    """The output embeddings of a causal LM (tied to the input embeddings or not), in float32."""
    out = model.get_output_embeddings()
    bias = getattr(out, "bias", None)
    cap = getattr(model.config, "final_logit_softcapping", None)
    return TeacherHead(out.weight.detach().float(), None if bias is None else bias.detach().float(),
                       float(cap) if cap else None)


def rotation_matrix(d: int, seed: int | None, device: torch.device | str) -> torch.Tensor | None:
    """R as float32 on the device, or None (no rotation)."""
    return None if seed is None else torch.as_tensor(rotation(d, seed), dtype=torch.float32, device=device)


@torch.no_grad()
def teacher_hidden(model: Any, input_ids: torch.Tensor, precision: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(h [b, T, d] float32, logits [b, T, V]) of a batch: h is what the model's head reads."""
    seen: list[torch.Tensor] = []
    hook = model.get_output_embeddings().register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    try:
        with forward_precision(precision, str(input_ids.device)):
            logits = model(input_ids=input_ids).logits
    finally:
        hook.remove()
    return seen[-1].float(), logits


def kl_and_agreement(teacher_logits: torch.Tensor, logits: torch.Tensor, chunk: int = 1024) -> tuple[float, float]:
    """(mean KL(teacher || reconstruction) in nats, top-1 agreement) over the rows of [N, V] logits, chunked so
    that no [N, V] float64 is ever made."""
    kl, agree = 0.0, 0
    for start in range(0, len(logits), chunk):
        p = torch.log_softmax(teacher_logits[start:start + chunk].float(), -1)
        q = torch.log_softmax(logits[start:start + chunk].float(), -1)
        kl += float((p.exp() * (p - q)).sum(-1).clamp(min=0).double().sum())
        agree += int((p.argmax(-1) == q.argmax(-1)).sum())
    return kl / max(len(logits), 1), agree / max(len(logits), 1)


def round_trip(h: torch.Tensor, codec: str, encoder: FitEncoder | None = None) -> torch.Tensor:
    """h [..., d] through a value codec's stored bytes and back (numpy, as the dump encodes and a reader
    decodes), on h's device; with a fitted basis's encoder, the indices it stores (the folded head reads them)."""
    c = codecs.get(codec)
    h16 = h.detach().cpu().numpy().astype(np.float16)
    values, scale = c.encode(h16) if encoder is None else c.quantize(encoder.coordinates(h16))
    return torch.as_tensor(c.decode(values, scale, h.shape[-1]), device=h.device)


def hidden_selection(model: Any, support: Any, *, vocab_size: int, block_size: int, eos_id: int, positions: float,
                     seed: int, limit_tokens: int | None = None) -> tuple[ClmSelection, TeacherHead]:
    """The selection of a hidden-state dump and the head it stores (rotated by R, whatever the codec: a float16
    store then derives to every other codec with the bytes of a direct dump)."""
    d = int(model.get_output_embeddings().weight.shape[1])
    head = head_of(model).rotated(rotation_matrix(d, seed, model.device))
    weight, bias = head_arrays(head)
    sel = ClmSelection.hidden(support.codec, hidden_size=d, vocab_size=vocab_size, block_size=block_size,
                              eos_id=eos_id, rotation_seed=seed, head_sha256=head_digest(weight, bias),
                              head_bias=bias is not None, logit_softcap=head.softcap, positions=positions,
                              limit_tokens=limit_tokens)
    return sel, head


def head_arrays(head: TeacherHead) -> tuple[np.ndarray, np.ndarray | None]:
    """The head as the store keeps it: float32 numpy weight [V, d] and bias [V] or None."""
    return head.weight.cpu().numpy(), None if head.bias is None else head.bias.cpu().numpy()


def measure_reconstruction(model: Any, blocks: np.ndarray, lengths: np.ndarray, sel: ClmSelection, head: TeacherHead,
                           device: str, precision: str, encoder: FitEncoder | None = None) -> ClmSelection:
    """The selection with the reconstruction's mean KL(teacher || stored) and top-1 agreement recorded, measured
    on the first block of the corpus (its real positions) as a reader decodes it."""
    h, logits = teacher_hidden(model, torch.as_tensor(blocks[:1], device=device), precision)
    real = int(lengths[0])
    r = rotation_matrix(sel.hidden_size, sel.rotation_seed, h.device)
    stored = round_trip(h[0, :real] if r is None else h[0, :real] @ r.T, sel.hidden_codec, encoder)
    kl, top1 = kl_and_agreement(logits[0, :real], head.logits(stored))
    return sel.measured(kl, top1, real, "teacher")


@torch.no_grad()
def compute_hidden_shard(model: Any, blocks: np.ndarray, lengths: np.ndarray, rows: np.ndarray, sel: ClmSelection,
                         batch_size: int, device: str, precision: str, text: None = None,
                         encoder: FitEncoder | None = None) -> dict[str, np.ndarray]:
    """Every array of one shard's rows of a hidden-state store: the rotated hidden states leave the device once
    per shard, as float16 (what every codec encodes from; a fitted basis's `encoder` encodes them on the host).
    `text` is None: a hidden-state store keeps no block text (its selection's text_bytes is None): the argument
    is there for the one signature of shard computes."""
    hidden, kept = hidden_states(model, blocks, lengths, sel, batch_size, device, precision)
    arrays = encode_hidden(hidden, kept, sel, encoder)
    arrays.update(row=rows, text_hash=block_hashes(blocks), input_ids=blocks, length=lengths)
    return arrays


@torch.no_grad()
def hidden_states(model: Any, blocks: np.ndarray, lengths: np.ndarray, sel: ClmSelection, batch_size: int,
                  device: str, precision: str) -> tuple[np.ndarray, np.ndarray]:
    """(hidden [n, T, d] float16, rotated; kept [n, T]) of a shard's blocks, batched as the dump batches them."""
    r = rotation_matrix(sel.hidden_size, sel.rotation_seed, device)
    parts, entropies = [], []
    for start in range(0, len(blocks), batch_size):
        h, logits = teacher_hidden(model, torch.as_tensor(blocks[start:start + batch_size], device=device), precision)
        parts.append((h if r is None else h @ r.T).half())
        if sel.positions < 1.0:
            logprobs = torch.log_softmax(logits.float(), -1)
            entropies.append(-(logprobs.exp() * logprobs).sum(-1))
    hidden = torch.cat(parts).cpu().numpy()
    entropy = torch.cat(entropies).cpu().numpy() if entropies else np.zeros(hidden.shape[:2])
    return hidden, kept_positions(entropy, lengths, sel.positions)


def fit_hidden(model: Any, shards: Iterable[PackedRows], sel: ClmSelection, head: TeacherHead, kl: float,
               tokens: int, batch_size: int, device: str, precision: str) -> Fit:
    """The fitted basis of a dump: its first `tokens` kept positions (the corpus's first shards, computed as the
    dump computes them, so that a float16 dump of the corpus keeps these very states) under the stored head."""
    found, count = [], 0
    for rows in shards:
        hidden, kept = hidden_states(model, rows.blocks, rows.lengths, sel, batch_size, device, precision)
        found.append(hidden[kept])
        count += len(found[-1])
        if count >= tokens:
            break
    h = np.concatenate(found)[:tokens] if found else np.zeros((0, sel.hidden_size), dtype=np.float16)
    return fit_head(h, *head_arrays(head), head.softcap, kl, tokens)


def folded_head(fit: Fit, softcap: float | None, device: Any) -> TeacherHead:
    """The head of a fitted store's indices, on the device."""
    return TeacherHead(torch.as_tensor(fit.weight, device=device), torch.as_tensor(fit.bias, device=device), softcap)
