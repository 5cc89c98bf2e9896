"""Batches for a student with another tokenizer (`hsk train --method uld | alm`; docs/guide/lm-stores.md).

A causal-LM store keeps each block's text, where each teacher token ends in it (bytes) and the teacher's
log-prob of each next token (hskstore.format.clm, the text arrays). Per batch, on the host, the student's
tokenizer re-tokenizes the blocks' texts (one batched call of the fast tokenizer; documents are cut where the
teacher put an EOS, and the student's own EOS goes there), and the two tokenizations are aligned:

- a *shared boundary* is a byte offset where a teacher token and a student token both end; at each, the
  teacher's position (the last of its tokens ending there) and the student's predict the same thing, the
  text after that offset: the pairs `uld` and MinED compare;
- a *chunk* is the text between two consecutive shared boundaries: its log-likelihood under the teacher is
  the sum of the stored actual-token log-probs over the teacher's tokens inside it, under the student the
  same sum from its own logits (ALM, Minixhofer et al. 2025).

MinED (FuseLLM): teacher ids map onto student ids whose strings match exactly once the tokenizers' space
markers are read as spaces (`surface_strings`); the stored support's mass on mapped ids is the KL's target.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from hskstore.format.clm import BlockText, ClmSelection, LMTargets, block_texts, decode, token_ends
from hskstore.format.config import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the printable character standing for each byte -> the byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


_BYTE_OF = _bytes_to_unicode()


def _byte_level(token: str) -> str | None:
    try:
        return bytes(_BYTE_OF[ch] for ch in token).decode("utf-8")
    except (KeyError, UnicodeDecodeError):  # not a byte-level string, or part of one character
        return None


def _decoder_type(tokenizer: PreTrainedTokenizerBase) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = json.loads(backend.to_str()).get("decoder") if backend is not None else None
    if decoder and decoder.get("type") == "Sequence":
        types = [d.get("type") for d in decoder.get("decoders", [])]
        return "Metaspace" if "Metaspace" in types or "Replace" in types else types[0] if types else ""
    return (decoder or {}).get("type") or ""


# decoder type -> a vocabulary string's surface text ("##" continuation first: it wins over a word start)
def _wordpiece(token: str) -> list[str]:
    return [token[2:]] if token.startswith("##") else [" " + token, token]


SURFACES = {
    "ByteLevel": lambda token: [s] if (s := _byte_level(token)) is not None else [],
    "WordPiece": _wordpiece,
    "Metaspace": lambda token: [token.replace("▁", " ")],
}


def surface_strings(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    """Each token's text as it reads in the text (space markers 'Ġ' / '▁' as spaces; a WordPiece '##x' as x,
    a word-initial x as ' x' and x) -> its id; special tokens are left out, the first id of a text kept."""
    rule = SURFACES.get(_decoder_type(tokenizer), lambda token: [token.replace("Ġ", " ").replace("▁", " ")])
    special = set(getattr(tokenizer, "all_special_tokens", []))
    out: dict[str, int] = {}
    for token, index in sorted(tokenizer.get_vocab().items(), key=lambda item: (not item[0].startswith("##"),
                                                                              item[1])):
        if token in special:
            continue
        for text in rule(token):
            if text:
                out.setdefault(text, index)
    return out


def mined_table(teacher_tokenizer: PreTrainedTokenizerBase, student_tokenizer: PreTrainedTokenizerBase,
                teacher_vocab: int) -> np.ndarray:
    """int64 [teacher_vocab]: the student id whose string is the teacher id's exactly, -1 where none is."""
    student = surface_strings(student_tokenizer)
    table = np.full(teacher_vocab, -1, dtype=np.int64)
    for text, index in surface_strings(teacher_tokenizer).items():
        if index < teacher_vocab and text in student:
            table[index] = student[text]
    return table


def last_of_each_end(ends: np.ndarray) -> np.ndarray:
    """Indices of the last token ending at each distinct offset (ends non-decreasing)."""
    if not len(ends):
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.append(ends[1:] != ends[:-1], True))


def shared_boundaries(teacher_ends: np.ndarray, student_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(teacher positions, student positions) of the byte offsets where a token of each ends: at each, the last
    token of either side ending there, in increasing order of offset."""
    t = last_of_each_end(teacher_ends)
    s = last_of_each_end(student_ends)
    _, ti, si = np.intersect1d(teacher_ends[t], student_ends[s], assume_unique=True, return_indices=True)
    return t[ti], s[si]


@dataclass(frozen=True)
class StudentBlock:
    """A block's text as the student tokenizes it: ids and where each ends in the text (bytes)."""

    ids: np.ndarray
    ends: np.ndarray


def retokenize(tokenizer: PreTrainedTokenizerBase, blocks: list[BlockText], teacher_ids: np.ndarray, teacher_eos: int,
               student_eos: int) -> list[StudentBlock]:
    """Each block's text in the student's tokens: cut into documents where the teacher put an EOS (the student's
    EOS there, ending where the teacher's does), the pieces tokenized in one batched call."""
    pieces, where = [], []
    for b, block in enumerate(blocks):
        cuts = [int(block.ends[t]) for t in np.flatnonzero(teacher_ids[b, : block.length] == teacher_eos)]
        start = 0
        for stop in [*cuts, None]:
            end = len(block.text) if stop is None else stop
            pieces.append(block.text[start:end].decode("utf-8", errors="replace"))
            where.append((b, start, stop))
            start = end
    encoded = tokenizer(pieces, add_special_tokens=False, return_offsets_mapping=True)
    ids: list[list[int]] = [[] for _ in blocks]
    ends: list[list[np.ndarray]] = [[] for _ in blocks]
    for (b, start, stop), text, piece_ids, offsets in zip(where, pieces, encoded["input_ids"],
                                                           encoded["offset_mapping"], strict=True):
        ids[b] += [*piece_ids, *([student_eos] if stop is not None else [])]
        ends[b].append(token_ends(offsets, text) + start)
        if stop is not None:
            ends[b].append(np.array([stop], dtype=np.int64))
    return [StudentBlock(np.asarray(i, dtype=np.int64), np.concatenate(e).astype(np.int64) if e else
                         np.zeros(0, dtype=np.int64)) for i, e in zip(ids, ends, strict=True)]


@dataclass(frozen=True)
class Alignment:
    """A batch's pairs (teacher position, student flat index) and chunks, host arrays."""

    pair_rows: np.ndarray  # [P] teacher block
    pair_teacher: np.ndarray  # [P] teacher position
    pair_student: np.ndarray  # [P] student position
    chunk_rows: np.ndarray  # [C]
    chunk_start: np.ndarray  # [C] student positions start..stop-1 hold the chunk's tokens' log-probs
    chunk_stop: np.ndarray
    chunk_teacher: np.ndarray  # [C] the teacher's log-likelihood of the chunk


def align(blocks: list[BlockText], students: list[StudentBlock], width: int) -> Alignment:
    """Pairs at shared boundaries (student positions below `width`) and the chunks between consecutive ones."""
    parts: dict[str, list[np.ndarray]] = {key: [] for key in Alignment.__dataclass_fields__}
    for b, (block, student) in enumerate(zip(blocks, students, strict=True)):
        t, s = shared_boundaries(block.ends[: block.length], student.ends[:width])
        parts["pair_rows"].append(np.full(len(t), b))
        parts["pair_teacher"].append(t)
        parts["pair_student"].append(s)
        cumulative = np.concatenate([[0.0], np.cumsum(block.actual, dtype=np.float64)])
        parts["chunk_rows"].append(np.full(max(len(t) - 1, 0), b))
        parts["chunk_start"].append(s[:-1])
        parts["chunk_stop"].append(s[1:])
        parts["chunk_teacher"].append(cumulative[t[1:]] - cumulative[t[:-1]])
    return Alignment(**{key: np.concatenate(value) if value else np.zeros(0) for key, value in parts.items()})


def student_width(students: list[StudentBlock], cap: int) -> int:
    return max(1, min(cap, max(len(s.ids) for s in students)))


def student_inputs(students: list[StudentBlock], width: int, pad: int, device: str) -> dict[str, torch.Tensor]:
    """The student's inputs, next-token labels and CE mask, its blocks cut to `width`."""
    ids = np.full((len(students), width), pad, dtype=np.int64)
    length = np.zeros(len(students), dtype=np.int64)
    for b, student in enumerate(students):
        n = min(width, len(student.ids))
        ids[b, :n], length[b] = student.ids[:n], n
    ids_t, length_t = torch.as_tensor(ids, device=device), torch.as_tensor(length, device=device)
    t = torch.arange(width, device=device)[None, :]
    labels = torch.cat([ids_t[:, 1:], torch.zeros_like(ids_t[:, :1])], 1)
    return {"input_ids": ids_t, "attention_mask": (t < length_t[:, None]).long(), "labels": labels,
            "ce_mask": t + 1 < length_t[:, None]}


def support_at(targets: LMTargets, alignment: Alignment, table: np.ndarray | None, width: int,
               device: str) -> dict[str, torch.Tensor]:
    """The stored support at the pairs whose teacher position keeps one, with the student's flat positions;
    and, with a MinED table, the support mapped onto the student's ids (renormalized over the mapped ids)."""
    kept = targets.kept[alignment.pair_rows, alignment.pair_teacher]
    rows, tpos = alignment.pair_rows[kept], alignment.pair_teacher[kept]
    flat = rows * width + alignment.pair_student[kept]
    ids, probs, used = targets.ids[rows, tpos], targets.probs[rows, tpos], targets.used[rows, tpos]
    out = {"x_pos": flat, "x_probs": probs, "x_used": used, "x_tail": targets.tail[rows, tpos]}
    if table is not None:
        mapped = table[ids]
        ok = used & (mapped >= 0)
        mass = (probs * ok).sum(-1)
        some = mass > 0
        out.update(m_pos=flat[some], m_ids=np.where(ok, mapped, 0)[some],
                   m_probs=(probs * ok / np.maximum(mass, 1e-12)[:, None])[some])
    return {key: torch.as_tensor(np.ascontiguousarray(value), device=device) for key, value in out.items()}


def chunk_batch(alignment: Alignment, width: int, device: str) -> dict[str, torch.Tensor]:
    rows = alignment.chunk_rows.astype(np.int64)
    return {"c_start": torch.as_tensor(rows * (width + 1) + alignment.chunk_start.astype(np.int64), device=device),
            "c_stop": torch.as_tensor(rows * (width + 1) + alignment.chunk_stop.astype(np.int64), device=device),
            "c_teacher": torch.as_tensor(alignment.chunk_teacher.astype(np.float32), device=device)}


@dataclass
class XtokMaker:
    """raw store rows -> the student's batch with its alignment to the teacher (one batch, on the host)."""

    sel: ClmSelection
    tokenizer: PreTrainedTokenizerBase
    student_eos: int
    device: str
    table: np.ndarray | None = None
    cap: int = 0  # the most student tokens per block (0: twice the block size)

    def __call__(self, raw: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        blocks = block_texts(raw)
        students = retokenize(self.tokenizer, blocks, raw["input_ids"], self.sel.eos_id, self.student_eos)
        width = student_width(students, self.cap or 2 * self.sel.block_size)
        alignment = align(blocks, students, width)
        batch = student_inputs(students, width, self.student_eos, self.device)
        batch.update(support_at(decode(raw, self.sel), alignment, self.table, width, self.device))
        batch.update(chunk_batch(alignment, width, self.device))
        return batch

    def close(self) -> None:
        pass


def student_eos(tokenizer: PreTrainedTokenizerBase, student: str) -> int:
    """The id the student puts between documents: its EOS, else its SEP (a WordPiece vocabulary)."""
    for token_id in (tokenizer.eos_token_id, getattr(tokenizer, "sep_token_id", None)):
        if token_id is not None:
            return int(token_id)
    raise ConfigError(f"the tokenizer of {student} has no EOS or SEP token, which separates documents: add one "
                      "(`hsk student lm` gives its students one)")


def check_fast(tokenizer: PreTrainedTokenizerBase, student: str) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"the tokenizer of {student} is not a fast (Rust) tokenizer, which gives the offsets a "
                          "student with another tokenizer is aligned by: save it with tokenizer.json")
