"""`hsk sweep` end to end on tiny models: plan, rows, resume, interrupted runs, dask, store reuse, CLI.

A 4-layer, width-32 random teacher is dumped once over 48 SST-2 rows at config 2,4,0.5 (reference
student of 2 layers); the sweep derives smaller stores from it and trains 'bert1' (the teacher's
first layer) for 2 steps per stage.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

import pipelines.sweep.execute as sweep
import pipelines.sweep.stores as sweep_stores
from hskstore import ConfigError
from hskstore.format.config import HSKConfig
from hskstore.io.location import file_lock
from hskstore.io.reader import open_store
from pipelines.dump.stage import DumpOptions, dump
from pipelines.sweep.execute import SweepError, run_sweep
from pipelines.sweep.grid import budget_grid, estimate_bytes_per_example, table5_grid
from pipelines.sweep.plan import plan_runs
from pipelines.sweep.results import read_results
from pipelines.sweep.spec import SweepSpec
from pipelines.sweep.stores import store_path
from pipelines.train.run.summary import RunSummary

SOURCE_CONFIG = "2,4,0.5"
TRAIN = dict(max_steps=2, batch_size=8, eval_limit=16, epochs_hsk=1, epochs_pred=1, workers=1, buffer_shards=2)


@pytest.fixture(scope="module")
def source(tmp_path_factory, confident_teacher_dir, glue_dir) -> str:
    out = str(tmp_path_factory.mktemp("source") / "sst2.zarr")
    options = DumpOptions(config=HSKConfig.parse(SOURCE_CONFIG), ref_student_layers=2, shard_rows=16,
                          batch_size=16, progress=False)
    dump("sst2", options, teacher=str(confident_teacher_dir), out=out, data_dir=str(glue_dir), limit=48,
         log=lambda *_: None)
    return out


def spec_for(source: str, work: Path, glue_dir: Path, **kw) -> SweepSpec:
    base = dict(source=source, configs=["1,2,0.25", "pred-only", "no-kd"], students=["bert1"], seeds=[0],
                train=dict(TRAIN), work_dir=str(work), data_dir=str(glue_dir))
    base.update(kw)
    return SweepSpec(**base)


class Trainer:
    """Stands in for pipelines.sweep.execute.train: counts the runs that train, fails chosen ones, fakes on demand."""

    def __init__(self, real):
        self.real = real
        self.calls: list[str] = []  # out_dir of every call
        self.fail: dict[str, BaseException] = {}  # run_id prefix -> exception to raise
        self.fake = False  # True: return a canned summary instead of training (resume logic only)

    def __call__(self, options, **kw):
        self.calls.append(kw["out_dir"])
        for needle, exc in self.fail.items():
            if needle in kw["out_dir"]:
                raise exc
        if self.fake:
            stages = {s: {"epochs": 1.0, "steps": 2} for s in options.method_options.get("stages", ("kd",))}
            return RunSummary(stages=stages, metric="accuracy", score=0.5, dev={"dev": {"accuracy": 0.5, "n": 16}},
                              train_seconds=0.01, examples_per_s=100.0)
        return self.real(options, **kw)


@pytest.fixture
def trainer(monkeypatch) -> Trainer:
    t = Trainer(sweep.train)
    monkeypatch.setattr(sweep, "train", t)
    return t


# --------------------------------------------------------------------------------------------------
# Grids and plans (no training)


def test_table5_grid_is_derivable_and_grouped_by_amount(source):
    meta = open_store(source).meta
    grid = table5_grid(meta)
    assert grid == table5_grid(meta)  # deterministic
    d, src = 32, HSKConfig.parse(SOURCE_CONFIG)
    amounts = [HSKConfig.parse(c).amount(d) for c in grid]
    assert amounts == sorted(amounts) and SOURCE_CONFIG not in grid
    for text in grid:
        c = HSKConfig.parse(text)
        assert c.n_layers <= src.n_layers and c.n_tokens <= src.n_tokens and c.n_width(d) <= src.n_width(d)
    # every amount group 0.1, 0.5, 1, 2 (< the source's A = 4) is represented, by at most 2 configs
    for target in (0.1, 0.5, 1, 2):
        near = [a for a in amounts if 1 / 1.4 <= a / target <= 1.4]
        assert 1 <= len(near) <= 2, (target, grid)
    assert len(table5_grid(meta, per_amount=1)) == 4

    # A BERT-base-like source (3,32,1.0, d=768): amounts up to the source's, the paper's anchors included.
    big = json.loads(json.dumps(meta))
    big["selection"].update(config="3,32,1", hidden_size=768, teacher_num_layers=12, teacher_layers=[6, 8, 10],
                            ranking_layers=[6, 9, 12], student_entries=[2, 3, 4], ref_student_layers=4)
    grid = table5_grid(big)
    big_amounts = [HSKConfig.parse(c).amount(768) for c in grid]
    assert min(big_amounts) < 0.15 and 40 < max(big_amounts) < 96
    assert {"1,9,0.1", "3,8,0.2"} <= set(grid) and "5,2,0.3" not in grid  # N^D 5 > 3
    # A uniform-mask source cannot narrow its width: every config keeps W.
    big["selection"]["width_strategy"] = "uniform"
    assert {HSKConfig.parse(c).width for c in table5_grid(big)} == {1.0}


def test_budget_grid_fits_the_budget(source):
    meta = open_store(source).meta
    full = estimate_bytes_per_example(meta, SOURCE_CONFIG)
    budget = (estimate_bytes_per_example(meta, "1,1,0.1") + full) / 2
    grid = budget_grid(meta, budget)
    assert grid and all(estimate_bytes_per_example(meta, c) <= budget for c in grid)
    assert budget_grid(meta, 1.0) == []
    assert estimate_bytes_per_example(meta, "2,4,0.5", "int8") < full
    assert budget_grid(meta, full * 10)[-1] == SOURCE_CONFIG  # a budget that fits everything: the source


def test_plan_is_deterministic(source, tmp_path, glue_dir):
    spec = spec_for(source, tmp_path / "a", glue_dir, configs=["table5", "1,2,0.25@int8", "full", "pred-only",
                                                               "no-kd"], value_dtypes=("float16", "int8"),
                    seeds=[0, 1])
    runs = plan_runs(spec)
    again = plan_runs(spec_for(source, tmp_path / "elsewhere", glue_dir, configs=spec.configs,
                               value_dtypes=spec.value_dtypes, seeds=[0, 1], results=str(tmp_path / "r.parquet")))
    assert [r.run_id for r in runs] == [r.run_id for r in again]  # where it is written is no part of a run
    assert len({r.run_id for r in runs}) == len(runs)
    n_grid = len(table5_grid(open_store(source).meta))
    # per seed: grid x 2 dtypes, 1,2,0.25 at int8 only, full x 2 dtypes, pred-only and no-kd once
    assert len(runs) == 2 * (2 * n_grid + 1 + 2 + 2)
    kinds = [r.kind for r in runs if r.seed == 0]
    assert kinds[:2] == ["no_kd", "pred_only"] and kinds[-2:] == ["full", "full"]  # ordered by amount
    full = [r for r in runs if r.kind == "full"]
    assert {(r.value_dtype, r.store_config) for r in full} == {("float16", None), ("int8", SOURCE_CONFIG)}
    assert all(r.amount_hsk == 4.0 for r in full)
    no_kd = next(r for r in runs if r.kind == "no_kd")
    assert no_kd.alpha == 0.0 and no_kd.stages == ("pred",) and no_kd.store_config == "0,0,0"
    # training settings are part of the run_id; logging and progress are not, nor the other configs
    def first_id(train: dict, configs=("1,2,0.25",)) -> str:
        return plan_runs(spec_for(source, tmp_path / "a", glue_dir, configs=list(configs), train=train))[0].run_id

    plain = first_id(dict(TRAIN))
    assert first_id(dict(TRAIN, log_every=7, progress=True)) == plain
    assert first_id(dict(TRAIN, max_steps=3)) != plain
    assert first_id(dict(TRAIN), ["1,2,0.25@int8"]) == next(
        r.run_id for r in runs if (r.kind, r.config, r.value_dtype, r.seed) == ("hsk", "1,2,0.25", "int8", 0))


def test_plan_refuses_what_the_source_cannot_give(source, tmp_path, glue_dir):
    with pytest.raises(ConfigError, match="cannot derive"):
        plan_runs(spec_for(source, tmp_path, glue_dir, configs=["3,4,0.5"]))
    with pytest.raises(ConfigError, match="TrainOptions"):
        spec_for(source, tmp_path, glue_dir, train={"epochs": 3})
    with pytest.raises(ConfigError, match="hsk dump --limit"):
        spec_for(source, tmp_path, glue_dir, train={"train_limit": 10})
    with pytest.raises(ConfigError, match="value dtypes"):
        plan_runs(spec_for(source, tmp_path, glue_dir, configs=["1,2,0.25@fp8"]))


# --------------------------------------------------------------------------------------------------
# Sweeps


def test_sweep_writes_rows_resumes_and_reuses_stores(source, tmp_path, glue_dir, trainer, monkeypatch):
    calls = trainer.calls
    spec = spec_for(source, tmp_path / "w", glue_dir, configs=["1,2,0.25", "full", "pred-only", "no-kd"],
                    value_dtypes=("float16", "int8"))
    lines: list[str] = []
    table = run_sweep(spec, log=lines.append)
    runs = plan_runs(spec)
    assert len(runs) == 6 and len(calls) == 6 and table.num_rows == 6
    rows = {r["run_id"]: r for r in read_results(spec.results_path).to_pylist()}
    assert set(rows) == {r.run_id for r in runs}
    for run in runs:
        row = rows[run.run_id]
        assert row["kind"] == run.kind and row["config"] == run.config and row["seed"] == 0
        assert row["metric_name"] == "accuracy" and 0.0 <= row["metric"] <= 1.0
        assert row["store_bytes"] > 0 and row["bytes_per_example"] > 0 and row["train_limit"] == 48
        assert row["train_seconds"] > 0 and row["examples_per_s"] > 0
        assert json.loads(row["metrics_json"])["dev"]["n"] == 16
        assert row["stages"] == ("pred" if run.kind in ("pred_only", "no_kd") else "hsk+pred")
    by = {(r["kind"], r["value_dtype"]): r for r in rows.values()}
    assert by[("hsk", "float16")]["amount_hsk"] == HSKConfig.parse("1,2,0.25").amount(32) == 0.5
    assert by[("full", "float16")]["source_store"] == source and by[("full", "float16")]["amount_hsk"] == 4.0
    assert by[("pred_only", None)]["amount_hsk"] == 0.0
    # a smaller config makes a smaller store, logits only the smallest (int8 only pays off on wider
    # vectors than these 8 values: its per-vector scale and fixed overhead dominate a tiny store)
    assert by[("pred_only", None)]["bytes_per_example"] < by[("hsk", "float16")]["bytes_per_example"] \
        < by[("full", "float16")]["bytes_per_example"]
    assert by[("full", "int8")]["bytes_per_example"] < by[("full", "float16")]["bytes_per_example"]
    assert all(r["bytes_per_example"] == r["store_bytes"] / 48 for r in rows.values())
    # the derived stores: 1,2,0.25 x 2 dtypes, the source at int8, logits only (shared by pred-only and no-kd)
    stores = sorted(p.name for p in Path(sweep_stores.store_dir(spec)).glob("*.zarr"))
    assert stores == ["1_2_0.25-float16.zarr", "1_2_0.25-int8.zarr", "2_4_0.5-int8.zarr", "logits.zarr"]
    assert open_store(str(store_path(spec, "1,2,0.25", "int8"))).selection.value_dtype == "int8"
    # each run keeps its student (best/) and log, not its optimizer checkpoint
    for run in runs:
        folder = sweep.run_dir(run, spec)
        assert (folder / "best" / "config.json").exists() and (folder / "train.log").exists()
        assert not (folder / "checkpoint").exists()
    assert any("already in" in line for line in lines) and len([ln for ln in lines if ln.startswith("[")]) == 6

    # Rerun: nothing trains, nothing is derived again, same table.
    def no_derive(*a, **k):
        raise AssertionError("a complete derived store must be reused")

    monkeypatch.setattr(sweep_stores, "derive", no_derive)
    calls.clear()
    again = run_sweep(spec, log=lines.append)
    assert calls == [] and again.num_rows == 6 and "6 already in" in lines[-1]
    # Another sweep in the same work_dir shares finished runs and stores: only its new run trains.
    calls.clear()
    more = run_sweep(spec_for(source, tmp_path / "w", glue_dir, configs=["1,2,0.25"], value_dtypes=("int8",),
                              seeds=[0, 1]), log=lambda *_: None)
    assert len(calls) == 1 and "seed1" in calls[0] and more.num_rows == 2
    assert read_results(spec.results_path).num_rows == 7


def test_interrupted_sweep_keeps_finished_rows_and_resumes(source, tmp_path, glue_dir, trainer):
    trainer.fake = True  # the resume logic does not depend on what training computes
    calls, fail = trainer.calls, trainer.fail
    spec = spec_for(source, tmp_path / "w", glue_dir, seeds=[0, 1])
    runs = plan_runs(spec)
    broken = next(r for r in runs if r.kind == "hsk" and r.seed == 1)
    fail[broken.run_id[:10]] = RuntimeError("simulated crash")
    with pytest.raises(SweepError, match="1 of 6 runs failed") as info:
        run_sweep(spec, log=lambda *_: None)
    assert [r.run_id for r, _ in info.value.failures] == [broken.run_id]
    assert len(calls) == 6  # the other runs went on
    done = set(read_results(spec.results_path).column("run_id").to_pylist())
    assert done == {r.run_id for r in runs} - {broken.run_id}

    # Fixed: the rerun trains only the failed run.
    fail.clear()
    calls.clear()
    table = run_sweep(spec, log=lambda *_: None)
    assert len(calls) == 1 and broken.run_id[:10] in calls[0] and table.num_rows == 6

    # fail-fast stops at the first failure; Ctrl-C stops at once; both keep what finished.
    spec2 = spec_for(source, tmp_path / "w2", glue_dir, seeds=[0, 1])
    fail[plan_runs(spec2)[1].run_id[:10]] = RuntimeError("boom")
    calls.clear()
    with pytest.raises(SweepError):
        run_sweep(spec2, log=lambda *_: None, keep_going=False)
    assert len(calls) == 2 and read_results(spec2.results_path).num_rows == 1
    fail.clear()
    fail[plan_runs(spec2)[3].run_id[:10]] = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec2, log=lambda *_: None)
    assert read_results(spec2.results_path).num_rows == 3


@pytest.mark.slow
def test_dask_local_cluster(source, tmp_path, glue_dir):
    pytest.importorskip("distributed")
    spec = spec_for(source, tmp_path / "w", glue_dir, configs=["1,2,0.25", "pred-only"])
    lines: list[str] = []
    table = run_sweep(spec, workers=2, log=lines.append)
    assert table.num_rows == 2
    assert set(table.column("run_id").to_pylist()) == {r.run_id for r in plan_runs(spec)}
    assert any("local cluster of 2 processes" in line for line in lines)
    # the runs ran in the workers, each with its share of the cores as torch threads
    import os

    heads = [(sweep.run_dir(r, spec) / "train.log").read_text().splitlines()[0] for r in plan_runs(spec)]
    threads = max(1, len(os.sched_getaffinity(0)) // 2)
    assert all(f"torch threads {threads}," in h and f"pid {os.getpid()})" not in h for h in heads), heads
    assert run_sweep(spec, workers=2, log=lines.append).num_rows == 2 and "2 already in" in lines[-1]


# --------------------------------------------------------------------------------------------------
# CLI


def test_cli_derive_sweep_dry_run_and_report(source, tmp_path, glue_dir, capsys):
    import pipelines.cli.sweep_commands  # noqa: F401  (registers derive/sweep/report on the app)
    from pipelines.cli import main

    out = tmp_path / "small.zarr"
    assert main(["derive", source, "--config", "1,2,0.25", "--out", str(out), "--values", "int8",
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "A=0.5" in text and "int8" in text and "B/example" in text
    assert open_store(str(out)).selection.value_dtype == "int8"
    assert main(["derive", source, "--config", "3,4,0.5", "--out", str(tmp_path / "x.zarr")]) == 2

    work = tmp_path / "w"
    args = ["sweep", "--source", source, "--configs", "1,2,0.25;pred-only", "--students", "bert1", "--seeds", "0",
            "--work-dir", str(work), "--max-steps", "2", "--batch-size", "8", "--eval-limit", "16",
            "--epochs-hsk", "1", "--epochs-pred", "1", "--data-dir", str(glue_dir)]
    assert main([*args, "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "2 runs (0 already" in text and "pending" in text and "logits.zarr" in text
    assert main(args) == 0
    capsys.readouterr()
    assert read_results(work / "results.parquet").num_rows == 2
    assert main(["report", str(work / "results.parquet"), "--out", str(tmp_path / "report")]) == 0
    text = capsys.readouterr().out
    assert "| kind | config |" in text and "marginal_utility.png" in text
    assert (tmp_path / "report" / "marginal_utility.png").exists()
    assert main(["report", str(tmp_path / "none.parquet"), "--out", str(tmp_path / "r2")]) == 2


def test_file_lock_makes_a_second_holder_wait(tmp_path):
    """The lock the store derivation and the results table share: a second holder (its own open of the
    file) waits until the first lets go; the lock file and its folder are made when absent."""
    path = tmp_path / "work" / "results.parquet.lock"
    entered = threading.Event()

    def second() -> None:
        with file_lock(path):
            entered.set()

    with file_lock(path):
        assert path.exists()
        waiter = threading.Thread(target=second)
        waiter.start()
        assert not entered.wait(0.3)
    assert entered.wait(5)
    waiter.join()
