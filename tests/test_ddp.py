"""Data-parallel training under torchrun (pipelines/train/run/ddp.py), 2 ranks on CPU (gloo).

A 2-layer width-32 teacher without dropout and a store of 32 SST-2 rows in 2 shards of 16. With a
global batch of 32 an epoch is one step on every row, whether one process takes the 32 rows or two
ranks take 16 each (their slices of the global batch), so after the same steps both hold the same weights: DDP
averages the ranks' gradients of per-example means. Resume: a 2-rank run stopped after step 2
continues from rank 0's checkpoint to the same weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_bert, run_group, stop_at_step_script

from hskstore.format.config import ConfigError, HSKConfig
from pipelines.cli import main
from pipelines.dump.stage import DumpOptions, dump
from pipelines.train.run.ddp import Ranks

REPO = Path(__file__).resolve().parents[1]
ARGS = ["--method", "kd", "--epochs", "3", "--lr", "1e-3", "--batch-size", "32", "--max-steps", "3", "--seed", "5",
        "--eval-limit", "16", "--log-every", "1", "--workers", "0", "--no-progress"]


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_tokenizer, glue_dir) -> str:
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("ddp")
    teacher = make_tiny_bert(num_layers=2, seed=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    teacher.save_pretrained(root / "teacher")  # no dropout: the ranks' random masks cannot differ from one process's
    AutoTokenizer.from_pretrained(tiny_tokenizer).save_pretrained(root / "teacher")
    options = DumpOptions(config=HSKConfig.parse("2,4,0.5"), ref_student_layers=2, shard_rows=16, batch_size=16,
                          progress=False)
    out = str(root / "store.zarr")
    dump("sst2", options, teacher=str(root / "teacher"), out=out, data_dir=str(glue_dir), limit=32,
         log=lambda *_: None)
    return out


def torchrun(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *argv]
    return run_group(cmd, env=env, timeout=300)  # a stopped test leaves no orphaned torchrun


def weights(out: Path) -> dict[str, torch.Tensor]:
    state = torch.load(out / "checkpoint" / "state.pt", map_location="cpu", weights_only=False)
    assert state["position"]["stage_index"] == 1  # the stage ran to its end
    return state["model"]


def train_records(out: Path) -> list[dict]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["type"] == "train"]


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.fixture(scope="module")
def one_process(store, glue_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one") / "run"
    assert main(["train", "--store", store, "--student", "bert2", "--out", str(out), "--data-dir", str(glue_dir),
                 *ARGS]) == 0
    return out


def test_two_ranks_reach_the_weights_of_one_process(store, glue_dir, one_process, tmp_path):
    out = tmp_path / "two"
    done = torchrun("-m", "pipelines.cli", "train", "--store", store, "--student", "bert2", "--out", str(out),
                    "--data-dir", str(glue_dir), *ARGS)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_weights(weights(out), weights(one_process))
    # rank 0 alone logs: each step once, with the same losses as one process on the global batch
    two, one = train_records(out), train_records(one_process)
    assert [r["step"] for r in two] == [1, 2, 3]
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], rel=1e-4)
    assert len({r["loss"] for r in one}) == 3  # it trained: every step's loss differs
    # rank 0 alone prints: the stage's line, its heartbeat at the last step, the end
    lines = ("stage kd: 3 epochs", "stage kd: step 3/3", "done: ", "summary: ")
    assert [done.stdout.count(line) for line in lines] == [1, 1, 1, 1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["batch_size"] == 32 and summary["examples"] == 96
    assert summary["score"] == pytest.approx(json.loads((one_process / "summary.json").read_text())["score"])
    assert (out / "best" / "config.json").exists()


STOP_AT_STEP_2 = stop_at_step_script(step=2, epochs=3, batch_size=32, max_steps=3, workers=0)


@pytest.mark.slow
def test_a_stopped_two_rank_run_resumes_to_the_same_weights(store, glue_dir, one_process, tmp_path, capsys):
    script = tmp_path / "stop.py"
    script.write_text(textwrap.dedent(STOP_AT_STEP_2))
    out = tmp_path / "cut"
    stopped = torchrun(str(script), store, str(out), str(glue_dir))
    assert stopped.returncode == 0 and stopped.stdout.count("stopped") == 2, stopped.stderr[-3000:]
    state = torch.load(out / "checkpoint" / "state.pt", weights_only=False)
    # the global position only: no rank count, so any number of ranks may resume it (tests/test_order.py)
    assert state["position"]["stage_step"] == 2 and "world_size" not in state["identity"]
    assert state["stream"] == {"epoch": 1, "batches_done": 1, "seed": 5, "canonical": 8}  # global batches done, C
    resumed = torchrun("-m", "pipelines.cli", "train", "--store", store, "--student", "bert2", "--out", str(out),
                       "--data-dir", str(glue_dir), *ARGS)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout and "step 2 of the stage" in resumed.stdout
    assert [r["step"] for r in train_records(out)] == [1, 2, 3]
    assert_same_weights(weights(out), weights(one_process))
    # another run's checkpoint is still refused (another seed); another number of ranks is not (tests/test_order.py)
    assert main(["train", "--store", store, "--student", "bert2", "--out", str(out), "--data-dir", str(glue_dir),
                 *ARGS, "--seed", "6"]) == 2
    assert "holds a checkpoint of another run" in capsys.readouterr().err


def test_the_global_batch_and_the_shards_must_split_over_the_ranks():
    assert Ranks().local_batch(31) == 31  # one process: the whole batch
    assert Ranks(rank=1, world_size=2).local_batch(32) == 16
    with pytest.raises(ConfigError, match="--batch-size 31 does not split over 2 ranks"):
        Ranks(rank=0, world_size=2).local_batch(31)
