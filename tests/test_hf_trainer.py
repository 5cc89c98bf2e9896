"""hsk inside the Hugging Face Trainer (pipelines/integrations/hf.py): a tiny student trained with
`transformers.Trainer` from a tiny store, and every target it sees is the store's.

A 4-layer, width-32 random teacher is dumped over 48 SST-2 rows (3 shards of 16) at config 2,4,0.5 for
a 2-layer reference student; the student is a 2-layer BERT of width 16, so W is exercised.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_tiny_bert, save_tiny_seq2seq, save_tiny_teacher

from hskstore import open_store
from hskstore.format.config import ConfigError, HSKConfig
from pipelines.cli import main
from pipelines.dump.stage import DumpOptions, dump
from pipelines.integrations.hf import (
    DistillTrainer,
    LMDistillTrainer,
    LMStoreCollator,
    LMStoreDataset,
    StoreCollator,
    StoreDataset,
)
from pipelines.train.run.meter import NonFiniteLoss

ROWS = 48


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_tokenizer, glue_dir) -> str:
    teacher = save_tiny_teacher(tmp_path_factory.mktemp("teacher"), tiny_tokenizer, confident=True)
    out = str(tmp_path_factory.mktemp("store") / "sst2.zarr")
    options = DumpOptions(config=HSKConfig.parse("2,4,0.5"), ref_student_layers=2, shard_rows=16, batch_size=16,
                          progress=False)
    dump("sst2", options, teacher=str(teacher), out=out, data_dir=str(glue_dir), limit=ROWS, log=lambda *_: None)
    return out


def test_batches_hold_the_stores_inputs_and_targets(store):
    data = StoreDataset(store, layers="all", read_rows=12)
    loader = torch.utils.data.DataLoader(data, batch_size=8, collate_fn=StoreCollator(data))
    stored = open_store(store)
    ref = stored.read(slice(None))
    dense = [stored.dense(ref, layer) for layer in stored.layers]
    seen = []
    for batch in loader:
        rows = batch["hsk_row"].numpy()
        seen += rows.tolist()
        width = batch["input_ids"].shape[1]
        assert width == ref["length"][rows].max()
        assert np.array_equal(batch["attention_mask"].sum(1).numpy(), ref["length"][rows])
        ids = np.where(batch["attention_mask"].numpy() == 1, ref["input_ids"][rows, :width], 0)
        assert np.array_equal(batch["input_ids"].numpy(), ids)
        assert np.array_equal(batch["labels"].numpy(), ref["label"][rows])
        assert torch.equal(batch["hsk_logits"], torch.from_numpy(ref["logits"][rows]).float())
        for i, vectors in enumerate(dense):
            assert torch.equal(batch[f"hsk_dense_{i}"], torch.from_numpy(vectors[rows]))
            assert np.array_equal(batch[f"hsk_valid_{i}"].numpy(), ref[f"layers/{i}/positions"][rows] >= 0)
    assert sorted(seen) == list(range(ROWS)) and seen != sorted(seen)  # every row once, shuffled


def test_trainer_distills_a_student_from_the_store(store, tmp_path):
    from transformers import Trainer, TrainingArguments

    student = make_tiny_bert(num_layers=2, hidden=16, heads=2, seed=3).train()
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    data = StoreDataset(store, layers="all", read_rows=16)
    args = TrainingArguments(str(tmp_path / "out"), per_device_train_batch_size=8, max_steps=18, learning_rate=3e-3,
                             logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, seed=0)
    trainer = DistillTrainer(model=student, args=args, train_dataset=data, data_collator=StoreCollator(data),
                             hsk_weight=1.0, temperature=2.0)
    assert isinstance(trainer, Trainer)
    assert [p.student_layer for p in trainer.pairs] == [1, 2] and trainer.projection.in_features == 16
    w_before = trainer.projection.weight.detach().clone()
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 18 and all(np.isfinite(losses))
    assert np.mean(losses[-6:]) < 0.8 * np.mean(losses[:6])
    assert all(not torch.equal(before[n], p) for n, p in student.named_parameters() if "pooler" not in n)
    assert not torch.equal(w_before, trainer.projection.weight)  # W trains with the student


def test_the_loss_is_hsk_trains_terms(store, tmp_path):
    """The Trainer's loss of a batch, recomputed here from the terms' definitions."""
    import torch.nn.functional as F
    from transformers import TrainingArguments

    student = make_tiny_bert(num_layers=2, hidden=32, heads=4, seed=3)
    data = StoreDataset(store, layers=[1], shuffle=False)
    trainer = DistillTrainer(model=student, args=TrainingArguments(str(tmp_path), use_cpu=True, report_to="none"),
                             train_dataset=data, data_collator=StoreCollator(data), hsk_weight=2.0, alpha=0.3)
    assert trainer.projection is None and [p.kept for p in trainer.pairs] == [1]
    batch = next(iter(torch.utils.data.DataLoader(data, batch_size=16, collate_fn=StoreCollator(data))))
    with torch.no_grad():
        loss = trainer.compute_loss(student, batch)
        out = student(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                      attention_mask=batch["attention_mask"], output_hidden_states=True)
    s, t = out.logits, batch["hsk_logits"]
    kl = F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), reduction="batchmean", log_target=True)
    picked = out.hidden_states[trainer.pairs[0].student_layer].gather(
        1, batch["hsk_positions_1"][..., None].expand(-1, -1, 32))
    valid = batch["hsk_valid_1"][..., None].float()
    hsk = (((picked - batch["hsk_dense_1"]) ** 2) * valid).sum() / (valid.sum() * 32)
    want = 0.7 * F.cross_entropy(s, batch["labels"]) + 0.3 * kl + 2.0 * hsk
    assert torch.allclose(loss, want, rtol=1e-5)


def test_refusals_name_the_fix(store, tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(str(tmp_path), use_cpu=True, report_to="none")
    with pytest.raises(ConfigError, match=r"layers=\[7\]: .* keeps layers \[0, 1\]"):
        StoreDataset(store, layers=[7])
    data = StoreDataset(store)
    with pytest.raises(ConfigError, match=r"hsk_weight=1.0 needs the HSK vectors: .*layers='all'"):
        DistillTrainer(model=make_tiny_bert(), args=args, train_dataset=data, hsk_weight=1.0)
    with pytest.raises(ConfigError, match="the student has 3 labels, the store's teacher 2: .*num_labels=2"):
        DistillTrainer(model=make_tiny_bert(num_labels=3), args=args, train_dataset=data)


# --- causal-LM and seq2seq stores ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lm_stores(tmp_path_factory, clm_teacher, clm_corpus, bpe_tokenizer) -> dict:
    """A top-8 causal-LM store of the tiny Llama over 40 documents, and a T5 seq2seq store of 16 pairs."""
    tmp = tmp_path_factory.mktemp("lm_stores")
    common = ["--shard-rows", "8", "--batch-size", "8", "--no-progress", "--device", "cpu"]
    assert main(["dump", "--objective", "clm", "--teacher", str(clm_teacher), "--text-file", str(clm_corpus),
                 "--support", "topk:8", "--block-size", "32", "--limit", "40", *common,
                 "--out", str(tmp / "clm.zarr")]) == 0
    lines = clm_corpus.read_text(encoding="utf-8").splitlines()[:32]
    pairs = tmp / "pairs.tsv"
    pairs.write_text("source\ttarget\n" + "".join(f"{a}\t{b}\n" for a, b in zip(lines[::2], lines[1::2])),
                     encoding="utf-8")
    t5 = save_tiny_seq2seq(tmp / "t5", bpe_tokenizer, "t5")
    assert main(["dump", "--objective", "seq2seq", "--teacher", str(t5), "--data-file", str(pairs), "--support",
                 "topk:8", "--max-length", "40", "--max-target", "16", *common, "--out", str(tmp / "s2s.zarr")]) == 0
    return {"clm": tmp / "clm.zarr", "clm_teacher": clm_teacher, "s2s": tmp / "s2s.zarr", "t5": t5}


def _lm_args(tmp_path, steps: int):
    from transformers import TrainingArguments

    return TrainingArguments(str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=steps,
                             learning_rate=3e-3, logging_steps=1, report_to="none", save_strategy="no", use_cpu=True,
                             seed=0)


def test_trainer_distills_a_causal_student_from_a_clm_store(lm_stores, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer

    torch.set_num_threads(1)
    teacher = lm_stores["clm_teacher"]
    student = AutoModelForCausalLM.from_pretrained(teacher, num_hidden_layers=2)
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    data = LMStoreDataset(str(lm_stores["clm"]), options={"lam": 0.5})
    assert data.method.name == "clm-kd" and [t.loss for t in data.stage.terms] == ["clm_ce", "clm_topk_kl"]
    trainer = LMDistillTrainer(model=student, args=_lm_args(tmp_path, 16), train_dataset=data,
                               data_collator=LMStoreCollator(), processing_class=AutoTokenizer.from_pretrained(teacher))
    assert isinstance(trainer, Trainer)
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 16 and all(np.isfinite(losses))
    assert np.mean(losses[-4:]) < np.mean(losses[:4])
    assert all(not torch.equal(before[n], p) for n, p in student.named_parameters())


def test_the_lm_loss_is_hsk_trains_terms(lm_stores):
    """A batch's loss through the Trainer's path, recomputed from the stored rows with lm.py's maths."""
    from transformers import AutoModelForCausalLM

    from hskstore import open_store
    from hskstore.format.clm import decode
    from pipelines.train.losses import lm

    student = AutoModelForCausalLM.from_pretrained(lm_stores["clm_teacher"], num_hidden_layers=2)
    data = LMStoreDataset(str(lm_stores["clm"]), options={"lam": 0.3}, shuffle=False)
    batch = next(iter(torch.utils.data.DataLoader(data, batch_size=4, collate_fn=LMStoreCollator())))
    with torch.no_grad():
        loss, terms = data.loss(student, batch)
        rows = batch["hsk_rows"].arrays
        width = batch["input_ids"].shape[1]
        ids = torch.as_tensor(rows["input_ids"].astype(np.int64))
        logits = student(input_ids=ids, attention_mask=(torch.arange(width)[None] < torch.as_tensor(
            rows["length"].astype(np.int64))[:, None]).long()).logits
    stored = decode(open_store(str(lm_stores["clm"])).read(slice(0, 4)), data.store.clm)
    kept = stored.kept[:, :width]
    logq = torch.log_softmax(logits[torch.as_tensor(kept)], -1)
    kd = lm.topk_tail_kl(logq, torch.as_tensor(stored.ids[kept]), torch.as_tensor(stored.probs[kept]),
                         torch.as_tensor(stored.used[kept])).mean()
    torch.testing.assert_close(terms["kd"], kd)
    torch.testing.assert_close(loss, 0.7 * terms["ce"] + 0.3 * kd)


def test_trainer_distills_a_seq2seq_student(lm_stores, tmp_path):
    from transformers import AutoModelForSeq2SeqLM

    torch.set_num_threads(1)
    student = AutoModelForSeq2SeqLM.from_pretrained(lm_stores["t5"])
    data = LMStoreDataset(str(lm_stores["s2s"]))
    assert data.method.name == "s2s-kd"
    trainer = LMDistillTrainer(model=student, args=_lm_args(tmp_path, 4), train_dataset=data,
                               data_collator=LMStoreCollator())
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 4 and all(np.isfinite(losses))


def test_a_nan_loss_stops_both_trainers(store, lm_stores, tmp_path):
    """NaN weights give a NaN loss: training raises at the first step instead of ending normally."""
    from transformers import AutoModelForCausalLM, TrainingArguments

    student = make_tiny_bert(num_layers=2, hidden=32, heads=4, seed=3)
    torch.nn.init.constant_(student.classifier.weight, float("nan"))
    data = StoreDataset(store)
    args = TrainingArguments(str(tmp_path / "task"), per_device_train_batch_size=8, max_steps=3, report_to="none",
                             save_strategy="no", use_cpu=True)
    with pytest.raises(NonFiniteLoss, match="NaN or infinite at step 1"):
        DistillTrainer(model=student, args=args, train_dataset=data, data_collator=StoreCollator(data)).train()
    causal = AutoModelForCausalLM.from_pretrained(lm_stores["clm_teacher"], num_hidden_layers=1)
    torch.nn.init.constant_(causal.lm_head.weight, float("nan"))
    lm_data = LMStoreDataset(str(lm_stores["clm"]))
    with pytest.raises(NonFiniteLoss, match="NaN or infinite at step 1"):
        LMDistillTrainer(model=causal, args=_lm_args(tmp_path, 3), train_dataset=lm_data,
                         data_collator=LMStoreCollator()).train()
    assert not list((tmp_path / "out").glob("checkpoint-*"))


def test_lm_refusals_name_the_fix(store, lm_stores, tmp_path):
    from transformers import AutoModelForCausalLM

    with pytest.raises(ConfigError, match=r"is a clm store: read it with LMStoreDataset"):
        StoreDataset(str(lm_stores["clm"]))
    with pytest.raises(ConfigError, match=r"is a task store: read it with StoreDataset"):
        LMStoreDataset(store)
    with pytest.raises(ConfigError, match="target=live"):
        LMStoreDataset(str(lm_stores["clm"]), options={"target": "live"})
    for method in ("uld", "alm"):  # another tokenizer: hsk train re-tokenizes the text, the Trainer does not
        with pytest.raises(ConfigError, match=rf"method='{method}' re-tokenizes .* `hsk train --store .*clm.zarr "
                                              rf"--method {method} --student DIR`"):
            LMStoreDataset(str(lm_stores["clm"]), method=method)
    small = AutoModelForCausalLM.from_pretrained(lm_stores["clm_teacher"], num_hidden_layers=1, vocab_size=100,
                                                 ignore_mismatched_sizes=True)
    with pytest.raises(ConfigError, match="100 rows but the store's tokenizer has 300 tokens"):
        LMDistillTrainer(model=small, args=_lm_args(tmp_path, 1), train_dataset=LMStoreDataset(str(lm_stores["clm"])),
                         data_collator=LMStoreCollator())
