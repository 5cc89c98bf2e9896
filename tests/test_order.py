"""Elastic deterministic data order (pipelines/train/data/stream.py global_plan; docs: docs/guide/scaling.md).

The global batches are a pure function of the store's layout, seed, epoch, global batch and shuffle
window; N ranks each take a slice of every global batch. So 1, 2 and 4 ranks see the same rows at
every step, a checkpoint made under N ranks resumes under M, and a store copied elsewhere resumes
in the same order (the checkpoint names the store by content address, not path).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import stop_at_step_script
from test_ddp import REPO, assert_same_weights, store, torchrun, train_records, weights  # noqa: F401
from test_stream import build

from pipelines.cli import main
from pipelines.train.data.stream import StoreStream

# a global batch of 16 over 32 rows: two steps per epoch, so a stop after step 1 is mid-epoch
ARGS = ["--method", "kd", "--epochs", "2", "--lr", "1e-3", "--batch-size", "16", "--max-steps", "4", "--seed", "5",
        "--eval-limit", "16", "--log-every", "1", "--workers", "1", "--no-progress"]


@pytest.fixture(scope="module")
def rows_store(tmp_path_factory):
    return build(tmp_path_factory.mktemp("order") / "s.zarr", n_rows=131, shard_rows=8)  # 17 shards


def steps(opened, world: int, global_batch: int, epoch: int, window: int = 3) -> tuple[list[set[int]], list[set]]:
    """Each step's rows over all ranks, and the shards each rank read, for `world` ranks."""
    per_rank, shards = [], []
    for rank in range(world):
        stream = StoreStream(opened, batch_size=global_batch // world, rank=rank, world_size=world, seed=11,
                             buffer_shards=window, workers=0, names=["row"], drop_last=True)
        stream.set_epoch(epoch)
        per_rank.append([b["row"].tolist() for b in stream])
        shards.append(set(stream.stats.shards_read))
    n = {len(r) for r in per_rank}
    assert len(n) == 1  # lockstep
    joined = [set().union(*(set(r[i]) for r in per_rank)) for i in range(n.pop())]
    assert all(len(s) == global_batch for s in joined)  # the ranks' slices are disjoint and full
    return joined, shards


@pytest.mark.parametrize("epoch", [0, 1])
def test_global_batches_are_the_same_rows_under_1_2_and_4_ranks(rows_store, epoch):
    one, _ = steps(rows_store, 1, 16, epoch)
    two, _ = steps(rows_store, 2, 16, epoch)
    four, _ = steps(rows_store, 4, 16, epoch)
    assert len(one) == 131 // 16 and one == two == four
    assert one != steps(rows_store, 1, 16, epoch + 1)[0]  # and the order moves on with the epoch


def test_each_rank_reads_only_the_shards_of_its_slices(tmp_path):
    # a window of 2 shards of 8 rows is one global batch of 16: sorted by row id, each half is one shard
    small = build(tmp_path / "s.zarr", n_rows=128, shard_rows=8)
    joined, shards = steps(small, 2, 16, 0, window=2)
    assert len(joined) == 8 and not shards[0] & shards[1]
    assert sorted(shards[0] | shards[1]) == list(range(16)) and len(shards[0]) == len(shards[1]) == 8
    # with a wider window a rank reads some shards of the other's half too, never the whole store
    for window in (4, 8):
        _, shards = steps(small, 2, 16, 0, window=window)
        assert all(len(s) < 16 for s in shards), window


@pytest.fixture(scope="module")
def wide_store(tmp_path_factory):
    return build(tmp_path_factory.mktemp("wide") / "s.zarr", n_rows=525, shard_rows=8)  # 66 shards, the last 5 rows


@pytest.mark.parametrize("window", [4, 8])
def test_each_rank_reads_about_1_over_n_of_the_store(wide_store, window):
    """Ranks that divide the canonical streams read only their streams' shards: 1/N of the store, plus
    a few shards for the epoch's last batches (the rows the longer streams have left)."""
    for epoch in (0, 1):
        for world in (1, 2, 4):
            _, shards = steps(wide_store, world, 16, epoch, window=window)
            n = wide_store.n_shards
            assert len(set().union(*shards)) >= n - 1  # all but, maybe, one whose rows fell in the dropped batch
            assert all(len(s) / n <= 1 / world + 4 / n for s in shards), (world, [len(s) for s in shards])
    # ranks that do not divide the streams (3 of 4) still share the batches, reading more of the store
    three, shards = steps(wide_store, 3, 12, 0, window=4)
    assert three == steps(wide_store, 1, 12, 0, window=4)[0] and max(len(s) for s in shards) > wide_store.n_shards / 3


def test_a_rank_holds_its_share_of_the_window(wide_store):
    for world in (1, 2, 4):
        for rank in range(world):
            stream = StoreStream(wide_store, batch_size=16 // world, rank=rank, world_size=world, buffer_shards=4,
                                 workers=1, names=["row"])
            n_rows = sum(len(b["row"]) for b in stream)
            assert n_rows == (525 if world == 1 else 525 // 16 * 16 // world)  # N ranks drop the partial batch
            assert stream.stats.peak_buffer_shards == 4 // world, (world, rank)


def test_a_state_saved_with_other_canonical_streams_is_refused(rows_store):
    stream = StoreStream(rows_store, batch_size=8, seed=2, canonical=4, names=["row"])
    other = StoreStream(rows_store, batch_size=8, seed=2, canonical=2, names=["row"])
    assert [b["row"].tolist() for b in stream] != [b["row"].tolist() for b in other]  # C is part of the order
    state = {**stream.state_dict(), "batches_done": 1}
    assert state["canonical"] == 4
    with pytest.raises(ValueError) as refused:
        other.load_state_dict(state)
    assert str(refused.value) == ("the checkpoint's data order has 4 canonical streams, this run's 2: "
                                  "resume with the same number")
    assert other.batches_done == 0  # nothing moved


def test_a_resumed_rank_continues_its_slices(rows_store):
    full = StoreStream(rows_store, batch_size=4, rank=1, world_size=4, seed=2, buffer_shards=3, names=["row"])
    expected = [b["row"].tolist() for b in full]
    resumed = StoreStream(rows_store, batch_size=4, rank=1, world_size=4, seed=2, buffer_shards=3, names=["row"])
    resumed.load_state_dict({"epoch": 0, "batches_done": 3, "seed": 2})
    assert [b["row"].tolist() for b in resumed] == expected[3:]
    assert len(set(resumed.stats.shards_read)) < rows_store.n_shards


STOP_AT_STEP_1 = stop_at_step_script(step=1, epochs=2, batch_size=16, max_steps=4, workers=1)


def train_args(url: str, out, glue_dir) -> list[str]:
    return ["train", "--store", url, "--student", "bert2", "--out", str(out), "--data-dir", str(glue_dir), *ARGS]


@pytest.fixture(scope="module")
def uninterrupted(store, glue_dir, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("order-one") / "run"
    assert main(train_args(store, out, glue_dir)) == 0
    return out


def stop_after_step_1(url: str, out, glue_dir, tmp_path, ranks: int) -> None:
    script = tmp_path / "stop.py"
    script.write_text(textwrap.dedent(STOP_AT_STEP_1))
    if ranks == 1:  # a process of its own, in torchrun's environment
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        done = subprocess.run([sys.executable, str(script), url, str(out), str(glue_dir)], env=env,
                              capture_output=True, text=True, timeout=300)
    else:
        done = torchrun(str(script), url, str(out), str(glue_dir))
    assert done.returncode == 0 and done.stdout.count("stopped") == ranks, done.stderr[-3000:]


def test_two_ranks_stopped_mid_epoch_resume_under_one_process(store, glue_dir, uninterrupted, tmp_path):  # noqa: F811
    out = tmp_path / "cut"
    stop_after_step_1(store, out, glue_dir, tmp_path, ranks=2)
    assert main(train_args(store, out, glue_dir)) == 0
    assert [r["step"] for r in train_records(out)] == [1, 2, 3, 4]
    assert [r["loss"] for r in train_records(out)] == pytest.approx(
        [r["loss"] for r in train_records(uninterrupted)], rel=1e-4)
    assert_same_weights(weights(out), weights(uninterrupted))


def test_one_process_stopped_mid_epoch_resumes_under_two_ranks(store, glue_dir, uninterrupted, tmp_path):  # noqa: F811
    out = tmp_path / "cut"
    stop_after_step_1(store, out, glue_dir, tmp_path, ranks=1)
    resumed = torchrun("-m", "pipelines.cli", *train_args(store, out, glue_dir))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "step 1 of the stage" in resumed.stdout
    assert_same_weights(weights(out), weights(uninterrupted))


def test_a_store_copied_elsewhere_resumes_in_the_same_order(store, glue_dir, uninterrupted, tmp_path):  # noqa: F811
    out = tmp_path / "cut"
    stop_after_step_1(store, out, glue_dir, tmp_path, ranks=1)
    moved = tmp_path / "elsewhere" / "copy.zarr"
    shutil.copytree(store, moved)
    before = sorted(p.read_bytes() for p in moved.rglob("*") if p.is_file())
    assert main(train_args(str(moved), out, glue_dir)) == 0
    assert [r["loss"] for r in train_records(out)] == pytest.approx(
        [r["loss"] for r in train_records(uninterrupted)], rel=1e-4)
    assert_same_weights(weights(out), weights(uninterrupted))
    assert sorted(p.read_bytes() for p in moved.rglob("*") if p.is_file()) == before  # the copy is only read
    assert np.isfinite([r["loss"] for r in train_records(out)]).all()


def test_a_store_copied_to_s3_resumes_in_the_same_order(s3, store, glue_dir, uninterrupted, tmp_path):  # noqa: F811
    from s3_server import BUCKET

    out = tmp_path / "cut"
    stop_after_step_1(store, out, glue_dir, tmp_path, ranks=1)
    url = f"s3://{BUCKET}/{tmp_path.name}/copy.zarr"
    s3.filesystem().put(store, url.removeprefix("s3://"), recursive=True)
    assert main(train_args(url, out, glue_dir)) == 0
    assert_same_weights(weights(out), weights(uninterrupted))


def test_the_shuffle_window_is_checked_before_anything_is_read(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--store", str(tmp_path / "none.zarr"), "--student", "bert2", "--out", str(out),
                 "--shuffle-window", "0"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error == "hsk: error: --shuffle-window must be an integer >= 1, got 0"
    assert not out.exists()
