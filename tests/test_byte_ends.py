"""A byte-level BPE's token byte ends from its ids alone (pipelines/dump/byte_ends.py) are the ones its offsets
give (the exact path, documents_owned), on text made to break them: emojis and ZWJ sequences, combining
characters, CRLF, runs of spaces and tabs, NBSP, CJK and Arabic, digits, added and special tokens; for the
tokenizer layouts of GPT-2 (offsets trimmed), SmolLM2 (digits split), Llama 3 (a regex split) and Qwen2 (NFC);
texts the table cannot vouch for take the offsets, and tokenizers it does not know are left to them."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from pipelines.dump.byte_ends import byte_table, table_ends
from pipelines.dump.corpus import encode_owned, text_table

TRICKY = [
    "héllo wörld 😀 👩‍👩‍👧 e\u0301 a\u0308\u0323 ok", "line\r\nnext\rcr\n\nend", "  lead  and   trail  ",
    "\t tabs\u00a0nbsp\u2009thin\u3000wide", "日本語のテキスト 中文", "مرحبا بالعالم", "1234567890 3.14 -7", "é", "😀",
    "\u0301 starts combining", "a\n\n  b  \n c", "<|im_start|>user hi<|im_end|> x", "mixed <eos>é😀<eos>",
    "<mask> masked  <mask>", "x" * 300, "🇫🇷🇩🇪 flags", "Ġ literal symbol Ċ", "zero\u200bwidth",
]
ALPHABET = list("ab xyz 01 é€😀\u0301\t\r\n\u00a0日") + ["  ", "<eos>", "<|im_start|>", "<mask>"]


def _random_texts(seed: int, n: int = 60) -> list[str]:
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(ALPHABET, rng.integers(1, 40))) for _ in range(n)]


def _trained(pre, post, normalizer=None, extra: tuple[str, ...] = ()) -> Tokenizer:
    """A byte-level BPE of 400 ids trained on the tricky texts (merges across multi-byte characters), with the
    special tokens <eos> and <|im_start|>, <|im_end|>, and <mask> that takes in the spaces on its left."""
    from tokenizers import AddedToken

    tok = Tokenizer(models.BPE())
    tok.normalizer, tok.pre_tokenizer, tok.post_processor = normalizer, pre, post
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TRICKY * 3 + _random_texts(99, 200) + list(extra), trainer)
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True)])
    return tok


LAYOUTS = {
    "gpt2": lambda: _trained(pre_tokenizers.ByteLevel(add_prefix_space=False),
                             processors.ByteLevel(trim_offsets=True)),
    "smollm2": lambda: _trained(pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                         pre_tokenizers.ByteLevel(add_prefix_space=False)]),
                                processors.TemplateProcessing(single="$A", pair="$A $B")),
    "llama3": lambda: _trained(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+| ?\p{L}+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), processors.ByteLevel(trim_offsets=False)),
    "qwen2": lambda: _trained(pre_tokenizers.ByteLevel(add_prefix_space=False), None, normalizers.NFC()),
}


def _fast(tok: Tokenizer):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def _same_both_ways(tokenizer, texts: list[str]) -> None:
    table = text_table(tokenizer)
    assert table is not None
    data = [t.encode("utf-8") for t in texts]
    fast_ids, fast_owned = encode_owned(tokenizer, texts, data, table)
    exact_ids, exact_owned = encode_owned(tokenizer, texts, data, None)
    assert fast_ids == exact_ids
    for text, fast, exact in zip(texts, fast_owned, exact_owned, strict=True):
        np.testing.assert_array_equal(fast, exact, err_msg=repr(text))


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def layout(request):
    return request.param, _fast(LAYOUTS[request.param]())


def test_the_table_gives_the_offsets_ends_on_tricky_and_random_text(layout):
    _, tokenizer = layout
    _same_both_ways(tokenizer, TRICKY)
    for seed in range(5):
        _same_both_ways(tokenizer, _random_texts(seed))


def test_the_table_vouches_for_plain_text_and_leaves_the_rest_to_the_offsets(layout):
    """Texts of plain byte-level tokens are the table's; one holding a token that takes in the spaces beside it
    (<mask>, lstrip) goes to the offsets, and under an NFC normalizer so does one not in NFC (e + combining
    acute); special tokens that keep to their own text are the table's."""
    name, tokenizer = layout
    texts = ["plain words 😀 and é", "a <mask> b", "e\u0301 decomposed", "chat <|im_start|>hi<|im_end|>"]
    table = text_table(tokenizer)
    ids = [tokenizer.backend_tokenizer.encode(t, add_special_tokens=False).ids for t in texts]
    counts = np.array([len(i) for i in ids])
    _, vouched = table_ends(table, np.concatenate(ids), counts, texts, [t.encode() for t in texts])
    assert vouched.tolist() == [True, False, name != "qwen2", True]
    _same_both_ways(tokenizer, texts)


def test_trimmed_offsets_move_a_trailing_space_to_the_next_token():
    """GPT-2's post-processor trims a token's trailing spaces off its end: "\\n\\n " then "b" -> the space is
    owned by the token after it, as the offsets say (the table subtracts it)."""
    tok = _trained(pre_tokenizers.ByteLevel(add_prefix_space=False), processors.ByteLevel(trim_offsets=True),
                   extra=("a\n\n b",) * 50)  # merges up to "\n\n " (ĊĊĠ): a token with content, then a space
    tokenizer = _fast(tok)
    table = text_table(tokenizer)
    assert table.trimmed is not None and table.trimmed.any()
    _same_both_ways(tokenizer, ["a\n\n  b", "x  \n\n   y", "end  "])


@pytest.mark.parametrize("changed", ["prefix-space", "metaspace", "wordlevel", "suffix", "strip-normalizer"])
def test_tokenizers_the_table_does_not_know_are_left_to_the_offsets(changed):
    """A prefix space (a byte the text lacks), Metaspace (no byte alphabet), a word-level model, an
    end-of-word suffix, a normalizer that changes the text: no table, the offsets give the ends."""
    if changed == "wordlevel":
        tok = Tokenizer(models.WordLevel({"a": 0, "<eos>": 1}, unk_token="<eos>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    elif changed == "suffix":
        tok = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        pre = {"prefix-space": pre_tokenizers.ByteLevel(add_prefix_space=True),
               "metaspace": pre_tokenizers.Metaspace()}.get(changed, pre_tokenizers.ByteLevel(add_prefix_space=False))
        tok = _trained(pre, None, normalizers.Strip() if changed == "strip-normalizer" else None)
    assert byte_table(tok) is None
    tokenizer = _fast(tok)
    assert text_table(tokenizer) is None
    texts = ["plain  words é 😀", " lead"]
    ids, owned = encode_owned(tokenizer, texts, [t.encode() for t in texts], None)
    assert [int(o.sum()) for o in owned] == [len(t.encode()) for t in texts]
