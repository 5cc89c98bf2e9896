"""Selection on the teacher's device (pipelines/dump/select_torch.py) against the numpy reference.

The torch engine must write the numpy engine's bytes: compared array by array on crafted probe
outputs full of ties, on a real MiniLM forward, and store by store through `hsk dump`.
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import chunk_bytes, save_tiny_teacher
from conftest import dump_args as shared_dump_args

from hskstore import codecs, open_store
from hskstore.codecs import mxfp4
from hskstore.format import codec
from hskstore.format.config import HSKConfig
from pipelines.cli import main
from pipelines.core import codecs_torch
from pipelines.dump import select_torch
from pipelines.dump.probe import ProbeOutput
from pipelines.dump.select_torch import HostCopies, host_arrays, pack_mask, select_batch
from pipelines.dump.stage import DumpOptions, build_selection
from pipelines.dump.targets import encode_batch

SEP = 3
HIDDEN, HEADS, LAYERS, T, B = 40, 4, 4, 24, 12


def crafted_probe(seed: int) -> tuple[ProbeOutput, np.ndarray, np.ndarray]:
    """Probe outputs full of ties: [CLS] scores and activations drawn from a few values, +-0.0 included."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, T + 1, size=B)
    lengths[0], lengths[1] = T, 2  # a full row, and one with nothing eligible but [CLS]
    ids = rng.integers(5, 50, size=(B, T))
    ids[np.arange(B), lengths - 1] = SEP
    ids[:, 0] = 2
    ids[2, 5] = SEP  # a pair's middle [SEP]
    ids[np.arange(T)[None, :] >= lengths[:, None]] = 0

    def tied(*shape):
        levels = np.array([0.0, -0.0, 0.5, -0.5, 1.0, 1.5, -3.0, 6.0, 1e-3, 6e4], dtype=np.float32)
        x = levels[rng.integers(0, len(levels), size=shape)]
        return np.where(rng.random(shape) < 0.3, rng.standard_normal(shape).astype(np.float32), x)

    hidden = {j: torch.from_numpy(tied(B, T, HIDDEN)) for j in range(LAYERS + 1)}
    cls = {layer: torch.from_numpy(tied(B, HEADS, T)) for layer in range(1, LAYERS + 1)}
    qk = {layer: (torch.from_numpy(tied(B, T, HIDDEN)), torch.from_numpy(tied(B, T, HIDDEN)))
          for layer in range(1, LAYERS + 1)}
    logits = torch.from_numpy(rng.standard_normal((B, 2)).astype(np.float32))
    return ProbeOutput(logits, hidden, cls, qk), ids, lengths


def both_engines(probe, ids, lengths, selection, max_length=T):
    """The reference's arrays and the torch engine's, after checking its device kernels (topk, sort; what a
    GPU runs) against the numpy kernels it uses on a CPU."""
    ref = encode_batch(probe, ids, lengths, selection, SEP, max_length)
    got = host_arrays(*HostCopies().start(select_batch(probe, ids, lengths, selection, SEP, max_length)))
    select_torch.NUMPY_KERNELS_ON_CPU = False
    try:
        assert_same_bytes(got, host_arrays(*HostCopies().start(
            select_batch(probe, ids, lengths, selection, SEP, max_length))))
    finally:
        select_torch.NUMPY_KERNELS_ON_CPU = True
    return ref, got


def assert_same_bytes(ref: dict, got: dict) -> None:
    assert sorted(ref) == sorted(got)
    for name in ref:
        a, b = np.asarray(ref[name]), np.asarray(got[name])
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert a.tobytes() == b.tobytes(), name


def selection_for(config="3,6,0.3", **kw):
    options = DumpOptions(config=HSKConfig.parse(config), **kw)
    return build_selection(options, LAYERS, HIDDEN, HEADS)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("values", codecs.choices())
@pytest.mark.parametrize("scores", ["pre-softmax", "post-softmax"])
def test_every_codec_and_score_kind_gives_the_reference_bytes(seed, values, scores):
    probe, ids, lengths = crafted_probe(seed)
    selection = selection_for(value_dtype=values, attention_scores=scores, attention_rows=True)
    assert_same_bytes(*both_engines(probe, ids, lengths, selection))


@pytest.mark.parametrize(("tokens", "width", "config"), [
    *[(t, w, "3,6,0.3") for t, w in itertools.product(["att-nosep", "att", "left"], ["mag", "uniform", "rand"])],
    ("cls", "mag", "2,1,0.5"), ("att", "mag", "2,30,1.0"), ("att-nosep", "rand", "4,1,0.05"),
])
def test_every_token_and_width_strategy_gives_the_reference_bytes(tokens, width, config):
    probe, ids, lengths = crafted_probe(3)
    for seed in (0, 7):
        selection = selection_for(config, token_strategy=tokens, width_strategy=width, width_seed=seed,
                                  value_dtype="int4", ranking_map="own" if seed else "ltop12")
        assert_same_bytes(*both_engines(probe, ids, lengths, selection))


def test_logits_only_and_explicit_layers():
    probe, ids, lengths = crafted_probe(4)
    assert_same_bytes(*both_engines(probe, ids, lengths, selection_for("0,0,0")))
    selection = selection_for("3,5,0.2", layers=[0, 2, 4])  # the embeddings (ranked by layer 1)
    assert_same_bytes(*both_engines(probe, ids, lengths, selection))


def test_codec_pieces_on_their_edges():
    rng = np.random.default_rng(5)
    mask = rng.random((7, 3, 45)) < 0.4
    assert pack_mask(torch.from_numpy(mask)).numpy().tobytes() == codec.pack_mask(mask).tobytes()
    # mxfp4: every grid midpoint (ties to the even code), saturation, zero groups, tiny and huge peaks
    mids = np.concatenate([mxfp4.E2M1_MID, mxfp4.E2M1_GRID, [7.0, -0.25, -5.0, 0.0]]).astype(np.float32)
    groups = np.stack([mids * 2.0 ** e for e in (-20, -1, 0, 3, 40)] + [np.zeros_like(mids)])
    groups[:, 0] = 6.0 * 2.0 ** np.array([-20, -1, 0, 3, 40, 0]) * (groups[:, 0] != 0)  # peak sets the scale
    ref_codes, ref_scale = codecs.get("mxfp4").quantize(groups)
    codes, scale = codecs_torch.get("mxfp4").quantize(torch.from_numpy(groups))
    assert codes.numpy().tobytes() == ref_codes.tobytes() and scale.numpy().tobytes() == ref_scale.tobytes()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU in this run")
def test_cuda_engine_gives_the_reference_bytes():
    probe, ids, lengths = crafted_probe(6)
    on_gpu = ProbeOutput(probe.logits.cuda(), {j: h.cuda() for j, h in probe.hidden.items()},
                         {k: s.cuda() for k, s in probe.cls_scores.items()},
                         {k: (q.cuda(), kk.cuda()) for k, (q, kk) in probe.qk.items()})
    for values, scores in itertools.product(codecs.choices(), ["pre-softmax", "post-softmax"]):
        selection = selection_for(value_dtype=values, attention_scores=scores)
        ref = encode_batch(probe, ids, lengths, selection, SEP, T)
        copies = HostCopies()
        got = host_arrays(*copies.start(select_batch(on_gpu, ids, lengths, selection, SEP, T)))
        assert_same_bytes(ref, got)


# --- a real teacher -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def minilm_probe(glue_dir):
    """A real MiniLM-L6 forward (pretrained weights, a seeded random head) on SST-2 rows."""
    pytest.importorskip("all_minilm_l6_v2", reason="needs the 'minilm' extra")
    from transformers import BertForSequenceClassification

    from pipelines.core.batching import batch_inputs
    from pipelines.core.data import load_examples
    from pipelines.core.models import load_tokenizer, resolve_model
    from pipelines.core.tasks import get_task
    from pipelines.core.tokenize import encode
    from pipelines.dump.probe import TeacherProbe

    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(resolve_model("minilm"), num_labels=2).eval()
    tokenizer = load_tokenizer("minilm")
    examples = load_examples(get_task("sst2"), "train", data_dir=str(glue_dir), limit=24)
    enc = encode(tokenizer, examples.texts, 64)
    batch = np.arange(len(examples))
    inputs = batch_inputs(enc, batch, "cpu")
    probe = TeacherProbe(model, list(range(1, 7)), list(range(1, 7)))
    out = probe(**inputs, hidden_layers=list(range(7)))
    probe.close()
    ids = enc["input_ids"][batch, : inputs["input_ids"].shape[1]]
    return out, ids, enc["length"], tokenizer.sep_token_id, model


@pytest.mark.parametrize(("values", "scores", "tokens", "width"), [
    ("float16", "pre-softmax", "att-nosep", "mag"), ("int8", "post-softmax", "att", "mag"),
    ("int4", "pre-softmax", "left", "rand"), ("mxfp4", "post-softmax", "att-nosep", "uniform"),
])
def test_real_minilm_outputs_give_the_reference_bytes(minilm_probe, values, scores, tokens, width):
    out, ids, lengths, sep, model = minilm_probe
    options = DumpOptions(config=HSKConfig.parse("3,8,0.2"), value_dtype=values, attention_scores=scores,
                          token_strategy=tokens, width_strategy=width, attention_rows=True)
    selection = build_selection(options, 6, 384, 12)
    ref = encode_batch(out, ids, lengths, selection, sep, 64)
    got = host_arrays(*HostCopies().start(select_batch(out, ids, lengths, selection, sep, 64)))
    assert_same_bytes(ref, got)


# --- whole stores through the CLI -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher"), tiny_tokenizer, num_layers=4, seed=2)


dump_args = functools.partial(shared_dump_args, task="mrpc", config=None, rows=40, shard_rows=16, batch_size=8,
                              max_length=48)


@pytest.mark.parametrize("extra", [
    ["--config", "3,8,0.2"],
    ["--config", "2,6,0.3", "--values", "int8", "--scores", "post-softmax", "--width", "rand", "--width-seed", "3"],
    ["--config", "2,5,0.5", "--values", "int4", "--tokens", "att", "--attention-rows"],
    ["--config", "1,4,0.25", "--values", "mxfp4", "--tokens", "left", "--width", "uniform", "--layers", "0"],
])
def test_stores_of_both_engines_are_identical(teacher_dir, glue_dir, tmp_path, extra):
    assert main(dump_args(teacher_dir, glue_dir, tmp_path / "t.zarr", *extra)) == 0  # default: torch
    assert main(dump_args(teacher_dir, glue_dir, tmp_path / "n.zarr", *extra, "--selection-engine", "numpy")) == 0
    t, n = open_store(str(tmp_path / "t.zarr")), open_store(str(tmp_path / "n.zarr"))
    assert t.meta["checksums"] == n.meta["checksums"] and t.verify() == []
    assert chunk_bytes(tmp_path / "t.zarr") == chunk_bytes(tmp_path / "n.zarr")


def test_a_numpy_dump_resumed_by_the_torch_engine(teacher_dir, glue_dir, tmp_path, monkeypatch, capsys):
    from hskstore.io.writer import StoreWriter

    args = ["--config", "3,6,0.25", "--values", "int4"]
    assert main(dump_args(teacher_dir, glue_dir, tmp_path / "full.zarr", *args)) == 0
    original, calls = StoreWriter.write_shard, {"n": 0}

    def dying_write(self, shard, arrays):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return original(self, shard, arrays)

    monkeypatch.setattr(StoreWriter, "write_shard", dying_write)
    assert main(dump_args(teacher_dir, glue_dir, tmp_path / "cut.zarr", *args, "--selection-engine", "numpy")) == 130
    monkeypatch.setattr(StoreWriter, "write_shard", original)
    assert main(dump_args(teacher_dir, glue_dir, tmp_path / "cut.zarr", *args)) == 0
    assert "resuming" in capsys.readouterr().out
    assert chunk_bytes(tmp_path / "full.zarr") == chunk_bytes(tmp_path / "cut.zarr")
    assert open_store(str(tmp_path / "cut.zarr")).meta["checksums"] == open_store(str(tmp_path / "full.zarr")).meta[
        "checksums"]


def test_unknown_engine_is_refused(teacher_dir, glue_dir, tmp_path, capsys):
    assert main(dump_args(teacher_dir, glue_dir, tmp_path / "x.zarr", "--config", "1,2,0.5",
                          "--selection-engine", "jax")) == 2
    err = capsys.readouterr().err
    assert "hsk: error:" in err and "--selection-engine" in err and not (tmp_path / "x.zarr").exists()
