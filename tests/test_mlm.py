"""The LightPAFF MLM store on tiny random masked-LM teachers: masking, top-k + lse, top-k KL, resume, CLI."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_bert_config
from test_dump import chunk_bytes
from transformers import AutoTokenizer, BertForMaskedLM

from hskstore import StoreExistsError, open_store
from hskstore.io.writer import StoreWriter
from pipelines.cli import main
from pipelines.dump.mlm import KEPT, MASK, RANDOM, Masking, dump_mlm, load_corpus, mask_rows
from pipelines.train.losses.terms import topk_kl, topk_probs


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer):
    return AutoTokenizer.from_pretrained(tiny_tokenizer)


@pytest.fixture(scope="module")
def mlm_teacher(tmp_path_factory, tiny_tokenizer) -> Path:
    """A random BertForMaskedLM (3 layers, d 32) with the tiny tokenizer."""
    out = tmp_path_factory.mktemp("mlm_teacher")
    torch.manual_seed(4)
    model = BertForMaskedLM(tiny_bert_config(num_layers=3))
    with torch.no_grad():
        model.cls.predictions.bias.normal_(0, 2.0)  # a peaked, far from uniform distribution
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_tokenizer).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory, glue_dir) -> Path:
    lines = (glue_dir / "SST-2" / "train.tsv").read_text().splitlines()[1:61]
    out = tmp_path_factory.mktemp("corpus") / "sst2.txt"
    out.write_text("\n".join(line.split("\t")[0] for line in lines) + "\n")
    return out


def synthetic(tokenizer, n: int = 400, t: int = 48, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = np.full((n, t), tokenizer.pad_token_id, dtype=np.int32)
    lengths = rng.integers(8, t + 1, size=n)
    for i, length in enumerate(lengths):
        ids[i, :length] = rng.integers(5, len(tokenizer), size=length)
        ids[i, 0], ids[i, length - 1] = tokenizer.cls_token_id, tokenizer.sep_token_id
    return {"input_ids": ids, "token_type_ids": np.zeros_like(ids), "length": lengths.astype(np.int32)}


def test_masking_statistics_and_determinism(tokenizer):
    enc = synthetic(tokenizer)
    rows = np.arange(len(enc["length"]))
    out = mask_rows(enc, rows, Masking(mask_seed=7), tokenizer)
    pos, kind = out["mlm/positions"], out["mlm/kind"]
    used = pos >= 0
    maskable = (enc["length"] - 2).sum()
    assert used.sum() / maskable == pytest.approx(0.15, abs=0.01)
    shares = [(kind[used] == k).mean() for k in (MASK, RANDOM, KEPT)]
    assert shares == pytest.approx([0.8, 0.1, 0.1], abs=0.025)
    for i in range(50):
        p = pos[i][pos[i] >= 0]
        assert p.min() >= 1 and p.max() <= enc["length"][i] - 2  # never [CLS], [SEP] or padding
        original, masked = enc["input_ids"][i], out["input_ids"][i]
        k = kind[i][: len(p)]
        assert (masked[p][k == MASK] == tokenizer.mask_token_id).all()
        assert (masked[p][k == KEPT] == original[p][k == KEPT]).all()
        assert (out["mlm/labels"][i][: len(p)] == original[p]).all()
        untouched = np.setdiff1d(np.arange(enc["input_ids"].shape[1]), p)
        assert (masked[untouched] == original[untouched]).all()
    again = mask_rows(enc, rows, Masking(mask_seed=7), tokenizer)
    assert all(np.array_equal(out[k], again[k]) for k in out)
    other = mask_rows(enc, rows, Masking(mask_seed=8), tokenizer)
    assert not np.array_equal(out["mlm/positions"], other["mlm/positions"])
    # A row is masked the same way whatever block it comes in (shards, resumes).
    part = mask_rows({k: v[100:120] for k, v in enc.items()}, rows[100:120], Masking(mask_seed=7), tokenizer)
    assert all(np.array_equal(part[k], out[k][100:120]) for k in part)


def test_topk_kl_equals_full_vocabulary_kl_restricted_the_same_way():
    g = torch.Generator().manual_seed(0)
    teacher, student = torch.randn(6, 50, generator=g) * 3, torch.randn(6, 50, generator=g) * 3
    values, ids = teacher.topk(8, dim=-1)
    lse = teacher.logsumexp(-1)
    got = float(topk_kl(student, ids, values, lse))

    p, q = teacher.double().softmax(-1).numpy(), student.double().softmax(-1).numpy()
    expected, full = [], []
    for i in range(6):
        kept = ids[i].numpy()
        pb = np.append(p[i, kept], 1 - p[i, kept].sum())  # the kept ids, then one bucket for the rest
        qb = np.append(q[i, kept], 1 - q[i, kept].sum())
        expected.append((pb * np.log(pb / qb)).sum())
        full.append((p[i] * np.log(p[i] / q[i])).sum())
    assert got == pytest.approx(np.mean(expected), rel=1e-6)
    assert got <= np.mean(full)  # merging outcomes never increases a KL
    assert float(topk_kl(teacher, ids, values, lse)) == pytest.approx(0.0, abs=1e-7)


def dump(teacher, corpus_file, out, **kw):
    corpus = load_corpus(str(corpus_file), limit=kw.pop("limit", 60))
    return dump_mlm(str(teacher), str(out), corpus, top_k=kw.pop("top_k", 16), max_length=32, batch_size=8,
                    shard_rows=16, progress=False, log=lambda *_: None, **kw)


def test_topk_and_lse_give_the_teachers_probabilities(mlm_teacher, corpus_file, tmp_path):
    dump(mlm_teacher, corpus_file, tmp_path / "c.zarr", masking=Masking(mask_seed=3))
    store = open_store(str(tmp_path / "c.zarr"))
    assert store.meta["objective"] == "mlm" and store.meta["selection"]["mask_seed"] == 3
    data = store.read_shard(1)
    model = BertForMaskedLM.from_pretrained(mlm_teacher).eval()
    ids = torch.as_tensor(data["input_ids"].astype(np.int64))  # the masked inputs, as stored
    mask = (torch.arange(ids.shape[1])[None, :] < torch.as_tensor(data["length"])[:, None]).long()
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits.double().softmax(-1)  # [n, T, V]
    pos = data["mlm/positions"]
    p, tail = topk_probs(torch.as_tensor(data["mlm/topk_logits"]), torch.as_tensor(data["mlm/lse"]))
    checked = 0
    for i, j in zip(*np.nonzero(pos >= 0)):
        probs = full[i, pos[i, j]]
        kept = torch.as_tensor(data["mlm/topk_ids"][i, j].astype(np.int64))
        torch.testing.assert_close(p[i, j], probs[kept], rtol=1e-5, atol=1e-7)
        assert torch.equal(torch.sort(kept).values, torch.sort(probs.topk(16).indices).values)
        assert float(tail[i, j]) == pytest.approx(1 - float(probs[kept].sum()), abs=1e-6)
        checked += 1
    assert checked >= 16


def test_killed_mlm_dump_reruns_bit_identical(mlm_teacher, corpus_file, tmp_path, monkeypatch):
    dump(mlm_teacher, corpus_file, tmp_path / "full.zarr")
    original, calls = StoreWriter.write_shard, {"n": 0}

    def dying_write(self, shard, arrays):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.EIO, "killed")
        return original(self, shard, arrays)

    monkeypatch.setattr(StoreWriter, "write_shard", dying_write)
    with pytest.raises(OSError):
        dump(mlm_teacher, corpus_file, tmp_path / "cut.zarr")
    monkeypatch.setattr(StoreWriter, "write_shard", original)
    with pytest.raises(Exception, match="incomplete"):
        open_store(str(tmp_path / "cut.zarr"))
    dump(mlm_teacher, corpus_file, tmp_path / "cut.zarr")
    full, cut = open_store(str(tmp_path / "full.zarr")), open_store(str(tmp_path / "cut.zarr"))
    assert full.meta["checksums"] == cut.meta["checksums"]
    assert chunk_bytes(tmp_path / "full.zarr") == chunk_bytes(tmp_path / "cut.zarr")

    calls["n"] = 0
    monkeypatch.setattr(StoreWriter, "write_shard", dying_write)
    with pytest.raises(OSError):
        dump(mlm_teacher, corpus_file, tmp_path / "other.zarr")
    monkeypatch.setattr(StoreWriter, "write_shard", original)
    with pytest.raises(StoreExistsError, match="different selection"):  # another masking seed never resumes into it
        dump(mlm_teacher, corpus_file, tmp_path / "other.zarr", masking=Masking(mask_seed=1))


def test_cli_mlm_teacher_dump_info_verify(tmp_path, tiny_base_dir, corpus_file, capsys):
    teacher = tmp_path / "mlm"
    args = ["teacher", "--objective", "mlm", "--base", str(tiny_base_dir), "--text-file", str(corpus_file),
            "--epochs", "1", "--batch-size", "16", "--max-length", "32", "--train-layers", "1", "--device", "cpu",
            "--out", str(teacher)]
    assert main(args) == 0
    model = BertForMaskedLM.from_pretrained(teacher)
    assert model.cls.predictions.decoder.weight.data_ptr() == model.bert.embeddings.word_embeddings.weight.data_ptr()
    from transformers import BertModel

    frozen = BertModel.from_pretrained(tiny_base_dir)
    assert torch.equal(model.bert.encoder.layer[0].attention.self.query.weight,
                       frozen.encoder.layer[0].attention.self.query.weight)  # below --train-layers: untouched
    top, top_before = model.bert.encoder.layer[-1], frozen.encoder.layer[-1]
    assert not torch.equal(top.output.dense.weight, top_before.output.dense.weight)  # trained
    summary = json.loads((teacher / "hsk_teacher.json").read_text())
    assert summary["objective"] == "mlm" and summary["dev_metrics"]["tokens"] > 0

    store = tmp_path / "c.zarr"
    dump_args = ["dump", "--objective", "mlm", "--text-file", str(corpus_file), "--teacher", str(teacher),
                 "--top-k", "8", "--max-length", "32", "--shard-rows", "16", "--no-progress", "--device", "cpu",
                 "--out", str(store)]
    assert main(dump_args) == 0
    capsys.readouterr()
    assert main(["info", str(store)]) == 0
    shown = capsys.readouterr().out
    assert "per masked token" in shown and "Megatron" in shown and "DistillKit" in shown
    assert main(["verify", str(store)]) == 0
    assert main(["dump", "--objective", "mlm", "--teacher", str(teacher), "--out", str(tmp_path / "x.zarr")]) == 2
    assert "--text-file" in capsys.readouterr().err
    # Commands made for task stores refuse it with one line instead of failing inside.
    assert main(["derive", str(store), "--config", "1,2,0.5", "--out", str(tmp_path / "d.zarr")]) == 2
    assert main(["train", "--store", str(store), "--student", "bert2", "--method", "mud", "--out",
                 str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("hsk: error:") and "masked-LM" in line for line in err)
    assert "pass --method lightpaff-pretrain" in err[1]


def test_mlm_teacher_resumes_to_the_same_teacher(tmp_path, tiny_base_dir, corpus_file):
    """A run cut short mid-epoch leaves no teacher at --out; the same call then resumes from the hidden
    work folder and saves the teacher an uninterrupted run saves."""
    from pipelines.train.kinds.mlm_teacher import train_mlm_teacher
    from pipelines.train.kinds.teacher import work_dir

    corpus = load_corpus(str(corpus_file))  # 60 rows: 54 train, 6 held out; batch 16 -> 4 steps an epoch

    def run(out: Path, **kw) -> dict:
        return train_mlm_teacher(str(tiny_base_dir), corpus, out, train_layers=1, epochs=2, batch_size=16,
                                 max_length=32, seed=2, checkpoint_every=2, progress=False, log=lambda *_: None,
                                 **kw)

    whole = run(tmp_path / "whole")

    class Stop(Exception):
        pass

    def die_at_step_7(step: int) -> None:
        if step == 7:
            raise Stop

    cut = tmp_path / "cut"
    with pytest.raises(Stop):
        run(cut, on_step=die_at_step_7)
    assert not cut.exists() and (work_dir(cut) / "mlm-state.pt").is_file()
    assert torch.load(work_dir(cut) / "mlm-state.pt", weights_only=False)["progress"]["step"] == 6
    resumed = run(cut)
    assert resumed["steps"] == whole["steps"] == 8
    assert resumed["history"] == whole["history"]
    assert resumed["weights_hash"] == whole["weights_hash"]
    assert not work_dir(cut).exists()
    assert json.loads((cut / ".hsk-output.json").read_text())["kind"] == "teacher"
