"""SPS students (PEA-KD): the forward is an explicit composition of BERT layers with Q/K swapped."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from conftest import make_tiny_bert, save_tiny_teacher

from pipelines.train.students.build import build_student
from pipelines.train.students.sps import SPSConfig, SPSForSequenceClassification, sps_from_bert, swapped_qk


def reference_layer(layer, x: torch.Tensor, additive_mask: torch.Tensor, swap: bool) -> torch.Tensor:
    """One post-LN BERT layer written out by hand (eval mode: no dropout)."""
    att = layer.attention.self
    q_lin, k_lin = (att.key, att.query) if swap else (att.query, att.key)
    b, t, d = x.shape
    h = att.num_attention_heads
    e = d // h

    def heads(y: torch.Tensor) -> torch.Tensor:
        return y.view(b, t, h, e).transpose(1, 2)

    q, k, v = heads(q_lin(x)), heads(k_lin(x)), heads(att.value(x))
    scores = q @ k.transpose(-1, -2) / math.sqrt(e) + additive_mask
    context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
    a = layer.attention.output.LayerNorm(layer.attention.output.dense(context) + x)
    return layer.output.LayerNorm(layer.output.dense(layer.intermediate(a)) + a)


def reference_forward(model, ids, mask, schedule):
    """hidden states and logits of running `schedule` [(layer index, swapped)] by hand."""
    bert = model.bert
    x = bert.embeddings(input_ids=ids)
    additive = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    states = [x]
    for index, swap in schedule:
        x = reference_layer(bert.encoder.layer[index], x, additive, swap)
        states.append(x)
    logits = model.classifier(bert.pooler(x))
    return states, logits


@pytest.mark.parametrize(
    ("k", "schedule"),
    [
        (2, [(0, False), (1, False), (0, True), (1, True)]),
        (4, [(0, False), (1, False), (2, False), (3, False), (1, True), (2, True), (3, True)]),
        (6, [(i, False) for i in range(6)] + [(3, True), (4, True), (5, True)]),
    ],
)
def test_sps_forward_equals_explicit_composition(k, schedule):
    torch.manual_seed(0)
    bert = make_tiny_bert(num_layers=k, seed=k)
    with torch.no_grad():  # sharper attention than the 0.02-std init, so that swapping Q and K shows
        for layer in bert.bert.encoder.layer:
            layer.attention.self.query.weight.mul_(15.0)
            layer.attention.self.key.weight.mul_(15.0)
    model = sps_from_bert(bert).eval()
    assert model.config.sps_schedule() == schedule
    ids = torch.randint(5, 60, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        states, logits = reference_forward(model, ids, mask, schedule)
        unswapped, _ = reference_forward(model, ids, mask, [(i, False) for i, _ in schedule])
    assert len(out.hidden_states) == len(schedule) + 1 == model.config.sps_effective_layers + 1
    real = mask.bool()
    for got, want in zip(out.hidden_states, states, strict=True):
        torch.testing.assert_close(got[real], want[real], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(out.logits, logits, atol=2e-5, rtol=1e-4)
    # The swap is what makes L' differ from L run twice (else this test could not tell them apart).
    assert not torch.allclose(unswapped[k + 1][real], states[k + 1][real], atol=1e-3)


def test_swapped_qk_restores_the_projections():
    att = make_tiny_bert(num_layers=1).bert.encoder.layer[0].attention.self
    q, k = att.query, att.key
    with pytest.raises(RuntimeError), swapped_qk(att):
        assert att.query is k and att.key is q
        raise RuntimeError("boom")
    assert att.query is q and att.key is k
    assert list(dict(att.named_children())) == ["query", "key", "value", "dropout"]


def test_sps_saves_and_loads_with_auto_classes(tmp_path):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    model = sps_from_bert(make_tiny_bert(num_layers=3, seed=3)).eval()
    model.save_pretrained(tmp_path / "sps")
    card = (tmp_path / "sps" / "README.md").read_text()
    assert "L1, L2, L3, L1', L2', L3'" in card and "import pipelines.train.students.sps" in card
    assert isinstance(AutoConfig.from_pretrained(tmp_path / "sps"), SPSConfig)
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "sps").eval()
    assert isinstance(loaded, SPSForSequenceClassification) and loaded.config.sps_repeat == 3
    ids = torch.randint(5, 60, (2, 8))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    # Plain transformers, without hsk's registration, refuses the folder instead of running a 3-layer BERT.
    code = (
        "from transformers import AutoModelForSequenceClassification as A\n"
        f"A.from_pretrained({str(tmp_path / 'sps')!r})"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0 and "hsk_sps" in done.stderr


def test_sps_config_checks_and_default_repeat():
    assert [SPSConfig(num_hidden_layers=k).sps_repeat for k in (1, 2, 3, 4, 6)] == [1, 2, 3, 3, 3]
    assert SPSConfig(num_hidden_layers=6, sps_repeat=6).sps_effective_layers == 12
    with pytest.raises(ValueError, match="sps_repeat"):
        SPSConfig(num_hidden_layers=2, sps_repeat=3)


def test_build_student_sps_shares_bert_k_parameters(tmp_path, tiny_tokenizer):
    teacher = save_tiny_teacher(tmp_path / "teacher", tiny_tokenizer, num_layers=4)
    sps, info = build_student("sps3", num_labels=2, teacher_hidden_size=32, base=str(teacher))
    bert, bert_info = build_student("bert3", num_labels=2, teacher_hidden_size=32, base=str(teacher))
    assert isinstance(sps, SPSForSequenceClassification)
    assert (info.kind, info.init, info.num_layers) == ("sps", "teacher-layers", 6)
    assert bert_info.num_layers == 3
    assert sum(p.numel() for p in sps.parameters()) == sum(p.numel() for p in bert.parameters())
    torch.testing.assert_close(sps.bert.encoder.layer[2].attention.self.key.weight,
                               bert.bert.encoder.layer[2].attention.self.key.weight)
