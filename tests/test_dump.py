"""The dump stage end to end on a tiny random teacher and real SST-2 / MRPC rows."""

from __future__ import annotations

import errno
import functools
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from conftest import chunk_bytes, dump_args, kill_dump_midway
from transformers import AutoTokenizer, BertForSequenceClassification

from hskstore import open_store
from hskstore.format.config import ConfigError, HSKConfig
from hskstore.format.schema import PROGRESS_DONE
from hskstore.io.writer import StoreWriter
from pipelines.cli import main
from pipelines.dump import stage as dump_stage
from pipelines.dump.stage import DumpOptions, dump

ROOT = Path(__file__).resolve().parents[1]


def run_dump(teacher_dir, glue_dir, out, config="3,4,0.25", limit=40, **kw):
    options = DumpOptions(
        config=HSKConfig.parse(config),
        max_length=kw.pop("max_length", 32),
        shard_rows=kw.pop("shard_rows", 16),
        batch_size=8,
        progress=False,
        **kw,
    )
    return dump(
        "sst2",
        options,
        teacher=str(teacher_dir),
        out=str(out),
        data_dir=str(glue_dir),
        limit=limit,
        log=lambda *_: None,
    )


def reference_hidden(teacher_dir, input_ids, lengths):
    """The teacher's hidden states and eager attention maps, computed independently of hsk."""
    model = BertForSequenceClassification.from_pretrained(teacher_dir, attn_implementation="eager").eval()
    ids = torch.as_tensor(input_ids.astype(np.int64))
    mask = (torch.arange(ids.shape[1])[None, :] < torch.as_tensor(lengths)[:, None]).long()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    return out


def test_round_trip_matches_teacher_masked_hidden_states(teacher_dir, glue_dir, tmp_path):
    result = run_dump(teacher_dir, glue_dir, tmp_path / "s.zarr", attention_scores="post-softmax")
    store = open_store(str(tmp_path / "s.zarr"))
    assert result.examples_written == 40 and len(store) == 40 and store.verify() == []
    # S=4, default L_top = round(10/12 * 4) = 3: map 0,1,2,2,3 -> entries 2..4 keep teacher layers 2,2,3,
    # ranked by the attention of layers 2,3,4 (the L_top=L map)
    assert [(lay.teacher_layer, lay.ranking_layer) for lay in store.layers] == [(2, 2), (2, 3), (3, 4)]
    data = store[0:40]
    ref = reference_hidden(teacher_dir, data["input_ids"], data["length"])
    np.testing.assert_allclose(data["logits"], ref.logits.numpy(), rtol=1e-4, atol=1e-5)
    sep = AutoTokenizer.from_pretrained(teacher_dir).sep_token_id
    for layer in store.layers:
        positions = data[f"{layer.name}/positions"]
        dense = store.dense(data, layer)
        hidden = ref.hidden_states[layer.teacher_layer].numpy()
        cls_att = (
            ref.attentions[layer.ranking_layer - 1][:, :, 0, :].mean(1).numpy()
        )  # post-softmax [CLS] row
        for i in range(40):
            n = data["length"][i]
            eligible = [p for p in range(n) if data["input_ids"][i, p] != sep]
            expect = sorted(eligible, key=lambda p: -cls_att[i, p])[:4]
            got = [p for p in positions[i] if p >= 0]
            assert got == expect, (i, got, expect)
            assert all(data["input_ids"][i, p] != sep for p in got)
            np.testing.assert_allclose(
                data[f"{layer.name}/scores"][i, : len(got)], cls_att[i, got], rtol=1e-4
            )
            for slot, p in enumerate(got):
                vec = hidden[i, p]
                kept = dense[i, slot] != 0
                assert kept.sum() == round(0.25 * 32)
                # the kept activations are the largest magnitudes, stored to fp16 precision
                assert np.abs(vec[kept]).min() >= np.abs(vec[~kept]).max() - 1e-3
                np.testing.assert_allclose(dense[i, slot][kept], vec[kept], rtol=1e-3, atol=1e-3)
            assert (dense[i, len(got) :] == 0).all()


def test_store_records_provenance_and_deviations(teacher_dir, glue_dir, tmp_path):
    meta = run_dump(teacher_dir, glue_dir, tmp_path / "s.zarr", limit=20).meta
    assert meta["complete"] and meta["teacher"]["weights_hash"].startswith("sha256:")
    assert meta["tokenizer"]["vocab_hash"] and meta["dataset"]["fingerprint"]
    assert meta["selection"]["token_strategy"] == "att-nosep" and meta["selection"]["width_strategy"] == "mag"
    assert {"width_mask", "sep_exclusion"} <= set(meta["selection"]["deviations"])
    assert set(meta["checksums"]) >= {"logits", "input_ids", "layers/0/values", "layers/2/masks"}
    store = open_store(str(tmp_path / "s.zarr"))
    assert (store[0:20]["text_hash"] != 0).all() and (store[0:20]["row"] == np.arange(20)).all()


def test_logits_only_int8_and_fsspec(teacher_dir, glue_dir, tmp_path):
    meta = run_dump(teacher_dir, glue_dir, "memory://hsk-dump-test", config="0,0,0", limit=20).meta
    assert meta["selection"]["teacher_layers"] == []
    assert open_store("memory://hsk-dump-test").verify() == []
    run_dump(teacher_dir, glue_dir, tmp_path / "q.zarr", value_dtype="int8", limit=20)
    run_dump(teacher_dir, glue_dir, tmp_path / "f.zarr", limit=20)
    q, f = open_store(str(tmp_path / "q.zarr")), open_store(str(tmp_path / "f.zarr"))
    dq, df = q.dense(q[0:20], q.layers[0]), f.dense(f[0:20], f.layers[0])
    assert ((dq != 0) == (df != 0)).all()
    np.testing.assert_allclose(dq, df, atol=np.abs(df).max() / 127)




def test_interrupted_dump_resumes_to_identical_bytes(teacher_dir, glue_dir, tmp_path, monkeypatch):
    run_dump(teacher_dir, glue_dir, tmp_path / "full.zarr", limit=48)
    original = StoreWriter.write_shard
    calls = {"n": 0}

    def dying_write(self, shard, arrays):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, shard, arrays)

    monkeypatch.setattr(StoreWriter, "write_shard", dying_write)
    with pytest.raises(OSError):
        run_dump(teacher_dir, glue_dir, tmp_path / "cut.zarr", limit=48)
    monkeypatch.setattr(StoreWriter, "write_shard", original)
    with pytest.raises(Exception, match="incomplete"):
        open_store(str(tmp_path / "cut.zarr"))
    resumed = run_dump(teacher_dir, glue_dir, tmp_path / "cut.zarr", limit=48)
    assert resumed.examples_written == 32  # only the shards that were missing
    full, cut = open_store(str(tmp_path / "full.zarr")), open_store(str(tmp_path / "cut.zarr"))
    assert full.meta["checksums"] == cut.meta["checksums"]
    assert chunk_bytes(tmp_path / "full.zarr") == chunk_bytes(tmp_path / "cut.zarr")


def test_overlapped_selection_writes_the_same_bytes(teacher_dir, glue_dir, tmp_path, monkeypatch):
    """Selection on a worker thread (the GPU path, forced on here) writes the inline path's store."""
    run_dump(teacher_dir, glue_dir, tmp_path / "inline.zarr", limit=48)
    overlapped = functools.partial(dump_stage.compute_shard, overlap=True)
    monkeypatch.setattr(dump_stage, "compute_shard", overlapped)
    run_dump(teacher_dir, glue_dir, tmp_path / "overlap.zarr", limit=48)
    inline, overlap = open_store(str(tmp_path / "inline.zarr")), open_store(str(tmp_path / "overlap.zarr"))
    assert inline.meta["checksums"] == overlap.meta["checksums"]
    assert chunk_bytes(tmp_path / "inline.zarr") == chunk_bytes(tmp_path / "overlap.zarr")


def test_pipelined_dump_writes_the_same_bytes_as_depth_one(teacher_dir, glue_dir, tmp_path):
    """Three shards written at once beside the forward (a GPU's schedule) and each shard tokenized in three
    pieces on three threads write the store of a serial host pipeline (one shard written at a time, tokenized
    whole, between forwards: a CPU's schedule)."""
    run_dump(teacher_dir, glue_dir, tmp_path / "serial.zarr", limit=88, write_depth=1, tokenize_threads=1)
    run_dump(teacher_dir, glue_dir, tmp_path / "deep.zarr", limit=88, write_depth=3, tokenize_threads=3,
             host_overlap=True)
    serial, deep = open_store(str(tmp_path / "serial.zarr")), open_store(str(tmp_path / "deep.zarr"))
    assert serial.meta["checksums"] == deep.meta["checksums"]
    assert chunk_bytes(tmp_path / "serial.zarr") == chunk_bytes(tmp_path / "deep.zarr")


def test_pipelined_dump_stops_at_a_failed_write_and_resumes_to_identical_bytes(
    teacher_dir, glue_dir, tmp_path, monkeypatch
):
    """Two shards in flight: a failed write stops the dump before another shard is submitted; the shard
    written beside it stays done, and the rerun writes only the missing ones, to the same bytes."""
    run_dump(teacher_dir, glue_dir, tmp_path / "full.zarr", limit=64, write_depth=1)
    original = StoreWriter.write_shard

    def dying_write(self, shard, arrays):
        if shard == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, shard, arrays)

    monkeypatch.setattr(StoreWriter, "write_shard", dying_write)
    with pytest.raises(OSError):
        run_dump(teacher_dir, glue_dir, tmp_path / "cut.zarr", limit=64, write_depth=2, host_overlap=True)
    monkeypatch.setattr(StoreWriter, "write_shard", original)
    done = zarr.open_group(str(tmp_path / "cut.zarr"), mode="r")[PROGRESS_DONE][:]
    assert done.tolist() == [1, 0, 1, 0]  # shard 2 was in flight beside the failing 1; 3 never submitted
    resumed = run_dump(teacher_dir, glue_dir, tmp_path / "cut.zarr", limit=64, write_depth=2, host_overlap=True)
    assert resumed.examples_written == 32
    full, cut = open_store(str(tmp_path / "full.zarr")), open_store(str(tmp_path / "cut.zarr"))
    assert full.meta["checksums"] == cut.meta["checksums"]
    assert chunk_bytes(tmp_path / "full.zarr") == chunk_bytes(tmp_path / "cut.zarr")


def test_kill_9_then_rerun_gives_same_checksums(teacher_dir, glue_dir, tmp_path):
    args = [
        "dump",
        "--task",
        "sst2",
        "--teacher",
        str(teacher_dir),
        "--config",
        "2,4,0.25",
        "--data-dir",
        str(glue_dir),
        "--limit",
        "400",
        "--shard-rows",
        "8",
        "--max-length",
        "32",
        "--batch-size",
        "4",
        "--no-progress",
        "--device",
        "cpu",
    ]
    assert main(args + ["--out", str(tmp_path / "ref.zarr")]) == 0
    kill_dump_midway(args, tmp_path / "k.zarr", shards=3)
    assert main(["verify", str(tmp_path / "k.zarr")]) == 1
    assert main(args + ["--out", str(tmp_path / "k.zarr")]) == 0
    assert (
        open_store(str(tmp_path / "k.zarr")).meta["checksums"]
        == open_store(str(tmp_path / "ref.zarr")).meta["checksums"]
    )
    assert main(["verify", str(tmp_path / "k.zarr")]) == 0


# `hsk dump` of SST-2 rows as run_dump makes it (3,4,0.25, 16-row shards), without --out
small_dump_args = functools.partial(dump_args, out=None, config="3,4,0.25", shard_rows=16, batch_size=8)


def test_write_processes_write_the_same_bytes_through_the_cli(teacher_dir, glue_dir, tmp_path):
    """`hsk dump --write-processes 2`: shards compressed and written by two other processes give the store of
    the default (threads), byte for byte; a file beside the output is left as it was."""
    args = small_dump_args(teacher_dir, glue_dir, rows=72)
    beside = tmp_path / "notes.txt"
    beside.write_bytes(b"mine\n")
    assert main(args + ["--out", str(tmp_path / "threads.zarr")]) == 0
    assert main(args + ["--out", str(tmp_path / "processes.zarr"), "--write-processes", "2"]) == 0
    threads, processes = open_store(str(tmp_path / "threads.zarr")), open_store(str(tmp_path / "processes.zarr"))
    assert threads.meta["checksums"] == processes.meta["checksums"]
    assert chunk_bytes(tmp_path / "threads.zarr") == chunk_bytes(tmp_path / "processes.zarr")
    assert beside.read_bytes() == b"mine\n"


def test_a_write_process_that_dies_is_one_line_and_the_rerun_resumes(teacher_dir, glue_dir, tmp_path, monkeypatch,
                                                                      capsys):
    """A write process killed right after its first shard (HSK_FAULT, inherited by the spawned processes): the
    dump stops with one line saying to rerun, the finished shards stay done, and the rerun writes the rest to the
    bytes of an uninterrupted dump."""
    base = small_dump_args(teacher_dir, glue_dir, rows=64)  # both through the CLI: the same torch threads
    assert main(base + ["--out", str(tmp_path / "full.zarr")]) == 0
    args = base + ["--out", str(tmp_path / "cut.zarr"), "--write-processes", "1"]
    monkeypatch.setenv("HSK_FAULT", "after-shard-written")
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hsk: error: a write process died") and "rerun the same command to resume" in err
    assert len(err.splitlines()) == 1
    done = zarr.open_group(str(tmp_path / "cut.zarr"), mode="r")[PROGRESS_DONE][:]
    assert done.tolist() == [1, 0, 0, 0]
    monkeypatch.delenv("HSK_FAULT")
    assert main(args) == 0
    full, cut = open_store(str(tmp_path / "full.zarr")), open_store(str(tmp_path / "cut.zarr"))
    assert full.meta["checksums"] == cut.meta["checksums"]
    assert chunk_bytes(tmp_path / "full.zarr") == chunk_bytes(tmp_path / "cut.zarr")


def test_write_processes_refuse_what_they_cannot_reach(teacher_dir, glue_dir, tmp_path, capsys):
    """A memory:// store lives in one process; dask workers write their own shards: both refused in one line,
    nothing written."""
    with pytest.raises(ConfigError, match="memory://"):
        run_dump(teacher_dir, glue_dir, "memory://wp/s.zarr", write_processes=2)
    out = tmp_path / "s.zarr"
    args = ["dump", "--task", "sst2", "--teacher", str(teacher_dir), "--config", "3,4,0.25", "--data-dir",
            str(glue_dir), "--out", str(out)]
    assert main(args + ["--write-processes", "2", "--workers", "2"]) == 2
    assert "each dask worker already writes its own shards" in capsys.readouterr().err
    assert main(args + ["--write-processes", "-1"]) == 2
    assert capsys.readouterr().err.strip() == "hsk: error: --write-processes must be an integer >= 0, got -1"
    assert not out.exists()
