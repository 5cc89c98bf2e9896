"""LightPAFF training (pipelines/methods/lightpaff.py, pipelines/train/kinds/lightpaff_pretrain.py) on tiny random
models.

A random 3-layer masked-LM teacher dumps a masked-LM store of 40 SST-2 sentences; a random 4-layer
classifier with the same tokenizer dumps task stores of SST-2 rows from a file where some or all
rows have no gold label. Pre-training distillation runs a few steps, then fine-tuning starts from it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import save_tiny_teacher, tiny_bert_config
from transformers import AutoTokenizer, BertForMaskedLM, BertForSequenceClassification

from hskstore.format.config import ConfigError, HSKConfig
from pipelines.cli import main
from pipelines.dump.mlm import Masking, dump_mlm, load_corpus
from pipelines.dump.stage import DumpOptions, dump
from pipelines.methods import get_method
from pipelines.train.losses.terms import LOSS_TERMS, TermInputs

LOGITS_ONLY = DumpOptions(config=HSKConfig.parse("0,0,0"), shard_rows=16, batch_size=16, progress=False)


def _x(student_logits, **batch) -> TermInputs:
    return TermInputs(SimpleNamespace(logits=student_logits), batch, [], None)


@pytest.fixture(scope="module")
def sentences(glue_dir) -> list[str]:
    lines = (glue_dir / "SST-2" / "train.tsv").read_text().splitlines()[1:41]
    return [line.split("\t") for line in lines]


@pytest.fixture(scope="module")
def mlm_store(tmp_path_factory, tiny_tokenizer, sentences) -> Path:
    root = tmp_path_factory.mktemp("lightpaff_mlm")
    torch.manual_seed(4)
    teacher = BertForMaskedLM(tiny_bert_config(num_layers=3))
    with torch.no_grad():
        teacher.cls.predictions.bias.normal_(0, 2.0)  # peaked, far from uniform
    teacher.save_pretrained(root / "teacher")
    AutoTokenizer.from_pretrained(tiny_tokenizer).save_pretrained(root / "teacher")
    (root / "corpus.txt").write_text("\n".join(s for s, _ in sentences) + "\n")
    dump_mlm(str(root / "teacher"), str(root / "c.zarr"), load_corpus(str(root / "corpus.txt")), top_k=8,
             masking=Masking(mask_seed=2), max_length=32, batch_size=8, shard_rows=16, progress=False,
             log=lambda *_: None)
    return root / "c.zarr"


@pytest.fixture(scope="module")
def task_stores(tmp_path_factory, tiny_tokenizer, sentences) -> dict[str, str]:
    """SST-2 stores of the same 32 rows: half without labels ("mixed"), and none with one ("unlabeled")."""
    root = tmp_path_factory.mktemp("lightpaff_task")
    teacher = save_tiny_teacher(root / "teacher", tiny_tokenizer, num_layers=4, seed=1, confident=True)
    out = {}
    for name, keep in (("mixed", lambda i: i % 2 == 0), ("unlabeled", lambda i: False)):
        rows = [f"{s}\t{label if keep(i) else ''}" for i, (s, label) in enumerate(sentences[:32])]
        (root / f"{name}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
        out[name] = str(root / f"{name}.zarr")
        dump("sst2", LOGITS_ONLY, teacher=str(teacher), out=out[name], data_file=str(root / f"{name}.tsv"),
             log=lambda *_: None)
    return out


# --------------------------------------------------------------------------------------------------
# Loss terms by hand


def test_finetune_term_by_hand_unlabeled_rows_use_kl_only():
    s = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]])  # student (1/4, 3/4)
    t = torch.tensor([[math.log(3.0), 0.0], [math.log(3.0), 0.0]])  # teacher (3/4, 1/4)
    kl = 0.75 * math.log(0.75 / 0.25) + 0.25 * math.log(0.25 / 0.75)
    ce = -math.log(0.75)  # gold 1
    x = _x(s, logits=t, labels=torch.tensor([1, -1]))
    # row 0: (1 - l) CE + l KL; row 1 (no gold): KL alone; mean over rows
    assert LOSS_TERMS["lightpaff_ft"](x, lam=0.3).item() == pytest.approx(((0.7 * ce + 0.3 * kl) + kl) / 2, rel=1e-6)
    x_none = _x(s, logits=t, labels=torch.tensor([-1, -1]))
    for lam in (0.0, 0.5, 1.0):
        assert LOSS_TERMS["lightpaff_ft"](x_none, lam=lam).item() == pytest.approx(kl, rel=1e-6)
    assert LOSS_TERMS["lightpaff_ft"](_x(s, logits=t, labels=torch.tensor([1, 1])), lam=0.0).item() == \
        pytest.approx(ce, rel=1e-6)


def test_pretrain_terms_by_hand():
    # vocabulary of 4; the student's softmax (0.1, 0.2, 0.3, 0.4); the teacher keeps top-2 ids 3 and 0
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    student = q.log()[None]
    p = {3: 0.5, 0: 0.3}  # tail: 0.2
    lse = torch.tensor([2.0])
    ids = torch.tensor([[3, 0]])
    values = torch.tensor([[math.log(0.5) + 2.0, math.log(0.3) + 2.0]])
    x = _x(student, mlm_labels=torch.tensor([2]), topk_ids=ids, topk_logits=values, lse=lse)
    assert LOSS_TERMS["mlm_mle"](x).item() == pytest.approx(-math.log(0.3), rel=1e-5)
    hand = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.1) + 0.2 * math.log(0.2 / (0.2 + 0.3))
    assert p and LOSS_TERMS["mlm_topk_kl"](x).item() == pytest.approx(hand, rel=1e-5)


def test_lambda_defaults_and_terms():
    pre = get_method("lightpaff-pretrain")
    assert pre.make_options().lam == 1.0 and get_method("lightpaff").make_options().lam == 0.5
    ctx = SimpleNamespace(meta={"objective": "mlm"})
    assert [t.name for t in pre.stages(pre.make_options(), ctx)[0].terms] == ["kl"]
    terms = pre.stages(pre.make_options({"lam": "0.25"}), ctx)[0].terms
    assert [(t.name, t.weight) for t in terms] == [("mle", 0.75), ("kl", 0.25)]
    with pytest.raises(ValueError, match="lam must be in"):
        get_method("lightpaff").make_options({"lam": 1.5})


# --------------------------------------------------------------------------------------------------
# Refusals before the first step


def test_stores_that_cannot_serve_the_method_are_refused(mlm_store, task_stores, tmp_path, capsys):
    out = tmp_path / "run"
    base = ["train", "--out", str(out), "--no-progress", "--no-eval"]
    assert main([*base, "--store", task_stores["mixed"], "--student", "bert2", "--method", "lightpaff-pretrain"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hsk: error:")
    assert "reads mlm stores" in err and "is a task store" in err
    assert main([*base, "--store", str(mlm_store), "--init", "bert2", "--method", "lightpaff"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--method lightpaff-pretrain" in err
    assert not out.exists()  # nothing written


def test_pretrain_refuses_a_student_with_another_vocabulary(mlm_store, tmp_path, tiny_tokenizer, capsys):
    other = tmp_path / "other"
    BertForMaskedLM(tiny_bert_config(num_layers=1, vocab_size=tiny_bert_config().vocab_size + 7)).save_pretrained(other)
    AutoTokenizer.from_pretrained(tiny_tokenizer).save_pretrained(other)
    code = main(["train", "--store", str(mlm_store), "--student", str(other), "--method", "lightpaff-pretrain",
                 "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("hsk: error:")]  # model loading draws bars
    assert code == 2 and len(errors) == 1 and "vocabulary" in errors[0] and "Traceback" not in err
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------------------------------
# Runs


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_pretrain_then_finetune(mlm_store, task_stores, tmp_path):
    pre = tmp_path / "pre"
    args = ["train", "--store", str(mlm_store), "--student", "bert2", "--method", "lightpaff-pretrain",
            "--lam", "0.5", "--max-steps", "3", "--batch-size", "8", "--log-every", "1", "--device", "cpu",
            "--workers", "0", "--no-progress", "--out", str(pre)]
    assert main(args) == 0
    records = [r for r in _records(pre) if r["type"] == "train"]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        mle, kl = r["terms"]["mle"], r["terms"]["kl"]
        assert mle > 0 and kl > 0 and r["loss"] == pytest.approx(0.5 * mle + 0.5 * kl, rel=1e-5)
    # a plain transformers masked LM: 2 layers, decoder tied to the word embeddings, trained away from its init
    model = BertForMaskedLM.from_pretrained(pre / "best")
    assert model.config.num_hidden_layers == 2
    assert model.cls.predictions.decoder.weight.data_ptr() == model.bert.embeddings.word_embeddings.weight.data_ptr()
    teacher = BertForMaskedLM.from_pretrained(mlm_store.parent / "teacher")
    assert not torch.equal(model.bert.encoder.layer[0].output.dense.weight,
                           teacher.bert.encoder.layer[0].output.dense.weight)
    assert json.loads((pre / "summary.json").read_text())["steps"] == 3

    ft = tmp_path / "ft"
    assert main(["train", "--store", task_stores["mixed"], "--init", str(pre / "best"), "--method", "lightpaff",
                 "--max-steps", "3", "--batch-size", "8", "--log-every", "1", "--device", "cpu", "--workers", "0",
                 "--no-eval", "--no-progress", "--out", str(ft)]) == 0
    summary = json.loads((ft / "summary.json").read_text())
    assert summary["method"] == "lightpaff" and summary["method_options"]["lam"] == 0.5
    student = BertForSequenceClassification.from_pretrained(ft / "best")
    assert student.config.num_hidden_layers == 2


def test_pretrain_resumes_mid_run_to_the_same_curve(mlm_store, tmp_path):
    # 40 rows / batch 8 = 5 steps an epoch, so 7 steps cross an epoch boundary. The run dies at step 5,
    # after the checkpoint of step 4: steps 5-7 are recomputed from it (step 5's record is dropped)
    from pipelines.train.options import TrainOptions
    from pipelines.train.run.driver import train

    def opts(**kw) -> TrainOptions:
        base = dict(method="lightpaff-pretrain", method_options={"epochs": 2, "lam": 0.5}, max_steps=7,
                    batch_size=8, log_every=1, checkpoint_every=2, seed=5, workers=0, progress=False)
        return TrainOptions(**{**base, **kw})

    def losses(out: Path) -> list[tuple[int, float]]:
        return [(r["step"], r["loss"]) for r in _records(out) if r["type"] == "train"]

    whole = train(opts(), student="bert2", out_dir=str(tmp_path / "whole"), store=str(mlm_store), log=lambda *_: None)

    class Stop(Exception):
        pass

    def interrupt(record: dict) -> None:
        if record["step"] == 5:
            raise Stop

    cut = tmp_path / "cut"
    with pytest.raises(Stop):
        train(opts(), student="bert2", out_dir=str(cut), store=str(mlm_store), log=lambda *_: None,
              on_step=interrupt)
    assert torch.load(cut / "checkpoint" / "state.pt", weights_only=False)["progress"]["step"] == 4
    assert not (cut / "best").exists()
    lines: list[str] = []
    resumed = train(opts(), student="bert2", out_dir=str(cut), store=str(mlm_store), log=lines.append)
    assert any("resuming" in line and "step 4 of 7" in line for line in lines)
    assert [s for s, _ in losses(cut)] == list(range(1, 8))
    np.testing.assert_allclose([x for _, x in losses(cut)], [x for _, x in losses(tmp_path / "whole")], rtol=1e-5)
    assert resumed["steps"] == whole["steps"] == 7
    a = BertForMaskedLM.from_pretrained(cut / "best")
    b = BertForMaskedLM.from_pretrained(tmp_path / "whole" / "best")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6, msg=name)

    # another run's checkpoint in --out is refused in one line, before anything is trained
    with pytest.raises(ConfigError, match="checkpoint of another run"):
        train(opts(seed=6), student="bert2", out_dir=str(cut), store=str(mlm_store), log=lambda *_: None)


def _curve(store: str, out: Path, lam: str) -> list[float]:
    assert main(["train", "--store", store, "--student", "bert2", "--method", "lightpaff", "--lam", lam,
                 "--max-steps", "3", "--batch-size", "8", "--log-every", "1", "--device", "cpu", "--workers", "0",
                 "--no-eval", "--no-progress", "--seed", "3", "--out", str(out)]) == 0
    return [r["terms"]["lightpaff"] for r in _records(out) if r["type"] == "train"]


def test_rows_without_labels_train_on_kl_only(task_stores, tmp_path):
    # no gold label anywhere: l does not change a thing
    a = _curve(task_stores["unlabeled"], tmp_path / "u1", "0.2")
    b = _curve(task_stores["unlabeled"], tmp_path / "u2", "0.9")
    assert len(a) == 3 and a == pytest.approx(b, rel=1e-6, abs=1e-9)
    # half the rows labelled: l weighs their CE, so it does
    c = _curve(task_stores["mixed"], tmp_path / "m1", "0.2")
    d = _curve(task_stores["mixed"], tmp_path / "m2", "0.9")
    assert c[0] != pytest.approx(d[0], rel=1e-3)


def test_an_older_checkpoint_is_refused_in_one_line_then_started_over(mlm_store, tmp_path, capsys):
    """A checkpoint of an older layout (version 2: LightPAFF pre-training had its own) is not resumed: the
    command says what to do in one line and leaves the folder as it was; --no-resume starts over."""
    from pipelines.train.options import TrainOptions
    from pipelines.train.run.checkpoints import CHECKPOINT_VERSION
    from pipelines.train.run.driver import train

    out = tmp_path / "run"

    class Stop(Exception):
        pass

    def interrupt(record: dict) -> None:
        if record["step"] == 3:
            raise Stop

    opts = TrainOptions(method="lightpaff-pretrain", max_steps=4, batch_size=8, checkpoint_every=2, workers=0,
                        progress=False)
    with pytest.raises(Stop):
        train(opts, student="bert2", out_dir=str(out), store=str(mlm_store), log=lambda *_: None, on_step=interrupt)
    path = out / "checkpoint" / "state.pt"
    state = torch.load(path, weights_only=False)
    assert state["version"] == CHECKPOINT_VERSION and state["position"]["stage_step"] == 2
    old = {"version": 2, "identity": state["identity"], "progress": {"step": 2, "seconds": 0.0, "last": {}},
           "model": state["model"], "optimizer": state["optimizer"], "scheduler": state["scheduler"],
           "stream": state["stream"], "rng": state["rng"]}  # the layout lightpaff_pretrain wrote before
    torch.save(old, path)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    args = ["train", "--store", str(mlm_store), "--student", "bert2", "--method", "lightpaff-pretrain",
            "--max-steps", "4", "--batch-size", "8", "--checkpoint-every", "2", "--device", "cpu", "--workers", "0",
            "--no-progress", "--out", str(out)]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hsk: error:")
    assert "older hsk (checkpoint version 2" in err and "--no-resume" in err
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert main([*args, "--no-resume"]) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 4
    assert torch.load(path, weights_only=False)["version"] == CHECKPOINT_VERSION
    # a finished run is judged by its summary, whatever its checkpoint's layout: rerunning says it is done
    torch.save({**torch.load(path, weights_only=False), "version": 2}, path)
    capsys.readouterr()
    assert main(args) == 0
    assert "already finished" in capsys.readouterr().out
