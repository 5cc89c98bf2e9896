"""Per-element losses under torchrun are the global batch's, whatever each rank holds (issue 34 item 8).

The HSK loss averages over every kept element of the batch, and the ranks' slices keep different numbers
of tokens (texts differ in length): a mean of the ranks' means weighs a rank with fewer tokens up, so
2 ranks trained other weights than 1 process from step 1. Each rank's sum is now divided by the global
count (pipelines.train.run.ddp.Ranks.mean_count). For tinybert-att (attention rows and mud's HSK loss,
then the logits) and pea (PTP, then KD + pkd-skip's Patient KD), which between them hold every per-element
term of mud, pkd-skip and pea, one process and 2 ranks (gloo, CPU) log the same step-1 loss and reach the
same weights. The teacher (and so bert<k> / sps<k>) has no dropout, so the
ranks' random masks cannot differ from one process's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_bert, run_group

from hskstore.format.config import HSKConfig
from pipelines.dump.stage import DumpOptions

REPO = Path(__file__).resolve().parents[1]
ATT = DumpOptions(config=HSKConfig.parse("2,4,0.5"), ref_student_layers=2, shard_rows=16, batch_size=16,
                  progress=False, attention_rows=True)
CLS = DumpOptions(config=HSKConfig.parse("3,1,1"), layers=[1, 2, 3], token_strategy="cls", shard_rows=16,
                  batch_size=16, progress=False)
COMMON = ["--batch-size", "16", "--seed", "5", "--max-steps", "2", "--log-every", "1", "--workers", "0",
          "--no-progress", "--no-eval"]
# method -> (store, its arguments)
RUNS = {
    "tinybert-att": ("att", ["--method", "tinybert-att", "--student", "bert2", "--lr-hsk", "1e-3", "--lr-pred",
                             "1e-3"]),
    "pea": ("cls", ["--method", "pea", "--student", "sps1", "--lr", "1e-3", "--set", "ptp_lr=1e-3"]),
}


@pytest.fixture(scope="module")
def stores(tmp_path_factory, tiny_tokenizer, glue_dir) -> dict[str, str]:
    from transformers import AutoTokenizer

    from pipelines.dump.stage import dump

    root = tmp_path_factory.mktemp("ddp_losses")
    teacher = make_tiny_bert(num_layers=4, seed=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    teacher.save_pretrained(root / "teacher")
    AutoTokenizer.from_pretrained(tiny_tokenizer).save_pretrained(root / "teacher")
    out = {}
    for name, options in (("att", ATT), ("cls", CLS)):
        out[name] = str(root / f"{name}.zarr")
        dump("sst2", options, teacher=str(root / "teacher"), out=out[name], data_dir=str(glue_dir), limit=48,
             log=lambda *_: None)
    return out


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def _records(out: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(out: Path) -> dict[str, torch.Tensor]:
    state = torch.load(out / "checkpoint" / "state.pt", map_location="cpu", weights_only=False)
    flat = {f"model.{k}": v for k, v in state["model"].items()}
    flat.update({f"projection.{k}": v for k, v in (state.get("projection") or {}).items()})
    return flat


def _one_and_two(argv: list[str], one: Path, two: Path) -> None:
    """`hsk ARGV` in one process (OUT = one), then under torchrun on 2 ranks (OUT = two)."""
    alone = run_group([sys.executable, "-m", "pipelines.cli", *[str(one) if a == "OUT" else a for a in argv]],
                      env=_env(), timeout=300)
    assert alone.returncode == 0, alone.stderr[-3000:]
    ranked = run_group([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        "-m", "pipelines.cli", *[str(two) if a == "OUT" else a for a in argv]], env=_env(), timeout=300)
    assert ranked.returncode == 0, ranked.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(RUNS))
def test_one_process_and_two_ranks_give_the_same_loss_and_weights(method, stores, tmp_path):
    store, args = RUNS[method]
    argv = ["train", "--store", stores[store], "--out", "OUT", *args, *COMMON]
    one, two = tmp_path / "one", tmp_path / "two"
    _one_and_two(argv, one, two)
    curve = {r["step"]: r for r in _records(one) if r["type"] == "train"}
    ranked_curve = {r["step"]: r for r in _records(two) if r["type"] == "train"}
    assert curve.keys() == ranked_curve.keys() and 1 in curve
    for step, record in curve.items():  # each term too: the per-element ones were the ranks' means before
        assert ranked_curve[step]["loss"] == pytest.approx(record["loss"], rel=1e-5, abs=1e-8), step
        assert ranked_curve[step]["terms"] == pytest.approx(record["terms"], rel=1e-5, abs=1e-8), step
    a, b = _weights(one), _weights(two)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5, msg=name)  # as tests/test_ddp.py


@pytest.fixture(scope="module")
def lm_stores(tmp_path_factory, clm_teacher, clm_corpus) -> dict[str, str]:
    """A top-8 causal-LM store (24 blocks) and a decoder-only seq2seq store (16 pairs) of the tiny Llama, which
    has no dropout: first2 is deterministic in one process and on each rank."""
    from pipelines.cli import main

    root = tmp_path_factory.mktemp("ddp_lm")
    common = ["--support", "topk:8", "--shard-rows", "8", "--batch-size", "8", "--no-progress", "--device", "cpu"]
    assert main(["dump", "--objective", "clm", "--teacher", str(clm_teacher), "--text-file", str(clm_corpus),
                 "--block-size", "32", "--limit", "40", *common, "--out", str(root / "clm.zarr")]) == 0
    lines = clm_corpus.read_text(encoding="utf-8").splitlines()[:32]
    pairs = root / "pairs.tsv"
    pairs.write_text("source\ttarget\n" + "".join(f"{a}\t{b}\n" for a, b in zip(lines[::2], lines[1::2])),
                     encoding="utf-8")
    assert main(["dump", "--objective", "seq2seq", "--teacher", str(clm_teacher), "--data-file", str(pairs),
                 "--prompt", "Say: {source}\\nAnswer:", "--max-length", "40", "--max-target", "16", *common,
                 "--out", str(root / "s2s.zarr")]) == 0
    return {"clm-kd": str(root / "clm.zarr"), "s2s-kd": str(root / "s2s.zarr")}


def _same_on_one_and_two_ranks(argv: list[str], tmp_path) -> None:
    """One process and 2 ranks of `argv` (3 steps) log the same losses and terms (the tolerance of test_ddp.py)
    and reach the same weights."""
    one, two = tmp_path / "one", tmp_path / "two"
    _one_and_two(argv, one, two)
    curve = {r["step"]: r for r in _records(one) if r["type"] == "train"}
    ranked_curve = {r["step"]: r for r in _records(two) if r["type"] == "train"}
    assert curve.keys() == ranked_curve.keys() == {1, 2, 3}
    for step, record in curve.items():
        assert ranked_curve[step]["loss"] == pytest.approx(record["loss"], rel=1e-5, abs=1e-8), step
        assert ranked_curve[step]["terms"] == pytest.approx(record["terms"], rel=1e-5, abs=1e-8), step
    assert len({r["loss"] for r in curve.values()}) == 3  # it trained
    a, b = _weights(one), _weights(two)
    assert a.keys() == b.keys()
    for name in a:  # Adam moves an element of near-zero gradient by ~lr: float noise there is a fraction of 1e-3
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=2e-5, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["clm-kd", "s2s-kd"])
def test_lm_methods_give_the_same_loss_and_weights_on_two_ranks(method, lm_stores, tmp_path):
    """clm-kd and s2s-kd average CE and KD over the global batch's positions (the ranks' blocks keep different
    numbers of them): 2 ranks log one process's losses and reach its weights (the tolerance of test_ddp.py)."""
    argv = ["train", "--store", lm_stores[method], "--out", "OUT", "--method", method, "--student", "first2",
            "--set", "lr=1e-3", "--epochs", "2", "--batch-size", "8", "--seed", "5", "--max-steps", "3",
            "--log-every", "1", "--workers", "0", "--no-progress", "--device", "cpu"]
    _same_on_one_and_two_ranks(argv, tmp_path)


@pytest.fixture(scope="module")
def bpe_student(tmp_path_factory, clm_corpus) -> str:
    """A student with another tokenizer than the store's teacher: a BPE of 400 trained on the corpus."""
    from pipelines.cli import main

    out = tmp_path_factory.mktemp("ddp_xtok") / "student"
    assert main(["student", "lm", "--train-tokenizer", str(clm_corpus), "--vocab-size", "400", "--student-layers", "2",
                 "--hidden", "32", "--heads", "2", "--ffn", "64", "--max-positions", "128", "--seed", "1",
                 "--out", str(out)]) == 0
    return str(out)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["uld", "alm"])
def test_cross_tokenizer_methods_give_the_same_loss_and_weights_on_two_ranks(method, lm_stores, bpe_student,
                                                                            tmp_path):
    """uld and alm average over the global batch's aligned positions and chunks (each rank's blocks align at
    different numbers of them): 2 ranks log one process's losses, each term's too, and reach its weights."""
    argv = ["train", "--store", lm_stores["clm-kd"], "--out", "OUT", "--method", method, "--student", bpe_student,
            "--set", "lr=1e-3", "--epochs", "2", "--batch-size", "8", "--seed", "5", "--max-steps", "3",
            "--log-every", "1", "--workers", "0", "--no-progress", "--device", "cpu"]
    _same_on_one_and_two_ranks(argv, tmp_path)
