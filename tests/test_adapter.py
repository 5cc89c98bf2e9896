"""The student adapter (pipelines/train/students/adapter.py): fixed output keys whatever the model, on tiny random
models."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_bert, tiny_bert_config
from transformers import BertForMaskedLM

from pipelines.train.students.adapter import StudentOutputs, adapter_for
from pipelines.train.students.heads import Heads
from pipelines.train.students.sps import sps_from_bert


def _batch(lengths: list[int], width: int = 7) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    ids = torch.randint(5, 60, (len(lengths), width))
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def test_a_classifier_and_an_sps_student_give_the_same_keys():
    batch = _batch([7, 4])
    for model, entries in ((make_tiny_bert(num_layers=2, seed=1).eval(), 3),
                           (sps_from_bert(make_tiny_bert(num_layers=2, seed=1)).eval(), 5)):  # 2 + 2 repeated + emb
        out = adapter_for("task")(model, None, batch, ("logits", "hidden_states", "attention_scores"))
        assert isinstance(out, StudentOutputs) and out.logits.shape == (2, 2) and out.attentions is None
        assert len(out.hidden_states) == entries and len(out.attention_scores) == entries - 1
        plain = adapter_for("task")(model, None, batch, ("logits",))
        assert plain.hidden_states is None and plain.attention_scores is None
        torch.testing.assert_close(plain.logits, out.logits)


def test_the_mlm_head_gives_the_logits_of_the_masked_positions_only():
    torch.manual_seed(3)
    model = BertForMaskedLM(tiny_bert_config(num_layers=2)).eval()
    assert Heads(model, "mlm").current == "mlm"
    batch = _batch([7, 5])
    positions = torch.tensor([[1, 3, -1], [2, -1, -1]])
    out = adapter_for("mlm")(model, None, {**batch, "positions": positions, "used": positions >= 0}, ("logits",))
    full = model(**batch).logits  # [B, T, V]: the head on every position
    want = torch.stack([full[0, 1], full[0, 3], full[1, 2]])
    assert out.logits.shape == (3, model.config.vocab_size)
    torch.testing.assert_close(out.logits, want, rtol=1e-5, atol=1e-5)


def test_a_package_head_gets_its_own_forward_and_an_unknown_head_is_refused(monkeypatch):
    from pipelines import registry
    from pipelines.registry import MethodError, declare_head
    from pipelines.train.students import adapter

    monkeypatch.setattr(registry, "HEADS", dict(registry.HEADS))
    monkeypatch.setattr(adapter, "ADAPTERS", dict(adapter.ADAPTERS))
    with pytest.raises(ValueError, match="not declared"):
        adapter.student_adapter("spans")(adapter.classifier_outputs)
    head = declare_head("spans", "a span head (a test package's)")

    @adapter.student_adapter(head)
    def spans(model, runner, batch, outputs):
        return StudentOutputs(logits=batch["input_ids"].float())

    batch = _batch([7, 4])
    assert adapter_for("spans") is spans
    torch.testing.assert_close(adapter_for("spans")(None, None, batch, ("logits",)).logits, batch["input_ids"].float())
    with pytest.raises(ValueError, match="already has an adapter"):
        adapter.student_adapter(head)(adapter.classifier_outputs)
    with pytest.raises(MethodError, match="head .spam. has no student adapter; known: task, ptp4, mlm, clm, s2s, sp"):
        adapter_for("spam")
