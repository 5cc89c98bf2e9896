"""Where each token of a tokenizer batch ends in its document's UTF-8 bytes, without the tokenizer's offsets, for
a byte-level BPE (GPT-2's, SmolLM2's, Llama 3's): what the text arrays of a causal-LM store are made of
(`clm/token_bytes`, `clm/text`; pipelines/dump/corpus.py).

In a byte-level BPE every byte of the text is one symbol and each id stands for a fixed string of them, so the
tokens' byte ends are a running sum of a per-id length table over the ids of `encode_batch_fast`, which tracks
no offsets (the offsets cost about 40% of the tokenizing, then as much again to read into numpy). The sum is
then placed where the offsets place a token's end: at the end of the character holding its last byte (a
character split over tokens belongs to the first), less the spaces a ByteLevel or RoBERTa post-processor trims
from the end of a token that is not all spaces (`trim_offsets`). Where the table cannot vouch for a batch the
caller takes the offsets (the exact path): a tokenizer other than a plain byte-level BPE (a normalizer that
changes the text, a prefix space, a splitter that drops text, a vocabulary outside the byte alphabet), an added
or special token among the ids, or a document whose tokens' bytes do not add up to its own.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass

import numpy as np

_KEEP_TEXT = ("Digits", "Split", "Punctuation")  # pre-tokenizers that split without dropping (unless "Removed")
_NO_TRIM = ("TemplateProcessing", "BertProcessing")  # post-processors that leave the offsets alone
_TRIM = ("ByteLevel", "RobertaProcessing")  # those that trim a token's spaces off its offsets (trim_offsets)
# a token's trailing spaces as the Rust post-processors count them: the byte-level space's symbol (Ġ) or Unicode
# White_Space (Rust's char::is_whitespace; Python's isspace also takes U+001C-U+001F)
_TRAILING = re.compile("[\u0120\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+\\Z")


@dataclass(frozen=True)
class ByteTable:
    """A byte-level BPE's ids as bytes: how many UTF-8 bytes each id stands for, how many trailing spaces the
    post-processor trims from its end offset, and the ids it cannot vouch for (added tokens that take in the
    whitespace beside them, ids the vocabulary lacks)."""

    lengths: np.ndarray  # int64 [ids]
    trimmed: np.ndarray | None  # int64 [ids], None when nothing is trimmed
    first_trimmed: np.ndarray | None  # int64 [ids]: the same for a text's first token (see _first_trimmed)
    unknown: np.ndarray  # bool [ids]
    nfc: bool  # the normalizer is NFC: only texts already in NFC are the tokenizer's own bytes


def byte_table(backend) -> ByteTable | None:
    """The table of a fast tokenizer's Rust backend that is a plain byte-level BPE, else None."""
    from tokenizers import pre_tokenizers

    spec = {part: _spec(getattr(backend, part)) for part in ("normalizer", "pre_tokenizer", "post_processor")}
    trims = _trimming(spec["post_processor"])
    model = backend.model
    if (type(model).__name__ != "BPE" or model.continuing_subword_prefix or model.end_of_word_suffix
            or trims is None or not _byte_level(spec["pre_tokenizer"]) or not _plain(spec["normalizer"])):
        return None
    added = backend.get_added_tokens_decoder()
    pieces = {i: token for token, i in backend.get_vocab(with_added_tokens=False).items() if i not in added}
    if not set("".join(pieces.values())) <= set(pre_tokenizers.ByteLevel.alphabet()):
        return None
    size = max([*pieces, *added], default=-1) + 1
    lengths, trimmed, unknown = np.zeros(size, np.int64), np.zeros(size, np.int64), np.ones(size, bool)
    ids = np.fromiter(pieces, dtype=np.int64, count=len(pieces))
    lengths[ids] = np.fromiter(map(len, pieces.values()), dtype=np.int64, count=len(pieces))
    unknown[ids] = False
    strings = dict(pieces) | {i: token.content for i, token in added.items()}
    for i, token in added.items():  # its offsets are its text's span unless it takes in the whitespace beside it
        lengths[i], unknown[i] = len(token.content.encode("utf-8")), token.lstrip or token.rstrip
    if not trims[0]:
        return ByteTable(lengths, None, None, unknown, spec["normalizer"] is not None)
    first = trimmed.copy()
    for i, token in strings.items():
        trimmed[i], first[i] = _trailing_spaces(token), _first_trimmed(token, trims[1])
    return ByteTable(lengths, trimmed, first, unknown, spec["normalizer"] is not None)


def _spec(component) -> dict | None:
    """A tokenizer component's own JSON (the whole tokenizer's holds the vocabulary too: slow to parse)."""
    return None if component is None else json.loads(component.__getstate__())


def _byte_level(pre: dict | None) -> bool:
    """One ByteLevel pre-tokenizer without a prefix space, beside only splitters that keep all the text."""
    members = _members(pre or {})
    levels = [m for m in members if m.get("type") == "ByteLevel"]
    others = [m for m in members if m.get("type") != "ByteLevel"]
    return len(levels) == 1 and not levels[0].get("add_prefix_space") and all(map(_keeps_text, others))


def _members(pre: dict) -> list[dict]:
    """A pre-tokenizer's parts: a Sequence's members, else itself."""
    return [m or {} for m in pre.get("pretokenizers", [pre])] if pre.get("type") == "Sequence" else [pre]


def _keeps_text(splitter: dict) -> bool:
    """A pre-tokenizer that splits without removing any of the text ({}: none, which keeps nothing)."""
    return splitter.get("type") in _KEEP_TEXT and splitter.get("behavior") != "Removed"


def _plain(normalizer: dict | None) -> bool:
    """No normalizer, or NFC (checked text by text: a text already in NFC is left as it is)."""
    return normalizer is None or normalizer.get("type") == "NFC"


def _trimming(post: dict | None) -> tuple[bool, bool] | None:
    """(whether the post-processor trims spaces off tokens' offsets, whether it counts a prefix space), or None
    for a post-processor this table does not know (or two that trim)."""
    if post is None or post.get("type") in _NO_TRIM:
        return False, False
    if post.get("type") in _TRIM:
        return bool(post.get("trim_offsets", True)), bool(post.get("add_prefix_space", True))
    if post.get("type") == "Sequence":
        found = [_trimming(p) for p in post.get("processors", [])]
        trimming = [f for f in found if f and f[0]]
        return None if None in found or len(trimming) > 1 else (trimming or [(False, False)])[0]
    return None


def _trailing_spaces(token: str) -> int:
    """The spaces trimming takes off a token's end offset: its trailing ones (the byte-level space's symbol or
    whitespace), none for a token of spaces only (its start moves to its end first, and the end never goes below
    the start)."""
    kept = _TRAILING.sub("", token)
    return len(token) - len(kept) if kept else 0


def _first_trimmed(token: str, prefix_space: bool) -> int:
    """The same for a text's first token: with a prefix space counted, one leading space is taken for the one
    the pre-tokenizer would have added and left in the span, so a token of one space ends where it starts."""
    return 1 if prefix_space and len(token) == 1 and _TRAILING.match(token) else _trailing_spaces(token)


def table_ends(table: ByteTable, ids: np.ndarray, counts: np.ndarray, texts: list[str], data: list[bytes]
               ) -> tuple[np.ndarray, np.ndarray]:
    """(ends, vouched): which texts the table vouches for (bool per text; not: one with an id it does not know, a
    text not in NFC under an NFC normalizer, one whose tokens' bytes are not its own), and the byte ends of their
    tokens in their joined UTF-8 bytes as the tokenizer's offsets give them (documents_owned's ends), from the
    batch's `ids` (concatenated; `counts` per text; `data`: each text's UTF-8)."""
    n = len(texts)
    doc = np.repeat(np.arange(n), counts)
    sizes = np.fromiter(map(len, data), dtype=np.int64, count=n)
    base = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=base[1:])
    known = np.minimum(ids, len(table.unknown) - 1)
    running = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(table.lengths[known], out=running[1:])
    first = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=first[1:])
    vouched = (running[first[1:]] - running[first[:-1]] == sizes) & (counts > 0)
    vouched &= np.bincount(doc, weights=(ids >= len(table.unknown)) | table.unknown[known], minlength=n) == 0
    if table.nfc:
        vouched &= np.fromiter((unicodedata.is_normalized("NFC", text) for text in texts), dtype=bool, count=n)
    ends = running[1:] - running[first[:-1]][doc] + base[doc]  # in the whole batch's bytes
    joined = b"".join(data)
    if not joined.isascii():
        ends = _character_ends(np.clip(ends, 0, len(joined)), joined)
    if table.trimmed is not None:  # a trimmed end follows a space: a character's end already
        heads = first[:-1][counts > 0]
        ends = ends - table.trimmed[known]
        ends[heads] += table.trimmed[known[heads]] - table.first_trimmed[known[heads]]
    kept = np.where(vouched, sizes, 0)
    shift = base[:-1] - (np.cumsum(kept) - kept)  # the vouched texts' bytes joined without the others'
    return np.maximum.accumulate((ends - shift[doc])[vouched[doc]]), vouched


def _character_ends(ends: np.ndarray, joined: bytes) -> np.ndarray:
    """Each end moved to the end of the character holding the byte before it (an offset counts characters): an
    end at a continuation byte (10xxxxxx) moves on to the next character's start, at most 3 bytes on."""
    codes = np.frombuffer(joined, dtype=np.uint8)
    moved, at = ends, np.flatnonzero(ends < len(codes))
    for _ in range(3):
        at = at[(codes[moved[at]] & 0xC0) == 0x80]
        if not len(at):
            break
        moved = moved.copy() if moved is ends else moved
        moved[at] += 1
        at = at[moved[at] < len(codes)]
    return moved
