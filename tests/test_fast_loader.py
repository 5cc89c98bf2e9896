"""The loader's fast paths give the same bits as the paths they replace: whole-shard objects decoded by
hsk (hskstore.io.zarr_adapter.read_shards) against zarr's read, and dense targets on CPU (dense_by_scatter)
against the gather kept for accelerators (dense_by_gather, the previous implementation) and numpy's
codec.dense, on stores of every value codec."""

from pathlib import Path

import numpy as np
import pytest
import torch
from test_stream import D, build

from hskstore import CorruptStoreError, codecs, open_store
from hskstore.format import codec
from hskstore.format.shard_codec import EMPTY_CHUNK, ShardLayout
from pipelines.train.data.decode import PinnedStaging, decode_batch, dense_by_gather, dense_by_scatter, dense_targets
from pipelines.train.data.stream import StoreStream

CODECS = list(codecs.choices())  # a task store's (int8u is only a fitted basis's)


def zero_logits(shard: int, arrays: dict) -> None:
    """Fill-value data zarr does not write: shard 1's first inner chunk of logits, all of shard 2's."""
    if shard == 1:
        arrays["logits"][:2] = 0
    if shard == 2:
        arrays["logits"][:] = 0


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, object]:
    """One store per value codec: 67 rows in shards of 8 (the last of 3) and inner chunks of 2; d = 20
    (the last mask byte half padding), N^W = 5 (odd: 4-bit values end on a lone nibble)."""
    root = tmp_path_factory.mktemp("fast")
    return {v: build(root / f"{v}.zarr", value_dtype=v, chunk_rows=2, edit=zero_logits) for v in CODECS}


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("value_dtype", CODECS)
def test_whole_shard_reads_equal_zarr(stores, value_dtype):
    store = stores[value_dtype]
    assert all(ShardLayout.of(store.group[name]) is not None for name in store.specs)  # the fast path is taken
    root = Path(store.url)
    assert not (root / "logits" / "c" / "2" / "0").exists()  # a shard object zarr did not write
    assert int(np.frombuffer((root / "logits" / "c" / "1" / "0").read_bytes()[-68:-4], "<u8")[0]) == EMPTY_CHUNK
    for shard in range(store.n_shards):
        fast = store.read_shard(shard, verify=True)  # digests checked on what hsk decoded
        slow = store.read(slice(*store.shard_bounds(shard)))  # zarr's read
        assert list(fast) == list(slow)
        for name in slow:
            assert same_bits(fast[name], slow[name]), (shard, name)
    assert len(fast["row"]) == 3


def test_damaged_shard_objects_are_refused(tmp_path):
    store = build(tmp_path / "d.zarr", n_rows=24, chunk_rows=4)
    obj = Path(store.url) / "layers" / "0" / "masks" / "c" / "1" / "0" / "0"
    good = obj.read_bytes()
    fmt = ShardLayout.of(store.group["layers/0/masks"])
    index_byte, data_byte, header_byte = len(good) - 10, 20, 4  # in the index; in a chunk; a blosc size
    for where, message in [(index_byte, "crc32c"), (header_byte, "does not decode"), (data_byte, "")]:
        bad = bytearray(good)
        bad[where] ^= 0x5A
        obj.write_bytes(bytes(bad))
        with pytest.raises(CorruptStoreError, match="layers/0/masks"):
            open_store(store.url).read_shard(1, verify=True)
        if message:
            with pytest.raises(ValueError, match=message):
                fmt.decode(np.frombuffer(bytes(bad), np.uint8))
    obj.write_bytes(good[:30])  # cut short
    with pytest.raises(CorruptStoreError, match="cannot read layers/0/masks"):
        open_store(store.url).read_shard(1, verify=False)
    obj.write_bytes(good)
    assert open_store(store.url).read_shard(1, verify=True)["row"].tolist() == list(range(8, 16))


def assert_dense_same(value_dtype, values, masks, scale=None, d=D):
    t = [torch.from_numpy(values), torch.from_numpy(masks), d, None if scale is None else torch.from_numpy(scale)]
    new, old = dense_by_scatter(*t, codec=value_dtype), dense_by_gather(*t, codec=value_dtype)
    assert new.dtype == old.dtype == torch.float32
    assert same_bits(new.numpy(), old.numpy())
    assert same_bits(new.numpy(), codec.dense(value_dtype, values, masks, d, scale))
    return new


@pytest.mark.parametrize("value_dtype", CODECS)
def test_cpu_decode_is_bit_identical(stores, value_dtype):
    store = stores[value_dtype]
    for batch in StoreStream(store, batch_size=7, buffer_shards=3, seed=1):
        out = decode_batch(batch, store.layers, store.hidden_size, "cpu", value_dtype)  # CPU tensors: dense_by_scatter
        for i, layer in enumerate(store.layers):
            arrays = [batch[f"{layer.name}/values"], batch[f"{layer.name}/masks"], batch.get(f"{layer.name}/scale")]
            new = assert_dense_same(value_dtype, *arrays)
            assert same_bits(out[f"dense_{i}"].numpy(), new.numpy())
            assert (new.numpy() != 0).any()
    unused = np.zeros_like(batch[f"{layer.name}/masks"])  # no used slot at all: zeros
    assert not assert_dense_same(value_dtype, arrays[0], unused, arrays[2]).any()


def same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and same_bits(a[k].cpu().numpy(), b[k].cpu().numpy()) for k in a)


@pytest.mark.parametrize("value_dtype", CODECS)
def test_staged_bytes_decode_alike(stores, value_dtype):
    """The CUDA path's transfer, run on CPU through ordinary memory: a batch's stored bytes packed into one
    reused buffer and viewed back in their dtypes give the direct path's tensors, and the device's decode of
    them (dense_by_gather) equals numpy's codec.dense, bit for bit. Buffers are reused (2 in turn): the
    batches decoded earlier are intact after later ones were staged."""
    store = stores[value_dtype]
    staging = PinnedStaging("cpu", pin=False, slots=2)
    done = []
    for batch in StoreStream(store, batch_size=7, buffer_shards=3, seed=1):
        done.append((decode_batch(batch, store.layers, store.hidden_size, "cpu", value_dtype),
                     decode_batch(batch, store.layers, store.hidden_size, "cpu", value_dtype, staging)))
        for layer in store.layers:
            names = [f"{layer.name}/{p}" for p in ("values", "masks", "scale") if f"{layer.name}/{p}" in batch]
            sent = staging.send({n: batch[n] for n in names})
            on_device = dense_by_gather(*(sent.get(f"{layer.name}/{p}") for p in ("values", "masks")),
                                        store.hidden_size, sent.get(f"{layer.name}/scale"), codec=value_dtype)
            stored = [batch.get(f"{layer.name}/{p}") for p in ("values", "masks")]
            assert same_bits(on_device.numpy(), codec.dense(value_dtype, *stored, store.hidden_size,
                                                            batch.get(f"{layer.name}/scale")))
    assert len(done) > 2
    assert all(same_tensors(direct, staged) for direct, staged in done)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_decode_from_pinned_buffers_without_a_sync(stores):
    """On CUDA: targets copied from the reused pinned buffers and decoded on the device equal the CPU decode,
    and after the first batch (its lookup tables) nothing in the transfer or decode waits for the device."""
    for value_dtype, store in stores.items():
        staging = PinnedStaging("cuda")
        batches = list(StoreStream(store, batch_size=7, buffer_shards=3, seed=1))
        decode_batch(batches[0], store.layers, store.hidden_size, "cuda", value_dtype, staging)
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = [decode_batch(b, store.layers, store.hidden_size, "cuda", value_dtype, staging) for b in batches]
        finally:
            torch.cuda.set_sync_debug_mode(0)
        for batch, out in zip(batches, got):
            assert same_tensors(decode_batch(batch, store.layers, store.hidden_size, "cpu", value_dtype), out)


@pytest.mark.parametrize("d", [D, 64])  # masks of 3 bytes (padding bits), and of 8 (counted as one word)
def test_uneven_bit_counts_decode_alike(d):
    """Vectors keeping fewer values than N^W (the gather's semantics: the j-th set bit takes value j)."""
    rng = np.random.default_rng(0)
    n_width = 6
    mask = np.zeros((5, 3, d), dtype=bool)
    for v, keep in enumerate([6, 0, 2, 6, 1, 5, 0, 3, 6, 6, 4, 0, 1, 2, 6]):
        mask.reshape(-1, d)[v, rng.choice(d, keep, replace=False)] = True
    values = rng.normal(size=(5, 3, n_width)).astype(np.float16)
    values[0, 0, 0] = -0.0  # the sign of a kept zero survives
    t = [torch.from_numpy(values), torch.from_numpy(codec.pack_mask(mask)), d]
    new, old = dense_by_scatter(*t, codec="float16"), dense_by_gather(*t, codec="float16")
    assert same_bits(new.numpy(), old.numpy())
    assert torch.equal(dense_targets(*t, codec="float16"), new)
    assert np.count_nonzero(new.numpy()) == mask.sum() - 1  # all kept values but the -0.0
    assert np.signbit(new[0, 0, np.flatnonzero(mask[0, 0])[0]].item())
    full = np.zeros_like(mask)  # every vector keeps N^W: the uniform path
    for v in range(15):
        full.reshape(-1, d)[v, rng.choice(d, n_width, replace=False)] = True
    t[1] = torch.from_numpy(codec.pack_mask(full))
    assert same_bits(dense_by_scatter(*t, codec="float16").numpy(), codec.dense("float16", values, t[1].numpy(), d))


@pytest.mark.parametrize("value_dtype", CODECS)
@pytest.mark.parametrize("d", [D, 64])
def test_full_width_decodes_alike(value_dtype, d):
    """N^W = d (every value kept, HSK's full-width configs): the values are the vectors, no scatter."""
    rng = np.random.default_rng(1)
    mask = np.ones((4, 3, d), dtype=bool)
    mask[1, 2] = mask[3, 0] = False  # unused token slots
    values, scale = codec.encode_values(rng.normal(size=(4, 3, d)).astype(np.float32), mask, d, value_dtype)
    assert_dense_same(value_dtype, values, codec.pack_mask(mask), scale, d)
    mask[:] = True  # every slot used
    values, scale = codec.encode_values(rng.normal(size=(4, 3, d)).astype(np.float32), mask, d, value_dtype)
    assert_dense_same(value_dtype, values, codec.pack_mask(mask), scale, d)


def test_read_shard_into_given_arrays(stores):
    store = stores["int4"]
    for shard in (0, store.n_shards - 1):  # a whole shard, and the last one (3 rows of an 8-row object)
        rows = np.subtract(*store.shard_bounds(shard)[::-1])
        out = {n: np.empty((rows, *s.shape[1:]), dtype=s.dtype) for n, s in store.specs.items()}
        got = store.read_shard(shard, verify=True, out=out)
        expected = store.read_shard(shard, verify=True)
        for name in store.specs:
            assert got[name] is out[name] and same_bits(out[name], expected[name])
    out["row"] = np.empty(rows + 1, dtype=np.int64)
    with pytest.raises(ValueError, match="out\\['row'\\] must be a C-contiguous int64 array of shape \\(3,\\)"):
        store.read_shard(shard, out=out)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_batches_alike_decoded_in_place_or_copied(stores, world_size):
    """A store's shards are decoded into the shuffle pool; a source without read_shard(out=) (rows held in
    memory) has its shards copied in: the same batches, bit for bit, for every rank (ranks keep part of
    a shard's rows) and from a resumed position."""
    from pipelines.train.data.sources import ShardedRows

    store = stores["float16"]
    held = ShardedRows(store.metadata, {n: store.read(slice(0, len(store)), [n])[n] for n in store.specs}, "mem")
    held.specs = store.specs  # what a StoreStream reads of a source's arrays (OnlineSource has them too)
    for rank in range(world_size):
        streams = [StoreStream(src, batch_size=3, buffer_shards=3, seed=5, rank=rank, world_size=world_size,
                               workers=w) for src, w in [(store, 0), (store, 2), (held, 1)]]
        for s in streams:
            s.load_state_dict({"epoch": 1, "batches_done": 2, "seed": 5})
        runs = [list(s) for s in streams]
        assert len(runs[0]) == len(streams[0]) - 2 > 0
        for batches in zip(*runs):
            for name in batches[0]:
                assert same_bits(batches[0][name], batches[1][name]) and same_bits(batches[0][name], batches[2][name])
