"""The values' domain (hskstore.format.domain): LM stores whose values or selection fields were forged, hsk's own
digests, checksums and manifest recomputed so that only the domain checks can catch them, are refused in one
line naming the array, the shard and the rule, by real `hsk` processes (verify, info, train, derive, export,
pack), the store's files unchanged and no run folder left."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import hsk, tree_hashes

from hskstore.format.clm import pack_ids, unpack_ids
from hskstore.format.digest import array_checksum, shard_digest
from hskstore.format.manifest import compute_manifest, list_arrays
from hskstore.format.schema import PROGRESS_DIGESTS
from pipelines.cli import main

VOCAB = 300  # the tiny BPE tokenizer's (tests/conftest.py)


def _clm(out: Path, teacher: Path, corpus: Path, support: str, *extra: str) -> Path:
    assert main(["dump", "--objective", "clm", "--teacher", str(teacher), "--text-file", str(corpus), "--support",
                 support, "--block-size", "16", "--limit", "40", "--shard-rows", "8", "--batch-size", "8",
                 "--no-progress", "--device", "cpu", "--out", str(out), *extra]) == 0
    return out


@pytest.fixture(scope="module")
def lm_stores(tmp_path_factory, clm_teacher, clm_corpus) -> dict[str, Path]:
    """Small causal-LM stores (top-8 float16 and int8, sample:16) and a seq2seq store (greedy output, top-4 on
    it) of the tiny Llama teacher."""
    tmp = tmp_path_factory.mktemp("domain")
    made = {"top8": _clm(tmp / "top8.zarr", clm_teacher, clm_corpus, "topk:8"),
            "int8": _clm(tmp / "int8.zarr", clm_teacher, clm_corpus, "topk:8", "--logprobs", "int8"),
            "sample": _clm(tmp / "sample.zarr", clm_teacher, clm_corpus, "sample:16")}
    pairs = tmp / "pairs.tsv"
    lines = clm_corpus.read_text(encoding="utf-8").splitlines()[:24]
    pairs.write_text("source\ttarget\n" + "".join(f"{a}\t{b}\n" for a, b in zip(lines[::2], lines[1::2])),
                     encoding="utf-8")
    made["s2s"] = tmp / "s2s.zarr"
    assert main(["dump", "--objective", "seq2seq", "--teacher", str(clm_teacher), "--data-file", str(pairs),
                 "--prompt", "Say: {source}\\nA:", "--max-length", "32", "--max-target", "8", "--shard-rows", "8",
                 "--batch-size", "4", "--support", "topk:4", "--decode", "greedy", "--no-progress", "--device", "cpu",
                 "--out", str(made["s2s"])]) == 0
    return made


def _root(store: Path) -> dict:
    return json.loads((store / "zarr.json").read_text())


def reseal(store: Path, arrays: dict | None = None, selection=None) -> None:
    """What a forger who knows the format does: rewrite arrays (name -> edit of the whole array) and the metadata
    (`selection` edits meta), then recompute the shard digests, the per-array checksums and the manifest."""
    root = _root(store)
    meta = root["attributes"]["hsk"]
    group = zarr.open_group(str(store), mode="r+")
    names = list(meta["checksums"])
    digests = np.asarray(group[PROGRESS_DIGESTS][:])
    rows = meta["layout"]["shard_rows"]
    for name, edit in (arrays or {}).items():
        data = edit(np.asarray(group[name][:]).copy())
        group[name][:] = data
        i = names.index(name)
        for shard in range(digests.shape[0]):
            digests[shard, i] = np.frombuffer(shard_digest(data[shard * rows:(shard + 1) * rows]), dtype=np.uint8)
        meta["checksums"][name] = array_checksum([bytes(d) for d in digests[:, i]])
    group[PROGRESS_DIGESTS][:] = digests
    if selection is not None:
        selection(meta)
    meta.pop("manifest")
    meta["manifest"] = compute_manifest(meta, list_arrays(zarr.open_group(str(store), mode="r")))
    (store / "zarr.json").write_text(json.dumps(root))


def _support(group: str, slots: int, bits: int, edit):
    """An edit of the bit-packed ids of `group` (ids [n, T, S] -> ids)."""
    return {f"{group}/ids": lambda packed: pack_ids(edit(unpack_ids(packed, bits, slots)), bits)}


def _first_kept(ids):
    ids[0, 0, 0] = VOCAB  # position 0 of row 0 is always kept (all positions are)
    return ids


def _last_row_padding(kept, lengths):
    row = int(np.flatnonzero(lengths < 16)[-1])
    bits = np.unpackbits(kept, axis=-1, count=16)
    bits[row, lengths[row]] = 1
    return np.packbits(bits, axis=-1)


def _setter(index, value):
    def edit(a):
        a[index] = value
        return a
    return edit


def _lengths(store: Path) -> np.ndarray:
    return np.asarray(zarr.open_group(str(store), mode="r")["length"][:])


# (store, forged arrays, the array the error names, words of the rule); bits 9 = ceil(log2 300)
FORGED_VALUES = {
    "input_ids at the vocabulary": ("top8", lambda s: {"input_ids": _setter((0, 3), VOCAB)}, "input_ids",
                                    "holds id 300, outside the vocabulary"),
    "clm/ids at the vocabulary": ("top8", lambda s: _support("clm", 8, 9, _first_kept), "clm/ids",
                                  "holds id 300"),
    "length 0": ("top8", lambda s: {"length": _setter(0, 0)}, "length", "holds length 0, outside 1..16"),
    "length negative": ("top8", lambda s: {"length": _setter(1, -7)}, "length", "holds length -7"),
    "log-prob NaN": ("top8", lambda s: {"clm/values": _setter((0, 0, 0), np.nan)}, "clm/values", "NaN or infinite"),
    "log-prob +inf": ("top8", lambda s: {"clm/values": _setter((0, 1, 2), np.inf)}, "clm/values", "NaN or infinite"),
    "log-prob -inf everywhere": ("top8", lambda s: {"clm/values": lambda v: np.full_like(v, -np.inf)}, "clm/values",
                                 "NaN or infinite"),
    "log-prob 65504": ("top8", lambda s: {"clm/values": _setter((0, 0, 0), 65504)}, "clm/values", "> 0"),
    "probabilities summing to 4": ("top8", lambda s: {"clm/values": lambda v: np.full_like(v, math.log(0.5))},
                                   "clm/values", "probabilities sum to 3.99"),
    "kept bit on padding": ("top8", lambda s: {"clm/kept": lambda k: _last_row_padding(k, _lengths(s))}, "clm/kept",
                            "(padding)"),
    "no kept position": ("top8", lambda s: {"clm/kept": np.zeros_like}, "clm/kept", "keeps 0 positions"),
    "int8 scale NaN": ("int8", lambda s: {"clm/scale": _setter((0, 0), np.nan)}, "clm/scale", "NaN, infinite"),
    "int8 scale negative": ("int8", lambda s: {"clm/scale": _setter((0, 0), -1)}, "clm/scale", "negative scale"),
    "counts not summing to the draws": ("sample", lambda s: {"clm/counts": lambda c: c + 1}, "clm/counts",
                                        "not the 16 draws"),
    "actual-token log-prob above 0": ("top8", lambda s: {"clm/actual": _setter((0, 0), 3.0)}, "clm/actual",
                                      "holds log-prob 3 > 0"),
    "actual-token log-prob NaN": ("top8", lambda s: {"clm/actual": _setter((1, 2), np.nan)}, "clm/actual",
                                  "NaN or infinite"),
    "token bytes beyond the text": ("top8", lambda s: {"clm/token_bytes": _setter((0, 0), 60000)},
                                    "clm/token_bytes", "more than text_bytes"),
    "s2s/ids at the vocabulary": ("s2s", lambda s: _support("s2s", 4, 9, _first_kept), "s2s/ids", "holds id 300"),
    "source_length 10^6": ("s2s", lambda s: {"source_length": _setter(0, 10**6)}, "source_length",
                           "holds length 1000000, outside 0..32"),
    "teacher_ids at the vocabulary": ("s2s", lambda s: {"teacher_ids": _setter((2, 0), 65535)}, "teacher_ids",
                                      "holds id 65535"),
}


@pytest.mark.parametrize("case", list(FORGED_VALUES))
def test_a_forged_value_is_refused_naming_the_array_shard_and_rule(lm_stores, tmp_path, case):
    kind, arrays, array, rule = FORGED_VALUES[case]
    store = Path(shutil.copytree(lm_stores[kind], tmp_path / f"{kind}.zarr"))
    reseal(store, arrays(store))
    kept = tree_hashes(store)
    code, out, err = hsk("verify", str(store), timeout=60)
    assert code != 0 and "Traceback" not in err, err
    assert f"array {array} of shard " in err and rule in err and "forged or damaged" in err, err
    assert tree_hashes(store) == kept


# (store, the selection edit, words of the one line)
FORGED_SELECTIONS = {
    "k 10^30 with 8 slots": ("top8", lambda s: s.update(k=10**30), "selection.k"),
    "positions NaN": ("top8", lambda s: s.update(positions=float("nan")), "positions nan is not a fraction"),
    "eos_id -1": ("top8", lambda s: s.update(eos_id=-1), "eos_id -1 is not an integer in 0..299"),
    "block_size 10^30": ("top8", lambda s: s.update(block_size=10**30), "block_size"),
    "vocab_size 10^100": ("top8", lambda s: s.update(vocab_size=10**100, id_bits=333), "vocab_size"),
    "draws 0": ("sample", lambda s: s.update(draws=0, slots=0), "draws 0"),
    "pad_id 10^20": ("s2s", lambda s: s.update(pad_id=10**20), "pad_id"),
    "max_target 10^30": ("s2s", lambda s: s.update(max_target=10**30), "max_target"),
}


@pytest.mark.parametrize("case", list(FORGED_SELECTIONS))
def test_a_forged_selection_field_is_refused_in_one_line(lm_stores, tmp_path, case):
    kind, edit, words = FORGED_SELECTIONS[case]
    store = Path(shutil.copytree(lm_stores[kind], tmp_path / f"{kind}.zarr"))
    reseal(store, selection=lambda meta: edit(meta["selection"]))
    kept = tree_hashes(store)
    code, _, err = hsk("verify", str(store), timeout=60)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert tree_hashes(store) == kept


def test_a_forged_teacher_vocabulary_is_refused(lm_stores, tmp_path):
    store = Path(shutil.copytree(lm_stores["top8"], tmp_path / "t.zarr"))
    reseal(store, selection=lambda meta: meta["teacher"].update(vocab_size=10**100))
    code, _, err = hsk("info", str(store), timeout=60)
    assert code == 2 and "teacher.vocab_size" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("kind, arrays, method", [
    ("top8", lambda s: {"input_ids": _setter((slice(None), 3), VOCAB)}, "clm-kd"),  # every shard: any read first
    ("sample", lambda s: {"clm/counts": lambda c: c + 1}, "clm-kd"),
    ("s2s", lambda s: {"source_length": _setter(0, 10**6)}, "s2s-kd"),
])
def test_train_on_a_forged_store_is_refused_and_leaves_no_run_folder(lm_stores, tmp_path, kind, arrays, method):
    store = Path(shutil.copytree(lm_stores[kind], tmp_path / f"{kind}.zarr"))
    reseal(store, arrays(store))
    kept = tree_hashes(store)
    run = tmp_path / "run"
    code, _, err = hsk("train", "--store", str(store), "--student", "first2", "--method", method, "--max-steps", "2",
                       "--batch-size", "4", "--device", "cpu", "--out", str(run), timeout=120)
    assert code == 2 and "of shard" in err and "forged or damaged" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not run.exists()  # no run folder, marker or metrics.jsonl left
    assert tree_hashes(store) == kept


def test_derive_export_and_pack_do_not_carry_a_forged_store_on(lm_stores, tmp_path):
    store = Path(shutil.copytree(lm_stores["top8"], tmp_path / "t.zarr"))
    reseal(store, {"clm/values": _setter((0, 0, 0), np.nan)})
    kept = tree_hashes(store)
    for args, out in ((("derive", str(store), "--support", "topk:4", "--out"), tmp_path / "d.zarr"),
                      (("export", str(store)), tmp_path / "e"),
                      (("pack", str(store)), tmp_path / "p.hsk.zip")):
        code, _, err = hsk(*args, str(out), timeout=60)
        assert code == 2 and "array clm/values of shard 0" in err and "Traceback" not in err, (args, err)
        assert not out.exists() or not any(out.iterdir()), args
    assert tree_hashes(store) == kept
