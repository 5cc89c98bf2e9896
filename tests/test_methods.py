"""Methods as data (pipelines/methods): registry, loss terms by hand, layer pairs, refusals, stage
transitions and head swaps, resume mid-way through a second stage, offline == online per method.

A 4-layer width-32 random teacher; two stores of the same 48 SST-2 rows (3 shards of 16): the mud
store (config 2,4,0.5, ranked tokens) and a Patient KD store ([CLS] vectors of teacher layers 1, 2, 3).
"""

from __future__ import annotations

import json
import math
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hskstore.format.config import ConfigError, HSKConfig
from pipelines.dump.stage import DumpOptions, dump
from pipelines.methods import Method, MethodError, Stage, Term, all_methods, get_method, register
from pipelines.methods.pkd import pkd_teacher_layers
from pipelines.train.losses.pairs import LayerPair, layer_pairs
from pipelines.train.losses.terms import LOSS_TERMS, TermInputs, weighted_sum
from pipelines.train.options import TrainOptions
from pipelines.train.run.driver import train
from pipelines.train.students.heads import Heads

ROWS = 48
MUD = DumpOptions(config=HSKConfig.parse("2,4,0.5"), ref_student_layers=2, shard_rows=16, batch_size=16,
                  progress=False)
PKD = DumpOptions(config=HSKConfig.parse("3,1,1"), layers=[1, 2, 3], token_strategy="cls", shard_rows=16,
                  batch_size=16, progress=False)


def _dump(root: Path, name: str, options: DumpOptions, teacher: Path, glue_dir: Path) -> str:
    out = str(root / name)
    dump("sst2", options, teacher=str(teacher), out=out, data_dir=str(glue_dir), limit=ROWS, log=lambda *_: None)
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory, confident_teacher_dir, glue_dir) -> dict[str, str]:
    root = tmp_path_factory.mktemp("stores")
    return {"mud": _dump(root, "mud.zarr", MUD, confident_teacher_dir, glue_dir),
            "cls": _dump(root, "cls.zarr", PKD, confident_teacher_dir, glue_dir)}


def options(method: str = "mud", **kw) -> TrainOptions:
    base = dict(max_steps=4, batch_size=8, log_every=1, eval_limit=16, progress=False, seed=7, workers=1,
                buffer_shards=2, checkpoint_every=100)
    base.update(kw)
    return TrainOptions(method=method, **base)


def curve(out: Path) -> list[tuple[str, int, float]]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["stage"], r["step"], r["loss"]) for r in records if r["type"] == "train"]


# --------------------------------------------------------------------------------------------------
# The registry and the pairs


def test_registry_lists_every_method_with_its_store_needs(capsys):
    from pipelines.cli import main

    names = [m.name for m in all_methods()]
    assert {"mud", "kd", "pkd-skip", "pkd-last", "finetune"} <= set(names)
    assert main(["methods"]) == 0
    text = capsys.readouterr().out
    for m in all_methods():
        assert any(line.split(None, 1) == [m.name, m.summary] for line in text.splitlines()) and m.store_needs in text
    with pytest.raises(MethodError, match="unknown method 'nope'"):
        get_method("nope")
    with pytest.raises(MethodError, match="no option beta"):
        get_method("kd").make_options({"beta": 1})
    assert get_method("pkd-skip").make_options({"beta": "100", "alpha": "0.2"}).beta == 100.0
    with pytest.raises(MethodError, match="alpha"):
        get_method("kd").make_options({"alpha": 1.5})


@pytest.mark.parametrize(("teacher", "student", "skip", "last"), [
    (12, 6, [2, 4, 6, 8, 10], [7, 8, 9, 10, 11]),  # Patient KD's paper
    (12, 3, [4, 8], [10, 11]),
    (6, 3, [2, 4], [4, 5]),  # our choice for the MiniLM teacher: every 2nd; the two below the top
    (6, 2, [3], [5]),
    (4, 3, [1, 2], [2, 3]),
])
def test_pkd_pairs_are_the_papers_i_pt(teacher, student, skip, last):
    assert pkd_teacher_layers("pkd-skip", teacher, student) == skip
    assert pkd_teacher_layers("pkd-last", teacher, student) == last


def test_pkd_needs_two_student_layers():
    with pytest.raises(ConfigError, match="2 <= S <= L"):
        pkd_teacher_layers("pkd-skip", 12, 1)


def test_pkd_pairs_from_a_store(stores):
    from hskstore.io.reader import open_store

    sel = open_store(stores["cls"]).selection
    pairs = layer_pairs("pkd-last", sel, 3, loss="pkd_cls", projection=False)
    assert pairs == [LayerPair(2, 1, "cls", "pkd_cls", 1.0, None, 1), LayerPair(3, 2, "cls", "pkd_cls", 1.0, None, 2)]
    with pytest.raises(ConfigError, match=r"--tokens cls --layers 1,2 --config 2,1,1"):
        layer_pairs("pkd-skip", open_store(stores["mud"]).selection, 3, loss="pkd_cls", projection=False)


# --------------------------------------------------------------------------------------------------
# Loss terms against values computed by hand


def _inputs(**batch) -> TermInputs:
    logits = batch.pop("student_logits")
    hidden = batch.pop("hidden", None)
    return TermInputs(SimpleNamespace(logits=logits, hidden_states=hidden), batch, batch.pop("pairs", []), None)


def test_terms_by_hand():
    s = torch.tensor([[0.0, math.log(3.0)]])  # student softmax (1/4, 3/4)
    t = torch.tensor([[math.log(3.0), 0.0]])  # teacher softmax (3/4, 1/4)
    x = _inputs(student_logits=s, logits=t, labels=torch.tensor([1]))
    assert LOSS_TERMS["ce"](x).item() == pytest.approx(-math.log(0.75))
    kl = 0.75 * math.log(0.75 / 0.25) + 0.25 * math.log(0.25 / 0.75)
    assert LOSS_TERMS["kl"](x, T=1.0).item() == pytest.approx(kl, rel=1e-5)
    # at T = 2 both softmaxes are (sqrt3, 1)/(sqrt3 + 1) swapped; the term is T^2 KL
    p, q = math.sqrt(3) / (math.sqrt(3) + 1), 1 / (math.sqrt(3) + 1)
    assert LOSS_TERMS["kl"](x, T=2.0).item() == pytest.approx(4 * (p * math.log(p / q) + q * math.log(q / p)), rel=1e-5)
    assert LOSS_TERMS["soft_ce"](x, T=1.0).item() == pytest.approx(-(0.75 * math.log(0.25) + 0.25 * math.log(0.75)))
    # rows without a gold label (-1) are left out of CE
    x2 = _inputs(student_logits=torch.cat([s, s]), logits=torch.cat([t, t]), labels=torch.tensor([1, -1]))
    assert LOSS_TERMS["ce"](x2).item() == pytest.approx(-math.log(0.75))
    # the weighted sum, and each term's value reported on its own
    total, values = weighted_sum((Term("ce", "ce", 0.3), Term("kl", "kl", 0.7, (("T", 1.0),))), x)
    assert values == pytest.approx({"ce": -math.log(0.75), "kl": kl}, rel=1e-5)
    assert total.item() == pytest.approx(0.3 * -math.log(0.75) + 0.7 * kl, rel=1e-5)


def test_pkd_and_hsk_terms_by_hand():
    # one example, student layers 1 and 2; [CLS] is position 0
    h1 = torch.tensor([[[3.0, 4.0], [9.0, 9.0]]])  # normalised [CLS] (0.6, 0.8)
    h2 = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])  # (1, 0)
    teacher0 = torch.tensor([[[0.0, 2.0]]])  # stored layer 0: (0, 1)
    teacher1 = torch.tensor([[[5.0, 0.0]]])  # stored layer 1: (1, 0)
    pairs = [LayerPair(2, 1, "cls", "pkd_cls", 1.0, None, 0), LayerPair(4, 2, "cls", "pkd_cls", 1.0, None, 1)]
    x = _inputs(student_logits=torch.zeros(1, 2), hidden=(None, h1, h2), dense_0=teacher0, dense_1=teacher1,
                pairs=pairs)
    # squared errors (0.36 + 0.04) and (0 + 0), averaged over 4 elements
    assert LOSS_TERMS["pkd_cls"](x).item() == pytest.approx(0.1)
    # HSK MSE at stored positions: layer pair 0 position 1 of h1 (9, 9) vs (0, 2): (81 + 49) / 2
    hpairs = [LayerPair(2, 1, "tokens", "hsk_mse", 1.0, None, 0)]
    x = _inputs(student_logits=torch.zeros(1, 2), hidden=(None, h1, h2), pairs=hpairs, dense_0=teacher0,
                positions_0=torch.tensor([[1]]), valid_0=torch.tensor([[True]]))
    assert LOSS_TERMS["hsk_mse"](x).item() == pytest.approx(65.0)


# --------------------------------------------------------------------------------------------------
# Refusals before the first step


def test_a_store_that_cannot_serve_the_method_is_refused_before_training(stores, confident_teacher_dir, tmp_path,
                                                                          capsys):
    from pipelines.cli import main

    out = tmp_path / "run"
    code = main(["train", "--store", stores["mud"], "--student", "bert3", "--method", "pkd-skip", "--out", str(out),
                 "--no-eval", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--tokens cls" in err
    assert not out.exists()  # nothing written
    # an option the method does not have is refused (one line), the run folder untouched
    code = main(["train", "--store", stores["mud"], "--student", "bert2", "--method", "kd", "--beta", "3",
                 "--out", str(out), "--no-eval"])
    assert code == 2 and "no option beta" in capsys.readouterr().err and not out.exists()


def test_pkd_store_missing_layers_names_the_dump(stores, confident_teacher_dir, tmp_path, glue_dir, capsys):
    from pipelines.cli import main

    top = _dump(tmp_path, "top.zarr", DumpOptions(config=HSKConfig.parse("1,1,1"), layers=[3], token_strategy="cls",
                                                  shard_rows=16, batch_size=16, progress=False),
                confident_teacher_dir, glue_dir)
    code = main(["train", "--store", top, "--student", "bert3", "--method", "pkd-skip", "--out",
                 str(tmp_path / "r"), "--no-eval"])
    err = capsys.readouterr().err
    assert code == 2 and "--tokens cls --layers 1,2 --config 2,1,1" in err and not (tmp_path / "r").exists()


# --------------------------------------------------------------------------------------------------
# Runs


@pytest.mark.parametrize("method", ["pkd-skip", "kd"])
def test_offline_equals_online(method, stores, confident_teacher_dir, glue_dir, tmp_path):
    store, online = (stores["cls"], PKD) if method == "pkd-skip" else (stores["mud"], MUD)
    opts = dict(method_options={"lr": 1e-3, "epochs": 1}, student_base=str(confident_teacher_dir),
                data_dir=str(glue_dir))
    off = train(options(method, **opts), student="bert2", out_dir=str(tmp_path / "off"), store=store,
                log=lambda *_: None)
    on = train(options(method, train_limit=ROWS, online=online, **opts), student="bert2",
               out_dir=str(tmp_path / "on"), teacher=str(confident_teacher_dir), task="sst2", config=str(online.config),
               log=lambda *_: None)
    assert off["method"] == on["method"] == method and on["mode"] == "online"
    a, b = curve(tmp_path / "off"), curve(tmp_path / "on")
    assert [k for _, k, _ in a] == [k for _, k, _ in b] == [1, 2, 3, 4]
    np.testing.assert_allclose([x for *_, x in b], [x for *_, x in a], rtol=2e-3, atol=1e-5)
    records = [json.loads(line) for line in (tmp_path / "off" / "metrics.jsonl").read_text().splitlines()]
    terms = records[0]["terms"]
    if method == "pkd-skip":
        assert set(terms) == {"ce", "kl", "pkd"}
        # the pairs of a 2-layer student of a 4-layer teacher: student layer 1 <- teacher layer 2
        assert [(p["student_layer"], p["teacher_layer"]) for p in off["layer_pairs"]] == [(1, 2)]
        o = off["method_options"]
        assert records[0]["loss"] == pytest.approx((1 - o["alpha"]) * terms["ce"] + o["alpha"] * terms["kl"]
                                                   + o["beta"] * terms["pkd"], rel=1e-5)
    else:
        assert set(terms) == {"ce", "kl"} and off["layer_pairs"] == []
        from hskstore.io.reader import open_store

        group = open_store(store).group  # kd reads the inputs, labels and logits, no layer
        names = ["label", "input_ids", "token_type_ids", "length", "text_hash", "logits"]
        assert off["store_bytes"]["read"] == sum(int(group[n].nbytes_stored()) for n in names)


def test_resume_in_the_second_stage_gives_the_same_curve(stores, confident_teacher_dir, glue_dir, tmp_path):
    mud = {"epochs_hsk": 1, "epochs_pred": 1, "lr_hsk": 1e-3, "lr_pred": 1e-3}
    kw = dict(method_options=mud, student_base=str(confident_teacher_dir), data_dir=str(glue_dir), checkpoint_every=2)
    whole = train(options(**kw), student="bert2", out_dir=str(tmp_path / "whole"), store=stores["mud"],
                  log=lambda *_: None)

    class Stop(Exception):
        pass

    def interrupt(record):
        if record["step"] == 7:  # stage pred, its step 3; its last checkpoint at its step 2
            raise Stop

    out = tmp_path / "cut"
    with pytest.raises(Stop):
        train(options(**kw), student="bert2", out_dir=str(out), store=stores["mud"], log=lambda *_: None,
              on_step=interrupt)
    state = torch.load(out / "checkpoint" / "state.pt", weights_only=False)
    assert state["position"]["stage_index"] == 1 and state["position"]["stage_step"] == 2
    lines: list[str] = []
    resumed = train(options(**kw), student="bert2", out_dir=str(out), store=stores["mud"], log=lines.append)
    assert any("resuming" in line and "stage pred, step 2" in line for line in lines)
    assert [(s, k) for s, k, _ in curve(out)] == [(s, k) for s, k, _ in curve(tmp_path / "whole")]
    np.testing.assert_allclose([x for *_, x in curve(out)], [x for *_, x in curve(tmp_path / "whole")], rtol=1e-5)
    # what was read is what the plan reads, whichever stages ran in this process
    assert resumed["store_bytes"] == whole["store_bytes"] and resumed["store_bytes"]["read"] > 0
    assert resumed["score"] == pytest.approx(whole["score"])


# --------------------------------------------------------------------------------------------------
# Stage transitions and head swaps


@dataclass
class _ToyOptions:
    epochs: float = 1.0


def _toy_build(options: _ToyOptions, ctx) -> list[Stage]:
    return [
        Stage(name="aux", epochs=options.epochs, lr=1e-3, terms=(Term("ce4", "ce"),), head="ptp4"),
        Stage(name="kd", epochs=options.epochs, lr=1e-3, terms=(Term("kl", "kl", 1.0, (("T", 2.0),)),),
              reads=("logits",), select_best=True),
    ]


TOY = register(Method(name="test-two-heads", summary="test: a 4-way head stage, then KD on the task head",
                      store_needs="logits", paper="-", options=_ToyOptions, build=_toy_build))


def test_heads_swap_and_come_back(confident_teacher_dir):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(confident_teacher_dir)
    task_head = model.classifier
    heads = Heads(model)
    heads.use("ptp4")
    assert model.classifier.out_features == 4 and model.classifier is not task_head
    ptp = model.classifier
    heads.use("task")
    assert model.classifier is task_head and heads.aside["ptp4"] is ptp
    state = heads.state_dict()
    again = Heads(AutoModelForSequenceClassification.from_pretrained(confident_teacher_dir))
    again.load_state_dict(state)
    torch.testing.assert_close(again.aside["ptp4"].weight, ptp.weight)
    with pytest.raises(ConfigError, match="unknown head"):
        heads.use("nope")


def test_two_heads_method_runs_resumes_and_ends_on_the_task_head(stores, confident_teacher_dir, glue_dir, tmp_path):
    from transformers import AutoModelForSequenceClassification

    kw = dict(student_base=str(confident_teacher_dir), data_dir=str(glue_dir), checkpoint_every=2)
    whole = train(options("test-two-heads", **kw), student="bert2", out_dir=str(tmp_path / "w"),
                  store=stores["mud"], log=lambda *_: None)
    assert [s["head"] for s in whole["plan"]] == ["ptp4", "task"]
    assert [(s, k) for s, k, _ in curve(tmp_path / "w")] == [("aux", k) for k in (1, 2, 3, 4)] + [
        ("kd", k) for k in (5, 6, 7, 8)]
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "w" / "best")
    assert model.classifier.out_features == 2

    class Stop(Exception):
        pass

    def interrupt(record):
        if record["step"] == 3:  # inside the ptp4 stage: the checkpoint holds the swapped head
            raise Stop

    with pytest.raises(Stop):
        train(options("test-two-heads", **kw), student="bert2", out_dir=str(tmp_path / "c"), store=stores["mud"],
              log=lambda *_: None, on_step=interrupt)
    train(options("test-two-heads", **kw), student="bert2", out_dir=str(tmp_path / "c"), store=stores["mud"],
          log=lambda *_: None)
    np.testing.assert_allclose([x for *_, x in curve(tmp_path / "c")], [x for *_, x in curve(tmp_path / "w")],
                               rtol=1e-5)


# --------------------------------------------------------------------------------------------------
# Sweeps over methods


def test_sweep_over_methods(stores, confident_teacher_dir, glue_dir, tmp_path):
    import pipelines.sweep.execute as sweep
    from pipelines.sweep.results import read_results

    def spec(**train):
        return sweep.SweepSpec(source=stores["cls"], methods="kd,pkd-skip", students="bert2", seeds=[0],
                               work_dir=str(tmp_path / "w"), data_dir=str(glue_dir),
                               train=dict(max_steps=1, batch_size=8, eval_limit=8, workers=1,
                                          student_base=str(confident_teacher_dir), **train))

    runs = sweep.plan_runs(spec())
    by = {r.method: r for r in runs}
    assert set(by) == {"kd", "pkd-skip"} and all(r.kind == "method" for r in runs)
    assert by["kd"].store_config == "0,0,0"  # logits only: trains from the smallest store
    assert by["pkd-skip"].store_config is None  # reads [CLS] layers: trains from the source
    # run ids hash the method's resolved options: beta moves pkd-skip's id only; where a run logs does not
    again = {r.method: r.run_id for r in sweep.plan_runs(spec(beta=10.0, log_every=3))}
    assert again["kd"] == by["kd"].run_id and again["pkd-skip"] != by["pkd-skip"].run_id
    with pytest.raises(ConfigError, match="neither a TrainOptions field nor an option"):
        spec(epochs_hsk=1)
    table = sweep.run_sweep(spec(), log=lambda *_: None)
    rows = {r["method"]: r for r in table.to_pylist()}
    assert set(rows) == {"kd", "pkd-skip"} and rows["kd"]["bytes_per_example"] < rows["pkd-skip"]["bytes_per_example"]
    assert json.loads(rows["pkd-skip"]["method_options"])["beta"] == 500.0
    assert read_results(spec().results_path).num_rows == 2
    with pytest.raises(ConfigError, match="--tokens cls"):
        sweep.plan_runs(sweep.SweepSpec(source=stores["mud"], methods="pkd-last", work_dir=str(tmp_path / "x")))


def test_sweep_cli_set_reaches_the_method_and_its_run_id(stores, tmp_path, capsys):
    from pipelines.cli import main

    def planned(*extra: str) -> str:
        args = ["sweep", "--source", stores["cls"], "--methods", "pea", "--students", "bert2",
                "--work-dir", str(tmp_path / "w"), "--dry-run", *extra]
        assert main(args) == 0
        return capsys.readouterr().out

    plain, one_epoch = planned(), planned("--set", "ptp_epochs=1")
    run_id = [line.split()[0] for line in plain.splitlines() if " method " in line]
    assert len(run_id) == 1 and run_id[0] not in one_epoch  # the option is part of what the run computes
    assert planned("--set", "ptp-epochs=1") == one_epoch  # dashes or underscores
    assert main(["sweep", "--source", stores["cls"], "--methods", "pea", "--set", "bogus=1", "--dry-run",
                 "--work-dir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bogus" in err and not (tmp_path / "w").exists()


def test_the_readme_example_method_runs_as_written(stores, confident_teacher_dir, tmp_path):
    """The guide's "Adding a method" (docs/guide/methods.md): its code, executed as it stands, registers a
    method the one loop trains."""
    from pipelines import registry
    from pipelines.registry import _REGISTRY

    guide = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "methods.md").read_text()
    section = guide.split("## Adding a method", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.splitlines()) <= 40
    module = types.ModuleType("readme_example")  # a real module: dataclasses look their module up
    sys.modules[module.__name__] = module
    try:
        exec(compile(code, "docs/guide/methods.md: Adding a method", "exec"), module.__dict__)
        out = tmp_path / "cos"
        train(options("cosine-kd", method_options={"gamma": "0.5"}, max_steps=2,
                      student_base=str(confident_teacher_dir)),
              student="bert2", out_dir=str(out), store=stores["mud"], log=lambda *_: None)
        records = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["type"] == "train"]
        assert [r["step"] for r in records] == [1, 2]
        for r in records:
            t = r["terms"]
            assert set(t) == {"ce", "kl", "cos"} and 0 <= t["cos"] <= 2
            assert r["loss"] == pytest.approx(0.5 * t["ce"] + 0.5 * t["kl"] + 0.5 * t["cos"], rel=1e-5)
        assert json.loads((out / "summary.json").read_text())["method_options"]["gamma"] == 0.5
    finally:
        _REGISTRY.pop("cosine-kd", None)
        LOSS_TERMS.pop("logit_cosine", None)
        registry.LOSS_TERMS.pop("logit_cosine", None)
        sys.modules.pop(module.__name__, None)
