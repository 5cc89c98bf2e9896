"""`encode` calls the Rust tokenizer directly: the arrays must equal the transformers call's, row for row."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.core.data import load_examples
from pipelines.core.models import load_tokenizer, resolve_model
from pipelines.core.tasks import get_task
from pipelines.core.tokenize import _rust_backend, encode, encode_reference


def same(tokenizer, texts, max_length: int) -> None:
    fast, ref = encode(tokenizer, texts, max_length), encode_reference(tokenizer, texts, max_length)
    assert fast.keys() == ref.keys()
    for name in ref:
        assert fast[name].dtype == ref[name].dtype and np.array_equal(fast[name], ref[name]), name


@pytest.fixture(scope="module")
def minilm():
    return load_tokenizer(resolve_model("minilm"))


@pytest.mark.parametrize("task", ["cola", "mrpc", "qnli", "sst2", "stsb"])  # the tasks ../shared holds
def test_every_glue_task_tokenizes_as_transformers_does(minilm, glue_dir, task):
    examples = load_examples(get_task(task), "dev", data_dir=str(glue_dir), limit=300)
    assert _rust_backend(minilm, 128) is not None
    same(minilm, examples.texts, 128)
    same(minilm, examples.texts, 24)  # most rows truncated: longest_first on pairs


def test_edge_cases_tokenize_as_transformers_does(minilm):
    first = ["", "[SEP] [PAD] [CLS] literal special tokens", "Ünïcödé — 東京 ﬁ", "word " * 400, "a", "x y"]
    second = ["b " * 300, "", "[MASK]", "short", "c " * 70, "🙂 emoji"]
    for max_length in (8, 16, 128):
        same(minilm, (first,), max_length)
        same(minilm, (first, second), max_length)


def test_ascii_rows_take_their_own_copy_and_keep_their_place(minilm):
    """Pure-ASCII rows go through the light normalizer, others (accents stripped, CJK spaced) through the full one,
    interleaved in one batch; the ids are the transformers call's, row for row."""
    full, plain = _rust_backend(minilm, 32)
    assert plain is not None and plain.normalizer.strip_accents is False and full.normalizer.strip_accents is None
    first = ["Café naïve", "plain words", "\x07bell\tand\x00 controls", "東京 tower", "UPPER Case", "résumé"]
    second = ["ascii", "Ångström", "more words", "x", "Zürich", "y"]
    same(minilm, (first,), 32)
    same(minilm, (first, second), 32)
    same(minilm, (["only", "ascii", "rows"],), 32)
    same(minilm, (["ñ", "ö"],), 32)


def test_tokenizers_set_to_the_left_take_the_transformers_call(tiny_tokenizer):
    tok = load_tokenizer(str(tiny_tokenizer))
    texts = (["the cat sat on the mat again and again"], ["a dog"])
    assert _rust_backend(tok, 6) is not None
    same(tok, texts, 6)
    tok.truncation_side = "left"
    assert _rust_backend(tok, 6) is None
    assert encode(tok, texts, 6)["input_ids"].tolist() == encode_reference(tok, texts, 6)["input_ids"].tolist()


def test_a_token_added_after_first_use_is_seen(tiny_tokenizer):
    tok = load_tokenizer(str(tiny_tokenizer))
    texts = (["the zorblat sat"],)
    same(tok, texts, 8)
    tok.add_tokens(["zorblat"])
    same(tok, texts, 8)
    assert encode(tok, texts, 8)["input_ids"][0, 2] == len(tok) - 1
