"""`hsk train` end to end on tiny models: offline == online, resume, provenance, damage, reload, `hsk eval`.

A 4-layer, width-32 random teacher is dumped over 48 SST-2 rows (3 shards of 16) at config 2,4,0.5
for a 2-layer reference student; students are 2-layer BERTs built in the test.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import build_tiny_tokenizer, make_tiny_bert, save_tiny_teacher

from hskstore import CorruptStoreError, IncompleteStoreError, ProvenanceError
from hskstore.format.config import HSKConfig
from pipelines.dump.stage import DumpOptions, dump
from pipelines.train.losses.pairs import layer_pairs
from pipelines.train.options import TrainOptions
from pipelines.train.run.driver import train

CONFIG = "2,4,0.5"
ROWS = 48


def dump_options() -> DumpOptions:
    return DumpOptions(
        config=HSKConfig.parse(CONFIG), ref_student_layers=2, shard_rows=16, batch_size=16, progress=False
    )


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher"), tiny_tokenizer, num_layers=4, seed=1, confident=True)


@pytest.fixture(scope="module")
def store(tmp_path_factory, teacher_dir, glue_dir) -> str:
    out = str(tmp_path_factory.mktemp("store") / "sst2.zarr")
    dump(
        "sst2",
        dump_options(),
        teacher=str(teacher_dir),
        out=out,
        data_dir=str(glue_dir),
        limit=ROWS,
        log=lambda *_: None,
    )
    return out


def save_student(out: Path, tokenizer_dir: Path, hidden: int = 16, seed: int = 3) -> Path:
    """A 2-layer student of another width (so the projection W is exercised)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    make_tiny_bert(num_layers=2, hidden=hidden, heads=2, vocab_size=len(tok), seed=seed).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    return save_student(tmp_path_factory.mktemp("student"), tiny_tokenizer)


def options(**kw) -> TrainOptions:
    base = dict(
        epochs_hsk=1,
        epochs_pred=1,
        max_steps=4,
        batch_size=8,
        log_every=1,
        eval_limit=32,
        progress=False,
        lr_hsk=1e-3,  # large steps: loss curves that diverge quickly if anything differs
        lr_pred=1e-3,
        seed=7,
        workers=1,
        buffer_shards=2,
        checkpoint_every=100,
    )
    base.update(kw)
    mud = {k: base.pop(k) for k in ("epochs_hsk", "epochs_pred", "lr_hsk", "lr_pred", "stages") if k in base}
    return TrainOptions(**base, method_options=mud)


def losses(out: Path) -> list[tuple[str, int, float]]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["stage"], r["step"], r["loss"]) for r in records if r["type"] == "train"]


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory, store, student_dir, glue_dir):
    out = tmp_path_factory.mktemp("offline")
    summary = train(
        options(),
        student=str(student_dir),
        out_dir=str(out),
        store=store,
        data_dir=str(glue_dir),
        log=lambda *_: None,
    )
    return out, summary


def test_offline_run_summary_and_files(offline_run):
    out, summary = offline_run
    assert summary["mode"] == "offline" and summary["steps"] == 8
    assert summary["stages"]["hsk"]["steps"] == 4 and summary["stages"]["pred"]["steps"] == 4
    assert summary["student_init"] == "pretrained" and summary["student"]["projection"] == [16, 32]
    # same depth as the store's reference student: entries 1, 2 <- teacher layers 2, 3 directly
    assert [(m["student_entry"], m["teacher_layer"]) for m in summary["layer_map"]] == [(1, 2), (2, 3)]
    assert summary["metric"] == "accuracy" and 0.0 <= summary["score"] <= 1.0
    assert summary["store_bytes"]["total"] > summary["store_bytes"]["read"] > 0
    assert summary["examples_per_s"] > 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 8
    assert all(np.isfinite(loss) for _, _, loss in losses(out))
    assert (out / "best" / "config.json").exists() and (out / "checkpoint" / "state.pt").exists()


def test_online_losses_equal_offline(tmp_path, offline_run, teacher_dir, student_dir, glue_dir):
    out_off, _ = offline_run
    out = tmp_path / "online"
    summary = train(
        options(train_limit=ROWS, online=dump_options()),
        student=str(student_dir),
        out_dir=str(out),
        teacher=str(teacher_dir),
        task="sst2",
        config=CONFIG,
        data_dir=str(glue_dir),
        log=lambda *_: None,
    )
    assert summary["mode"] == "online"
    off, on = losses(out_off), losses(out)
    assert [(s, k) for s, k, _ in off] == [(s, k) for s, k, _ in on] and len(off) == 8
    # the same targets up to fp16 storage of the HSK values
    np.testing.assert_allclose([x for *_, x in on], [x for *_, x in off], rtol=2e-3, atol=1e-5)


def test_resume_mid_epoch_matches_uninterrupted_run(tmp_path, store, student_dir, glue_dir, offline_run):
    class Stop(Exception):
        pass

    def interrupt(record):
        if record["step"] == 3:  # stage hsk, mid-epoch (6 batches per epoch); last checkpoint at step 2
            raise Stop

    out = tmp_path / "resumed"
    opts = options(checkpoint_every=2)
    with pytest.raises(Stop):
        train(
            opts,
            student=str(student_dir),
            out_dir=str(out),
            store=store,
            data_dir=str(glue_dir),
            log=lambda *_: None,
            on_step=interrupt,
        )
    assert not (out / "summary.json").exists()
    messages = []
    summary = train(
        opts,
        student=str(student_dir),
        out_dir=str(out),
        store=store,
        data_dir=str(glue_dir),
        log=messages.append,
    )
    assert any("resuming" in m for m in messages)
    uninterrupted = losses(offline_run[0])
    resumed = losses(out)
    assert [(s, k) for s, k, _ in resumed] == [(s, k) for s, k, _ in uninterrupted]
    np.testing.assert_allclose([x for *_, x in resumed], [x for *_, x in uninterrupted], rtol=1e-5, atol=1e-7)
    assert summary["stages"]["pred"]["final_loss"] == pytest.approx(
        offline_run[1]["stages"]["pred"]["final_loss"], rel=1e-5
    )
    # a finished run is not trained again
    again = train(
        opts,
        student=str(student_dir),
        out_dir=str(out),
        store=store,
        data_dir=str(glue_dir),
        log=lambda *_: None,
    )
    assert again["steps"] == summary["steps"]


def test_other_tokenizer_refused_for_hsk_allowed_for_logits_only(tmp_path, store, glue_dir, caplog):
    words = ["the", "a", "film", "movie", "good", "bad", "is", "it", "and", "of"]
    other_tok = build_tiny_tokenizer(tmp_path / "tok", words + list("abcdefghijklmnopqrstuvwxyz"))
    student = save_student(tmp_path / "other", other_tok)
    with pytest.raises(ProvenanceError, match="tokenizer"):
        train(
            options(),
            student=str(student),
            out_dir=str(tmp_path / "a"),
            store=store,
            data_dir=str(glue_dir),
            log=lambda *_: None,
        )
    with caplog.at_level(logging.WARNING, logger="hsk.train"):
        summary = train(
            options(stages=("pred",)),
            student=str(student),
            out_dir=str(tmp_path / "b"),
            store=store,
            data_dir=str(glue_dir),
            log=lambda *_: None,
        )
    assert summary["steps"] == 4 and any("tokenizer" in w for w in summary["warnings"])
    assert any("re-tokenizes" in r.message for r in caplog.records)


def test_corrupted_store_is_refused(tmp_path, store, student_dir, glue_dir):
    bad = tmp_path / "bad.zarr"
    shutil.copytree(store, bad)
    shard_files = sorted(
        p for p in (bad / "layers" / "0" / "values").rglob("*") if p.is_file() and p.name != "zarr.json"
    )
    victim = shard_files[0]
    data = bytearray(victim.read_bytes())
    for i in range(len(data) // 2, min(len(data), len(data) // 2 + 16)):
        data[i] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError):
        train(
            options(epochs_hsk=3, max_steps=None, stages=("hsk",)),
            student=str(student_dir),
            out_dir=str(tmp_path / "run"),
            store=str(bad),
            data_dir=str(glue_dir),
            log=lambda *_: None,
        )


def test_incomplete_store_is_refused(tmp_path, store, student_dir):
    import zarr

    half = tmp_path / "half.zarr"
    shutil.copytree(store, half)
    group = zarr.open_group(str(half), mode="r+")
    meta = dict(group.attrs["hsk"], complete=False)  # as a dump killed before its last shard leaves it
    group.attrs["hsk"] = meta
    with pytest.raises(IncompleteStoreError, match="incomplete"):
        train(
            options(),
            student=str(student_dir),
            out_dir=str(tmp_path / "run"),
            store=str(half),
            log=lambda *_: None,
        )


def test_saved_student_reloads_with_plain_transformers(offline_run, glue_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from pipelines.core.data import load_examples
    from pipelines.core.tokenize import encode
    from pipelines.train.run.evaluate import evaluate_model, predict

    out, summary = offline_run
    model = AutoModelForSequenceClassification.from_pretrained(out / "best").eval()
    tok = AutoTokenizer.from_pretrained(out / "best")
    dev = load_examples("sst2", "dev", data_dir=glue_dir, limit=32)
    with torch.no_grad():
        plain = [model(**tok(text, return_tensors="pt")).logits[0].numpy() for text in dev.texts[0][:8]]
    ours = predict(model, encode(tok, dev.texts, 64))
    np.testing.assert_allclose(np.stack(plain), ours[:8], rtol=1e-4, atol=1e-5)
    result = evaluate_model(str(out / "best"), "sst2", data_dir=str(glue_dir), limit=32)
    assert result["splits"]["dev"]["accuracy"] == pytest.approx(summary["dev"]["dev"]["accuracy"])
    assert result["score"] == pytest.approx(summary["score"])


def test_cli_train_and_eval(tmp_path, store, student_dir, glue_dir, offline_run, capsys):
    from pipelines.cli import (
        main,
        train_commands,  # noqa: F401  (registers `hsk train` / `hsk eval`)
    )

    out = tmp_path / "cli"
    code = main(
        [
            "train",
            "--store",
            store,
            "--student",
            str(student_dir),
            "--out",
            str(out),
            "--stages",
            "pred",
            "--epochs-pred",
            "0.5",
            "--batch-size",
            "8",
            "--data-dir",
            str(glue_dir),
            "--eval-limit",
            "16",
            "--no-progress",
        ]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3  # half of 6 batches
    capsys.readouterr()
    code = main(
        [
            "eval",
            str(offline_run[0] / "best"),
            "--task",
            "sst2",
            "--data-dir",
            str(glue_dir),
            "--limit",
            "32",
            "--json",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["splits"]["dev"]["n"] == 32 and result["metric"] == "accuracy"
    assert (
        main(
            [
                "train",
                "--store",
                store,
                "--student",
                str(student_dir),
                "--out",
                str(tmp_path / "x"),
                "--stages",
                "pred,hsk",
            ]
        )
        == 2
    )  # a user error, one line, no traceback


def test_layer_map_for_another_depth(store, teacher_dir):
    from pipelines.train.data.sources import open_offline

    sel = open_offline(store, None).selection
    lines = []
    pairs = layer_pairs("store", sel, 1, loss="hsk_mse", projection=False, log=lines.append)  # 1-layer student
    assert [(p.kept, p.student_layer, p.teacher_layer) for p in pairs] == [(0, 0, 2), (1, 1, 3)]
    assert "student embeddings <- stored teacher layer 2" in "\n".join(lines)
    pairs = layer_pairs("store", sel, 2, loss="hsk_mse", projection=True)
    assert [(p.kept, p.student_layer, p.teacher_layer, p.projection) for p in pairs] == [(0, 1, 2, "W"), (1, 2, 3, "W")]


def test_bert_k_and_tinybert_random_fallback(monkeypatch, teacher_dir, caplog):
    from pipelines.train.students.build import build_student

    model, info = build_student("bert2", num_labels=2, teacher_hidden_size=32, base=str(teacher_dir))
    assert info.num_layers == 2 and info.projection is None and info.init == "teacher-layers"
    teacher = make_tiny_bert(num_layers=4, seed=1)  # the same weights (the scaled head is not compared)
    for name in ("bert.encoder.layer.1.output.dense.weight", "bert.embeddings.word_embeddings.weight"):
        torch.testing.assert_close(model.state_dict()[name], teacher.state_dict()[name])

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HSK_TINYBERT_PATH", raising=False)
    with caplog.at_level(logging.WARNING, logger="hsk.students"):
        model, info = build_student(
            "tinybert4", num_labels=2, teacher_hidden_size=32, tokenizer_fallback=str(teacher_dir)
        )
    assert info.init == "random" and info.projection.in_features == 312 and info.num_layers == 4
    assert model.config.intermediate_size == 1200 and model.config.num_attention_heads == 12
    assert any("RANDOMLY INITIALISED" in r.message for r in caplog.records)
