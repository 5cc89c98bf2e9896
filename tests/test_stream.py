"""The training loader: shuffled shard stream (coverage, determinism, memory, resume, ranks) and decoding."""

from pathlib import Path

import numpy as np
import pytest
import torch

from hskstore import CorruptStoreError, IncompleteStoreError, open_store
from hskstore.format import codec
from hskstore.format.config import HSKConfig, Selection
from hskstore.format.schema import array_specs, make_layout
from hskstore.io.writer import StoreWriter
from pipelines.train.data.decode import decode_batch
from pipelines.train.data.stream import StoreStream

D = 20  # not a multiple of 8: the last mask byte is partly padding
T = 12


def make_meta(n_rows, shard_rows, value_dtype="float16", regression=False, config="2,3,0.25", chunk_rows=None):
    sel = Selection(HSKConfig.parse(config), D, 4, (2, 4), (1, 2), (2, 4), ref_student_layers=2, l_top=4,
                    value_dtype=value_dtype)
    return {
        "task": {"name": "stsb" if regression else "sst2", "split": "train", "labels": ["a", "b"],
                 "regression": regression},
        "dataset": {"source": "synthetic", "fingerprint": "x", "n_rows": n_rows},
        "teacher": {"name": "t", "weights_hash": "w", "num_layers": 4, "hidden_size": D, "num_labels": 2},
        "tokenizer": {"name": "t", "vocab_hash": "v", "vocab_size": 60000, "sep_id": 3},
        "max_length": T,
        "selection": sel.to_dict(),
        "layout": make_layout(n_rows, sel.n_width, shard_rows, chunk_rows=chunk_rows or shard_rows),
    }


def shard_arrays(meta, start, stop):
    """Rows as a dump would write them: row ids, real masks with N^W bits, unused slots empty."""
    rng = np.random.default_rng(start)
    n = stop - start
    n_width = meta["layout"]["n_width"]
    out = {}
    for s in array_specs(meta):
        tail = s.shape[1:]
        if s.name == "row":
            out[s.name] = np.arange(start, stop)
        elif s.name == "length":
            out[s.name] = rng.integers(1, T + 1, n)
        elif s.name == "input_ids":
            out[s.name] = rng.integers(0, 60000, (n, *tail))
        elif s.name.endswith("positions"):
            out[s.name] = np.where(rng.random((n, *tail)) < 0.2, -1, rng.integers(0, T, (n, *tail)))
        elif "int" in s.dtype and not s.name.endswith(("masks", "values")):
            out[s.name] = rng.integers(-1, 2, (n, *tail))
        elif not s.name.endswith(("masks", "values", "scale")):
            out[s.name] = rng.normal(size=(n, *tail))
    for layer in [f"layers/{i}" for i in range(2)]:
        used = out[f"{layer}/positions"] >= 0
        mask = np.zeros((*used.shape, D), dtype=bool)
        for idx in np.argwhere(used):
            mask[tuple(idx)][rng.choice(D, n_width, replace=False)] = True
        out[f"{layer}/masks"] = codec.pack_mask(mask)
        vectors = rng.normal(size=(*used.shape, D)).astype(np.float32)
        values, scale = codec.encode_values(vectors, mask, n_width, meta["selection"]["value_dtype"])
        out[f"{layer}/values"] = values
        if scale is not None:
            out[f"{layer}/scale"] = scale
    return out


def build(path, n_rows=67, shard_rows=8, edit=None, **kw):
    """A complete synthetic store; `edit(shard, arrays)` may change a shard's arrays before they are written."""
    url = str(path)
    meta = make_meta(n_rows, shard_rows, **kw)
    writer = StoreWriter.open(url, meta)
    for shard in range(writer.n_shards):
        arrays = shard_arrays(meta, *writer.shard_bounds(shard))
        if edit is not None:
            edit(shard, arrays)
        writer.write_shard(shard, arrays)
    writer.finalize()
    return open_store(url)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build(tmp_path_factory.mktemp("stream") / "s.zarr")  # 9 shards, the last one 3 rows


def rows_of(stream):
    return [b["row"].tolist() for b in stream]


@pytest.mark.parametrize("drop_last", [False, True])
def test_every_example_once_per_epoch_and_len(store, drop_last):
    stream = StoreStream(store, batch_size=5, buffer_shards=2, workers=2, drop_last=drop_last)
    for epoch in range(2):
        stream.set_epoch(epoch)
        n = len(stream)
        batches = list(stream)
        assert len(batches) == n == (67 // 5 if drop_last else -(-67 // 5))
        rows = np.concatenate([b["row"] for b in batches])
        assert len(set(rows.tolist())) == len(rows)
        assert sorted(rows.tolist()) == (sorted(rows.tolist()) if drop_last else list(range(67)))
        assert [len(b["row"]) for b in batches] == [5] * (n - 1) + [5 if drop_last else 2]
    reference = store.read(slice(0, 67))
    for batch in batches:  # each batch row holds that example's arrays; ids trimmed to the longest text
        width = int(batch["length"].max())
        assert batch["input_ids"].shape[1] == batch["token_type_ids"].shape[1] == width
        np.testing.assert_array_equal(batch["input_ids"], reference["input_ids"][batch["row"], :width])
        np.testing.assert_array_equal(batch["layers/1/values"], reference["layers/1/values"][batch["row"]])
        np.testing.assert_array_equal(batch["logits"], reference["logits"][batch["row"]])


def test_deterministic_per_seed_and_different_across_seeds_and_epochs(store):
    def run(seed=0, epoch=0, workers=2):
        stream = StoreStream(store, batch_size=4, seed=seed, buffer_shards=3, workers=workers, names=["row"])
        stream.set_epoch(epoch)
        return rows_of(stream)

    first = run()
    assert first == run() == run(workers=0) == run(workers=3)
    assert first != run(seed=1) and first != run(epoch=1)
    flat = [r for b in first for r in b]
    assert flat != sorted(flat)
    ordered = StoreStream(store, batch_size=4, shuffle=False, buffer_shards=3, names=["row"])
    assert [r for b in rows_of(ordered) for r in b] == list(range(67))


@pytest.mark.parametrize("buffer_shards,workers", [(1, 1), (2, 2), (3, 1), (4, 0)])
def test_buffer_holds_at_most_the_configured_shards(store, buffer_shards, workers):
    stream = StoreStream(store, batch_size=3, buffer_shards=buffer_shards, workers=workers)
    assert sum(len(b["row"]) for b in stream) == 67
    stats = stream.stats
    assert stats.peak_buffer_shards == buffer_shards
    assert stats.peak_resident_shards <= buffer_shards + max(workers, 1)
    assert sorted(stats.shards_read) == list(range(store.n_shards))


def test_read_ahead_queues_more_shards_than_threads_same_batches(store):
    plain = StoreStream(store, batch_size=3, buffer_shards=2, workers=1, names=["row"])
    deep = StoreStream(store, batch_size=3, buffer_shards=2, workers=1, read_ahead=5, names=["row"])
    assert rows_of(deep) == rows_of(plain)
    assert plain.stats.peak_resident_shards <= 2 + 1 < deep.stats.peak_resident_shards <= 2 + 5


def test_resume_mid_epoch_continues_exactly(store):
    kw = dict(batch_size=4, buffer_shards=2, workers=2, seed=7, names=["row", "logits"])  # fewer reads: fast
    full = StoreStream(store, **kw)
    expected = []
    for epoch in range(2):
        full.set_epoch(epoch)
        expected += [(epoch, b["row"].tolist()) for b in full]
    per_epoch = len(expected) // 2
    logits = store.read(slice(0, 67), ["logits"])["logits"]
    for stop in [0, 1, 8, per_epoch - 1, per_epoch, per_epoch + 3]:
        stream, got = StoreStream(store, **kw), []
        for epoch in range(2):  # a training loop that checkpoints after `stop` steps and is killed
            if len(got) == stop:
                break
            stream.set_epoch(epoch)
            for batch in stream:
                got.append((epoch, batch["row"].tolist()))
                if len(got) == stop:
                    break
        state = stream.state_dict()
        resumed = StoreStream(store, **kw)
        resumed.load_state_dict(state)
        for epoch in range(state["epoch"], 2):
            resumed.set_epoch(epoch)  # does not undo the loaded position
            for b in resumed:
                got.append((epoch, b["row"].tolist()))
                # rows carried over from skipped shards come with their own data
                np.testing.assert_array_equal(b["logits"], logits[b["row"]])
        assert got == expected, stop
    # skipping does not read the skipped shards: a late resume reads few of them
    late = StoreStream(store, **kw)
    late.load_state_dict({"epoch": 0, "batches_done": per_epoch - 1, "seed": 7})
    assert len(list(late)) == 1 and len(set(late.stats.shards_read)) < store.n_shards // 2
    with pytest.raises(ValueError, match="batches done"):
        late.load_state_dict({"epoch": 0, "batches_done": per_epoch + 1, "seed": 7})


def test_ranks_take_disjoint_slices_of_the_one_process_batches(store):
    """N ranks of local batch b see, step by step, the batches of one process of batch N*b (split);
    a global batch cannot split over the ranks when partial, so N ranks drop the epoch's last one."""
    world = 3
    streams = [StoreStream(store, batch_size=4, rank=r, world_size=world, seed=3) for r in range(world)]
    alone = StoreStream(store, batch_size=4 * world, seed=3, names=["row"])
    for epoch in range(2):
        alone.set_epoch(epoch)
        expected = [set(b) for b in rows_of(alone)][: 67 // 12]
        per_rank = []
        for s in streams:
            s.set_epoch(epoch)
            assert len(s) == 67 // 12  # DDP lockstep: every rank the same number of full batches
            per_rank.append(rows_of(s))
        for step, slices in enumerate(zip(*per_rank)):
            assert [len(x) for x in slices] == [4] * world
            assert set().union(*map(set, slices)) == expected[step]
            assert len(set().union(*map(set, slices))) == 12  # disjoint
    with pytest.raises(ValueError, match="fewer than the 10 ranks"):
        StoreStream(store, batch_size=4, rank=0, world_size=10)


@pytest.mark.parametrize("value_dtype", ["float16", "int8"])
def test_decode_matches_codec_dense(tmp_path, value_dtype):
    store = build(tmp_path / "d.zarr", n_rows=30, shard_rows=16, value_dtype=value_dtype)
    stream = StoreStream(store, batch_size=7, buffer_shards=2)
    for batch in stream:
        out = decode_batch(batch, store.layers, store.hidden_size, torch.device("cpu"), value_dtype)
        for i, layer in enumerate(store.layers):
            expected = store.dense(batch, layer)
            assert out[f"dense_{i}"].dtype == torch.float32
            np.testing.assert_array_equal(out[f"dense_{i}"].numpy(), expected)
            pos = batch[f"{layer.name}/positions"]
            np.testing.assert_array_equal(out[f"valid_{i}"].numpy(), pos >= 0)
            np.testing.assert_array_equal(out[f"positions_{i}"].numpy(), np.maximum(pos, 0))
            assert out[f"positions_{i}"].dtype == torch.long
        np.testing.assert_array_equal(out["input_ids"].numpy(), batch["input_ids"].astype(np.int64))
        assert {out[k].dtype for k in ("input_ids", "token_type_ids", "attention_mask")} == {torch.long}
        np.testing.assert_array_equal(out["attention_mask"].numpy().sum(1), batch["length"])
        assert out["labels"].dtype == torch.long and out["logits"].dtype == torch.float32
    assert (batch["input_ids"] > 32767).any()  # uint16 ids past the int16 range survive the transfer


def test_regression_labels_and_names_subset(tmp_path):
    store = build(tmp_path / "r.zarr", n_rows=10, shard_rows=4, regression=True)
    stream = StoreStream(store, batch_size=4, names=["label", "logits"])
    batch = next(iter(stream))
    assert set(batch) == {"row", "label", "logits"}
    out = decode_batch(batch, store.layers, store.hidden_size, "cpu", store.selection.value_dtype)
    assert set(out) == {"labels", "logits"} and out["labels"].dtype == torch.float32
    with pytest.raises(ValueError, match="no arrays"):
        StoreStream(store, batch_size=4, names=["nope"])


def test_corrupted_shard_raises_during_iteration(tmp_path):
    store = build(tmp_path / "c.zarr", n_rows=40, shard_rows=8)
    victim = Path(store.url) / "layers" / "0" / "values" / "c" / "2" / "0" / "0"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    stream = StoreStream(store, batch_size=4, shuffle=False, buffer_shards=1, workers=2)
    got = []
    with pytest.raises(CorruptStoreError, match="shard 2 .*rows 16:24"):
        for batch in stream:
            got.append(batch)
    assert len(got) == 4  # the two intact shards before it were delivered


def test_incomplete_store_is_refused(tmp_path):
    meta = make_meta(16, 8)
    writer = StoreWriter.open(str(tmp_path / "i.zarr"), meta)
    writer.write_shard(0, shard_arrays(meta, 0, 8))
    with pytest.raises(IncompleteStoreError, match="incomplete"):
        StoreStream(open_store(str(tmp_path / "i.zarr"), allow_incomplete=True), batch_size=4)
