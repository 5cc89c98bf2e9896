"""derive(big -> small) must equal a direct dump at the small config, array for array.

The "dump" here is a numpy mimic of pipelines.dump.targets.encode_batch run on one set of random
teacher tensors (hidden states, [CLS] attention rows, ids with [SEP]s, lengths), so both sides
see the same teacher; values are drawn on a coarse grid so ranking and magnitude ties occur.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hskstore import ConfigError, CorruptStoreError, IncompleteStoreError, StoreExistsError, open_store
from hskstore.format import codec
from hskstore.format.config import HSKConfig, Selection
from hskstore.format.schema import array_specs, layer_names, make_layout
from hskstore.io.writer import StoreWriter
from hskstore.method.layermap import default_l_top, select_depth
from hskstore.method.selection import attention_scores, eligible_tokens, rank_tokens, width_mask
from hskstore.share.derive import derive

N, T, L, D, HEADS, SEP, CLS = 23, 12, 6, 32, 3, 102, 101
SHARD_ROWS = 8  # 3 shards, the last one partial


@pytest.fixture(scope="module")
def teacher():
    rng = np.random.default_rng(7)
    lengths = rng.integers(2, T + 1, size=N).astype(np.int16)
    lengths[:3] = [2, 3, T]  # texts with fewer eligible tokens than N^L
    ids = np.zeros((N, T), dtype=np.int64)
    types = np.zeros((N, T), dtype=np.int64)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(1000, 2000, size=n)
        ids[i, 0], ids[i, n - 1] = CLS, SEP
        if n >= 6 and i % 2:  # a sentence pair: a second [SEP] inside
            cut = int(rng.integers(2, n - 2))
            ids[i, cut] = SEP
            types[i, cut + 1:n] = 1
    hidden = rng.normal(size=(N, L + 1, T, D)).astype(np.float32)
    coarse = rng.integers(-4, 5, size=hidden.shape) * 0.5  # magnitude ties across indices
    hidden = np.where(rng.random(hidden.shape) < 0.5, coarse, hidden).astype(np.float32)
    # Per-head pre-softmax [CLS] query rows of each attention layer (index 1..L), on a grid: ranking ties.
    cls_rows = rng.integers(-3, 4, size=(N, L + 1, HEADS, T)).astype(np.float32)
    return {"ids": ids, "types": types, "lengths": lengths, "hidden": hidden, "cls": cls_rows,
            "labels": rng.integers(0, 2, size=N), "logits": rng.normal(size=(N, 2)).astype(np.float32)}


def make_selection(config, token_strategy="att-nosep", width_strategy="mag", value_dtype="float16",
                   attention="pre-softmax", layers=None, width_seed=3) -> Selection:
    cfg = HSKConfig.parse(config)
    teacher_layers, entries, ranking = select_depth(cfg.n_layers, L, ref_student_layers=None if layers else 4,
                                                    explicit_layers=layers)
    return Selection(
        cfg, D, L, tuple(teacher_layers), None if entries is None else tuple(entries), tuple(ranking),
        ref_student_layers=None if layers else 4, l_top=None if layers else default_l_top(L),
        token_strategy=token_strategy, attention_scores=attention, width_strategy=width_strategy,
        width_seed=width_seed, value_dtype=value_dtype,
    )


def make_meta(sel: Selection) -> dict:
    return {
        "task": {"name": "sst2", "split": "train", "labels": ["negative", "positive"], "regression": False},
        "dataset": {"source": "synthetic", "fingerprint": "x", "n_rows": N},
        "teacher": {"name": "t", "weights_hash": "w", "num_layers": L, "hidden_size": D, "num_labels": 2},
        "tokenizer": {"name": "t", "vocab_hash": "v", "vocab_size": 30522, "sep_id": SEP},
        "max_length": T,
        "selection": sel.to_dict(),
        "layout": make_layout(N, sel.n_width, SHARD_ROWS),
    }


def encode_rows(t: dict, rows: slice, sel: Selection) -> dict[str, np.ndarray]:
    """What the dump writes for these rows (pipelines.dump.targets.encode_batch, in numpy)."""
    ids, lengths = t["ids"][rows], t["lengths"][rows]
    out = {
        "row": np.arange(N)[rows], "text_hash": np.arange(N, dtype=np.uint64)[rows] * 31,
        "label": t["labels"][rows], "logits": t["logits"][rows], "input_ids": ids,
        "token_type_ids": t["types"][rows], "length": lengths,
    }
    eligible = eligible_tokens(ids, lengths, SEP, exclude_sep=sel.token_strategy == "att-nosep")
    for name, tl, rl in zip(layer_names(sel.config.n_layers), sel.teacher_layers, sel.ranking_layers,
                            strict=True):
        scores = attention_scores(t["cls"][rows, rl], lengths, sel.attention_scores)
        positions, kept = rank_tokens(scores, eligible, sel.config.n_tokens, sel.token_strategy)
        hidden = t["hidden"][rows, tl]
        vectors = np.take_along_axis(hidden, np.maximum(positions, 0).astype(np.int64)[..., None], axis=1)
        mask = width_mask(vectors, sel.n_width, sel.width_strategy, seed=sel.width_seed, valid=positions >= 0)
        values, scale = codec.encode_values(vectors, mask, sel.n_width, sel.value_dtype)
        out.update({f"{name}/positions": positions, f"{name}/scores": kept, f"{name}/values": values,
                    f"{name}/masks": codec.pack_mask(mask)})
        if scale is not None:
            out[f"{name}/scale"] = scale
    return out


def direct_dump(url, t, sel: Selection, shards=None) -> StoreWriter:
    writer = StoreWriter.open(str(url), make_meta(sel))
    for shard in writer.pending_shards() if shards is None else shards:
        writer.write_shard(shard, encode_rows(t, slice(*writer.shard_bounds(shard)), sel))
    if shards is None:
        writer.finalize()
    return writer


def assert_same_store(derived_url, direct_url):
    a, b = open_store(str(derived_url)), open_store(str(direct_url))
    assert a.meta["selection"] == b.meta["selection"]
    assert a.meta["layout"] == b.meta["layout"]
    assert a.meta["identity"] == b.meta["identity"]
    assert list(a.specs) == list(b.specs)
    for shard in range(a.n_shards):
        da, db = a.read_shard(shard), b.read_shard(shard)
        for name in b.specs:
            assert da[name].dtype == db[name].dtype, name
            np.testing.assert_array_equal(da[name], db[name], err_msg=f"{name} shard {shard}")
    assert a.meta["checksums"] == b.meta["checksums"]
    assert a.meta["inputs_hash"] == b.meta["inputs_hash"]
    assert a.verify() == []


CASES = [
    # (source selection kwargs, source config, target config, target value dtype)
    ({"token_strategy": "att-nosep", "width_strategy": "mag"}, "4,8,0.5", "2,3,0.25", None),
    ({"token_strategy": "left", "width_strategy": "mag"}, "4,8,0.5", "3,5,0.125", None),
    ({"token_strategy": "att", "attention": "post-softmax"}, "5,8,0.5", "5,2,0.25", None),
    ({"token_strategy": "att-nosep", "width_strategy": "rand"}, "4,8,0.5", "2,3,0.125", None),
    ({"token_strategy": "att-nosep", "width_strategy": "mag"}, "3,6,1.0", "1,6,0.0625", None),
    ({"token_strategy": "att-nosep", "width_strategy": "mag"}, "4,8,0.5", "2,4,0.25", "int8"),
    ({"token_strategy": "att-nosep", "width_strategy": "rand"}, "4,8,0.5", "3,4,0.25", "int8"),
    ({"token_strategy": "att-nosep", "width_strategy": "mag"}, "4,8,0.5", "4,8,0.5", "int8"),
    ({"token_strategy": "att-nosep", "width_strategy": "uniform"}, "4,8,0.25", "2,5,0.25", None),
    ({"width_strategy": "mag", "value_dtype": "int8"}, "4,8,0.5", "2,3,0.5", None),
    ({"token_strategy": "cls"}, "4,1,0.5", "2,1,0.25", None),
    ({"token_strategy": "att-nosep"}, "4,8,0.5", "0,0,0", None),
    ({"token_strategy": "att-nosep", "layers": [1, 3, 5, 6]}, "4,8,0.5", "2,3,0.25", None),
]


@pytest.mark.parametrize("kwargs, big, small, dtype", CASES)
def test_derive_equals_direct_dump(tmp_path, teacher, kwargs, big, small, dtype):
    src_sel = make_selection(big, **kwargs)
    direct_dump(tmp_path / "big.zarr", teacher, src_sel)
    small_kwargs = dict(kwargs, value_dtype=dtype or kwargs.get("value_dtype", "float16"))
    if "layers" in kwargs:  # explicit-layer stores keep their last N^D' layers
        small_kwargs["layers"] = kwargs["layers"][-HSKConfig.parse(small).n_layers:]
    direct_dump(tmp_path / "small.zarr", teacher, make_selection(small, **small_kwargs))
    meta = derive(str(tmp_path / "big.zarr"), HSKConfig.parse(small), str(tmp_path / "derived.zarr"),
                  value_dtype=dtype)
    assert meta["complete"] and meta["derived_from"]["config"] == str(HSKConfig.parse(big))
    big_meta = open_store(str(tmp_path / "big.zarr")).meta
    assert meta["derived_from"]["checksums"] == big_meta["checksums"]
    assert meta["derived_from"]["identity"] == big_meta["identity"]
    assert meta["teacher"] == big_meta["teacher"] and meta["dataset"] == big_meta["dataset"]
    assert_same_store(tmp_path / "derived.zarr", tmp_path / "small.zarr")


def test_derive_of_a_derived_store_keeps_the_chain(tmp_path, teacher):
    direct_dump(tmp_path / "big.zarr", teacher, make_selection("5,8,0.5"))
    derive(str(tmp_path / "big.zarr"), "4,6,0.25", str(tmp_path / "mid.zarr"))
    meta = derive(str(tmp_path / "mid.zarr"), "2,3,0.125", str(tmp_path / "small.zarr"))
    direct_dump(tmp_path / "direct.zarr", teacher, make_selection("2,3,0.125"))
    assert_same_store(tmp_path / "small.zarr", tmp_path / "direct.zarr")
    assert meta["derived_from"]["config"] == "4,6,0.25"
    assert meta["derived_from"]["derived_from"]["config"] == "5,8,0.5"


@pytest.mark.parametrize("kwargs, small, dtype, message", [
    ({}, "5,8,0.5", None, "keeps 4 layers"),
    ({}, "2,9,0.5", None, "keeps 8 tokens"),
    ({}, "2,3,0.75", None, "N\\^W=16 of 32"),
    ({"width_strategy": "uniform"}, "2,3,0.25", None, "not nested"),
    ({"value_dtype": "int8"}, "2,3,0.25", None, "derive from the float16 store"),
    ({"value_dtype": "int8"}, "2,3,0.5", "float16", "cannot become float16"),
    ({}, "2,3,0.25", "bfloat16", "unknown value dtype"),
])
def test_refusals(tmp_path, teacher, kwargs, small, dtype, message):
    direct_dump(tmp_path / "big.zarr", teacher, make_selection("4,8,0.5", **kwargs))
    with pytest.raises(ConfigError, match=message):
        derive(str(tmp_path / "big.zarr"), small, str(tmp_path / "out.zarr"), value_dtype=dtype)
    assert not (tmp_path / "out.zarr").exists()  # refused before anything is written


def test_logits_only_source_is_refused(tmp_path, teacher):
    direct_dump(tmp_path / "logits.zarr", teacher, make_selection("0,0,0"))
    with pytest.raises(ConfigError, match="logits only"):
        derive(str(tmp_path / "logits.zarr"), "0,0,0", str(tmp_path / "out.zarr"))


def test_incomplete_corrupt_or_same_source_is_refused(tmp_path, teacher):
    sel = make_selection("4,8,0.5")
    direct_dump(tmp_path / "half.zarr", teacher, sel, shards=[0, 2])
    with pytest.raises(IncompleteStoreError):
        derive(str(tmp_path / "half.zarr"), "2,3,0.25", str(tmp_path / "out.zarr"))

    direct_dump(tmp_path / "big.zarr", teacher, sel)
    with pytest.raises(StoreExistsError, match="source store itself"):
        derive(str(tmp_path / "big.zarr"), "2,3,0.25", str(tmp_path / "big.zarr"), overwrite=True)

    victim = sorted(p for p in (tmp_path / "big.zarr" / "layers" / "3" / "values").rglob("*") if p.is_file()
                    and p.name != "zarr.json")[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match="corrupt|damaged"):
        derive(str(tmp_path / "big.zarr"), "2,3,0.25", str(tmp_path / "bad.zarr"))


class Interrupted(Exception):
    pass


def test_interrupted_derive_resumes(tmp_path, teacher):
    direct_dump(tmp_path / "big.zarr", teacher, make_selection("4,8,0.5"))
    direct_dump(tmp_path / "small.zarr", teacher, make_selection("2,3,0.25", value_dtype="int8"))
    out = str(tmp_path / "derived.zarr")

    def killed_after_one(shards):
        for i, shard in enumerate(shards):
            if i == 1:
                raise Interrupted
            yield shard

    with pytest.raises(Interrupted):
        derive(str(tmp_path / "big.zarr"), "2,3,0.25", out, value_dtype="int8", progress=killed_after_one)
    with pytest.raises(IncompleteStoreError):
        open_store(out)
    seen: list[int] = []

    def record(shards):
        for shard in shards:
            seen.append(shard)
            yield shard

    derive(str(tmp_path / "big.zarr"), "2,3,0.25", out, value_dtype="int8", progress=record)
    assert seen == [1, 2]  # shard 0 was not written again
    assert_same_store(out, tmp_path / "small.zarr")
    said: list[str] = []
    derive(str(tmp_path / "big.zarr"), "2,3,0.25", out, value_dtype="int8", log=said.append)
    assert said == [f"{out} is already complete, nothing to do"]  # the same derive again
    with pytest.raises(StoreExistsError, match="--overwrite"):
        derive(str(tmp_path / "big.zarr"), "2,2,0.25", out, value_dtype="int8")
    derive(str(tmp_path / "big.zarr"), "2,3,0.25", out, value_dtype="int8", overwrite=True)
    assert_same_store(out, tmp_path / "small.zarr")


def test_resume_from_other_source_data_is_refused(tmp_path, teacher):
    direct_dump(tmp_path / "a.zarr", teacher, make_selection("4,8,0.5"))
    other = dict(teacher, logits=teacher["logits"] + 1)  # same metadata, different data
    direct_dump(tmp_path / "b.zarr", other, make_selection("4,8,0.5"))
    out = str(tmp_path / "derived.zarr")

    def killed(shards):
        yield from list(shards)[:1]
        raise Interrupted

    with pytest.raises(Interrupted):
        derive(str(tmp_path / "a.zarr"), "2,3,0.25", out, progress=killed)
    with pytest.raises(StoreExistsError, match="another source"):
        derive(str(tmp_path / "b.zarr"), "2,3,0.25", out)


def test_streaming_reads_one_shard_at_a_time(tmp_path, teacher, monkeypatch):
    """Memory does not grow with the store: every source read is one shard's rows."""
    from hskstore.io.reader import HSKStore

    direct_dump(tmp_path / "big.zarr", teacher, make_selection("4,8,0.5"))
    sizes = []
    original = HSKStore.read

    def spy(self, index, names=None):
        if isinstance(index, slice):
            sizes.append(index.stop - index.start)
        return original(self, index, names)

    monkeypatch.setattr(HSKStore, "read", spy)
    whole = HSKStore.read_shard  # whole shards are read without HSKStore.read (one object per array)

    def spy_shard(self, shard, **kw):
        sizes.append(self.shard_bounds(shard)[1] - self.shard_bounds(shard)[0])
        return whole(self, shard, **kw)

    monkeypatch.setattr(HSKStore, "read_shard", spy_shard)
    derive(str(tmp_path / "big.zarr"), "2,3,0.25", str(tmp_path / "out.zarr"))
    assert sizes and max(sizes) <= SHARD_ROWS
    assert Path(tmp_path / "out.zarr").exists()
    assert {s.name for s in array_specs(open_store(str(tmp_path / "out.zarr")).meta)} >= {"layers/1/values"}
