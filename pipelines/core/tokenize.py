"""Tokenize task texts into fixed-width id arrays (the store keeps them, so students need no text).

A fast (Rust) tokenizer is called directly: its batch encoding, truncated in Rust and unpadded,
is written into zero-filled arrays. That halves tokenizing's CPU against the transformers call
(benchmarks/dump/dump_ceiling.py), which builds a Python dict per row and pads, and it gives the same
arrays (tests/test_tokenize.py checks both on five GLUE tasks and edge cases). Tokenizers without a Rust backend,
or set to truncate or pad on the left, take the transformers call.

Rows that are pure ASCII (88% of QNLI's pairs, 99% of SST-2's sentences) go through a second copy whose BERT
normalizer skips the two passes that cannot change ASCII text (accent stripping, which decomposes every
character to Unicode NFD first, and CJK spacing): faster, and the same ids.
"""

from __future__ import annotations

import copy
import threading
import weakref

import numpy as np

_BACKENDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {(max_length, size): backend}
_LOCK = threading.Lock()


def encode(tokenizer, texts: tuple[list[str], ...], max_length: int) -> dict[str, np.ndarray]:
    """Tokenize one or two text columns, truncating to max_length and padding to it.

    Returns int32 input_ids / token_type_ids [N, max_length] and int32 lengths [N] (number of
    real tokens, [CLS] and [SEP] included).
    """
    backends = _rust_backend(tokenizer, max_length) if len(texts) in (1, 2) else None
    if backends is None:
        return encode_reference(tokenizer, texts, max_length)
    rows = list(texts[0]) if len(texts) == 1 else list(zip(*texts, strict=True))
    encodings = _encode_rows(rows, texts, *backends)
    n = len(encodings)
    input_ids = np.zeros((n, max_length), dtype=np.int32)
    token_type_ids = np.zeros((n, max_length), dtype=np.int32)
    length = np.empty(n, dtype=np.int32)
    for i, enc in enumerate(encodings):
        ids = enc.ids
        k = len(ids)  # unpadded: every token is real
        input_ids[i, :k] = ids
        token_type_ids[i, :k] = enc.type_ids
        length[i] = k
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "length": length}


def encode_reference(tokenizer, texts: tuple[list[str], ...], max_length: int) -> dict[str, np.ndarray]:
    """`encode` through the transformers call (any tokenizer; the reference the fast path must match)."""
    enc = tokenizer(
        *texts,
        truncation=True,
        max_length=max_length,
        padding="max_length",
        return_token_type_ids=True,
        return_attention_mask=True,
        return_tensors="np",
    )
    return {
        "input_ids": enc["input_ids"].astype(np.int32),
        "token_type_ids": enc["token_type_ids"].astype(np.int32),
        "length": enc["attention_mask"].sum(axis=1).astype(np.int32),
    }


def _encode_rows(rows: list, texts: tuple[list[str], ...], backend, ascii_backend) -> list:
    """The Rust encodings of `rows`, in order: pure-ASCII rows through `ascii_backend` where there is one."""
    if ascii_backend is None:
        return backend.encode_batch_fast(rows, add_special_tokens=True)
    plain = [all(t.isascii() for t in row) for row in zip(*texts)]  # str.isascii: a flag, not a scan
    if all(plain):
        return ascii_backend.encode_batch_fast(rows, add_special_tokens=True)
    done = {
        flag: iter(b.encode_batch_fast([r for r, p in zip(rows, plain) if p == flag], add_special_tokens=True))
        for flag, b in ((True, ascii_backend), (False, backend))
    }
    return [next(done[p]) for p in plain]


def _ascii_normalizer(normalizer):
    """The BERT normalizer without its no-op passes on ASCII text, or None for any other normalizer."""
    from tokenizers.normalizers import BertNormalizer

    if type(normalizer) is not BertNormalizer:
        return None
    return BertNormalizer(clean_text=normalizer.clean_text, handle_chinese_chars=False, strip_accents=False,
                          lowercase=normalizer.lowercase)


def _rust_backend(tokenizer, max_length: int):
    """Private copies of the tokenizer's Rust backend, truncating like the transformers call: (any row's, pure
    ASCII rows' or None), or None when the transformers call must be taken."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "truncation_side", "right") != "right" \
            or getattr(tokenizer, "padding_side", "right") != "right" or tokenizer.pad_token_id != 0 \
            or getattr(tokenizer, "pad_token_type_id", 0) != 0:
        return None  # a pad id other than 0 would not be the zeros the arrays start as
    key = (max_length, len(tokenizer))  # a token added since the copy was made asks for a new one
    with _LOCK:  # a copy per key: configuring one is not thread-safe, encoding with it is
        copies = _BACKENDS.setdefault(tokenizer, {})
        if key not in copies:
            own = copy.deepcopy(backend)
            own.enable_truncation(max_length, strategy="longest_first", direction="right")
            own.no_padding()
            light = _ascii_normalizer(own.normalizer)
            plain = None
            if light is not None:
                plain = copy.deepcopy(own)
                plain.normalizer = light
            copies[key] = (own, plain)
        return copies[key]
