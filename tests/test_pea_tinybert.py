"""Methods `pea` (PTP stage, then Patient KD; SPS students) and `tinybert-att` (attention rows + HSK)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import make_tiny_bert

from hskstore.format.config import ConfigError, HSKConfig
from pipelines.dump.stage import DumpOptions, dump
from pipelines.train.losses.attention import ScoreRecorder, attention_mse, score_rows
from pipelines.train.losses.pairs import LayerPair
from pipelines.train.losses.terms import LOSS_TERMS, TermInputs
from pipelines.train.options import TrainOptions
from pipelines.train.run.driver import train
from pipelines.train.students.adapter import StudentOutputs
from pipelines.train.students.sps import sps_from_bert

ROWS = 48
ATT = DumpOptions(config=HSKConfig.parse("2,4,0.5"), ref_student_layers=2, shard_rows=16, batch_size=16,
                  progress=False, attention_rows=True)
CLS = DumpOptions(config=HSKConfig.parse("3,1,1"), layers=[1, 2, 3], token_strategy="cls", shard_rows=16,
                  batch_size=16, progress=False)


@pytest.fixture(scope="module")
def stores(tmp_path_factory, confident_teacher_dir, glue_dir) -> dict[str, str]:
    root = tmp_path_factory.mktemp("stores")
    out = {}
    for name, opts in (("att", ATT), ("cls", CLS)):
        out[name] = str(root / f"{name}.zarr")
        dump("sst2", opts, teacher=str(confident_teacher_dir), out=out[name], data_dir=str(glue_dir), limit=ROWS,
             log=lambda *_: None)
    return out


def options(method: str, **kw) -> TrainOptions:
    base = dict(max_steps=3, batch_size=8, log_every=1, eval_limit=16, progress=False, seed=7, workers=1,
                buffer_shards=2, checkpoint_every=100)
    base.update(kw)
    return TrainOptions(method=method, **base)


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def curve(out: Path) -> list[tuple[str, int, float]]:
    return [(r["stage"], r["step"], r["loss"]) for r in records(out) if r["type"] == "train"]


# --------------------------------------------------------------------------------------------------
# Loss terms by hand


def test_ptp_term_by_hand():
    # teacher: [0, log 9] -> class 1 at 0.9; gold 1 (right) and 0 (wrong); thresholds 0.8 / 0.95
    batch = {"logits": torch.tensor([[0.0, math.log(9.0)]] * 2), "labels": torch.tensor([1, 0])}
    student = torch.tensor([[2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
    x = TermInputs(SimpleNamespace(logits=student), batch, [], None)
    # PTP labels: right & 0.9 > 0.8 -> 0; wrong & 0.9 <= 0.95 -> 3
    want = -(math.log(math.exp(2) / (math.exp(2) + 3)) + math.log(math.e / (2 * math.e + 2))) / 2
    assert LOSS_TERMS["ptp_ce"](x, t1=0.8, t2=0.95).item() == pytest.approx(want, rel=1e-6)
    with pytest.raises(ValueError, match="ptp4"):
        LOSS_TERMS["ptp_ce"](TermInputs(SimpleNamespace(logits=student[:, :2]), batch, [], None), t1=0.8, t2=0.95)


def test_attention_terms_by_hand():
    # one head of width 2: q rows (1, 0) and (0, 2); keys (1, 1), (2, 0), (0, 3)
    q = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [5.0, 5.0]]])
    k = torch.tensor([[[1.0, 1.0], [2.0, 0.0], [0.0, 3.0]]])
    rows = score_rows(q, k, torch.tensor([[1, 0]]), num_heads=1)
    s = 1 / math.sqrt(2)
    torch.testing.assert_close(rows, torch.tensor([[[[2 * s, 0.0, 6 * s], [s, 2 * s, 0.0]]]]))
    teacher = torch.tensor([[[[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]]])  # T = 4 >= t = 3, padded key zero
    valid, keys = torch.tensor([[True, True]]), torch.tensor([[1, 1, 0]])  # key 2 is padding
    # real keys only: ((2s - 1)^2 + 0 + (s - 0)^2 + (2s - 1)^2) / 4
    want = (2 * (2 * s - 1) ** 2 + s * s) / 4
    assert attention_mse(rows, teacher, valid, keys).item() == pytest.approx(want, rel=1e-6)
    # an unused slot drops out; "mean" compares head-averaged rows (one head here: the same value)
    assert attention_mse(rows, teacher, torch.tensor([[True, False]]), keys).item() == pytest.approx(
        ((2 * s - 1) ** 2 + 0.0) / 2, rel=1e-6)
    assert attention_mse(rows, teacher, valid, keys, heads="mean").item() == pytest.approx(want, rel=1e-6)
    with pytest.raises(ConfigError, match="heads=mean"):
        attention_mse(rows, teacher.expand(1, 2, 2, 4), valid, keys)
    # the term: pairs above the embeddings only; student layer s reads recorded call s - 1
    outputs = StudentOutputs(attention_scores=[(q, k, 1)])
    batch = {"attention_0": teacher, "positions_0": torch.tensor([[1, 0]]), "valid_0": valid, "attention_mask": keys}
    pairs = [LayerPair(0, 0, "tokens", "x", 1.0, None, 5), LayerPair(2, 1, "tokens", "x", 1.0, None, 0)]
    assert LOSS_TERMS["attention_mse"](TermInputs(outputs, batch, pairs, None)).item() == pytest.approx(want)


def test_score_recorder_follows_the_sps_schedule():
    bert = make_tiny_bert(num_layers=2, seed=3)
    model = sps_from_bert(bert).eval()
    ids = torch.randint(5, 60, (2, 6))
    with torch.no_grad():
        with ScoreRecorder(model) as calls:
            out = model(input_ids=ids, output_hidden_states=True)
        calls = list(calls)
    assert len(calls) == 4  # L1, L2, L1', L2'
    att = model.bert.encoder.layer[0].attention.self
    with torch.no_grad():  # L1' reads hidden state 2 with Q and K swapped
        torch.testing.assert_close(calls[2][0], att.key(out.hidden_states[2]))
        torch.testing.assert_close(calls[2][1], att.query(out.hidden_states[2]))
        torch.testing.assert_close(calls[0][0], att.query(out.hidden_states[0]))


# --------------------------------------------------------------------------------------------------
# Refusals before the first step


def test_stores_that_cannot_serve_pea_or_tinybert_are_refused(stores, tmp_path, capsys):
    from pipelines.cli import main

    cases = [
        (["--store", stores["cls"], "--method", "tinybert-att"], "--attention-rows"),
        (["--store", stores["att"], "--method", "pea"], "--tokens cls"),
        (["--store", stores["att"], "--method", "pea", "--ptp-t1", "1.5"], "--ptp-t1"),
        (["--store", stores["att"], "--method", "tinybert-att", "--set", "heads=some"], "heads"),
    ]
    for args, message in cases:
        out = tmp_path / "run"
        code = main(["train", *args, "--student", "bert2", "--out", str(out), "--no-eval", "--no-progress"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "hsk: error:" in err and message in err, err
        assert not out.exists()


# --------------------------------------------------------------------------------------------------
# Runs: stage transitions, head swap, SPS student, offline == online, resume


def test_pea_on_an_sps_student(stores, confident_teacher_dir, glue_dir, tmp_path):
    from transformers import AutoModelForSequenceClassification

    opts = dict(method_options={"lr": 1e-3, "ptp_lr": 1e-3, "ptp_epochs": 1, "epochs": 1},
                student_base=str(confident_teacher_dir), data_dir=str(glue_dir))
    summary = train(options("pea", **opts), student="sps1", out_dir=str(tmp_path / "pea"), store=stores["cls"],
                    log=lambda *_: None)
    assert [s["head"] for s in summary["plan"]] == ["ptp4", "task"]
    assert summary["plan"][0]["terms"] == [{"name": "ptp", "loss": "ptp_ce", "weight": 1.0, "t1": 0.98, "t2": 0.8}]
    # sps1 runs 2 effective layers: Patient KD pairs student layer 1 with teacher layer 4 * 1 // 2 = 2
    assert [(p["student_layer"], p["teacher_layer"]) for p in summary["layer_pairs"]] == [(1, 2)]
    train_records = [r for r in records(tmp_path / "pea") if r["type"] == "train"]
    assert [(r["stage"], set(r["terms"])) for r in train_records] == [("ptp", {"ptp"})] * 3 + [
        ("kd", {"ce", "kl", "pkd"})] * 3
    best = AutoModelForSequenceClassification.from_pretrained(tmp_path / "pea" / "best")
    assert type(best).__name__ == "SPSForSequenceClassification" and best.classifier.out_features == 2
    assert "L1, L1'" in (tmp_path / "pea" / "best" / "README.md").read_text()


@pytest.mark.parametrize(("stop", "checkpoint_every"), [(5, 1), (4, 100)])
def test_pea_resumes_inside_the_kd_stage_with_the_same_curve(stop, checkpoint_every, stores, confident_teacher_dir,
                                                              glue_dir, tmp_path):
    # (5, 1): the kd stage's second step, from its own checkpoint (the trained task head comes back);
    # (4, 100): the kd stage's first step, from the checkpoint at the end of PTP: the fresh KD head is drawn
    # again, and must be the very same head.
    kw = dict(method_options={"lr": 1e-3, "ptp_lr": 1e-3, "ptp_epochs": 1, "epochs": 1, "beta": 0.0},
              student_base=str(confident_teacher_dir), data_dir=str(glue_dir), checkpoint_every=checkpoint_every,
              eval_limit=8)
    train(options("pea", **kw), student="sps1", out_dir=str(tmp_path / "whole"), store=stores["att"],
          log=lambda *_: None)

    class Stop(Exception):
        pass

    def interrupt(record):
        if record["step"] == stop:
            raise Stop

    with pytest.raises(Stop):
        train(options("pea", **kw), student="sps1", out_dir=str(tmp_path / "cut"), store=stores["att"],
              log=lambda *_: None, on_step=interrupt)
    train(options("pea", **kw), student="sps1", out_dir=str(tmp_path / "cut"), store=stores["att"],
          log=lambda *_: None)
    whole, cut = curve(tmp_path / "whole"), curve(tmp_path / "cut")
    assert [(s, k) for s, k, _ in cut] == [(s, k) for s, k, _ in whole]
    np.testing.assert_allclose([x for *_, x in cut], [x for *_, x in whole], rtol=1e-5)
    # one row per event, as in the uninterrupted run: each stage ends once, each step is logged once
    events = [(r["type"], r["stage"], r["step"]) for r in records(tmp_path / "cut")]
    assert events == [(r["type"], r["stage"], r["step"]) for r in records(tmp_path / "whole")]
    assert [e for e in events if e[0] == "stage_end"] == [("stage_end", "ptp", 3), ("stage_end", "kd", 6)]


@pytest.mark.parametrize("kd_head", ["fresh", "kept"])
def test_pea_kd_stage_head_after_ptp(kd_head, stores, confident_teacher_dir, glue_dir, tmp_path):
    """The KD stage starts from a freshly drawn task head (the authors' code), or with --set kd_head=kept
    from the head the student had before PTP (for sps<k>, the teacher's classifier)."""
    from transformers import AutoModelForSequenceClassification

    # a KD learning rate of 1e-12 leaves the head where the stage started it (Adam steps ~ lr)
    mo = {"lr": 1e-12, "ptp_lr": 1e-3, "ptp_epochs": 1, "epochs": 1, "beta": 0.0, "kd_head": kd_head}
    summary = train(options("pea", method_options=mo, student_base=str(confident_teacher_dir), data_dir=str(glue_dir)),
                    student="sps1", out_dir=str(tmp_path / kd_head), store=stores["cls"], log=lambda *_: None)
    assert [s["fresh_head"] for s in summary["plan"]] == [False, kd_head == "fresh"]
    head = AutoModelForSequenceClassification.from_pretrained(tmp_path / kd_head / "best").classifier
    teacher_head = AutoModelForSequenceClassification.from_pretrained(confident_teacher_dir).classifier
    if kd_head == "kept":
        torch.testing.assert_close(head.weight, teacher_head.weight)
        torch.testing.assert_close(head.bias, teacher_head.bias)
    else:  # BERT's initialisation, std initializer_range (0.02), zero bias; nothing of the teacher's head
        assert float(head.bias.detach().abs().max()) < 1e-6 and 0.01 < float(head.weight.detach().std()) < 0.03
        assert float(teacher_head.bias.detach().abs().max()) > 0.5


@pytest.mark.parametrize("method", ["tinybert-att", "pea"])
def test_offline_equals_online(method, stores, confident_teacher_dir, glue_dir, tmp_path):
    if method == "pea":
        mo, store, online, student = ({"lr": 1e-3, "ptp_lr": 1e-3, "ptp_epochs": 1, "epochs": 1},
                                      stores["cls"], CLS, "sps1")
    else:
        mo, store, online, student = {"epochs_hsk": 1, "epochs_pred": 1, "lr_hsk": 1e-3}, stores["att"], ATT, "bert2"
    opts = dict(method_options=mo, student_base=str(confident_teacher_dir), data_dir=str(glue_dir))
    off = train(options(method, **opts), student=student, out_dir=str(tmp_path / "off"), store=store,
                log=lambda *_: None)
    on = train(options(method, train_limit=ROWS, online=online, **opts), student=student,
               out_dir=str(tmp_path / "on"), teacher=str(confident_teacher_dir), task="sst2", config=str(online.config),
               log=lambda *_: None)
    assert on["mode"] == "online" and off["mode"] == "offline"
    a, b = records(tmp_path / "off"), records(tmp_path / "on")
    a, b = [r for r in a if r["type"] == "train"], [r for r in b if r["type"] == "train"]
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4, 5, 6]
    for x, y in zip(a, b, strict=True):  # every term, not only their sum
        assert set(x["terms"]) == set(y["terms"])
        for name in x["terms"]:
            assert y["terms"][name] == pytest.approx(x["terms"][name], rel=2e-3, abs=1e-5)
    if method == "tinybert-att":
        assert {"hsk", "att"} == set(a[0]["terms"]) and a[0]["terms"]["att"] > 0
        assert off["layer_pairs"][0]["loss"] == "hsk_mse+attention_mse"


def test_tinybert_att_needs_the_teachers_head_count_or_mean(stores, confident_teacher_dir, glue_dir, tmp_path):
    narrow = make_tiny_bert(num_layers=2, heads=2, seed=5)  # 2 heads; the teacher has 4
    from transformers import AutoTokenizer

    narrow.save_pretrained(tmp_path / "narrow")
    AutoTokenizer.from_pretrained(confident_teacher_dir).save_pretrained(tmp_path / "narrow")
    opts = dict(student_base=str(confident_teacher_dir), data_dir=str(glue_dir), max_steps=1,
                method_options={"epochs_hsk": 1, "epochs_pred": 1})
    with pytest.raises(ConfigError, match="heads=mean"):
        train(options("tinybert-att", **opts), student=str(tmp_path / "narrow"), out_dir=str(tmp_path / "a"),
              store=stores["att"], log=lambda *_: None)
    opts["method_options"] = {"epochs_hsk": 1, "epochs_pred": 1, "heads": "mean"}
    summary = train(options("tinybert-att", **opts), student=str(tmp_path / "narrow"), out_dir=str(tmp_path / "b"),
                    store=stores["att"], log=lambda *_: None)
    assert summary["method_options"]["heads"] == "mean"
    att = [r["terms"]["att"] for r in records(tmp_path / "b") if r["type"] == "train" and r["stage"] == "hsk"]
    assert len(att) == 1 and att[0] > 0


def test_metrics_log_keeps_one_row_per_event(tmp_path):
    from pipelines.core.run_state import MetricsLog

    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, None)
    ptp_last = {"type": "train", "stage": "ptp", "step": 3, "loss": 1.0}
    ptp_end = {"type": "stage_end", "stage": "ptp", "step": 3, "final_loss": 1.0}
    for record in (ptp_last, ptp_end, ptp_last, ptp_end, {"type": "train", "stage": "kd", "step": 4, "loss": 0.5}):
        log.write(record)
    events = [(r["type"], r["stage"], r["step"]) for r in records(tmp_path)]
    assert events == [("train", "ptp", 3), ("stage_end", "ptp", 3), ("train", "kd", 4)]
    # A file that already repeats the PTP stage's end (written by an older hsk): a resume at the end of PTP
    # keeps one copy of each row up to its step and drops the rest; a row met again is not written again.
    lines = [json.dumps(r) for r in (ptp_last, ptp_end, ptp_last, ptp_end, {"type": "train", "stage": "kd",
                                                                            "step": 4})]
    path.write_text("".join(f"{line}\n" for line in lines))
    log = MetricsLog(path, 3)
    log.write(ptp_end)
    log.write({"type": "train", "stage": "kd", "step": 4, "loss": 0.4})
    events = [(r["type"], r["stage"], r["step"]) for r in records(tmp_path)]
    assert events == [("train", "ptp", 3), ("stage_end", "ptp", 3), ("train", "kd", 4)]
    assert records(tmp_path)[-1]["loss"] == 0.4


def test_hsk_train_pea_warns_when_the_ptp_labels_are_degenerate(stores, confident_teacher_dir, glue_dir, tmp_path,
                                                                 capsys):
    """The tiny confident teacher is sure of every row, right or wrong: at SST-2's (0.98, 0.8) no row is
    right-confident nor wrong-unsure. The run says so before training, and records it in summary.json."""
    import re

    from pipelines.cli import main

    def run(out: Path, *flags: str) -> str:
        assert main(["train", "--method", "pea", "--store", stores["cls"], "--student", "sps1", "--student-base",
                     str(confident_teacher_dir), "--max-steps", "1", "--batch-size", "8", "--eval-limit", "8",
                     "--data-dir", str(glue_dir), "--no-progress", "--out", str(out), *flags]) == 0
        return capsys.readouterr().out

    said = run(tmp_path / "authors")
    line = next(x for x in said.splitlines() if x.startswith("WARNING: PTP labels of this store are degenerate"))
    assert "0 right-confident" in line and "0 wrong-unsure" in line
    summary = json.loads((tmp_path / "authors" / "summary.json").read_text())
    assert any(w.startswith("PTP labels of this store are degenerate") for w in summary["warnings"])
    t1, t2 = re.search(r"--ptp-t1 ([0-9.]+) --ptp-t2 ([0-9.]+)", line).groups()
    # the suggested thresholds give labels of every class: no warning
    assert "PTP labels" not in run(tmp_path / "split", "--ptp-t1", t1, "--ptp-t2", t2)
