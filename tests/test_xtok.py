"""Students with another tokenizer (pipelines/methods/xtok.py, pipelines/train/data/xtok.py): the store's text
arrays against the teacher, the alignment of two real tokenizers at shared byte boundaries, the losses pinned
to their definitions, training with each method, the refusals, and bits per byte."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import corpus_lines, save_tiny_causal_lm

from hskstore import open_store
from hskstore.format.clm import ACTUAL, TEXT, TOKEN_BYTES, pack_token_bytes, token_ends
from pipelines.cli import main
from pipelines.train.data import xtok
from pipelines.train.losses import lm

ODD = "Café déjà-vu: naïve résumé costs €5 — ok  ☕!"


def build_wordpiece_tokenizer(out_dir: Path, texts: list[str], vocab_size: int = 500) -> Path:
    """A cased WordPiece vocabulary trained on `texts` (BERT's pre-tokenizer), [SEP] as its EOS."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=["[UNK]", "[SEP]"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", sep_token="[SEP]",
                            eos_token="[SEP]").save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def xcorpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("xcorpus") / "corpus.txt"
    path.write_text("\n".join([ODD, *corpus_lines(80)]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def xstore(tmp_path_factory, clm_teacher, xcorpus) -> Path:
    out = tmp_path_factory.mktemp("xstore") / "top8.zarr"
    assert main(["dump", "--objective", "clm", "--teacher", str(clm_teacher), "--text-file", str(xcorpus),
                 "--support", "topk:8", "--block-size", "64", "--shard-rows", "16", "--batch-size", "8",
                 "--no-progress", "--device", "cpu", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory) -> Path:
    return build_wordpiece_tokenizer(tmp_path_factory.mktemp("wordpiece"), [ODD, *corpus_lines(500)])


@pytest.fixture(scope="module")
def wordpiece_student(tmp_path_factory, wordpiece) -> Path:
    return save_tiny_causal_lm(tmp_path_factory.mktemp("wp_student"), wordpiece, "llama", seed=1)


def _docs(corpus: Path) -> list[str]:
    return [line.strip() for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]


# --- the store: text, offsets, actual-token log-probs ---------------------------------------------------------


def test_the_store_keeps_the_text_offsets_and_the_teachers_actual_logprobs(xstore, clm_teacher, xcorpus):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert main(["verify", str(xstore)]) == 0
    store = open_store(str(xstore))
    data = store.read(slice(None))
    texts = store.texts(data)
    docs = _docs(xcorpus)
    assert b"".join(t.text for t in texts) == "".join(docs).encode("utf-8")  # every byte, in order
    tokenizer = AutoTokenizer.from_pretrained(clm_teacher)
    first = tokenizer(ODD, add_special_tokens=False, return_offsets_mapping=True)
    ends = token_ends(first["offset_mapping"], ODD)
    n = len(ends)
    np.testing.assert_array_equal(texts[0].ends[:n], ends)  # where each teacher token ends, in bytes
    assert texts[0].ends[n] == len(ODD.encode("utf-8"))  # the EOS ends its document
    start, since = 0, 0
    for t in range(n):  # the bytes up to each token's end are its text (tokens of one character: the last owns it)
        if t + 1 == n or texts[0].ends[t + 1] > texts[0].ends[t]:
            assert texts[0].text[start:texts[0].ends[t]].decode() == tokenizer.decode(first["input_ids"][since:t + 1])
            start, since = texts[0].ends[t], t + 1
    model = AutoModelForCausalLM.from_pretrained(clm_teacher, dtype=torch.float32).eval()
    ids = torch.as_tensor(data["input_ids"].astype(np.int64))
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=ids).logits, -1)
    expected = full[:, :-1].gather(-1, ids[:, 1:, None])[..., 0].numpy()
    real = np.arange(63)[None, :] + 1 < data["length"][:, None]
    np.testing.assert_allclose(data[ACTUAL][:, :-1][real], expected[real], atol=2e-3, rtol=1e-3)  # float16
    assert (data[ACTUAL][:, :-1][~real] == 0).all() and (data[ACTUAL][:, -1] == 0).all()


def test_token_bytes_partition_the_documents():
    texts = ["ab cd", "é"]
    ends = [np.array([2, 5]), np.array([2])]
    token_bytes, blocks = pack_token_bytes(ends, texts, 3)
    np.testing.assert_array_equal(token_bytes, [[2, 3, 0], [2, 0, 0]])  # ab, ' cd', EOS; é, EOS, padding
    assert blocks == [b"ab cd", "é".encode()]
    np.testing.assert_array_equal(token_ends([(0, 1), (1, 2)], "é€"), [2, 5])  # characters -> UTF-8 bytes


def test_info_counts_the_actual_logprobs_as_knowledge_and_the_text_apart(xstore):
    store = open_store(str(xstore))
    report = store.storage_report()
    arrays = report["arrays"]
    assert {ACTUAL, TOKEN_BYTES, TEXT} <= set(arrays)
    clm = sum(a["stored"] for name, a in arrays.items() if name.startswith("clm/"))
    assert report["knowledge_bytes"] == clm - arrays[TOKEN_BYTES]["stored"] - arrays[TEXT]["stored"]


# --- alignment of two real tokenizers --------------------------------------------------------------------------


def _ends_of(tokenizer, text: str) -> np.ndarray:
    return token_ends(tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"], text)


def test_stored_offsets_align_a_wordpiece_to_the_teacher_at_every_shared_boundary(xstore, wordpiece, clm_teacher):
    from transformers import AutoTokenizer

    store = open_store(str(xstore))
    data = store.read(slice(0, 1))
    block = store.texts(data)[0]
    student_tok = AutoTokenizer.from_pretrained(wordpiece)
    student = xtok.retokenize(student_tok, [block], data["input_ids"], store.clm.eos_id,
                              student_tok.sep_token_id)[0]
    t, s = xtok.shared_boundaries(block.ends[: block.length], student.ends)
    # independently: the offsets where both tokenizers end a token in the test string
    teacher_ends = set(_ends_of(AutoTokenizer.from_pretrained(clm_teacher), ODD).tolist())
    student_ends = set(_ends_of(student_tok, ODD).tolist())
    inside = len(ODD.encode())
    shared = sorted((teacher_ends & student_ends) | {inside})  # the document's end: both EOS there
    found = block.ends[t]
    assert found[found <= inside].tolist() == shared
    np.testing.assert_array_equal(block.ends[t], student.ends[s])
    assert len(shared) < len(teacher_ends)  # the tokenizers differ: some teacher boundaries are not shared
    assert student.ids[len(_ends_of(student_tok, ODD))] == student_tok.sep_token_id  # its EOS ends the document
    text = block.text
    for a, b in zip(np.r_[0, found[:-1]], found, strict=True):  # each chunk reads the same in both
        assert text[a:b].decode("utf-8")


def test_mined_maps_ids_by_their_strings(wordpiece, clm_teacher):
    from transformers import AutoTokenizer

    teacher, student = AutoTokenizer.from_pretrained(clm_teacher), AutoTokenizer.from_pretrained(wordpiece)
    table = xtok.mined_table(teacher, student, len(teacher))
    student_vocab = {i: tok for tok, i in student.get_vocab().items()}
    mapped = np.flatnonzero(table >= 0)
    assert len(mapped) > 50
    for index in mapped:
        text = teacher.decode([int(index)])
        token = student_vocab[int(table[index])]
        assert text == (token[2:] if token.startswith("##") else token) or text == " " + token
    the = teacher.convert_tokens_to_ids("Ġthe")
    assert student_vocab[int(table[the])] == "the"  # 'Ġ' read as the space a WordPiece word starts with


# --- the losses, pinned ---------------------------------------------------------------------------------------


def test_uld_is_the_l1_of_sorted_probabilities_zero_padded():
    """With the whole teacher distribution stored, the paper's formula: both vectors sorted, the shorter
    (the teacher's 3 ids) padded with zeros to the student's 5."""
    p = torch.tensor([[0.2, 0.5, 0.3]])
    q = torch.tensor([[0.05, 0.4, 0.1, 0.25, 0.2]])
    expected = abs(0.5 - 0.4) + abs(0.3 - 0.25) + abs(0.2 - 0.2) + 0.1 + 0.05
    used = torch.ones_like(p, dtype=torch.bool)
    assert float(lm.uld_l1(q, p, used, tail=True)[0]) == pytest.approx(expected)
    # a top-2 support: the teacher's tail (0.2) against the student's mass past its top 2 (0.35)
    top2 = torch.tensor([[0.5, 0.3]])
    assert float(lm.uld_l1(q, top2, used[:, :2], tail=True)[0]) == pytest.approx(0.1 + 0.05 + abs(0.2 - 0.35))
    assert float(lm.uld_l1(p, p, used, tail=True)[0]) == pytest.approx(0.0)
    # permuting ids changes nothing: no id is compared
    assert float(lm.uld_l1(q[:, [4, 3, 2, 1, 0]], p, used, tail=True)[0]) == pytest.approx(expected)


def test_alm_binary_kl_is_the_bernoulli_kl_of_chunk_likelihoods():
    p, q = torch.tensor([0.5, 0.9, 1e-6]), torch.tensor([0.25, 0.9, 0.3])
    expected = p * torch.log(p / q) + (1 - p) * torch.log((1 - p) / (1 - q))
    got = lm.binary_kl(torch.log(p), torch.log(q))
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    assert float(got[1]) == pytest.approx(0.0, abs=1e-6)
    assert float(lm.binary_kl(torch.tensor([-1e-9]), torch.tensor([-50.0]))[0]) > 40  # p ~ 1, q ~ 0: large


def test_chunk_loglikelihoods_sum_the_tokens_between_shared_boundaries():
    block = xtok.BlockText(b"abcdef", np.array([2, 3, 6]), np.array([-1.0, -2.0, 0.0], dtype=np.float32), 3)
    student = xtok.StudentBlock(np.array([5, 6, 7, 8]), np.array([1, 2, 4, 6]))
    alignment = xtok.align([block], [student], 8)
    assert alignment.pair_teacher.tolist() == [0, 2] and alignment.pair_student.tolist() == [1, 3]
    # one chunk "cdef": teacher tokens 'c', 'def' -> log p = actual[0] + actual[1]; student tokens 'cd', 'ef'
    assert alignment.chunk_teacher.tolist() == [-3.0]
    assert (alignment.chunk_start.tolist(), alignment.chunk_stop.tolist()) == ([1], [3])


def test_mapped_ce_is_the_kl_less_the_teachers_entropy():
    q = torch.log_softmax(torch.tensor([[1.0, 2.0, 0.5, -1.0]]), -1)
    ids, p = torch.tensor([[1, 3]]), torch.tensor([[0.75, 0.25]])
    kl = float((p * (p.log() - q.gather(-1, ids))).sum())
    entropy = float(-(p * p.log()).sum())
    assert float(lm.mapped_ce(q, ids, p)[0]) == pytest.approx(kl + entropy)


# --- training and refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize("method, extra", [("uld", ()), ("alm", ()), ("alm", ("--set", "mined=0"))])
def test_a_student_with_another_vocabulary_trains_with_each_method(xstore, wordpiece_student, tmp_path, method,
                                                                   extra):
    out = tmp_path / "run"
    assert main(["train", "--store", str(xstore), "--student", str(wordpiece_student), "--method", method,
                 "--max-steps", "4", "--batch-size", "4", "--device", "cpu", "--out", str(out), *extra]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    terms = [r["terms"] for r in records if "terms" in r]
    names = {"uld": {"ce", "kd"}, "alm": {"ce", "alm", "mined"} - ({"mined"} if extra else set())}[method]
    assert terms and set(terms[-1]) == names, terms
    assert all(math.isfinite(v) and v >= 0 for t in terms for v in t.values())
    assert json.loads((out / "summary.json").read_text())["steps"] == 4


def test_clm_kd_refuses_another_vocabulary_naming_the_methods_that_take_one(xstore, wordpiece_student, tmp_path,
                                                                            capsys):
    assert main(["train", "--store", str(xstore), "--student", str(wordpiece_student), "--method", "clm-kd",
                 "--max-steps", "2", "--device", "cpu", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--method alm or uld" in err[0], err
    assert not (tmp_path / "run").exists()


def test_a_store_without_the_text_is_refused_naming_the_redump(clm_teacher, xcorpus, wordpiece_student, tmp_path,
                                                               capsys, monkeypatch):
    """A store written as before the text arrays (the dump's tokenization without offsets) still reads and
    trains clm-kd; uld refuses it in one line naming the re-dump, its files untouched."""
    from pipelines.dump import clm as dump_clm

    monkeypatch.setattr(dump_clm, "text_bytes_bound", lambda *args: None)  # as a slow tokenizer's dump
    old = tmp_path / "old.zarr"
    assert main(["dump", "--objective", "clm", "--teacher", str(clm_teacher), "--text-file", str(xcorpus),
                 "--support", "topk:4", "--block-size", "32", "--limit", "20", "--no-progress", "--device", "cpu",
                 "--out", str(old)]) == 0
    store = open_store(str(old))
    assert store.clm.text_bytes is None and ACTUAL not in store.specs
    assert main(["verify", str(old)]) == 0
    capsys.readouterr()
    before = {p: p.read_bytes() for p in old.rglob("*") if p.is_file()}
    assert main(["train", "--store", str(old), "--student", str(wordpiece_student), "--method", "uld",
                 "--max-steps", "2", "--device", "cpu", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "re-dump" in err[0] and "hsk dump --objective clm" in err[0], err
    assert before == {p: p.read_bytes() for p in old.rglob("*") if p.is_file()}
    assert not (tmp_path / "run").exists()
    assert main(["train", "--store", str(old), "--student", "first1", "--method", "clm-kd", "--max-steps", "2",
                 "--device", "cpu", "--out", str(tmp_path / "kd")]) == 0


# --- evaluation across tokenizers -----------------------------------------------------------------------------


def test_eval_reports_bits_per_byte_on_one_scale_for_two_tokenizers(clm_teacher, wordpiece_student, xcorpus,
                                                                     capsys):
    results = []
    for model in (clm_teacher, wordpiece_student):
        assert main(["eval", str(model), "--text-file", str(xcorpus), "--block-size", "32", "--json"]) == 0
        results.append(json.loads(capsys.readouterr().out))
    docs = _docs(xcorpus)
    expected_bytes = sum(len(d.encode("utf-8")) + 1 for d in docs)  # each document and its end
    for r in results:
        assert r["bytes"] == expected_bytes  # the denominator is the text's, whatever the tokenizer
        assert r["bits_per_byte"] == pytest.approx(r["nll"] * r["tokens"] / math.log(2) / r["bytes"], rel=1e-9)
    assert results[0]["tokens"] != results[1]["tokens"]
    # untrained models: bits per byte ~ log2(vocabulary) x tokens per byte, each by its own tokenizer
    for r, vocab in zip(results, (300, 500), strict=True):
        assert r["bits_per_byte"] == pytest.approx(math.log2(vocab) * r["tokens"] / r["bytes"], rel=0.35)
    assert main(["eval", str(clm_teacher), "--text-file", str(xcorpus), "--block-size", "32"]) == 0
    assert "bits per byte" in capsys.readouterr().out


# --- students made for a tokenizer (`hsk student lm`) ---------------------------------------------------------


def test_hsk_student_lm_trains_a_bpe_on_the_corpus_and_the_student_distils(xstore, xcorpus, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "bpe500"
    assert main(["student", "lm", "--train-tokenizer", str(xcorpus), "--vocab-size", "500", "--student-layers", "1",
                 "--hidden", "32", "--ffn", "64", "--out", str(out)]) == 0
    assert "vocabulary 500" in capsys.readouterr().out
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert len(tokenizer) == 500 and tokenizer.eos_token == "<|endoftext|>"
    assert tokenizer.decode(tokenizer(ODD)["input_ids"]) == ODD  # byte-level: every text round-trips
    assert AutoModelForCausalLM.from_pretrained(out).config.vocab_size == 500
    assert main(["train", "--store", str(xstore), "--student", str(out), "--method", "alm", "--max-steps", "2",
                 "--batch-size", "4", "--device", "cpu", "--out", str(tmp_path / "run")]) == 0
    assert main(["eval", str(tmp_path / "run" / "best"), "--text-file", str(xcorpus), "--block-size", "32"]) == 0
    assert "bits per byte" in capsys.readouterr().out


def test_hsk_student_lm_over_minilms_wordpiece_takes_sep_as_eos(tmp_path, capsys):
    from transformers import AutoTokenizer

    out = tmp_path / "minilm-vocab"
    assert main(["student", "lm", "--tokenizer", "minilm", "--student-layers", "1", "--hidden", "32", "--ffn", "64",
                 "--out", str(out)]) == 0
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.eos_token == "[SEP]" and len(tokenizer) == 30522
    before = sorted(p.name for p in out.iterdir())
    assert main(["student", "lm", "--tokenizer", "minilm", "--out", str(out)]) == 2  # not over a student
    assert "--overwrite" in capsys.readouterr().err and sorted(p.name for p in out.iterdir()) == before
