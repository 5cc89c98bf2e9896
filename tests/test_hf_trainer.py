"""hsk inside the Hugging Face Trainer (pipelines/integrations/hf.py): a tiny student trained with
`transformers.Trainer` from a tiny store, and every target it sees is the store's.

A 4-layer, width-32 random teacher is dumped over 48 SST-2 rows (3 shards of 16) at config 2,4,0.5 for
a 2-layer reference student; the student is a 2-layer BERT of width 16, so W is exercised.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_tiny_bert, save_tiny_teacher

from hskstore import open_store
from hskstore.format.config import ConfigError, HSKConfig
from pipelines.dump.stage import DumpOptions, dump
from pipelines.integrations.hf import DistillTrainer, StoreCollator, StoreDataset

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
