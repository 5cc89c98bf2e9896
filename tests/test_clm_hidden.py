"""The final-hidden-state support of causal-LM stores (`hsk dump --objective clm --support hidden:CODEC`): the
rotation, the head against the teacher's logits, the store (info, verify, derive, card), the full-vocabulary KD
target decoded on the device, and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import save_tiny_causal_lm

from hskstore import open_store
from hskstore.format.clm import HEAD, Support, head_logits, rotation
from hskstore.format.config import ConfigError
from pipelines.cli import main
from pipelines.dump.clm_hidden import head_of, teacher_hidden
from pipelines.train.kinds.clm import ClmFeed, lm_batch
from pipelines.train.losses import lm
from pipelines.train.losses.terms import LOSS_TERMS


def _dump(tmp: Path, teacher: Path, corpus: Path, support: str, name: str) -> Path:
    out = tmp / name
    assert main(["dump", "--objective", "clm", "--teacher", str(teacher), "--text-file", str(corpus), "--support",
                 support, "--block-size", "32", "--limit", "60", "--shard-rows", "16", "--batch-size", "4",
                 "--no-progress", "--device", "cpu", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def hidden_stores(tmp_path_factory, clm_teacher, clm_corpus) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("hidden_stores")
    return {codec: _dump(tmp, clm_teacher, clm_corpus, f"hidden:{codec}", f"{codec}.zarr")
            for codec in ("float16", "int8")}


def _model(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


# --- the pure parts ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [32, 48, 576, 7])
def test_the_rotation_is_orthogonal_exact_and_seeded(d):
    r = rotation(d, 3)
    assert np.array_equal(r @ r.T, np.eye(d))  # exact in float64: +-1 sums divided by a power of two
    assert np.array_equal(r, rotation(d, 3)) and not np.array_equal(r, rotation(d, 4))
    if d == 576:  # an outlier dimension is spread over most of the width
        assert (np.abs(r) > 0).mean() > 0.8 and np.abs(r).max() < 0.2


def test_the_rotation_spreads_an_outlier_dimension_so_a_scale_keeps_the_rest():
    """Hidden states with one massive dimension (as LLMs have): int8's scale per vector spends its levels on it, and
    the rotated states round-trip with a far smaller error (measured back in the original coordinates)."""
    from hskstore import codecs

    rng = np.random.default_rng(0)
    h = rng.standard_normal((64, 128)).astype(np.float32)
    h[:, 5] = 60.0  # a massive activation
    r = rotation(128, 0)
    int8 = codecs.get("int8")

    def error(x: np.ndarray, back: np.ndarray) -> float:
        decoded = int8.decode(*int8.encode(x.astype(np.float16)), 128) @ back
        return float(np.abs(decoded - h)[:, np.arange(128) != 5].mean())

    assert error(h @ r.T, r) < 0.3 * error(h, np.eye(128))


def test_hidden_support_parses_and_names_its_codec():
    assert Support.parse("hidden") == Support("hidden", 0, "float16")
    assert str(Support.parse("hidden:nf4")) == "hidden:nf4"
    with pytest.raises(ConfigError, match="hidden:CODEC"):
        Support.parse("hidden:int3")


# --- the head against the teacher ---------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_head_of_the_captured_state_gives_the_teachers_logits(arch, bpe_tokenizer, tmp_path):
    """Llama (tied head) and GPT-2 (tied, a final LayerNorm): logits = head(h), h the head's input; the rotated
    head of the rotated state gives the same logits."""
    model = _model(save_tiny_causal_lm(tmp_path / arch, bpe_tokenizer, arch))
    ids = torch.randint(0, 300, (2, 24))
    h, logits = teacher_hidden(model, ids, "fp32")
    head = head_of(model)
    torch.testing.assert_close(head.logits(h), logits, atol=1e-5, rtol=1e-5)
    r = torch.as_tensor(rotation(h.shape[-1], 0), dtype=torch.float32)
    torch.testing.assert_close(head.rotated(r).logits(h @ r.T), logits, atol=1e-4, rtol=1e-4)


def test_a_float16_store_reconstructs_the_teachers_log_softmax(hidden_stores, clm_teacher):
    store = open_store(str(hidden_stores["float16"]))
    data = store.read_shard(0)
    targets = store.targets(data)
    weight, bias = store.head()
    ours = torch.log_softmax(torch.as_tensor(head_logits(targets.hidden, weight, bias, None)), -1)
    with torch.no_grad():
        theirs = torch.log_softmax(_model(clm_teacher)(input_ids=torch.as_tensor(data["input_ids"].astype(np.int64)))
                                   .logits, -1)
    kept = torch.as_tensor(targets.kept)
    assert kept.sum() > 100 and (targets.hidden[~targets.kept] == 0).all()
    torch.testing.assert_close(ours[kept], theirs[kept], atol=2e-2, rtol=0)  # h rounded to float16 once
    assert float(lm.full_kl(ours[kept], theirs[kept]).mean()) < 1e-4


# --- training: the KD target made on the device -------------------------------------------------------------------


def test_the_kd_target_of_a_hidden_batch_is_the_teachers_and_the_loss_its_kl(hidden_stores, clm_teacher):
    """The batch's teacher logits (decoded from the stored bytes and the head, on the device) give the teacher's
    log_softmax; clm_full_kl on them is the KL of a student to the teacher itself."""
    from pipelines.registry import Term
    from pipelines.train.losses.terms import TermInputs

    store = open_store(str(hidden_stores["float16"]))
    feed_maker = ClmFeed(store).maker(None, [], "cpu", None)
    data = store.read_shard(0)
    batch = feed_maker(data)
    assert set(batch) >= {"kd_mask", "teacher_logits"} and "kd_ids" not in batch
    teacher = _model(clm_teacher)
    with torch.no_grad():
        full = torch.log_softmax(teacher(input_ids=batch["input_ids"]).logits, -1)[batch["kd_mask"]]
    torch.testing.assert_close(torch.log_softmax(batch["teacher_logits"], -1), full, atol=2e-2, rtol=0)
    student = torch.randn(*batch["input_ids"].shape, full.shape[-1])
    term = Term("kd", "clm_full_kl", 1.0, (("temperature", 1.0),))
    inputs = TermInputs(batch=batch, outputs=type("O", (), {"logits": student})(), pairs=None, projection=None)
    value = LOSS_TERMS[term.loss](inputs, **term.kwargs)
    expected = lm.full_kl(torch.log_softmax(student[batch["kd_mask"]], -1), full).mean()
    assert abs(float(value) - float(expected)) < 2e-3 * float(expected)
    assert lm_batch(data, store.clm, "cpu", None, feed_maker.head)["teacher_logits"].shape == (len(full), 300)


def test_a_two_layer_student_trains_from_a_hidden_store(hidden_stores, tmp_path, capsys):
    """From the stored states and head, not a live teacher (the full-vocabulary KL of target=live is another term)."""
    out = tmp_path / "run"
    assert main(["train", "--store", str(hidden_stores["int8"]), "--student", "first2", "--method", "clm-kd",
                 "--max-steps", "4", "--batch-size", "4", "--device", "cpu", "--out", str(out)]) == 0
    assert "support hidden:int8, target store" in capsys.readouterr().out
    assert [t["loss"] for t in json.loads((out / "summary.json").read_text())["plan"][0]["terms"]] == [
        "clm_ce", "clm_hidden_kl"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["terms"]["kd"] for r in records if "kd" in r.get("terms", {})]
    assert losses and all(np.isfinite(losses)) and all(v > 0 for v in losses)


# --- the store: info, verify, derive, card -------------------------------------------------------------------------


def test_info_shows_bytes_per_token_and_the_measured_reconstruction(hidden_stores, capsys):
    sel = open_store(str(hidden_stores["int8"])).clm
    assert sel.reconstruction_reference == "teacher" and 0 <= sel.reconstruction_kl < 0.05
    assert main(["info", str(hidden_stores["int8"])]) == 0
    out = capsys.readouterr().out
    assert "hidden state (d 32, int8" in out and "B/token" in out and "mean KL(teacher || stored)" in out
    report = open_store(str(hidden_stores["int8"])).storage_report()
    assert report["head_bytes"] > 0 and report["bytes_per_token"] > 32  # d int8 codes per token and more
    assert main(["info", "--card", str(hidden_stores["int8"])]) == 0
    assert "final hidden state" in capsys.readouterr().out


def test_derive_to_a_smaller_codec_gives_the_dumps_bytes(hidden_stores, tmp_path, capsys):
    out = tmp_path / "int8.zarr"
    assert main(["derive", str(hidden_stores["float16"]), "--support", "hidden:int8", "--out", str(out)]) == 0
    derived, direct = open_store(str(out)), open_store(str(hidden_stores["int8"]))
    assert main(["verify", str(out)]) == 0
    for name in ("clm/hidden", "clm/hidden_scale", "clm/kept", "input_ids"):
        assert np.array_equal(derived.read_shard(0)[name], direct.read_shard(0)[name]), name
    assert np.array_equal(derived.head()[0], direct.head()[0])
    assert derived.clm.reconstruction_reference == "source store" and derived.clm.reconstruction_kl < 0.05
    nf4 = tmp_path / "nf4.zarr"
    assert main(["derive", str(out), "--support", "hidden:nf4", "--out", str(nf4)]) == 0
    assert open_store(str(nf4)).clm.hidden_codec == "nf4"


def test_derive_refuses_what_a_hidden_store_cannot_give(hidden_stores, tmp_path, capsys):
    for support, words in (("hidden:float16", "precision only goes down"), ("topk:4", "hidden:CODEC only")):
        assert main(["derive", str(hidden_stores["int8"]), "--support", support, "--out",
                     str(tmp_path / "x.zarr")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
        assert not (tmp_path / "x.zarr").exists()


def test_a_damaged_head_is_found_by_verify(hidden_stores, tmp_path, capsys):
    import shutil

    import zarr

    copy = tmp_path / "copy.zarr"
    shutil.copytree(hidden_stores["int8"], copy)
    head = zarr.open_group(str(copy), mode="r+")[HEAD]
    head[0, 0] = float(head[0, 0]) + 1.0
    assert main(["verify", str(copy)]) != 0
    captured = capsys.readouterr()
    assert "head_sha256" in captured.out + captured.err


def test_a_bad_hidden_support_is_one_line_and_writes_nothing(clm_teacher, clm_corpus, tmp_path, capsys):
    before = clm_corpus.read_bytes()
    assert main(["dump", "--objective", "clm", "--teacher", str(clm_teacher), "--text-file", str(clm_corpus),
                 "--support", "hidden:int3", "--no-progress", "--out", str(tmp_path / "bad.zarr")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hidden:int3" in err[0], err
    assert not (tmp_path / "bad.zarr").exists() and clm_corpus.read_bytes() == before


def test_a_hidden_store_keeps_no_block_text_and_the_other_tokenizer_methods_say_so(hidden_stores):
    """A hidden-state store is dumped from the streamed corpus without the text arrays (text_bytes null); the
    methods for a student with another tokenizer refuse it in one line naming the supports that keep them."""
    from hskstore.format.clm import TEXT_ARRAYS, require_text

    store = open_store(str(hidden_stores["int8"]))
    assert store.clm.text_bytes is None and not set(TEXT_ARRAYS) & set(store.specs)
    with pytest.raises(ConfigError, match="hidden states without block text.*--support topk:K or sample:N"):
        require_text(store.clm, str(hidden_stores["int8"]))
