"""Tokenize task texts into fixed-width id arrays (the store keeps them, so students need no text).

A fast (Rust) tokenizer is called directly: its batch encoding, truncated in Rust and unpadded,
is written into zero-filled arrays. That halves tokenizing's CPU against the transformers call
(benchmarks/dump_ceiling.py), which builds a Python dict per row and pads, and it gives the same
arrays (tests/test_tokenize.py checks both on five GLUE tasks and edge cases). Tokenizers without a Rust backend,
or set to truncate or pad on the left, take the transformers call.
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
    backend = _rust_backend(tokenizer, max_length) if len(texts) in (1, 2) else None
    if backend is None:
        return encode_reference(tokenizer, texts, max_length)
    rows = list(texts[0]) if len(texts) == 1 else list(zip(*texts, strict=True))
    encodings = backend.encode_batch_fast(rows, add_special_tokens=True)
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


def _rust_backend(tokenizer, max_length: int):
    """A private copy of the tokenizer's Rust backend, truncating like the transformers call, or None."""
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
            copies[key] = own
        return copies[key]
