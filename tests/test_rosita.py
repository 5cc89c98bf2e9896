"""ROSITA students on tiny random BERTs: importance, pruning, factorisation, save/reload, plain export, CLI.

`hsk student build rosita` end to end on a 4-layer width-32 teacher over 32 SST-2 rows, then
`hsk train --student DIR` from a store of that teacher.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import make_tiny_bert
from transformers import AutoModelForSequenceClassification, BertForSequenceClassification

from hskstore.format.config import HSKConfig
from pipelines.cli import main
from pipelines.core.pruned_bert import HskBertForSequenceClassification
from pipelines.dump.stage import DumpOptions, dump
from pipelines.train.students.rosita import (
    PLAIN_DIR,
    SUMMARY_FILE,
    RositaShape,
    accumulate_abs_grads,
    factorise_embedding,
    importance_from_grads,
    merge_export,
    prune_teacher,
    save_rosita,
    top_indices,
)

HEADS, HIDDEN = 4, 32
HEAD_SIZE = HIDDEN // HEADS


def teacher(num_layers: int = 3, seed: int = 5) -> BertForSequenceClassification:
    return make_tiny_bert(num_layers=num_layers, hidden=HIDDEN, heads=HEADS, seed=seed)


def batches(vocab: int, n: int = 3, rows: int = 4, length: int = 9, seed: int = 0) -> list[tuple[dict, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(5, vocab, (rows, length), generator=g)
        mask = torch.ones(rows, length, dtype=torch.long)
        mask[0, length - 3 :] = 0  # one padded row
        inputs = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask}
        out.append((inputs, torch.randint(0, 2, (rows,), generator=g)))
    return out


def logits(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(**inputs).logits


def test_importance_equals_brute_force():
    model = teacher()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    data = batches(model.config.vocab_size)
    scores = importance_from_grads(model, accumulate_abs_grads(model, data, 2), 2)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # frozen: nothing moved

    # Brute force: one backward per batch, then element by element over each structure's weights.
    layers = model.bert.encoder.layer[:2]
    modules = {}
    for i, layer in enumerate(layers):
        att = layer.attention
        modules[i] = [att.self.query, att.self.key, att.self.value, att.output.dense,
                      layer.intermediate.dense, layer.output.dense]
    grad_sum = {id(p): np.zeros(tuple(p.shape)) for ms in modules.values() for m in ms for p in m.parameters()}
    for inputs, target in data:
        model.zero_grad()
        F.cross_entropy(model(**inputs).logits, target).backward()
        for ms in modules.values():
            for m in ms:
                for p in m.parameters():
                    grad_sum[id(p)] += np.abs(p.grad.double().numpy())
    model.zero_grad()

    def s(p, *index) -> float:
        return abs(float(p.detach().double()[index])) * grad_sum[id(p)][index]

    for i, (q, k, v, o, inter, out) in modules.items():
        for h in range(HEADS):
            total = 0.0
            for r in range(h * HEAD_SIZE, (h + 1) * HEAD_SIZE):
                for lin in (q, k, v):
                    total += s(lin.bias, r) + sum(s(lin.weight, r, c) for c in range(HIDDEN))
                total += sum(s(o.weight, c, r) for c in range(HIDDEN))
            assert scores.heads[i, h] == pytest.approx(total, rel=1e-9)
        for n in range(0, inter.out_features, 7):
            total = s(inter.bias, n) + sum(s(inter.weight, n, c) for c in range(HIDDEN))
            total += sum(s(out.weight, c, n) for c in range(HIDDEN))
            assert scores.neurons[i, n] == pytest.approx(total, rel=1e-9)
    assert scores.heads.shape == (2, HEADS) and scores.neurons.shape == (2, 2 * HIDDEN)


def test_top_indices_ties_and_order():
    assert top_indices(np.array([0.5, 2.0, 0.5, 3.0, 0.5]), 3) == [0, 1, 3]  # tie at 0.5: lowest index
    assert top_indices(np.array([1.0, 1.0]), 2) == [0, 1]


def masked_reference(model, layers: int, kept_heads, kept_neurons):
    """The teacher cut to `layers` layers, removed heads and neurons zeroed in place (no pruning code)."""
    ref = copy.deepcopy(model)
    ref.bert.encoder.layer = ref.bert.encoder.layer[:layers]
    with torch.no_grad():
        for i, layer in enumerate(ref.bert.encoder.layer):
            for h in set(range(HEADS)) - set(kept_heads[i]):
                rows = slice(h * HEAD_SIZE, (h + 1) * HEAD_SIZE)
                layer.attention.self.value.weight[rows] = 0
                layer.attention.self.value.bias[rows] = 0
            for n in set(range(layer.intermediate.dense.out_features)) - set(kept_neurons[i]):
                layer.output.dense.weight[:, n] = 0  # the neuron's output never reaches the residual
    return ref


def test_pruning_keeps_exactly_the_chosen_heads_and_neurons():
    model = teacher()
    kept_heads = [[1, 3], [0, 2]]
    kept_neurons = [[0, 4, 7, 9, 63], [2, 3, 5, 40, 41]]
    student = prune_teacher(model, RositaShape(layers=2, heads=2, ffn=5, emb_rank=0), kept_heads, kept_neurons)

    assert student.config.num_hidden_layers == 2 and student.config.intermediate_size == 5
    assert student.config.removed_heads(0) == [0, 2] and student.config.removed_heads(1) == [1, 3]
    for i in range(2):
        t, s = model.bert.encoder.layer[i], student.bert.encoder.layer[i]
        rows = [h * HEAD_SIZE + j for h in kept_heads[i] for j in range(HEAD_SIZE)]
        for part in ("query", "key", "value"):
            assert torch.equal(getattr(s.attention.self, part).weight, getattr(t.attention.self, part).weight[rows])
            assert torch.equal(getattr(s.attention.self, part).bias, getattr(t.attention.self, part).bias[rows])
        assert torch.equal(s.attention.output.dense.weight, t.attention.output.dense.weight[:, rows])
        assert torch.equal(s.intermediate.dense.weight, t.intermediate.dense.weight[kept_neurons[i]])
        assert torch.equal(s.output.dense.weight, t.output.dense.weight[:, kept_neurons[i]])
        assert s.attention.self.num_attention_heads == 2
    # The same function as the teacher with the other heads and neurons switched off.
    inputs = batches(model.config.vocab_size, n=1)[0][0]
    ref = masked_reference(model, 2, kept_heads, kept_neurons)
    torch.testing.assert_close(logits(student, inputs), logits(ref, inputs), rtol=0, atol=1e-5)


def test_factorised_embedding_is_the_truncated_svd():
    table = torch.randn(40, 12, generator=torch.Generator().manual_seed(1))
    factors, project = factorise_embedding(table, 12)
    torch.testing.assert_close(factors @ project.T, table, rtol=0, atol=1e-5)  # full rank: exact
    factors, project = factorise_embedding(table, 4)
    s = torch.linalg.svdvals(table.double())
    error = torch.linalg.norm((factors @ project.T - table).double())
    assert float(error) == pytest.approx(float(s[4:].square().sum().sqrt()), rel=1e-5)  # Eckart-Young


def rosita_student(model=None):
    model = model or teacher()
    shape = RositaShape(layers=2, heads=3, ffn=20, emb_rank=8)
    kept_heads = [[0, 1, 3], [1, 2, 3]]
    kept_neurons = [list(range(0, 40, 2)), list(range(1, 41, 2))]
    return prune_teacher(model, shape, kept_heads, kept_neurons)


def test_save_reload_and_plain_export_give_the_same_logits(tmp_path, tiny_tokenizer):
    from transformers import AutoTokenizer

    student = rosita_student()
    inputs = batches(student.config.vocab_size, n=1)[0][0]
    expected = logits(student, inputs)
    plain = merge_export(student)
    summary = {
        "teacher": "tiny", "task": "sst2", "shape": {"layers": 2, "heads": 3, "ffn": 20, "emb_rank": 8},
        "teacher_shape": {"layers": 3, "heads": HEADS, "ffn": 2 * HIDDEN}, "importance_examples": 12,
        "importance_loss": "cross-entropy to the gold labels",
        "parameters": {"teacher": 1, "student": 1, "plain_export": 1},
    }
    save_rosita(student, plain, AutoTokenizer.from_pretrained(tiny_tokenizer), tmp_path / "r", summary)

    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "r")
    assert isinstance(reloaded, HskBertForSequenceClassification)
    assert torch.equal(logits(reloaded, inputs), expected)  # bit-identical after a save and reload

    plain_reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "r" / PLAIN_DIR)
    assert type(plain_reloaded) is BertForSequenceClassification  # transformers' own class
    assert json.loads((tmp_path / "r" / PLAIN_DIR / "config.json").read_text())["model_type"] == "bert"
    torch.testing.assert_close(logits(plain_reloaded, inputs), expected, rtol=0, atol=1e-5)
    assert "plain/" in (tmp_path / "r" / "README.md").read_text()


def build_args(confident_teacher_dir, glue_dir, out, *extra, heads="2"):
    return ["student", "build", "rosita", "--teacher", str(confident_teacher_dir), "--task", "sst2", "--layers", "2",
            "--heads", heads, "--ffn", "16", "--emb-rank", "8", "--data-dir", str(glue_dir),
            "--train-limit", "32", "--device", "cpu", "--out", str(out), *extra]


def test_cli_build_then_train_from_a_store(tmp_path, confident_teacher_dir, glue_dir, capsys):
    out = tmp_path / "rosita"
    assert main(build_args(confident_teacher_dir, glue_dir, out)) == 0
    printed = capsys.readouterr().out
    assert "parameters: teacher" in printed and "-> student" in printed
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert [len(h) for h in summary["kept_heads"]] == [2, 2] and [len(n) for n in summary["kept_neurons"]] == [16, 16]
    assert summary["parameters"]["student"] < summary["parameters"]["teacher"]
    # The kept heads are the top-scoring ones.
    for scores, kept in zip(summary["head_scores"], summary["kept_heads"]):
        assert min(scores[h] for h in kept) >= max(s for h, s in enumerate(scores) if h not in kept)

    store = str(tmp_path / "sst2.zarr")
    options = DumpOptions(config=HSKConfig.parse("2,4,0.5"), ref_student_layers=2, shard_rows=16, batch_size=16,
                          progress=False)
    dump("sst2", options, teacher=str(confident_teacher_dir), out=store, data_dir=str(glue_dir), limit=32,
         log=lambda *_: None)
    run = tmp_path / "run"
    args = ["train", "--store", store, "--student", str(out), "--out", str(run), "--max-steps", "2",
            "--epochs-hsk", "1", "--epochs-pred", "1", "--batch-size", "8", "--eval-limit", "16",
            "--data-dir", str(glue_dir), "--device", "cpu", "--no-progress"]
    assert main(args) == 0
    result = json.loads((run / "summary.json").read_text())
    assert result["student"]["kind"] == "rosita" and result["student"]["init"] == "teacher-pruned"
    assert result["student"]["projection"] is None  # the teacher's width: no projection
    assert isinstance(AutoModelForSequenceClassification.from_pretrained(run / "best"),
                      HskBertForSequenceClassification)
    assert main(["eval", str(run / "best"), "--task", "sst2", "--data-dir", str(glue_dir), "--limit", "8"]) == 0
    capsys.readouterr()
    # As a teacher, a pruned model's head-averaged attention rows would be wrong: refused with one line.
    dump_args = ["dump", "--task", "sst2", "--teacher", str(out), "--config", "1,2,0.5", "--data-dir", str(glue_dir),
                 "--limit", "8", "--device", "cpu", "--no-progress", "--out", str(tmp_path / "s.zarr")]
    assert main(dump_args) == 2
    assert "pruned attention heads" in capsys.readouterr().err


def test_cli_refuses_bad_input_with_one_line(tmp_path, confident_teacher_dir, glue_dir, capsys):
    assert main(build_args(confident_teacher_dir, glue_dir, tmp_path / "a", heads="9")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hsk: error: --heads 9 is out of range for this teacher: pass 1..4"]

    bad_kind = build_args(confident_teacher_dir, glue_dir, tmp_path / "b")
    bad_kind[2] = "tinybert"
    assert main(bad_kind) == 2
    assert capsys.readouterr().err.startswith("hsk: error: unknown student kind 'tinybert'")

    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    for extra in ([], ["--overwrite"]):  # a folder hsk did not make is never written into
        assert main(build_args(confident_teacher_dir, glue_dir, taken, *extra)) == 2
        assert "choose another --out" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["taken"] and (taken / "notes.txt").read_text() == "mine"


def test_cli_overwrite_replaces_only_a_student(tmp_path, confident_teacher_dir, glue_dir, capsys):
    out = tmp_path / "rosita"
    assert main(build_args(confident_teacher_dir, glue_dir, out)) == 0
    first = json.loads((out / SUMMARY_FILE).read_text())
    capsys.readouterr()
    assert main(build_args(confident_teacher_dir, glue_dir, out, heads="1")) == 2
    assert "already holds a student" in capsys.readouterr().err
    assert json.loads((out / SUMMARY_FILE).read_text()) == first
    assert main(build_args(confident_teacher_dir, glue_dir, out, "--overwrite", heads="1")) == 0
    assert json.loads((out / SUMMARY_FILE).read_text())["shape"]["heads"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rosita"]  # nothing staged left behind
