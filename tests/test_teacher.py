"""Teacher fine-tuning on a tiny random BERT: a plain HF checkpoint whose saved dev metric is real."""

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from pipelines.core.data import load_examples
from pipelines.core.metrics import compute_metrics
from pipelines.core.models import load_classifier, load_tokenizer
from pipelines.core.tokenize import encode
from pipelines.train.kinds.teacher import SUMMARY_FILE, fine_tune_teacher
from pipelines.train.run.evaluate import predict

COMMON = dict(epochs=1.0, lr=1e-3, batch_size=16, train_limit=64, eval_limit=48, progress=False)


@pytest.fixture(scope="module")
def sst2_teacher(tmp_path_factory, tiny_base_dir, glue_dir):
    out = tmp_path_factory.mktemp("teacher_sst2")
    logs: list[str] = []
    summary = fine_tune_teacher("sst2", str(tiny_base_dir), out, data_dir=glue_dir, log=logs.append, **COMMON)
    return out, summary, logs


def test_summary_file_has_the_metric(sst2_teacher):
    out, summary, logs = sst2_teacher
    on_disk = json.loads((out / SUMMARY_FILE).read_text())
    assert on_disk == summary
    acc = summary["dev_metrics"]["dev"]["accuracy"]
    assert 0.0 <= acc <= 1.0
    assert summary["task"] == "sst2" and summary["train_examples"] == 64 and summary["max_length"] == 64
    assert summary["base_weights_hash"].startswith("sha256:") and summary["seed"] == 0
    assert summary["dev_data"]["dev"]["examples"] == 48
    assert {"torch", "transformers", "numpy", "python"} <= set(summary["software"])
    assert summary["history"][0]["dev"]["dev"]["accuracy"] == acc and summary["best_epoch"] == 1
    assert any("epoch 1" in line for line in logs)


def test_checkpoint_reloads_with_plain_transformers(sst2_teacher, glue_dir):
    out, summary, _ = sst2_teacher
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.config.id2label == {0: "negative", 1: "positive"}
    assert model.config.label2id == {"negative": 0, "positive": 1}
    dev = load_examples("sst2", "dev", data_dir=glue_dir, limit=48)
    enc = tokenizer(dev.texts[0], truncation=True, max_length=64, padding=True, return_tensors="pt")
    with torch.no_grad():
        plain = model(**enc).logits.numpy()
    # The saved weights are the evaluated ones: the plain-HF dev metric equals the recorded one.
    got = compute_metrics("sst2", plain, dev.labels)["accuracy"]
    assert got == pytest.approx(summary["dev_metrics"]["dev"]["accuracy"], abs=1e-6)
    # hsk's own loader + length-trimmed batches give the same logits as padded plain HF.
    ours = predict(load_classifier(str(out)), encode(load_tokenizer(str(out)), dev.texts, 64), batch_size=7)
    np.testing.assert_allclose(ours, plain, rtol=1e-5, atol=1e-5)


def test_deterministic_for_a_seed(sst2_teacher, tmp_path, tiny_base_dir, glue_dir):
    _, first, _ = sst2_teacher
    again = fine_tune_teacher(
        "sst2", str(tiny_base_dir), tmp_path, data_dir=glue_dir, log=lambda _: None, **COMMON
    )
    assert again["weights_hash"] == first["weights_hash"]
    assert again["history"] == first["history"]


def test_regression_task_and_dev_free_data_file(tmp_path, tiny_base_dir, glue_dir, monkeypatch):
    summary = fine_tune_teacher(
        "stsb", str(tiny_base_dir), tmp_path / "stsb", data_dir=glue_dir, log=lambda _: None, **COMMON
    )
    assert set(summary["dev_metrics"]["dev"]) == {"spearman", "pearson"}
    config = json.loads((tmp_path / "stsb" / "config.json").read_text())
    assert len(config["id2label"]) == 1
    assert config["problem_type"] == "regression"

    # A user's training file and no dev data anywhere: trains, warns, keeps the last epoch.
    monkeypatch.delenv("HSK_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = tmp_path / "mine.jsonl"
    rows = [{"sentence": f"a good movie number {i}", "label": i % 2} for i in range(20)]
    rows.append({"sentence": "no label here"})
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    logs: list[str] = []
    summary = fine_tune_teacher(
        "sst2", str(tiny_base_dir), tmp_path / "own", data_file=data, log=logs.append, **COMMON
    )
    assert summary["dev_metrics"] == {} and summary["train_examples"] == 20
    assert any("WARNING: no dev data" in line for line in logs)
    assert any("dropping 1 training rows" in line for line in logs)
