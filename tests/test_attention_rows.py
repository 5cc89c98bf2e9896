"""`hsk dump --attention-rows`: TinyBERT's pre-softmax attention rows in the store, `hsk info`, `hsk derive`."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertForSequenceClassification

from hskstore import ConfigError, open_store
from hskstore.share.derive import derive
from pipelines.cli import main

HEADS = 4  # the tiny teacher's


def dump_cli(teacher_dir, glue_dir, out, config, *extra) -> None:
    args = ["dump", "--task", "sst2", "--teacher", str(teacher_dir), "--config", config, "--out", str(out),
            "--data-dir", str(glue_dir), "--limit", "20", "--max-length", "24", "--shard-rows", "8",
            "--batch-size", "4", "--device", "cpu", "--no-progress", *extra]
    assert main(args) == 0


@pytest.fixture(scope="module")
def big(teacher_dir, glue_dir, tmp_path_factory) -> Path:
    """3 kept layers (teacher 2, 3, 4 of the 4-layer teacher's map), 6 tokens, with attention rows."""
    out = tmp_path_factory.mktemp("stores") / "big.zarr"
    dump_cli(teacher_dir, glue_dir, out, "3,6,0.5", "--attention-rows")
    return out


def reference_rows(teacher_dir, store, layer) -> np.ndarray:
    """Scores recomputed from the teacher's hidden states with its own Q/K Linears (no hsk code)."""
    model = BertForSequenceClassification.from_pretrained(teacher_dir).eval()
    data = store.read(slice(None), ["input_ids", "token_type_ids", "length", f"{layer.name}/positions"])
    ids = torch.as_tensor(data["input_ids"].astype(np.int64))
    lengths = torch.as_tensor(data["length"].astype(np.int64))
    mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask, token_type_ids=torch.as_tensor(
            data["token_type_ids"].astype(np.int64)), output_hidden_states=True).hidden_states
        att = model.bert.encoder.layer[layer.teacher_layer - 1].attention.self
        x = hidden[layer.teacher_layer - 1]  # the input of teacher layer j
        b, t, d = x.shape
        q = att.query(x).view(b, t, HEADS, d // HEADS).transpose(1, 2)
        k = att.key(x).view(b, t, HEADS, d // HEADS).transpose(1, 2)
        full = (q @ k.transpose(-1, -2) / math.sqrt(d // HEADS)).numpy()  # [B, H, T, T]
    positions = data[f"{layer.name}/positions"]
    want = np.zeros((b, HEADS, positions.shape[1], t), dtype=np.float32)
    for r in range(b):
        for slot, p in enumerate(positions[r]):
            if p >= 0:
                want[r, :, slot, : lengths[r]] = full[r, :, p, : lengths[r]]
    return want


def test_dump_stores_rows_of_the_kept_tokens(big, teacher_dir):
    store = open_store(str(big))
    assert store.selection.attention_heads == HEADS and store.meta["selection"]["attention_heads"] == HEADS
    for layer in store.layers:
        rows = store.read(slice(None), [f"{layer.name}/attention"])[f"{layer.name}/attention"]
        assert rows.shape == (20, HEADS, 6, 24) and rows.dtype == np.float16
        want = reference_rows(teacher_dir, store, layer)
        np.testing.assert_allclose(rows.astype(np.float32), want, atol=2e-3, rtol=2e-3)
        assert np.abs(rows).max() > 0.05  # not a store of zeros


def test_info_shows_the_cost_and_plain_stores_are_unchanged(big, teacher_dir, glue_dir, tmp_path, capsys):
    assert main(["info", str(big)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("attention"))
    assert "B/example" in line and f"{HEADS} heads x 6 rows x 24 keys" in line
    plain = tmp_path / "plain.zarr"
    dump_cli(teacher_dir, glue_dir, plain, "3,6,0.5")
    meta = open_store(str(plain)).meta
    assert "attention_heads" not in meta["selection"]
    assert not [name for name in open_store(str(plain)).specs if name.endswith("/attention")]
    # The flag adds arrays and nothing else: every other array is byte for byte the same.
    with_rows = open_store(str(big)).meta["checksums"]
    assert {k: v for k, v in with_rows.items() if not k.endswith("/attention")} == meta["checksums"]


def test_derive_keeps_a_prefix_of_rows_or_drops_them(big, teacher_dir, glue_dir, tmp_path):
    derive(str(big), "2,4,0.5", str(tmp_path / "kept.zarr"))
    dump_cli(teacher_dir, glue_dir, tmp_path / "direct.zarr", "2,4,0.5", "--attention-rows")
    kept, direct = open_store(str(tmp_path / "kept.zarr")), open_store(str(tmp_path / "direct.zarr"))
    assert kept.selection.attention_heads == HEADS
    for layer in direct.layers:
        name = f"{layer.name}/attention"
        got = kept.read(slice(None), [name])[name]
        np.testing.assert_array_equal(got, direct.read(slice(None), [name])[name])

    assert main(["derive", str(big), "--config", "2,4,0.5", "--out", str(tmp_path / "dropped.zarr"),
                 "--no-attention-rows", "--no-progress"]) == 0
    dump_cli(teacher_dir, glue_dir, tmp_path / "direct_plain.zarr", "2,4,0.5")
    dropped = open_store(str(tmp_path / "dropped.zarr")).meta
    assert "attention_heads" not in dropped["selection"]
    assert dropped["checksums"] == open_store(str(tmp_path / "direct_plain.zarr")).meta["checksums"]


def test_rows_refused_where_they_cannot_be(teacher_dir, glue_dir, tmp_path, capsys):
    dump_cli(teacher_dir, glue_dir, tmp_path / "plain.zarr", "1,4,0.5")
    with pytest.raises(ConfigError, match="--attention-rows"):
        derive(str(tmp_path / "plain.zarr"), "1,4,0.5", str(tmp_path / "x.zarr"), attention_rows=True)
    # Only the embedding output kept: it has no attention of its own.
    args = ["dump", "--task", "sst2", "--teacher", str(teacher_dir), "--config", "1,4,0.5", "--layers", "0",
            "--out", str(tmp_path / "emb.zarr"), "--data-dir", str(glue_dir), "--limit", "8", "--attention-rows",
            "--device", "cpu", "--no-progress"]
    assert main(args) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "hsk:" in line or "Traceback" in line]
    assert len(err) == 1 and err[0].startswith("hsk: error:") and "--attention-rows" in err[0]
    assert not (tmp_path / "emb.zarr").exists()  # refused before anything was written
