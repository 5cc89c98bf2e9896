"""What the CLI says: refusals that name the value and come back before torch is imported, a warning for
fp16 on a CPU, a progress line while training, stores that can be shared without local paths, more encoder
families, and TensorBoard event files beside metrics.jsonl. Each through the real CLI where there is one (hsk
inside the Hugging Face Trainer: tests/test_hf_trainer.py)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import dump_args as shared_dump_args
from conftest import save_tiny_teacher

from pipelines.cli import main

REPO = Path(__file__).resolve().parents[1]


def hsk(*args: str, cwd: Path | None = None, code: str = "from pipelines.cli import run; run()"):
    """`hsk ARGS` as a user runs it, in a new process -> (exit status, stdout, stderr)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("HSK_DEBUG", None)
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def one_line(capsys, code: int, *words: str, after: str = "") -> str:
    """The command's only output line, `hsk: error: ...` with exit status 2, holding every word; `after`: a
    warning line the command says first (a --no-eval run)."""
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code == 2, text
    lines = text.strip().splitlines()
    if after:
        assert lines[0].startswith(after), text
        lines = lines[1:]
    assert len(lines) == 1 and lines[0].startswith("hsk: error: "), text
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, tiny_tokenizer) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher") / "t", tiny_tokenizer, num_layers=4, seed=5)


dump_args = functools.partial(shared_dump_args, config="2,4,0.5", student_layers=2)


@pytest.fixture(scope="module")
def store(tmp_path_factory, teacher, glue_dir) -> Path:
    out = tmp_path_factory.mktemp("store") / "sst2.zarr"
    assert main(dump_args(teacher, glue_dir, out)) == 0
    return out


# -- argument errors: one line naming the value, before torch and transformers are imported ---------------------

# Each refusal in a fresh process that reports, after the CLI returns, whether torch or transformers was imported.
_PROBE = "import sys; from pipelines.cli import main; c = main(sys.argv[1:]); print(c, 'torch' in sys.modules, " \
         "'transformers' in sys.modules)"


@pytest.mark.parametrize("args, words", [
    (["dump", "--task", "sst2", "--teacher", "t", "--config", "1,2,0.1", "--limit", "-5", "--out", "o.zarr"],
     ["--limit must be an integer >= 1, got -5"]),
    (["teacher", "--task", "sst2", "--epochs", "0", "--out", "t"], ["--epochs must be > 0, got 0"]),
    (["teacher", "--task", "sst5", "--out", "t"], ["unknown task 'sst5'", "sst2"]),
    (["train", "--teacher", "t", "--task", "sst5", "--student", "bert3", "--out", "r"], ["unknown task 'sst5'"]),
    (["eval", "m", "--task", "sst5"], ["unknown task 'sst5'"]),
    (["train", "--store", "s.zarr", "--student", "bert3", "--out", "r", "--batch-size", "0"],
     ["--batch-size must be an integer >= 1, got 0"]),
    (["train", "--store", "s.zarr", "--student", "bert3", "--out", "r", "--method", "kd", "--epochs", "0"],
     ["--epochs must be > 0, got 0"]),
    (["train", "--store", "s.zarr", "--student", "bert3", "--out", "r", "--max-steps", "0"],
     ["--max-steps must be an integer >= 1, got 0"]),
    (["eval", "m", "--task", "sst2", "--batch-size", "0"], ["--batch-size must be an integer >= 1, got 0"]),
    (["dump", "--task", "sst2", "--teacher", "t", "--config", "1,2,0.1", "--max-length", "1", "--out", "o.zarr"],
     ["--max-length must be an integer >= 2, got 1"]),
])
def test_argument_errors_are_refused_before_torch_is_imported(tmp_path, args, words):
    code, out, err = hsk(*args, cwd=tmp_path, code=_PROBE)
    assert out.strip() == "2 False False", out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hsk: error: "), err
    for word in words:
        assert word in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_catalog_task_filter_takes_any_store_task(tmp_path, capsys):
    """--task of catalog filters stores (an MLM store's task is "mlm"): it is not checked as a GLUE task."""
    assert main(["catalog", str(tmp_path), "--task", "mlm"]) == 0


# -- fp16 on a CPU: accepted (it is how its numerics are tested), with one warning line -------------------------


@pytest.mark.slow
def test_fp16_on_a_cpu_is_one_warning_line_and_training_prints_a_heartbeat(store, glue_dir, tmp_path):
    code, out, err = hsk("train", "--store", str(store), "--student", "bert2", "--method", "kd", "--lr", "1e-3",
                         "--batch-size", "8", "--max-steps", "4", "--log-every", "1", "--heartbeat", "0",
                         "--no-eval", "--no-progress", "--device", "cpu", "--precision", "fp16",
                         "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert code == 0, out + err
    warnings = [line for line in err.splitlines() if "fp16" in line]
    assert len(warnings) == 1 and warnings[0].startswith("WARNING: --precision fp16 on cpu"), err
    assert "--precision fp32" in warnings[0]
    beats = [line for line in out.splitlines() if line.startswith("stage kd: step ")]
    # --heartbeat 0: a line at every logged step, with the loss, the rate and the time left
    assert [b.split(",")[0] for b in beats] == [f"stage kd: step {i}/4" for i in (1, 2, 3, 4)], out
    assert "loss " in beats[0] and "examples/s" in beats[0] and beats[-1].endswith("0s left"), beats


RUN_ARGS = ["--student", "bert2", "--method", "kd", "--batch-size", "4", "--log-every", "1", "--no-eval",
            "--no-progress", "--device", "cpu"]


@pytest.fixture(scope="module")
def finished_run(store, tmp_path_factory) -> tuple[Path, str]:
    """A finished 5-step kd run with the default heartbeat (60 s), and what it printed on stdout."""
    out = tmp_path_factory.mktemp("run") / "run"
    code, said, err = hsk("train", "--store", str(store), *RUN_ARGS, "--max-steps", "5", "--out", str(out))
    assert code == 0, said + err
    return out, said


def test_the_heartbeat_is_quiet_between_its_seconds(finished_run):
    """The default heartbeat: a stage's first logged step and its last, nothing between on a short run."""
    out, said = finished_run
    beats = [line.split(",")[0] for line in said.splitlines() if line.startswith("stage kd: step ")]
    assert beats == ["stage kd: step 1/5", "stage kd: step 5/5"], said
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["type"] == "train" for r in records) == 5  # metrics.jsonl still logs every step


@pytest.mark.slow
def test_report_to_tensorboard_writes_event_files_beside_metrics_jsonl(store, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is in the test extra")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    code, said, err = hsk("train", "--store", str(store), *RUN_ARGS, "--max-steps", "3", "--report-to", "tensorboard",
                          "--out", str(out))
    assert code == 0, said + err
    events = sorted(out.glob("events.out.tfevents.*"))
    assert len(events) == 1 and (out / "metrics.jsonl").is_file()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["type"] == "train"]
    board = EventAccumulator(str(out))
    board.Reload()
    assert {"train/kd/loss", "train/kd/lr", "train/kd/terms/kl", "train/kd/terms/ce"} <= set(board.Tags()["scalars"])
    logged = board.Scalars("train/kd/loss")
    assert [e.step for e in logged] == [1, 2, 3] and [e.value for e in logged] == pytest.approx(losses)


def test_report_to_tensorboard_without_the_package_names_the_install(tmp_path):
    """With tensorboard not importable (None in sys.modules: Python's way to block an import), one line naming
    `pip install tensorboard`, before torch is imported."""
    probe = "import sys; sys.modules['tensorboard'] = None; " + _PROBE
    code, out, err = hsk("train", "--store", "s.zarr", "--student", "bert2", "--out", "r", "--report-to", "tensorboard",
                         cwd=tmp_path, code=probe)
    assert out.strip() == "2 False False", out + err
    assert err.strip() == "hsk: error: --report-to tensorboard needs the tensorboard package: pip install tensorboard"
    code, out, err = hsk("train", "--store", "s.zarr", "--student", "bert2", "--out", "r", "--report-to", "wandb",
                         cwd=tmp_path, code=_PROBE)
    assert err.strip() == "hsk: error: --report-to wandb: choose one of none, tensorboard", err


# -- refusals name what is wrong -------------------------------------------------------------------------------


def test_another_run_at_out_names_the_option_that_differs(store, finished_run, capsys):
    out, _ = finished_run
    line = one_line(capsys, main(["train", "--store", str(store), *RUN_ARGS, "--max-steps", "4", "--out", str(out)]),
                    "holds a checkpoint of another run", "--max-steps 5 there, 4 here", "--overwrite",
                    after="WARNING: --no-eval")
    assert "student, store, method" not in line
    one_line(capsys, main(["train", "--store", str(store), *RUN_ARGS, "--max-steps", "5", "--seed", "3",
                                  "--out", str(out)]), "--seed 0 there, 3 here", after="WARNING: --no-eval")


def test_file_outputs_name_their_own_option(store, tmp_path, capsys):
    mine = tmp_path / "notes.txt"
    mine.write_text("the user's notes")
    one_line(capsys, main(["catalog", str(store), "--html", str(mine)]), "choose another --html")
    one_line(capsys, main(["export", str(store), str(mine)]), "choose another OUT")
    assert mine.read_text() == "the user's notes"


def test_a_data_file_or_a_folder_given_as_a_store_says_what_it_is(glue_dir, tmp_path, capsys):
    tsv = glue_dir / "SST-2" / "dev.tsv"
    one_line(capsys, main(["info", str(tsv)]), f"{tsv} is a file, not an hsk store", "hsk dump --data-file")
    (tmp_path / "mine").mkdir()
    one_line(capsys, main(["verify", str(tmp_path / "mine")]), "is a folder but not an hsk store", "hsk dump --out")
    one_line(capsys, main(["info", str(tmp_path / "none")]), "no store at")


def test_eval_given_a_store_or_a_run_folder_names_the_model_to_pass(store, finished_run, capsys):
    out, _ = finished_run
    line = one_line(capsys, main(["eval", str(store), "--task", "sst2"]), "is an hsk store, not a model", "best/")
    assert "hsk teacher" not in line
    one_line(capsys, main(["eval", str(out), "--task", "sst2"]), "is a training run folder", str(out / "best"))


# -- sharing: the card and croissant.json name no local path -------------------------------------------------


def test_card_and_croissant_of_a_store_from_local_folders_hold_no_absolute_path(store, teacher, glue_dir, capsys):
    local = [str(teacher), str(glue_dir), str(store.parent)]
    for path in sorted(p for p in store.rglob("*") if p.is_file()):
        if path == store / "zarr.json":  # the checksummed metadata: where hsk finds the store's teacher again
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        assert not [p for p in local if p in text], path
    card = (store / "README.md").read_text()
    assert f"{teacher.parent.name}/{teacher.name}" in card and "glue_data:SST-2/train.tsv" in card
    assert main(["info", str(store), "--card"]) == 0
    shown = capsys.readouterr().out
    assert "glue_data:SST-2/train.tsv" in shown and not [p for p in local[:2] if p in shown]


# -- architectures: CamemBERT is RoBERTa; XLNet and Funnel are refused with the reason; decoders are warned ----


def _family(model_type: str, out: Path, tokenizer_dir: Path, **fields) -> Path:
    """A tiny random classifier of `model_type` over the tiny vocabulary, saved with the tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), num_labels=2,
                                  pad_token_id=tokenizer.pad_token_id, **fields)
    torch.manual_seed(3)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


_ENCODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=160, type_vocab_size=1)


def test_camembert_is_a_teacher_and_a_student(tiny_tokenizer, glue_dir, tmp_path, capsys):
    teacher = _family("camembert", tmp_path / "teacher", tiny_tokenizer, **{**_ENCODER, "num_hidden_layers": 4})
    out = tmp_path / "c.zarr"
    assert main(dump_args(teacher, glue_dir, out, "--attention-rows")) == 0
    assert main(["verify", str(out)]) == 0
    student = _family("camembert", tmp_path / "student", tiny_tokenizer, **_ENCODER)
    assert main(["train", "--store", str(out), "--student", str(student), "--out", str(tmp_path / "run"),
                 "--data-dir", str(glue_dir), "--max-steps", "1", "--eval-limit", "8", "--no-progress"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["student"]["num_layers"] == 2 and not summary.get("warnings")


@pytest.mark.parametrize("model_type, fields, says", [
    ("xlnet", dict(d_model=32, n_layer=2, n_head=4, d_inner=64), "XLNet is a permutation language model"),
    ("funnel", dict(d_model=32, n_head=4, d_head=8, d_inner=64, block_sizes=[1, 1], num_decoder_layers=1),
     "pools the sequence between its blocks"),
])
def test_xlnet_and_funnel_are_refused_with_the_reason(model_type, fields, says, store, tiny_tokenizer, glue_dir,
                                                      tmp_path, capsys):
    model = _family(model_type, tmp_path / model_type, tiny_tokenizer, **fields)
    one_line(capsys, main(dump_args(model, glue_dir, tmp_path / "s.zarr")), f"a {model_type} teacher is not "
             "supported", says)
    assert not (tmp_path / "s.zarr").exists()
    one_line(capsys, main(["train", "--store", str(store), "--student", str(model), "--out", str(tmp_path / "run"),
                           "--no-eval", "--max-steps", "1", "--no-progress"]), f"a {model_type} student is not "
             "supported", says, after="WARNING: --no-eval")
    assert not (tmp_path / "run").exists()


def test_a_gpt2_student_trains_with_one_warning_saying_why(store, tiny_tokenizer, tmp_path, capsys):
    student = _family("gpt2", tmp_path / "gpt2", tiny_tokenizer, n_embd=32, n_layer=2, n_head=4, n_positions=160)
    assert main(["train", "--store", str(store), "--student", str(student), "--method", "kd", "--out",
                 str(tmp_path / "run"), "--no-eval", "--max-steps", "1", "--no-progress"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("WARNING: a gpt2")]
    assert len(said) == 1 and "is a causal decoder: its first token sees only itself" in said[0], said
