"""The intermediate layers of causal-LM stores (`hsk dump --objective clm --hidden-layers`, `hsk train --method clm-kd
--set layer_weight`): the stored states against the teacher's hidden_states, the layer loss against a hand
computation, the store (info, verify, derive, a forged array), and refusals through the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import clm_dump_args, hsk, tree_hashes

from hskstore import open_store
from hskstore.format.clm import rotation
from hskstore.format.clm_layers import LAYERS, decode_layers
from pipelines.cli import main
from pipelines.train.kinds.clm import ClmFeed
from pipelines.train.kinds.clm_layers import clm_layer_pairs
from pipelines.train.losses.terms import LOSS_TERMS, TermInputs

STRIDE = 3


def _dump(tmp: Path, teacher: Path, corpus: Path, name: str, *extra: str) -> Path:
    out = tmp / name
    assert main(clm_dump_args(teacher, corpus, out, "--hidden-layers", "0,2,4", "--layer-stride", str(STRIDE),
                              *extra)) == 0
    return out


@pytest.fixture(scope="module")
def layer_stores(tmp_path_factory, clm_teacher, clm_corpus) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("layer_stores")
    return {"float16": _dump(tmp, clm_teacher, clm_corpus, "f16.zarr"),
            "int8": _dump(tmp, clm_teacher, clm_corpus, "int8.zarr", "--layer-codec", "int8")}


def _teacher(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _teacher_states(teacher: Path, ids: np.ndarray) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        out = _teacher(teacher)(input_ids=torch.as_tensor(ids.astype(np.int64)), output_hidden_states=True)
    return out.hidden_states


@pytest.mark.parametrize("codec, tolerance", [("float16", 2e-3), ("int8", 2e-2)])
def test_stored_layer_states_are_the_teachers_hidden_states(layer_stores, clm_teacher, codec, tolerance):
    """Rotated back (h = h' R), the stored vectors are hidden_states[j] at positions 0, 3, 6, ... of each block
    within the codec's rounding (relative to each vector's largest value); the padding is zeros."""
    store = open_store(str(layer_stores[codec]))
    states = store.clm.layer_states
    assert states.layers == (0, 2, 4) and states.stride == STRIDE and states.codec == codec and states.width == 32
    data = store.read_shard(store.n_shards - 1)  # the last block is padded
    stored = decode_layers(data, states) @ rotation(32, states.rotation_seed)
    hidden = _teacher_states(clm_teacher, data["input_ids"])
    positions = np.arange(0, 16, STRIDE)
    real = positions[None, :] < data["length"][:, None]
    assert stored.shape == (len(data["input_ids"]), len(positions), 3, 32) and not real.all()
    for k, j in enumerate(states.layers):
        theirs = hidden[j][:, positions].numpy()
        error = np.abs(stored[:, :, k] - theirs)[real].max(-1) / np.maximum(np.abs(theirs[real]).max(-1), 1e-6)
        assert error.max() < tolerance, (j, error.max())
        assert (stored[:, :, k][~real] == 0).all()


def test_the_layer_loss_is_the_hand_computed_mse(layer_stores, clm_teacher):
    """clm_layer_mse on a batch made from the stored bytes = the mean over elements of (student layer s - teacher
    layer j)^2 at the real stored positions, summed over the pairs, with the teacher's states from its own forward;
    the cosine term likewise."""
    from pipelines.train.kinds.clm import clm_student

    store = open_store(str(layer_stores["float16"]))
    stage = type("S", (), {"terms": (type("T", (), {"loss": "clm_layer_mse"})(),)})()
    data = store.read_shard(store.n_shards - 1)
    batch = ClmFeed(store).maker(stage, [], "cpu", None)(data)
    student, _, _ = clm_student("first2", str(clm_teacher))
    pairs = clm_layer_pairs(store.clm.layer_states, 2, "", "clm_layer_mse", False)
    assert [(p.student_layer, p.teacher_layer) for p in pairs] == [(0, 0), (1, 2), (2, 4)]
    with torch.no_grad():
        outputs = student(input_ids=batch["input_ids"], output_hidden_states=True)
        value = LOSS_TERMS["clm_layer_mse"](TermInputs(outputs, batch, pairs, None))
        cosine = LOSS_TERMS["clm_layer_cos"](TermInputs(outputs, batch, pairs, None))
    teacher = _teacher_states(clm_teacher, data["input_ids"])
    positions = np.arange(0, 16, STRIDE)
    real = torch.as_tensor(positions[None, :] < data["length"][:, None])
    expected = expected_cos = 0.0
    for s, j in ((0, 0), (1, 2), (2, 4)):
        mine, theirs = outputs.hidden_states[s][:, positions][real], teacher[j][:, positions][real]
        expected += float(((mine - theirs) ** 2).mean())
        expected_cos += float((1 - torch.nn.functional.cosine_similarity(mine, theirs, dim=-1)).mean())
    assert expected > 0.01  # layers 1 and 2 of first2 are not the teacher's layers 2 and 4
    assert abs(float(value) - expected) < 1e-3 * expected
    assert abs(float(cosine) - expected_cos) < 1e-3 * expected_cos + 1e-5


def test_a_student_trains_with_the_layer_loss_and_a_projection(layer_stores, clm_teacher, tmp_path, capsys):
    """first2 with the layer term (its pairs in the log); a random student of another width learns through W."""
    out = tmp_path / "run"
    assert main(["train", "--store", str(layer_stores["int8"]), "--student", "first2", "--method", "clm-kd",
                 "--set", "layer_weight=0.5", "--set", "layer_map=2:4", "--max-steps", "3", "--batch-size", "4",
                 "--device", "cpu", "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["terms"]["layers"] for r in records if "layers" in r.get("terms", {})]
    assert losses and all(np.isfinite(losses)) and all(v > 0 for v in losses)
    wide = tmp_path / "wide"
    assert main(["student", "lm", "--tokenizer", str(clm_teacher), "--student-layers", "1", "--hidden", "16",
                 "--heads", "2", "--ffn", "32", "--out", str(wide)]) == 0
    capsys.readouterr()
    assert main(["train", "--store", str(layer_stores["int8"]), "--student", str(wide), "--method", "clm-kd",
                 "--set", "layer_weight=1", "--set", "layer_loss=cosine", "--set", "layer_map=0:0,1:4",
                 "--max-steps", "2", "--batch-size", "4", "--device", "cpu", "--teacher", str(clm_teacher),
                 "--out", str(tmp_path / "run2")]) == 0
    assert "student 0 <- teacher 0 via W, student 1 <- teacher 4 via W" in capsys.readouterr().out


def test_the_store_shows_verifies_and_derives_its_layers(layer_stores, small_clm_store, tmp_path, capsys):
    report = open_store(str(layer_stores["int8"])).storage_report()
    base = open_store(str(small_clm_store)).storage_report()
    assert report["layer_bytes_per_token"] > 0 and report["bytes_per_token"] > base["bytes_per_token"]
    assert main(["info", str(layer_stores["int8"])]) == 0
    assert "teacher layers 0,2,4 at every 3th position (int8, rotated)" in capsys.readouterr().out
    assert main(["verify", str(layer_stores["int8"])]) == 0
    out = tmp_path / "top4.zarr"
    assert main(["derive", str(layer_stores["int8"]), "--support", "topk:4", "--out", str(out)]) == 0
    derived = open_store(str(out))
    assert derived.clm.layer_states == open_store(str(layer_stores["int8"])).clm.layer_states
    assert np.array_equal(derived.read_shard(0)[LAYERS], open_store(str(layer_stores["int8"])).read_shard(0)[LAYERS])
    assert main(["info", "--card", str(out)]) == 0
    assert "teacher layers 0,2,4" in capsys.readouterr().out


def test_a_forged_layer_vector_at_the_padding_is_refused(layer_stores, tmp_path):
    """A nonzero vector past a row's length is no dump's: verify refuses it in one line, though the forger
    recomputed the digests (test_domain.reseal)."""
    from test_domain import reseal

    copy = Path(shutil.copytree(layer_stores["float16"], tmp_path / "forged.zarr"))
    lengths = open_store(str(copy)).read(slice(0, None), ["length"])["length"]
    row = int(np.flatnonzero(lengths < 16)[0])

    def edit(values):
        values[row, -1, 0, 0] = 1.0
        return values

    reseal(copy, {LAYERS: edit})
    code, _, err = hsk("verify", str(copy), timeout=60)
    assert code != 0 and "Traceback" not in err, err
    assert "array clm/layers of shard " in err and "padding" in err and "forged or damaged" in err, err


def test_train_on_forged_layer_scales_is_refused_and_leaves_no_run_folder(layer_stores, tmp_path):
    """Every row's layer scales negative (whatever shard the run reads first): one line, no run folder, the store
    untouched."""
    from test_domain import reseal

    from hskstore.format.clm_layers import LAYERS_SCALE

    copy = Path(shutil.copytree(layer_stores["int8"], tmp_path / "forged.zarr"))
    reseal(copy, {LAYERS_SCALE: lambda scales: -np.abs(scales) - 1})
    kept, run = tree_hashes(copy), tmp_path / "run"
    code, _, err = hsk("train", "--store", str(copy), "--student", "first2", "--method", "clm-kd", "--set",
                       "layer_weight=0.5", "--max-steps", "2", "--batch-size", "4", "--device", "cpu", "--no-progress",
                       "--out", str(run), timeout=300)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "clm/layers_scale" in err and "negative scale" in err, err
    assert not run.exists() and tree_hashes(copy) == kept


def test_a_forged_layer_selection_is_refused_in_one_line(layer_stores, tmp_path):
    from test_domain import reseal

    copy = Path(shutil.copytree(layer_stores["int8"], tmp_path / "forged.zarr"))
    reseal(copy, selection=lambda meta: meta["selection"]["layer_states"].update(layers=[0, 2, 9]))
    code, _, err = hsk("verify", str(copy), timeout=60)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "selection.layer_states.layers [0, 2, 9]" in err and "0..4" in err, err


@pytest.mark.parametrize("support", ["sample:4", "hidden:int8"])
def test_the_layers_ride_along_any_support(clm_teacher, clm_corpus, tmp_path, support):
    out = tmp_path / "s.zarr"
    assert main(clm_dump_args(clm_teacher, clm_corpus, out, "--hidden-layers", "3", "--layer-stride", "16",
                              "--layer-codec", "nf4", support=support)) == 0
    store = open_store(str(out))
    assert main(["verify", str(out)]) == 0 and str(store.clm.described) == support
    data = store.read_shard(0)
    stored = decode_layers(data, store.clm.layer_states) @ rotation(32, 0)
    theirs = _teacher_states(clm_teacher, data["input_ids"])[3][:, :1].numpy()
    assert stored.shape == (8, 1, 1, 32)
    assert np.abs(stored - theirs[:, :, None]).max() < 0.2 * np.abs(theirs).max()  # 4 bits, rotated


def test_a_layer_the_teacher_lacks_is_one_line_and_writes_nothing(clm_teacher, clm_corpus, tmp_path, capsys):
    before = clm_corpus.read_bytes()
    out = tmp_path / "bad.zarr"
    code, _, err = hsk(*clm_dump_args(clm_teacher, clm_corpus, out, "--hidden-layers", "2,9"))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("hsk: error: --hidden-layers 2,9: the teacher") and "has 4 layers" in lines[0]
    assert "pass numbers from 0 to 4" in lines[0]
    assert not out.exists() and clm_corpus.read_bytes() == before
    for flags, words in ((("--hidden-layers", "2,x"), "--hidden-layers '2,x'"),
                         (("--hidden-layers", "2", "--layer-stride", "0"), "--layer-stride 0"),
                         (("--hidden-layers", "2", "--layer-codec", "int3"), "int3")):
        assert main(clm_dump_args(clm_teacher, clm_corpus, out, *flags)) == 2  # in process: refused before loading
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and words in err, err
        assert not out.exists()


def test_the_layer_term_needs_a_store_with_layers(small_clm_store, tmp_path, capsys):
    assert main(["train", "--store", str(small_clm_store), "--student", "first2", "--method", "clm-kd", "--set",
                 "layer_weight=1", "--device", "cpu", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--hidden-layers" in err[0], err
    assert not (tmp_path / "r").exists()
