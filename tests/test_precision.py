"""`--precision` and `--compile` (issue 40): fp32, bf16 and fp16 steps, recorded in a run's identity and summary;
the step torch.compile'd.

auto is fp32 on the CPU (the pinned curves, tests/test_pinned_curves.py, pin that it computes what it
always did); bf16 and fp16 run under torch.autocast on the CPU too, so the whole path is tested here.
A checkpoint trained in one precision is not resumed in another.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_bert

from hskstore.format.config import HSKConfig
from pipelines.dump.stage import DumpOptions, dump

COMMON = ["--student", "bert2", "--batch-size", "8", "--max-steps", "3", "--seed", "3", "--workers", "0",
          "--no-progress", "--no-eval", "--log-every", "1", "--device", "cpu"]
ARGS = [*COMMON, "--method", "kd", "--lr", "1e-3"]


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_tokenizer, glue_dir) -> str:
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("precision")
    teacher = root / "teacher"  # no dropout (nor in bert2, its first layers): compiled and eager steps compare
    make_tiny_bert(num_layers=4, seed=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).save_pretrained(
        teacher)
    AutoTokenizer.from_pretrained(tiny_tokenizer).save_pretrained(teacher)
    options = DumpOptions(config=HSKConfig.parse("2,4,0.5"), ref_student_layers=2, shard_rows=16, batch_size=16,
                          progress=False)
    out = str(root / "s.zarr")
    dump("sst2", options, teacher=str(teacher), out=out, data_dir=str(glue_dir), limit=48, log=lambda *_: None)
    return out


class Done:
    def __init__(self, exit_code: int, output: str):
        self.exit_code, self.output = exit_code, output


@pytest.fixture
def hsk(capsys):
    """Run the real CLI (pipelines.cli.main: one `hsk: error:` line for a user error) -> exit code and output."""
    from pipelines.cli import main

    def run(*argv: str) -> Done:
        code = main(list(argv))
        said = capsys.readouterr()
        return Done(code, said.out + said.err)

    return run


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def losses(out: Path) -> list[float]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["type"] == "train"]


def test_bf16_on_the_cpu_trains_names_its_precision_and_refuses_an_fp32_resume(store, tmp_path, hsk):
    out = tmp_path / "bf16"
    done = hsk("train", "--store", store, "--out", str(out), *ARGS, "--precision", "bf16")
    assert done.exit_code == 0, done.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["precision"] == "bf16"
    state = torch.load(out / "checkpoint" / "state.pt", map_location="cpu", weights_only=False)
    assert state["identity"]["precision"] == "bf16"
    assert len(losses(out)) == 3 and all(math.isfinite(x) for x in losses(out))
    before = digest(out)
    refused = hsk("train", "--store", store, "--out", str(out), *ARGS, "--precision", "fp32")
    assert refused.exit_code == 2
    lines = [line for line in refused.output.splitlines() if line.startswith("hsk: error:")]
    assert len(lines) == 1 and "trained in bf16" in lines[0] and "--precision bf16" in lines[0], refused.output
    assert digest(out) == before
    again = hsk("train", "--store", store, "--out", str(out), *ARGS, "--precision", "bf16")  # the same run: done
    assert again.exit_code == 0 and "already finished" in again.output and digest(out) == before


def test_auto_is_fp32_on_the_cpu_and_bf16_computes_close_to_it(store, tmp_path, hsk):
    fp32, bf16 = tmp_path / "auto", tmp_path / "bf16"
    assert hsk("train", "--store", store, "--out", str(fp32), *ARGS).exit_code == 0
    assert json.loads((fp32 / "summary.json").read_text())["precision"] == "fp32"
    assert hsk("train", "--store", store, "--out", str(bf16), *ARGS, "--precision", "bf16").exit_code == 0
    # bf16 keeps 8 bits of mantissa: the same losses to about 1%, not the same bits
    assert losses(bf16) == pytest.approx(losses(fp32), rel=5e-2)
    assert losses(bf16) != losses(fp32)


def test_fp16_scales_the_loss_and_keeps_the_scaler_in_its_checkpoint(store, tmp_path, hsk):
    out = tmp_path / "fp16"
    done = hsk("train", "--store", store, "--out", str(out), *COMMON, "--precision", "fp16", "--method", "mud",
               "--lr-hsk", "1e-3", "--lr-pred", "1e-3")
    assert done.exit_code == 0, done.output
    assert json.loads((out / "summary.json").read_text())["precision"] == "fp16"
    state = torch.load(out / "checkpoint" / "state.pt", map_location="cpu", weights_only=False)
    assert state["scaler"] is not None and state["scaler"]["scale"] > 0


@pytest.mark.parametrize("value", ["fp8", "BF17"])
def test_an_unknown_precision_is_refused_in_one_line(value, store, tmp_path, hsk):
    out = tmp_path / "bad"
    done = hsk("train", "--store", store, "--out", str(out), *ARGS, "--precision", value)
    assert done.exit_code == 2 and done.output.count("hsk: error: --precision") == 1, done.output
    assert not out.exists()


@pytest.mark.slow
def test_a_compiled_step_computes_the_eager_losses(store, tmp_path, hsk):
    """--compile (torch.compile of the student's forward and the loss terms; inductor on the CPU, a C++
    compiler needed) trains the same curve as eager, to float rounding; with --pad-to-max-length the shapes
    are static (what CUDA graphs, --compile-mode reduce-overhead, need)."""
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    static = [*ARGS, "--pad-to-max-length"]
    assert hsk("train", "--store", store, "--out", str(eager), *static).exit_code == 0
    done = hsk("train", "--store", store, "--out", str(compiled), *static, "--compile")
    assert done.exit_code == 0, done.output
    assert losses(compiled) == pytest.approx(losses(eager), rel=1e-4)
    assert json.loads((compiled / "summary.json").read_text())["options"]["pad_to_max_length"] is True


def test_hsk_teacher_trains_in_bf16_and_records_it(tiny_base_dir, glue_dir, tmp_path, hsk):
    """`hsk teacher` goes through the same run setup (pipelines/train/run/setup.py): its precision is recorded."""
    out = tmp_path / "teacher"
    done = hsk("teacher", "--task", "sst2", "--base", str(tiny_base_dir), "--data-dir", str(glue_dir), "--out",
               str(out), "--epochs", "1", "--train-limit", "32", "--eval-limit", "16", "--batch-size", "16",
               "--device", "cpu", "--precision", "bf16", "--no-progress")
    assert done.exit_code == 0, done.output
    from pipelines.train.kinds.teacher import SUMMARY_FILE

    assert json.loads((out / SUMMARY_FILE).read_text())["precision"] == "bf16"
    bad = hsk("teacher", "--task", "sst2", "--base", str(tiny_base_dir), "--data-dir", str(glue_dir), "--out",
              str(tmp_path / "bad"), "--precision", "fp8", "--no-progress")
    assert bad.exit_code == 2 and bad.output.count("hsk: error: --precision fp8") == 1, bad.output
    assert not (tmp_path / "bad").exists()
