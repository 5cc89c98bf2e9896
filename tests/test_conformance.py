"""The conformance vectors (docs/conformance/): they regenerate byte for byte, and a reader written from
docs/STORE_FORMAT.md alone (tests/conformance_reader.py: numpy and zarr, no hskstore) decodes every one
of them, reproducing the manifest, the checksums, every shard digest and every value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import conformance_reader as reader
import numpy as np
import pytest

from hskstore import codecs

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "docs" / "conformance"
# a vector per value codec, then one per other case
NAMES = [*codecs.names(), "attention", "derived", "mlm", "edges", "clm", "clm-sample", "clm-hidden", "clm-layers",
         "clm-fit", "seq2seq"]
CLM_NAMES = ("clm", "clm-sample")
LM_KINDS = ("mlm", "clm", "seq2seq")  # the objectives of stores without layers of kept values
DOC = (ROOT / "docs" / "STORE_FORMAT.md").read_text(encoding="utf-8")


def load(name: str) -> tuple[reader.Bundle, dict]:
    return reader.Bundle.open(VECTORS / f"{name}.hsk.zip"), json.loads((VECTORS / f"{name}.json").read_text())


def as_array(entry: dict) -> np.ndarray:
    return np.array(entry["data"], dtype=entry["dtype"]).reshape(entry["shape"])


def changed_entries(new: Path, old: Path) -> list[str]:
    """The zip entries that differ between two bundles (only compressed chunks: a compressor's new version)."""
    if new.suffix != ".zip":
        return ["the whole JSON"]
    with zipfile.ZipFile(new) as a, zipfile.ZipFile(old) as b:
        names = sorted(set(a.namelist()) | set(b.namelist()))
        return [n for n in names if n not in a.namelist() or n not in b.namelist() or a.read(n) != b.read(n)][:8]


def test_vectors_regenerate_byte_identically(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(VECTORS / "generate.py"), "--out", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    committed = sorted(p.name for p in VECTORS.iterdir() if p.suffix in (".zip", ".json"))
    assert sorted(p.name for p in tmp_path.iterdir()) == committed == sorted(
        [f"{n}.hsk.zip" for n in NAMES] + [f"{n}.json" for n in NAMES])
    differ = {name: changed_entries(tmp_path / name, VECTORS / name) for name in committed
              if (tmp_path / name).read_bytes() != (VECTORS / name).read_bytes()}
    assert not differ, f"hsk no longer writes the committed vectors (what changed: {differ}); if that is meant, " \
                       "say so in STORE_FORMAT.md and rerun python docs/conformance/generate.py"
    # under 1.2 MB: format 3's dimension names and attributes in every array's zarr.json, with the source texts,
    # took the eight vectors from 694 kB to 749 kB; the `edges` vector (inner chunks, ties, d = 60) adds 86 kB;
    # the two causal-LM vectors 72 kB, nearly all of it what every bundle has whatever its data (croissant.json,
    # the card, a zarr.json per array: ~28 kB a bundle); the seq2seq vector 48 kB (954 kB in all), its bundle 42 kB
    # for 11 data arrays, each with its zarr.json; nf4 (one vector per codec) 80 kB and clm-hidden (the final
    # hidden state and its head) 68 kB: 1,127 kB in all; clm-layers (top-3 and two layers' int8 vectors) 80 kB;
    # int8u (one vector per codec) 83 kB and clm-fit (indices, the folded head, the encoder) 80 kB: 1,364 kB
    assert sum((VECTORS / name).stat().st_size for name in committed) < 1_400_000


@pytest.mark.parametrize("name", NAMES)
def test_reader_verifies_and_decodes_every_vector(name):
    bundle, expected = load(name)
    arrays = reader.read_verified(bundle)  # manifest, checksums and every shard digest, as the doc orders
    meta = bundle.meta
    assert meta["manifest"] == expected["manifest"] == reader.manifest(bundle)
    assert meta["checksums"] == expected["checksums"]
    assert meta["identity"] == reader.identity(meta) and meta["inputs_hash"] == reader.inputs_hash(meta)
    assert reader.data_arrays(meta) == expected["digest_order"] == list(expected["arrays"])
    digests = bundle.group["_progress/digests"][:]
    assert [[bytes(d).hex() for d in shard] for shard in digests] == expected["shard_digests"]
    for array_name, entry in expected["arrays"].items():
        np.testing.assert_array_equal(arrays[array_name], as_array(entry), err_msg=array_name)
        assert arrays[array_name].dtype == np.dtype(entry["dtype"]), array_name
    if meta.get("objective") not in LM_KINDS:  # task stores: layers of kept values
        for i in range(len(meta["selection"]["teacher_layers"])):
            check_layer(arrays, f"layers/{i}", meta, expected["decoded_values"][f"layers/{i}"])


def check_layer(arrays: dict, layer: str, meta: dict, decoded: list) -> None:
    """Decoded values as the JSON says; N^W mask ones per used slot; unused slots all zero; dense agrees."""
    sel, n_width, d = meta["selection"], meta["layout"]["n_width"], meta["selection"]["hidden_size"]
    values = reader.decode(arrays[f"{layer}/values"], arrays.get(f"{layer}/scale"), sel["value_dtype"], n_width)
    np.testing.assert_array_equal(values, np.array(decoded, dtype=np.float32))
    used = arrays[f"{layer}/positions"] >= 0
    ones = np.unpackbits(arrays[f"{layer}/masks"], axis=-1)[..., :d].sum(axis=-1)
    assert (ones == np.where(used, n_width, 0)).all()
    vectors = reader.dense(values, arrays[f"{layer}/masks"], d)
    assert (vectors[~used] == 0).all() and (values[~used] == 0).all()
    assert (arrays[f"{layer}/scores"][~used] == 0).all()
    keep = np.unpackbits(arrays[f"{layer}/masks"], axis=-1)[..., :d].astype(bool)
    assert np.array_equal(vectors[keep], values[used].reshape(-1))


def test_quantisation_rules_of_the_doc_reproduce_the_stores():
    """int8 from the float16 vector, then int4 and mxfp4 from int8, with the doc's float32 arithmetic."""
    stores = {name: reader.read_verified(load(name)[0]) for name in ("float16", "int8", "int4", "mxfp4")}
    for i in range(3):
        layer = f"layers/{i}"
        q8, scale8 = reader.quantize_int8(stores["float16"][f"{layer}/values"])
        assert np.array_equal(q8, stores["int8"][f"{layer}/values"])
        assert np.array_equal(scale8, stores["int8"][f"{layer}/scale"])
        for name, quantize in (("int4", reader.quantize_int4), ("mxfp4", reader.quantize_mxfp4)):
            codes, scale = quantize(q8, scale8)
            assert np.array_equal(codes, stores[name][f"{layer}/values"]), (name, layer)
            assert np.array_equal(scale, stores[name][f"{layer}/scale"]), (name, layer)
    codes = reader.nibbles(stores["mxfp4"]["layers/2/values"], 35)
    assert (codes != 8).all()  # negative values that round to zero get +0
    assert ((stores["float16"]["layers/2/values"] < 0) & (codes == 0)).any()
    assert (reader.nibbles(stores["int4"]["layers/2/values"], 35) != 8).all()  # int4 never writes -8


def test_attention_rows_are_zero_for_padded_keys_and_unused_slots():
    arrays = reader.read_verified(load("attention")[0])
    assert "layers/0/attention" not in arrays  # teacher layer 0, the embeddings, has no attention
    for i in (1, 2):
        rows = arrays[f"layers/{i}/attention"]  # [N, H, N^L, T]
        padded = np.arange(rows.shape[-1])[None, :] >= arrays["length"][:, None]  # [N, T]
        unused = arrays[f"layers/{i}/positions"] < 0  # [N, N^L]
        assert (rows[np.broadcast_to(padded[:, None, None, :], rows.shape)] == 0).all()
        assert (rows[np.broadcast_to(unused[:, None, :, None], rows.shape)] == 0).all()
        assert (rows != 0).any()


def test_masked_lm_masking_is_reproduced_from_the_doc():
    bundle, _ = load("mlm")
    arrays, meta = reader.read_verified(bundle), bundle.meta
    assert meta["selection"]["unit"] == "per row: round(mask_rate * maskable tokens), at least 1"
    for i in range(meta["layout"]["n_rows"]):
        positions = arrays["mlm/positions"][i]
        used = positions >= 0
        original = arrays["input_ids"][i].copy()
        original[positions[used]] = arrays["mlm/labels"][i][used]  # the labels are the original ids
        masked, want_positions, kinds = reader.remask(original, int(arrays["length"][i]), int(arrays["row"][i]), meta)
        assert np.array_equal(positions[used], want_positions) and np.array_equal(arrays["mlm/kind"][i][used], kinds)
        assert np.array_equal(masked, arrays["input_ids"][i])
        assert (arrays["mlm/kind"][i][~used] == 0).all() and (arrays["mlm/labels"][i][~used] == 0).all()
        assert (arrays["mlm/topk_ids"][i][~used] == 0).all() and (arrays["mlm/lse"][i][~used] == 0).all()
    assert 5 in (arrays["mlm/positions"] >= 0).sum(axis=1)  # the row with 30 maskable tokens: 4.5 -> 5


def test_mask_count_rounds_half_up_in_code_and_doc():
    from pipelines.dump.mlm import Masking, _n_masked

    assert "floor(mask_rate x maskable + 0.5)" in DOC and "half up" in DOC
    assert _n_masked(0.15, 30) == reader.mask_count(0.15, 30) == 5  # 4.5 -> 5, where half-to-even gives 4
    for rate in (0.15, 0.1, 0.3, 0.5, 1 / 3):
        for maskable in range(0, 300):
            assert _n_masked(rate, maskable) == reader.mask_count(rate, maskable), (rate, maskable)
    assert Masking().max_masked(32) == reader.mask_count(0.15, 30) == 5  # M = floor(0.15 x (T-2) + 0.5)


def test_derived_vector_follows_the_doc_from_the_float16_vector():
    """Last N^D' layers, first N^L' slots, top N^W' of the kept fp16 values by |value|, then int8 -> int4."""
    src, derived = reader.read_verified(load("float16")[0]), load("derived")
    out, meta = reader.read_verified(derived[0]), derived[0].meta
    assert meta["derived_from"]["checksums"] == load("float16")[0].meta["checksums"]
    n_layers, n_tokens, n_width = 2, 3, meta["layout"]["n_width"]
    for name in ("row", "text_hash", "label", "logits", "input_ids", "token_type_ids", "length"):
        assert np.array_equal(out[name], src[name])
    for i in range(n_layers):
        s, o = f"layers/{3 - n_layers + i}", f"layers/{i}"
        assert np.array_equal(out[f"{o}/positions"], src[f"{s}/positions"][:, :n_tokens])
        assert np.array_equal(out[f"{o}/scores"], src[f"{s}/scores"][:, :n_tokens])
        values = src[f"{s}/values"][:, :n_tokens]
        used = out[f"{o}/positions"] >= 0
        # top N^W' by |fp16| with ties to the lower index: a stable sort of -|v|
        order = np.argsort(-np.abs(values.astype(np.float32)), axis=-1, kind="stable")[..., :n_width]
        keep = np.zeros(values.shape, dtype=bool)
        np.put_along_axis(keep, order, True, axis=-1)
        keep &= used[..., None]
        narrow = np.zeros((*used.shape, n_width), dtype=np.float16)
        narrow[used] = values[keep].reshape(-1, n_width)
        q8, scale8 = reader.quantize_int8(narrow)
        codes, scale = reader.quantize_int4(q8, scale8)
        assert np.array_equal(out[f"{o}/values"], codes) and np.array_equal(out[f"{o}/scale"], scale)
        dense_src = np.unpackbits(src[f"{s}/masks"][:, :n_tokens], axis=-1).astype(bool)
        dense_out = np.zeros_like(dense_src)
        dense_out[dense_src] = keep[dense_src.any(-1)].reshape(-1)
        assert np.array_equal(out[f"{o}/masks"], np.packbits(dense_out, axis=-1))


def rewrite(src: Path, out: Path, key: str, change) -> Path:
    """A copy of a bundle with one entry's bytes changed."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            zout.writestr(info, change(data) if info.filename == key else data)
    return out


def test_reader_refuses_edited_metadata_and_data(tmp_path):
    src = VECTORS / "int4.hsk.zip"
    edited = rewrite(src, tmp_path / "meta.hsk.zip", "zarr.json", lambda b: b.replace(b'"sst2"', b'"sst3"'))
    with pytest.raises(AssertionError, match="manifest"):
        reader.read_verified(reader.Bundle.open(edited))
    axes = rewrite(src, tmp_path / "axes.hsk.zip", "layers/0/masks/zarr.json",
                   lambda b: b.replace(b'"mask_bytes"', b'"mask_bits"'))
    with pytest.raises(AssertionError, match="manifest"):
        reader.read_verified(reader.Bundle.open(axes))
    # the compression level is how one writer stored the bytes, not what they decode to (format 4)
    level = rewrite(src, tmp_path / "level.hsk.zip", "layers/0/masks/zarr.json",
                    lambda b: b.replace(b'"clevel": 5', b'"clevel": 6'))
    assert b'"clevel": 6' in zipfile.ZipFile(level).read("layers/0/masks/zarr.json")
    reader.read_verified(reader.Bundle.open(level))
    # a missing chunk reads as zeros: only its digest tells
    missing = tmp_path / "missing.hsk.zip"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(missing, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            if info.filename != "layers/1/values/c/1/0/0":
                zout.writestr(info, zin.read(info.filename))
    with pytest.raises(AssertionError) as caught:
        reader.read_verified(reader.Bundle.open(missing))
    assert caught.value.args[0] == ("layers/1/values", 1)


def test_64_bit_integers_are_strings_and_the_source_texts_give_the_dataset_fingerprint():
    """JavaScript's JSON.parse rounds integers above 2**53: int64 and uint64 data are decimal strings."""
    for name in NAMES:
        bundle, vector = load(name)
        for array_name in ("row", "text_hash"):
            entry = vector["arrays"][array_name]
            assert all(isinstance(x, str) for x in entry["data"]), (name, array_name)
        assert max(int(x) for x in vector["arrays"]["text_hash"]["data"]) > 2**53  # would be rounded as a number
        meta = bundle.meta
        labels = np.full(len(vector["source_texts"]), -1, dtype=np.int64) if meta.get("objective") in LM_KINDS \
            else as_array(vector["arrays"]["label"]).astype(np.int64)  # labels as loaded: int64
        texts = vector["source_texts"]  # a seq2seq store's rows are [source, target]: two columns
        columns = [list(column) for column in zip(*texts, strict=True)] if meta.get("objective") == "seq2seq" \
            else [texts]
        streamed = {"clm": reader.corpus_stream_fingerprint, "seq2seq": reader.pair_stream_fingerprint}
        fingerprint = streamed[meta["objective"]](texts) if meta.get("objective") in streamed \
            else reader.examples_fingerprint(columns, labels)  # an LM corpus is fingerprinted as it streams
        assert fingerprint == meta["dataset"]["fingerprint"], name


def test_edges_vector_inner_chunks_mask_padding_and_rounding_ties():
    bundle, vector = load("edges")
    meta, arrays = bundle.meta, reader.read_verified(bundle)
    layout, d = meta["layout"], meta["selection"]["hidden_size"]
    assert (layout["shard_rows"], layout["chunk_rows"]) == (2, 1) and d % 8
    # several inner chunks per shard, one not stored: row 0's label is 0, so its chunk's bytes are all zero
    with zipfile.ZipFile(VECTORS / "edges.hsk.zip") as zf:
        index = reader.shard_index(zf.read("label/c/0"), 2)
    assert index[0] is None and index[1] is not None
    assert arrays["label"][0] == 0 and arrays["label"][1] != 0
    # mask padding: the 8 d-bit mask bytes hold d = 60 bits, the last byte's 4 low bits are 0
    for i in range(len(meta["selection"]["teacher_layers"])):
        bits = np.unpackbits(arrays[f"layers/{i}/masks"], axis=-1)
        assert bits.shape[-1] == 64 and not bits[..., d:].any() and bits[..., :d].any()
    # int8 from the fp16 kept values (`source_values`), ties included: x.5 rounds half to even
    top = f"layers/{len(meta['selection']['teacher_layers']) - 1}"
    values16 = np.array(vector["source_values"][top], dtype=np.float16)
    q8, scale8 = reader.quantize_int8(values16)
    assert np.array_equal(q8, arrays[f"{top}/values"]) and np.array_equal(scale8, arrays[f"{top}/scale"])
    used = arrays[f"{top}/positions"] >= 0
    with np.errstate(divide="ignore", invalid="ignore"):  # unused slots: scale 0
        ratio = values16.astype(np.float32) / scale8.astype(np.float32)[..., None]
    ties = used[..., None] & (np.abs(ratio - np.trunc(ratio)) == 0.5)
    assert ties.any()
    half_up = np.floor(ratio[ties] + 0.5)
    assert (q8[ties] != half_up).any()  # a reader rounding half up gets these wrong


@pytest.mark.parametrize("name", CLM_NAMES)
def test_causal_lm_vectors_decode_from_the_doc(name):
    """Ids unpacked bit by bit, kept positions, log-probs and tail (top-K) or counts (sampled) as the JSON says;
    zeros wherever a position is not kept; blocks, lengths and text_hash rebuilt from the documents' tokens."""
    bundle, vector = load(name)
    arrays, meta = reader.read_verified(bundle), bundle.meta
    sel, decoded = meta["selection"], vector["decoded"]
    kept = reader.kept_mask(arrays["clm/kept"], sel["block_size"])
    ids = reader.unpack_ids(arrays["clm/ids"], sel["id_bits"], sel["slots"])
    assert np.array_equal(kept, np.array(decoded["kept"], dtype=bool))
    assert np.array_equal(ids, np.array(decoded["ids"]))
    assert ids.max() < sel["vocab_size"] == meta["teacher"]["vocab_size"] and sel["id_bits"] == 6
    check_padding_bits(arrays, sel, "clm", sel["block_size"])
    real = np.arange(sel["block_size"])[None, :] < arrays["length"][:, None]
    assert not (kept & ~real).any()  # padding is never kept
    wanted = np.ceil(sel["positions"] * arrays["length"]).astype(int)  # ceil(fraction x length) per block
    assert np.array_equal(kept.sum(-1), np.minimum(wanted, arrays["length"]))
    assert (ids[~kept] == 0).all()
    if sel["support"] == "topk":
        check_topk(arrays, sel, kept, ids, decoded, "clm")
    else:
        check_sample(arrays, sel, kept, ids)
    check_blocks(arrays, meta, vector["source_tokens"])


@pytest.mark.parametrize("name", CLM_NAMES)
def test_causal_lm_vectors_keep_their_blocks_text_from_the_doc(name):
    """The blocks' texts concatenated are the documents' bytes; each word-level token owns its word (and the
    space before it), each EOS its document's end; the actual-token log-probs are <= 0, 0 where t + 1 is not
    a real token, and equal the stored top-K log-prob wherever the next token is among the stored ids."""
    bundle, vector = load(name)
    arrays, meta = reader.read_verified(bundle), bundle.meta
    sel = meta["selection"]
    texts, ends = zip(*(reader.clm_block_text(arrays, row) for row in range(len(arrays["row"]))), strict=True)
    assert "".join(texts) == "".join(vector["source_texts"])
    assert list(texts) == vector["decoded"]["texts"] and [list(e) for e in ends] == vector["decoded"]["ends"]
    assert sum(len(doc) + 1 for doc in vector["source_tokens"]) == int(arrays["length"].sum())  # and their EOS
    for row, (text, end) in enumerate(zip(texts, ends, strict=True)):
        data = text.encode()
        for t in range(int(arrays["length"][row])):
            piece = data[(end[t - 1] if t else 0):end[t]].decode()
            if arrays["input_ids"][row, t] == sel["eos_id"]:
                assert piece == ""  # the documents here have no trailing spaces
            else:
                assert piece.strip() and " " not in piece.strip()  # one word (or <unk>'s word), its space before
    actual = arrays["clm/actual"].astype(np.float32)
    real = np.arange(sel["block_size"])[None, :] + 1 < arrays["length"][:, None]
    assert (actual <= 0).all() and (actual[~real] == 0).all() and (actual[real] < 0).all()
    if sel["support"] == "topk":
        kept = reader.kept_mask(arrays["clm/kept"], sel["block_size"])
        ids = reader.unpack_ids(arrays["clm/ids"], sel["id_bits"], sel["slots"])
        logprobs = reader.clm_logprobs(arrays, sel)
        following = np.concatenate([arrays["input_ids"][:, 1:], arrays["input_ids"][:, :1] * 0], 1).astype(int)
        hit = (ids == following[..., None]) & (kept & real)[..., None]
        assert hit.any()
        np.testing.assert_allclose(np.broadcast_to(actual[..., None], hit.shape)[hit], logprobs[hit], atol=2e-3)


def test_hidden_vector_decodes_from_the_doc():
    """The final hidden state through its codec as the JSON says, zero where a position is not kept; the head
    matches head_sha256, and head(hidden) is a distribution over the teacher's vocabulary."""
    bundle, vector = load("clm-hidden")
    arrays, meta = reader.read_verified(bundle), bundle.meta
    sel, decoded = meta["selection"], vector["decoded"]
    kept = reader.kept_mask(arrays["clm/kept"], sel["block_size"])
    assert np.array_equal(kept, np.array(decoded["kept"], dtype=bool))
    hidden = reader.clm_hidden(arrays, sel)
    np.testing.assert_array_equal(hidden, np.array(decoded["hidden"], dtype=np.float32))
    assert (hidden[~kept] == 0).all() and (np.abs(hidden[kept]).sum(-1) > 0).all()
    weight, bias = reader.clm_head(bundle, sel)
    assert weight.shape == (sel["vocab_size"], sel["hidden_size"]) and bias is None
    logits = reader.hidden_logits(hidden[kept], weight, bias, sel["logit_softcap"])
    assert logits.shape == (int(kept.sum()), sel["vocab_size"]) and np.isfinite(logits).all()
    assert sel["rotation_seed"] == 3 and sel["reconstruction_reference"] == "teacher"
    assert 0 <= sel["reconstruction_kl"] < 0.05 and 0 < sel["reconstruction_top1"] <= 1
    check_blocks(arrays, meta, vector["source_tokens"])


def test_fit_vector_decodes_from_the_doc():
    """"The fitted basis": int8u indices (integers, zero where not kept) read by the folded head and bias as any
    hidden-state store's; hidden_fit.encoder_sha256 covers the writer's encoder as the doc says."""
    import hashlib

    bundle, vector = load("clm-fit")
    arrays, meta = reader.read_verified(bundle), bundle.meta
    sel = meta["selection"]
    kept = reader.kept_mask(arrays["clm/kept"], sel["block_size"])
    hidden = reader.clm_hidden(arrays, sel)
    np.testing.assert_array_equal(hidden, np.array(vector["decoded"]["hidden"], dtype=np.float32))
    assert sel["hidden_codec"] == "int8u" and "clm/hidden_scale" not in arrays
    assert (hidden == np.rint(hidden)).all() and np.abs(hidden).max() <= 127 and (hidden[~kept] == 0).all()
    weight, bias = reader.clm_head(bundle, sel)
    assert weight.shape == (sel["vocab_size"], sel["hidden_size"]) and bias.shape == (sel["vocab_size"],)
    assert np.isfinite(reader.hidden_logits(hidden[kept], weight, bias, sel["logit_softcap"])).all()
    fit = sel["hidden_fit"]
    assert fit["tokens"] == 96 and fit["kl"] == 0.02 and fit["theta"] == 24 * 0.02 / sel["hidden_size"]
    digest = hashlib.sha256(np.ascontiguousarray(bundle.group["clm/fit_mean"][:], dtype="<f8").tobytes())
    digest.update(np.ascontiguousarray(bundle.group["clm/fit_encoder"][:], dtype="<f8").tobytes())
    assert "sha256:" + digest.hexdigest() == fit["encoder_sha256"]
    assert sel["reconstruction_reference"] == "teacher" and 0 <= sel["reconstruction_kl"] < 0.2


def test_layers_vector_decodes_from_the_doc():
    """"Intermediate layers": the layer vectors through their codec as the JSON says, zeros at the padding; the
    rotation written from the doc's words is hsk's, so a reader gets the teacher's vectors back as h' R."""
    from hskstore.format.clm import rotation

    bundle, vector = load("clm-layers")
    arrays, meta = reader.read_verified(bundle), bundle.meta
    sel = meta["selection"]
    layers = sel["layer_states"]
    assert layers == {"layers": [0, 2], "stride": 3, "codec": "int8", "width": 32, "teacher_layers": 2,
                      "rotation_seed": 5}
    stored = reader.clm_layers(arrays, sel)
    assert stored.shape == (len(arrays["row"]), 6, 2, 32)
    np.testing.assert_array_equal(stored, np.array(vector["decoded"]["layers"], dtype=np.float32))
    padded = np.arange(0, 16, 3)[None, :] >= arrays["length"][:, None]
    assert padded.any() and (stored[padded] == 0).all() and (np.abs(stored[~padded]).sum(-1) > 0).all()
    r = reader.rotation(32, 5)
    assert np.array_equal(r, rotation(32, 5)) and np.array_equal(r @ r.T, np.eye(32))
    check_blocks(arrays, meta, vector["source_tokens"])


def check_padding_bits(arrays: dict, sel: dict, group: str, width: int) -> None:
    """The bits after the last slot's id, and after the last of the `width` positions in `<group>/kept`, are 0."""
    id_bits = np.unpackbits(arrays[f"{group}/ids"], axis=-1, bitorder="little")
    assert not id_bits[..., sel["slots"] * sel["id_bits"]:].any()
    assert not np.unpackbits(arrays[f"{group}/kept"], axis=-1)[..., width:].any()


def check_topk(arrays: dict, sel: dict, kept: np.ndarray, ids: np.ndarray, decoded: dict, group: str) -> None:
    logprobs = reader.clm_logprobs(arrays, sel, group)
    np.testing.assert_array_equal(logprobs, np.array(decoded["logprobs"], dtype=np.float32))
    tail = reader.clm_tail(logprobs, kept)
    # the doc fixes the arithmetic (float32, slot order): the same bits, not merely close ones
    np.testing.assert_array_equal(tail, np.array(decoded["tail"], dtype=np.float32))
    assert ((tail >= 0) & (tail <= 1)).all() and (tail[kept] > 0).all()
    assert (logprobs[~kept] == 0).all()
    on = logprobs[kept]  # [kept positions, K]: log-probs <= 0, by descending probability, ids distinct
    assert (on <= 0).all() and (np.diff(on, axis=-1) <= 0).all()
    assert all(len(set(row)) == sel["k"] for row in ids[kept].tolist())


def check_sample(arrays: dict, sel: dict, kept: np.ndarray, ids: np.ndarray) -> None:
    counts = arrays["clm/counts"].astype(int)
    assert np.array_equal(counts.sum(-1), np.where(kept, sel["draws"], 0))  # the draws, on kept positions only
    used = counts > 0
    for row_ids, row_used in zip(ids[kept].tolist(), used[kept].tolist(), strict=True):
        n = sum(row_used)
        assert row_used == [True] * n + [False] * (len(row_used) - n)  # used slots first, then unused ones
        assert row_ids[:n] == sorted(set(row_ids[:n])) and row_ids[n:] == [0] * (len(row_ids) - n)
    assert (~used & kept[..., None]).any() and (used & (ids == 0)).any()  # empty slots; a used slot holding id 0


def check_blocks(arrays: dict, meta: dict, documents: list[list[int]]) -> None:
    sel = meta["selection"]
    blocks, lengths = reader.pack_documents(documents, sel["block_size"], sel["eos_id"])
    assert np.array_equal(arrays["input_ids"], blocks) and np.array_equal(arrays["length"], lengths)
    assert arrays["input_ids"].dtype == np.uint16  # vocabularies up to 65,536 ids
    assert [reader.block_hash(b) for b in arrays["input_ids"]] == arrays["text_hash"].tolist()
    assert meta["tokenizer"]["pad_id"] == sel["eos_id"] and meta["max_length"] == sel["block_size"]
    assert set(meta["checksums"]) == set(reader.data_arrays(meta))  # no token_type_ids: inputs_hash is input_ids'


def test_causal_lm_arrays_point_at_their_section():
    """Every clm array's `spec` attribute names this page's causal-LM section, whose heading gives that anchor."""
    bundle, _ = load("clm")
    assert '## Causal-LM stores (`objective: "clm"`)' in DOC
    for path, node in bundle.nodes.items():
        if not path.startswith("_progress"):
            assert node["attributes"]["spec"] == "docs/STORE_FORMAT.md#causal-lm-stores-objective-clm", path


def test_seq2seq_vector_decodes_from_the_doc():
    """The s2s/ support over the teacher's output (its positions, its length), decoded as the causal-LM support is;
    the pairs rebuilt from their tokens (EOS, the cut at max_target, padding) and text_hash from the two rows."""
    bundle, vector = load("seq2seq")
    arrays, meta = reader.read_verified(bundle), bundle.meta
    sel, decoded = meta["selection"], vector["decoded"]
    assert (sel["architecture"], sel["supports_on"], sel["support"], sel["id_bits"]) == ("decoder-only", "teacher",
                                                                                         "topk", 6)
    kept = reader.kept_mask(arrays["s2s/kept"], sel["max_target"])
    ids = reader.unpack_ids(arrays["s2s/ids"], sel["id_bits"], sel["slots"])
    assert np.array_equal(kept, np.array(decoded["kept"], dtype=bool))
    assert np.array_equal(ids, np.array(decoded["ids"]))
    _, length = reader.supported_target(arrays, sel)
    assert np.array_equal(kept, np.arange(sel["max_target"])[None, :] < length[:, None])  # positions 1: all real ones
    assert (ids[~kept] == 0).all() and ids.max() < sel["vocab_size"] == meta["teacher"]["vocab_size"]
    check_padding_bits(arrays, sel, "s2s", sel["max_target"])
    check_topk(arrays, sel, kept, ids, decoded, "s2s")
    check_pairs(arrays, meta, vector["source_tokens"])
    check_teacher_output(arrays, sel)


def check_pairs(arrays: dict, meta: dict, pairs: list) -> None:
    """source_ids: the prompted source's tokens cut at max_source, padded with pad_id; reference_ids: the target's
    tokens then EOS, cut at max_target, padded; text_hash over the two whole rows."""
    sel = meta["selection"]
    for i, (source, target) in enumerate(pairs):
        row, n = reader.padded(source, sel["max_source"], sel["pad_id"])
        assert arrays["source_ids"][i].tolist() == row and arrays["source_length"][i] == n
        row, n = reader.padded(reader.with_eos(target, sel["eos_id"]), sel["max_target"], sel["pad_id"])
        assert arrays["reference_ids"][i].tolist() == row and arrays["reference_length"][i] == n
    hashes = [reader.pair_hash(s, r) for s, r in zip(arrays["source_ids"], arrays["reference_ids"], strict=True)]
    assert hashes == arrays["text_hash"].tolist()
    assert arrays["source_ids"].dtype == arrays["reference_ids"].dtype == np.uint16  # vocabularies up to 65,536 ids
    assert meta["tokenizer"]["pad_id"] == sel["pad_id"] and meta["max_length"] == sel["max_source"]
    assert meta["layout"]["n_width"] == sel["slots"] and set(meta["checksums"]) == set(reader.data_arrays(meta))


def check_teacher_output(arrays: dict, sel: dict) -> None:
    """The teacher's greedy output: up to and including its first EOS, or max_new_tokens (= max_target) without one;
    padded with pad_id."""
    assert sel["decoding"] == {"strategy": "greedy", "beams": 1, "max_new_tokens": sel["max_target"]}
    for row, n in zip(arrays["teacher_ids"].tolist(), arrays["teacher_length"].tolist(), strict=True):
        assert 1 <= n <= sel["max_target"] and sel["eos_id"] not in row[: n - 1]
        assert n == sel["max_target"] or row[n - 1] == sel["eos_id"]
        assert row[n:] == [sel["pad_id"]] * (len(row) - n)


def test_seq2seq_arrays_point_at_their_section():
    """Every seq2seq array's `spec` attribute names this page's sequence-to-sequence section."""
    bundle, _ = load("seq2seq")
    assert '## Sequence-to-sequence stores (`objective: "seq2seq"`)' in DOC
    for path, node in bundle.nodes.items():
        if not path.startswith("_progress"):
            assert node["attributes"]["spec"] == "docs/STORE_FORMAT.md#sequence-to-sequence-stores-objective-seq2seq", \
                path


@pytest.mark.parametrize("name", NAMES)
def test_every_blosc_frame_decodes_as_the_doc_says(name):
    """"Shard objects" and "Blosc frames": each stored inner chunk, decoded by the doc's description, is the
    chunk's rows as zarr reads them (the last chunk zero-padded)."""
    bundle, _ = load(name)
    frames = 0
    with zipfile.ZipFile(VECTORS / f"{name}.hsk.zip") as zf:
        for path, node in bundle.nodes.items():
            sharding = node["codecs"][0]
            if sharding["name"] != "sharding_indexed":
                continue
            inner, outer = sharding["configuration"]["chunk_shape"], node["chunk_grid"]["configuration"]["chunk_shape"]
            per_shard = outer[0] // inner[0]
            data = bundle.group[path][:]
            dtype = np.dtype(reader.DIGEST_DTYPE[node["data_type"]])
            for key in (k for k in zf.namelist() if k.startswith(f"{path}/c/")):
                raw = zf.read(key)
                shard = int(key[len(path) + 3:].split("/")[0])
                for c, where in enumerate(reader.shard_index(raw, per_shard)):
                    if where is None:
                        continue
                    start = (shard * per_shard + c) * inner[0]
                    rows = np.zeros((inner[0], *data.shape[1:]), dtype=dtype)
                    rows[: len(data[start:start + inner[0]])] = data[start:start + inner[0]]
                    assert reader.blosc_decode(raw[where[0]:where[0] + where[1]]) == rows.tobytes(), (path, key, c)
                    frames += 1
    assert frames > 0
