"""Regenerate the conformance vectors of docs/STORE_FORMAT.md ("Writing a reader").

    python docs/conformance/generate.py              # rewrites docs/conformance/
    python docs/conformance/generate.py --out DIR    # anywhere else (tests/test_conformance.py compares)

Every vector is a real store, written by the real commands (`hsk dump`, `hsk derive`, `hsk pack`)
from a tiny BERT built here with fixed-seed weights, a tiny WordPiece vocabulary and a few rows of
text (the causal-LM vectors: a tiny Llama over a fixed word list; the seq2seq vector: the same Llama
over a few source/target pairs), then packed as a bundle `<name>.hsk.zip`. Next to each bundle,
`<name>.json` says what a reader must find in it: the manifest, the checksums, every shard digest,
every array as decoded numbers, and the kept values of each layer decoded to float32 (the causal-LM
and seq2seq vectors: their supports decoded).

The teachers are exact (exact_teachers.py): weights on a grid of 1/8, norms and activations that
round to that grid, attention by powers of two, so every float32 sum they compute is exact and no
result depends on the order a CPU adds in (SIMD width, threads, BLAS path); each teacher is run in
float32 and float64 before it is saved and every module's outputs must be equal. The generator
registers them (their `model_type`, attention function and score reader) in its own process, and
hsk reads them through its ordinary code paths. So the vectors regenerate byte for byte on any
x86-64 or ARM CPU, whatever ATEN_CPU_CAPABILITY, MKL_CBWR or thread count.

What depends on where and when the generator runs (the temporary folder the teacher was saved
in, the creation time, the hsk version, the thread count) is replaced by fixed values after the
dump, and the store's `identity`, `manifest` and card are then recomputed exactly as the writer
computes them, so each vector is a valid store and regenerating gives the same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root: run from anywhere
sys.path.insert(1, str(HERE))  # exact_teachers.py, also when this file is imported rather than run

# Fixed values for what would otherwise name this run's machine, folder or time.
PINNED_CREATED = "2026-01-01T00:00:00+00:00"
PINNED_VERSION = "conformance"
PINNED_TEACHER = "/conformance/teacher"
PINNED_SOURCE_STORE = "float16.zarr"
# The LM vectors' float16 log-probs lie at least this far (in float16 ulps) from a rounding midpoint: torch's float32
# log-softmax (not exact) is within a few float32 ulps of the exact value on any CPU: under 1e-3 of a float16 ulp.
MIN_MARGIN = 0.004
PINNED_THREADS = 1  # `compute.torch_threads`: the teachers are exact, so the thread count changes no value

VOCAB = list(dict.fromkeys([
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
    *"the a film movie is was not very good bad fun dull story and but it of".split(),
    *list("abcdefghijklmnopqrstuvwxyz.,!'"),
    *[f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"],
]))
# Rows of the task stores: a long one (cut at max_length), a short one (fewer eligible tokens than
# N^L: unused slots), non-ASCII text (text_hash is over UTF-8).
ROWS = [
    ("a dull , dull story and a bad movie , not fun at all and not good either", 0),
    ("fun", 1),
    ("the story of the film : naïve but fun !", 1),
]
# The masked-LM corpus: the second line has 30 maskable tokens (0.15 x 30 = 4.5, rounded half up to 5).
CORPUS = [
    "the film is very good and the story is fun",
    " ".join(["a dull story"] * 10),
    "not bad",
]
DATA_FILE = "critiques-données.tsv"  # a non-ASCII name: the manifest's JSON escapes it
HIDDEN, LAYERS, HEADS, MAX_LENGTH = 64, 2, 2, 16
CONFIG = "3,4,0.55"  # N^D 3 (embeddings included), N^L 4, N^W = round(0.55 * 64) = 35: odd, two 4-bit groups
COMMON = ["--max-length", str(MAX_LENGTH), "--shard-rows", "2", "--student-layers", "2", "--l-top", "2",
          "--device", "cpu", "--no-progress"]
# The `edges` vector: d = 60 (not a multiple of 8: 4 padding bits in each mask's last byte), int8 values, shards
# of 2 rows in inner chunks of 1 (row 0's label is 0: that inner chunk is not stored). Its teacher's top layer
# writes these constants in the first hidden dims: 127 makes every int8 scale exactly 1.0, so the others are
# exact rounding ties (x.5), which int8 rounds half to even.
EDGE_HIDDEN, EDGE_CONFIG, EDGE_CHUNK_ROWS = 60, "2,4,0.55", 1
EDGE_CONSTANTS = (127.0, 2.5, -3.5, 4.5, 5.5, -6.5, 10.5, -11.5, 100.5)
# The causal-LM vectors (`clm`, `clm-sample`): a word-level tokenizer over a fixed word list (a trained BPE's merges
# may change between `tokenizers` versions; a word list cannot), so V = 38 and ids take 6 bits. The corpus is 35
# tokens with the EOS after each document: blocks of 16 give 16, 16 and 3 real tokens (the last padded with 13
# EOS), blocks of 12 give 12, 12 and 11; "ending" is not a word of the list (<unk>).
CLM_WORDS = ["<eos>", "<unk>", *"the a an film movie story plot actor cast is was are not very quite too good bad fun "
             "dull slow long short and but or it this that of in with , . ! ?".split()]
CLM_CORPUS = [
    "the film is very good, and the story is fun!",
    "a dull movie.",
    "this actor was quite good in a slow plot",
    "not bad, but the ending",
]
# top-3 at 6 bits: 18 bits in 3 bytes per position (ids straddle bytes, 6 padding bits); 12 of 16 positions kept.
# 5 draws at 6 bits: 30 bits in 4 bytes; blocks of 12: `clm/kept`'s second byte has 4 padding bits.
CLM_COMMON = ["dump", "--objective", "clm", "--teacher", "clm-teacher", "--text-file", "clm-corpus.txt",
              "--shard-rows", "2", "--device", "cpu", "--no-progress"]
CLM_TOPK = ["--support", "topk:3", "--logprobs", "float16", "--block-size", "16", "--positions", "0.75"]
CLM_SAMPLE = ["--support", "sample:5", "--block-size", "12", "--sample-seed", "7"]
# The final hidden state (`clm-hidden`): int8 codes and a scale per position of the Llama's 32-wide state, rotated
# (seed 3), and the rotated head once (clm/head [38, 32] float32); blocks of 16 as the top-K vector.
CLM_HIDDEN = ["--support", "hidden:int8", "--block-size", "16", "--sample-seed", "3"]
# The fitted basis (`clm-fit`): int8u indices of the 32-wide state in a basis fitted to its first 96 positions for a
# mean KL of 0.02, the folded head and bias (clm/head [38, 32], clm/head_bias [38]) and the writer's encoder
# (clm/fit_mean, clm/fit_encoder, float64). A fit needs more than 2 d positions: the corpus three times over
# (105 tokens), in blocks of 16.
CLM_FIT = ["--support", "hidden:fit", "--block-size", "16", "--sample-seed", "3", "--hidden-fit-tokens", "96",
           "--hidden-kl", "0.02", "--text-file", "clm-fit-corpus.txt"]
# The intermediate layers (`clm-layers`): top-3 (float16, every position) and the Llama's layers 0 and 2 (the
# embeddings' output and its last layer's) at positions 0, 3, ..., 15 of blocks of 16, int8, rotated (seed 5).
CLM_LAYERS = ["--support", "topk:3", "--logprobs", "float16", "--block-size", "16", "--hidden-layers", "0,2",
              "--layer-stride", "3", "--layer-codec", "int8", "--sample-seed", "5"]
# The sequence-to-sequence vector (`seq2seq`): the same Llama, decoder-only, reads each source in the prompt template
# (11, 11 and 6 tokens in max_source 12: padded); its greedy output (two run to max_target 6, one ends with EOS)
# and top-3 on it (18 bits of ids in 3 bytes; `s2s/kept` holds 6 positions in a byte: 2 padding bits). The
# references end with EOS and are padded (4 and 1 tokens), or are cut at max_target 6 before their EOS (9 tokens).
S2S_PAIRS = [
    ("the movie was very good and fun", "a good film ."),
    ("this plot is too long and slow", "the story is long but the cast is good"),
    ("not bad", "fun"),
]
S2S_PROMPT = "{source} . in short ,"
S2S_DUMP = ["dump", "--objective", "seq2seq", "--teacher", "clm-teacher", "--data-file", "s2s-pairs.tsv", "--prompt",
            S2S_PROMPT, "--support", "topk:3", "--logprobs", "float16", "--decode", "greedy", "--max-length", "12",
            "--max-target", "6", "--shard-rows", "2", "--device", "cpu", "--no-progress"]


@contextmanager
def _cwd(path: Path):
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _tokenizer(out: Path) -> None:
    from transformers import BertTokenizer

    BertTokenizer(vocab={tok: i for i, tok in enumerate(VOCAB)}, do_lower_case=True).save_pretrained(out)


def _config(hidden: int = HIDDEN, **kwargs):
    from exact_teachers import ExactBertConfig

    return ExactBertConfig(vocab_size=len(VOCAB), hidden_size=hidden, num_hidden_layers=LAYERS,
                           num_attention_heads=HEADS, intermediate_size=2 * hidden, max_position_embeddings=32,
                           type_vocab_size=2, pad_token_id=0, **kwargs)


def _checked(model, tokenizer_dir: Path, texts: list[str]):
    """The model, once `check_exact` has run it on `texts` (padded: masks exercised)."""
    from exact_teachers import check_exact
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    check_exact(model, **tokenizer(texts, padding=True, return_tensors="pt"))
    return model


def build_clm_teacher(out: Path) -> None:
    """A tiny exact Llama over CLM_WORDS, saved with its tokenizer (whitespace and punctuation split, EOS)."""
    import torch
    from exact_teachers import ExactLlamaConfig, ExactLlamaForCausalLM, exact_weights
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(CLM_WORDS)}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, eos_token="<eos>", unk_token="<unk>").save_pretrained(out)
    config = ExactLlamaConfig(vocab_size=len(CLM_WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                              eos_token_id=0, bos_token_id=0, pad_token_id=0)
    model = exact_weights(ExactLlamaForCausalLM(config).eval(), seed=9)
    with torch.no_grad():
        model.lm_head.weight.mul_(4)  # weights up to 1: a distribution with a shape (top-3, repeated draws)
    _checked(model, out, [*CLM_CORPUS, *(S2S_PROMPT.replace("{source}", a) + " " + b for a, b in S2S_PAIRS)])
    model.save_pretrained(out)


def build_teachers(work: Path) -> None:
    """A sequence classifier (the task teacher), a masked-LM teacher and a causal LM: exact (exact_teachers.py),
    their weights drawn from fixed seeds.

    The classifier's top layer writes zeros in hidden dims 32..63 (its output norm scales and shifts them by 0),
    so the kept values 32..34 of its vectors, the second 4-bit group, are all zero.
    """
    import torch
    from exact_teachers import ExactBertForMaskedLM, ExactBertForSequenceClassification, exact_weights

    for name in ("teacher", "mlm-teacher", "edge-teacher"):
        _tokenizer(work / name)
    texts = [text for text, _ in ROWS]
    teacher = exact_weights(ExactBertForSequenceClassification(_config(num_labels=2)).eval(), seed=0)
    with torch.no_grad():
        norm = teacher.bert.encoder.layer[-1].output.LayerNorm
        norm.weight[32:] = 0.0
        norm.bias[32:] = 0.0
    _checked(teacher, work / "teacher", texts).save_pretrained(work / "teacher")
    mlm = exact_weights(ExactBertForMaskedLM(_config()).eval(), seed=1)
    with torch.no_grad():
        # a peaked distribution (a bias of spread 2, on a grid of 1/4) with no two ids ever tied: each id's bias
        # has its own fraction of 1/64 (the grid of h . E), so top-k's order never depends on tie-breaking
        generator = torch.Generator().manual_seed(1)
        bias = mlm.cls.predictions.bias
        spread = torch.round(torch.randn(bias.shape, generator=generator) * 8) / 4
        bias.copy_(spread + torch.randperm(len(bias), generator=generator) / (64 * 128))
    _checked(mlm, work / "mlm-teacher", CORPUS).save_pretrained(work / "mlm-teacher")
    edge = exact_weights(ExactBertForSequenceClassification(_config(EDGE_HIDDEN, num_labels=2)).eval(), seed=2)
    with torch.no_grad():
        norm = edge.bert.encoder.layer[-1].output.LayerNorm
        k = len(EDGE_CONSTANTS)
        norm.weight[:k] = 0.0
        norm.bias[:k] = torch.tensor(EDGE_CONSTANTS)
    _checked(edge, work / "edge-teacher", texts).save_pretrained(work / "edge-teacher")
    build_clm_teacher(work / "clm-teacher")


def _hsk(*args: str) -> None:
    from pipelines.cli import main

    code = main(list(args))
    if code:
        raise SystemExit(f"hsk {' '.join(args)} failed with exit status {code}")


def dump_stores(work: Path) -> list[str]:
    """Every vector as a store folder in `work`; returns their names, in the order of the vectors."""
    (work / DATA_FILE).write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in ROWS), encoding="utf-8")
    (work / "corpus.txt").write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    (work / "clm-corpus.txt").write_text("\n".join(CLM_CORPUS) + "\n", encoding="utf-8")
    (work / "clm-fit-corpus.txt").write_text("\n".join(CLM_CORPUS * 3) + "\n", encoding="utf-8")
    (work / "s2s-pairs.tsv").write_text("source\ttarget\n" + "".join(f"{a}\t{b}\n" for a, b in S2S_PAIRS),
                                        encoding="utf-8")
    from hskstore import codecs

    task = ["dump", "--task", "sst2", "--teacher", "teacher", "--data-file", DATA_FILE, *COMMON]
    values_vectors = list(codecs.names())  # one vector per registered value codec
    with _cwd(work):
        for values in values_vectors:
            _hsk(*task, "--config", CONFIG, "--values", values, "--out", f"{values}.zarr")
        # pre-softmax scores: numpy's float32 exp (post-softmax) differs between CPU instruction sets
        _hsk(*task, "--config", CONFIG, "--attention-rows", "--tokens", "att", "--out", "attention.zarr")
        _hsk("dump", "--objective", "mlm", "--teacher", "mlm-teacher", "--text-file", "corpus.txt", "--top-k", "3",
             "--mask-seed", "1", "--max-length", "32", "--shard-rows", "2", "--device", "cpu", "--no-progress",
             "--out", "mlm.zarr")
        for name in (*values_vectors, "attention", "mlm"):
            pin(f"{name}.zarr")
        # derive reads the pinned float16 store: its derived_from names the pinned source
        _hsk("derive", "float16.zarr", "--config", "2,3,0.3", "--values", "int4", "--out", "derived.zarr")
        pin("derived.zarr")
        edge = ["dump", "--task", "sst2", "--teacher", "edge-teacher", "--data-file", DATA_FILE, *COMMON,
                "--config", EDGE_CONFIG]
        _hsk(*edge, "--values", "float16", "--out", "edges-float16.zarr")  # the values int8 quantises (JSON)
        _hsk(*edge, "--values", "int8", "--out", "edges-dumped.zarr")
        relayout("edges-dumped.zarr", "edges.zarr", EDGE_CHUNK_ROWS)
        pin("edges.zarr")
        _hsk(*CLM_COMMON, *CLM_TOPK, "--out", "clm.zarr")
        _hsk(*CLM_COMMON, *CLM_SAMPLE, "--out", "clm-sample.zarr")
        _hsk(*CLM_COMMON, *CLM_HIDDEN, "--out", "clm-hidden.zarr")
        _hsk(*CLM_COMMON, *CLM_LAYERS, "--out", "clm-layers.zarr")
        _hsk(*CLM_COMMON, *CLM_FIT, "--out", "clm-fit.zarr")
        pin("clm-fit.zarr")
        pin("clm.zarr")
        pin("clm-sample.zarr")
        pin("clm-hidden.zarr")
        pin("clm-layers.zarr")
        _hsk(*S2S_DUMP, "--out", "seq2seq.zarr")
        pin("seq2seq.zarr")
    return [*values_vectors, "attention", "derived", "mlm", "edges", "clm", "clm-sample", "clm-hidden", "clm-layers",
            "clm-fit", "seq2seq"]


# What a new store takes from a store it is rewritten from: all but what its writer records itself.
_WRITTEN_BY_WRITER = ("checksums", "inputs_hash", "complete", "identity", "created", "software_version",
                      "format_version", "manifest", "stored_bytes")


def relayout(src: str, out: str, chunk_rows: int) -> None:
    """The store at `src` rewritten by hsk's writer with inner chunks of `chunk_rows` rows (the dump picks
    chunks of a quarter shard only for shards of 64 rows or more: too big for a vector)."""
    from hskstore import open_store
    from hskstore.io.writer import StoreWriter

    store = open_store(src)
    meta = {k: v for k, v in store.meta.items() if k not in _WRITTEN_BY_WRITER}
    meta["layout"] = dict(meta["layout"], chunk_rows=chunk_rows)
    with StoreWriter.open(out, meta, software_version=PINNED_VERSION) as writer:
        for shard in range(store.n_shards):
            writer.write_shard(shard, store.read_shard(shard))
        writer.finalize()


def pin(url: str) -> None:
    """Replace run-dependent metadata by fixed values; recompute identity, manifest, card and croissant.json
    as the writer does (croissant.json names the root zarr.json by its sha256, so it follows the pinning)."""
    import zarr

    from hskstore.format.manifest import MANIFEST_KEY, compute_manifest, list_arrays
    from hskstore.format.schema import META_KEY, array_specs
    from hskstore.io.croissant import write_croissant
    from hskstore.io.writer import identity, write_store_card

    group = zarr.open_group(url, mode="r+")
    meta = group.attrs[META_KEY]
    meta.update(created=PINNED_CREATED, software_version=PINNED_VERSION)
    if meta.get("compute", {}).get("torch_threads"):
        meta["compute"]["torch_threads"] = PINNED_THREADS
    for key in ("teacher", "tokenizer"):
        if meta[key].get("path"):
            meta[key].update(path=PINNED_TEACHER, name=PINNED_TEACHER)
    if "derived_from" in meta:
        meta["derived_from"].update(url=PINNED_SOURCE_STORE, created=PINNED_CREATED)
    meta["identity"] = identity(meta)
    meta.pop(MANIFEST_KEY, None)
    meta[MANIFEST_KEY] = compute_manifest(meta, list_arrays(group))
    group.attrs[META_KEY] = meta
    write_store_card(group, meta, [spec.name for spec in array_specs(meta)], url)
    write_croissant(group, meta, [spec.name for spec in array_specs(meta)], url)


def _numbers(array: np.ndarray) -> list:
    """Array elements as JSON numbers (float16/32 values are exact as JSON's float64), 64-bit integers as
    decimal strings (JavaScript's JSON.parse would round those above 2**53)."""
    if array.dtype.kind in "iu" and array.dtype.itemsize == 8:
        return array.astype(str).tolist()
    return array.tolist() if array.dtype.kind in "iub" else array.astype(np.float64).tolist()


def source_texts(name: str) -> list:
    """The texts a vector's rows were made from, in row order (its `dataset.fingerprint` is computed over them;
    a causal-LM store's rows are blocks of these documents; a seq2seq store's rows are [source, target] pairs)."""
    if name == "seq2seq":
        return [list(pair) for pair in S2S_PAIRS]
    if name == "clm-fit":
        return list(CLM_CORPUS * 3)
    if name.startswith("clm"):
        return list(CLM_CORPUS)
    return list(CORPUS) if name == "mlm" else [text for text, _ in ROWS]


def source_tokens(work: Path) -> list[list[int]]:
    """The causal-LM documents as the teacher's tokenizer gives them (no special tokens): what the blocks pack."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(work / "clm-teacher")(CLM_CORPUS, add_special_tokens=False)["input_ids"]


def pair_tokens(work: Path) -> list[list[list[int]]]:
    """The seq2seq pairs as the teacher's tokenizer gives them, before EOS, cuts and padding: [the source in the
    prompt template (with the tokenizer's special tokens: none here), the target (without)] per pair."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(work / "clm-teacher")
    sources = tokenizer([S2S_PROMPT.replace("{source}", source) for source, _ in S2S_PAIRS])["input_ids"]
    targets = tokenizer([target for _, target in S2S_PAIRS], add_special_tokens=False)["input_ids"]
    return [[source, target] for source, target in zip(sources, targets, strict=True)]


def support_decoded(targets, arrays: dict[str, np.ndarray], sel, group: str) -> dict:
    """What a support decodes to: kept positions, unpacked ids and, for top-K, the log-probs through the value codec
    and the tail 1 - sum(exp) (float32 as hskstore computes it; 0 where a position is not kept)."""
    from hskstore import codecs

    doc = {"kept": _numbers(targets.kept), "ids": _numbers(targets.ids.astype(np.int32))}  # numbers, not strings
    if sel.support == "topk":
        logprobs = codecs.get(sel.logprob_codec).decode(arrays[f"{group}/values"], arrays.get(f"{group}/scale"),
                                                        sel.slots)
        doc["logprobs"] = _numbers(logprobs.astype(np.float32))
        doc["tail"] = _numbers(np.where(targets.kept, targets.tail, 0).astype(np.float32))
    return doc


def clm_decoded(arrays: dict[str, np.ndarray], selection: dict) -> dict:
    """What a causal-LM store's `clm/` support decodes to, over the blocks' positions."""
    from hskstore.format.clm import GROUP, HIDDEN, ClmSelection, block_texts, decode, decode_hidden
    from hskstore.format.clm_layers import decode_layers

    sel = ClmSelection.from_dict(selection)
    if sel.support == HIDDEN:  # the hidden states through the codec (rotated); the head is an array of the bundle
        targets = decode_hidden(arrays, sel)
        return {"kept": _numbers(targets.kept), "hidden": _numbers(targets.hidden.astype(np.float32))}
    doc = support_decoded(decode(arrays, sel), arrays, sel, GROUP)
    if sel.layer_states is not None:  # the layer vectors through their codec (rotated)
        doc["layers"] = _numbers(decode_layers(arrays, sel.layer_states).astype(np.float32))
    if sel.text_bytes is not None:  # each block's text and where its tokens end in it (bytes)
        texts = block_texts(arrays)
        ends = np.stack([t.ends for t in texts]).astype(np.int32)  # numbers, not strings
        doc.update(texts=[t.text.decode("utf-8") for t in texts], ends=_numbers(ends))
    return doc


def seq2seq_decoded(arrays: dict[str, np.ndarray], selection: dict) -> dict:
    """What a seq2seq store's `s2s/` support decodes to, over the positions of the target it sits on."""
    from hskstore.format.seq2seq import GROUP, Seq2seqSelection, decode

    sel = Seq2seqSelection.from_dict(selection)
    return support_decoded(decode(arrays, sel), arrays, sel, GROUP)


DECODED = {"clm": clm_decoded, "seq2seq": seq2seq_decoded}  # objective -> its support, decoded


def decoded(meta: dict, arrays: dict[str, np.ndarray]) -> dict:
    """What a store's values decode to: an LM store's support (`decoded`), a task store's kept values of each layer
    decoded to float32 (`decoded_values`); nothing for masked-LM and logits-only stores."""
    from hskstore.format.codec import decode_values

    if meta.get("objective") in DECODED:
        return {"decoded": DECODED[meta["objective"]](arrays, meta["selection"])}
    if meta.get("objective") == "mlm" or not meta["layout"]["n_width"]:
        return {}
    n_width, codec = meta["layout"]["n_width"], meta["selection"]["value_dtype"]  # the store's codec, by name
    return {"decoded_values": {
        name[: -len("/values")]: _numbers(decode_values(codec, a, arrays.get(name[: -len("values")] + "scale"),
                                                        n_width))
        for name, a in arrays.items() if name.endswith("/values")
    }}


def expected(bundle: Path) -> dict:
    """What a reader must decode from a bundle, computed by the reference reader (hskstore)."""
    from hskstore import open_store
    from hskstore.format.schema import PROGRESS_DIGESTS

    store = open_store(str(bundle))
    meta = store.meta
    digests = store.group[PROGRESS_DIGESTS][:]
    names = list(store.specs)
    data = {name: [] for name in names}
    for shard in range(store.n_shards):
        for name, value in store.read_shard(shard).items():
            data[name].append(value)
    arrays = {name: np.concatenate(parts) for name, parts in data.items()}
    doc = {
        "bundle": bundle.name,
        "manifest": meta.get("manifest"),
        "checksums": meta["checksums"],
        "digest_order": names,
        "shard_digests": [[bytes(digests[s, i]).hex() for i in range(len(names))] for s in range(store.n_shards)],
        "arrays": {name: {"dtype": str(a.dtype), "shape": list(a.shape), "data": _numbers(a)}
                   for name, a in arrays.items()},
        **decoded(meta, arrays),
    }
    return doc


def _array(vector: dict, name: str) -> np.ndarray:
    entry = vector["arrays"][name]
    return np.array(entry["data"], dtype=entry["dtype"]).reshape(entry["shape"])


def _nibbles(codes: np.ndarray, n: int) -> np.ndarray:
    return np.stack([codes & 15, codes >> 4], axis=-1).reshape(*codes.shape[:-1], -1)[..., :n]


def _straddles(ids: np.ndarray, used: np.ndarray, bits: int) -> bool:
    """Whether a used id has set bits on both sides of a byte boundary (its slot's bits cross one)."""
    for slot in range(ids.shape[-1]):
        first = slot * bits
        low = 8 - first % 8  # bits of the id in the slot's first byte
        if low < bits and ((used[..., slot] & (ids[..., slot] % (1 << low) > 0) & (ids[..., slot] >> low > 0)).any()):
            return True
    return False


def clm_cases(topk: dict, sample: dict, selections: dict[str, dict]) -> dict[str, bool]:
    """The causal-LM vectors' cases: ids across bytes, padding bits, a padded last block, unkept positions, empty
    slots and repeated draws."""
    cases = {}
    for name, v in (("clm", topk), ("clm-sample", sample)):
        sel, kept = selections[name], np.array(v["decoded"]["kept"], dtype=bool)
        ids = np.array(v["decoded"]["ids"])
        used = _array(v, "clm/counts") > 0 if sel["support"] == "sample" else np.broadcast_to(kept[..., None],
                                                                                               ids.shape)
        cases[f"{name}: ids straddle byte boundaries"] = _straddles(ids, used, sel["id_bits"])
        cases[f"{name}: padding bits after each position's ids"] = sel["slots"] * sel["id_bits"] % 8 > 0
        cases[f"{name}: a padded last block"] = _array(v, "length")[-1] < sel["block_size"]
    lengths = _array(topk, "length")
    real = np.arange(selections["clm"]["block_size"])[None, :] < lengths[:, None]
    cases["clm: real positions not kept"] = bool((real & ~np.array(topk["decoded"]["kept"], dtype=bool)).any())
    tokens = _array(topk, "input_ids").astype(int)
    following = np.concatenate([tokens[:, 1:], tokens[:, :1] * 0], 1)  # the next token at each position
    kept_real = real & np.array(topk["decoded"]["kept"], dtype=bool)
    cases["clm: a next token among the top-3"] = bool(
        ((np.array(topk["decoded"]["ids"]) == following[..., None]) & kept_real[..., None]).any())
    counts, kept = _array(sample, "clm/counts"), np.array(sample["decoded"]["kept"], dtype=bool)
    cases["clm-sample: empty slots"] = bool((kept[..., None] & (counts == 0)).any())
    cases["clm-sample: a repeated draw"] = bool((counts > 1).any())
    # id 0 (EOS) drawn: a used slot may hold id 0, so only a count of 0 marks an unused slot
    cases["clm-sample: id 0 drawn"] = bool(((np.array(sample["decoded"]["ids"]) == 0) & (counts > 0)).any())
    cases["clm-sample: kept's last byte has padding bits"] = selections["clm-sample"]["block_size"] % 8 > 0
    return cases


def layer_cases(vector: dict, sel: dict) -> dict[str, bool]:
    """The intermediate-layer vector's cases: a stored position in a block's padding (a zero vector) and real ones."""
    states = sel["layer_states"]
    positions = np.arange(0, sel["block_size"], states["stride"])
    padded = positions[None, :] >= _array(vector, "length")[:, None]
    layers = np.array(vector["decoded"]["layers"], dtype=np.float32)
    return {"clm-layers: a stored position in the padding": bool(padded.any()),
            "clm-layers: zero vectors there, nonzero ones elsewhere": bool(
                (layers[padded] == 0).all() and (np.abs(layers[~padded]).sum(-1) > 0).all())}


def seq2seq_cases(vector: dict, sel: dict) -> dict[str, bool]:
    """The seq2seq vector's cases: references cut at max_target (no EOS) and ending with EOS, padded sources, the
    teacher's output ending with EOS and running to max_target, ids across bytes, `s2s/kept`'s padding bits."""
    reference, length = _array(vector, "reference_ids"), _array(vector, "reference_length")
    ends = reference[np.arange(len(reference)), length - 1] == sel["eos_id"]
    full, output = length == sel["max_target"], _array(vector, "teacher_length")
    kept, ids = np.array(vector["decoded"]["kept"], dtype=bool), np.array(vector["decoded"]["ids"])
    return {
        "seq2seq: a reference cut at max_target": bool((full & ~ends).any()),
        "seq2seq: a padded reference ending with EOS": bool((~full & ends).any()),
        "seq2seq: padded sources": bool((_array(vector, "source_length") < sel["max_source"]).any()),
        "seq2seq: a teacher output ending with EOS": bool((output < sel["max_target"]).any()),
        "seq2seq: a teacher output cut at max_target": bool((output == sel["max_target"]).any()),
        "seq2seq: ids straddle byte boundaries": _straddles(ids, np.broadcast_to(kept[..., None], ids.shape),
                                                            sel["id_bits"]),
        "seq2seq: kept's byte has padding bits": sel["max_target"] % 8 > 0,
    }


def selection(bundle: Path) -> dict:
    """A bundle's `selection`, from its root zarr.json."""
    with zipfile.ZipFile(bundle) as zf:
        return json.loads(zf.read("zarr.json"))["attributes"]["hsk"]["selection"]


def check_coverage(vectors: dict[str, dict], selections: dict[str, dict]) -> None:
    """Refuse vectors that lost a case the docs promise they hold (as a changed teacher or text would)."""
    cases = {f"{name}: partial last shard": len(v["shard_digests"]) * 2 > len(_array(v, "row"))
             for name, v in vectors.items()}
    kinds = _array(vectors["mlm"], "mlm/kind")
    cases["mlm: every masking kind"] = {1, 2, 3} <= set(kinds.ravel().tolist())
    cases["mlm: a half-way mask count (0.15 x 30 = 4.5 -> 5)"] = 5 in (kinds > 0).sum(axis=1).tolist()
    cases["float16: unused token slots"] = bool((_array(vectors["float16"], "layers/0/positions") < 0).any())
    used = _array(vectors["int4"], "layers/2/positions") >= 0
    cases["int4: an all-zero group in a used slot"] = bool((_array(vectors["int4"], "layers/2/scale")[used] == 0).any())
    src = _array(vectors["float16"], "layers/2/values")
    codes = _nibbles(_array(vectors["mxfp4"], "layers/2/values"), src.shape[-1])
    cases["mxfp4: negative values that round to +0"] = bool(((src < 0) & (codes == 0)).any())
    edges = vectors["edges"]
    top = sorted(edges["source_values"])[-1]
    with np.errstate(divide="ignore", invalid="ignore"):  # unused slots: scale 0
        ratio = np.array(edges["source_values"][top], dtype=np.float32) / _array(edges, f"{top}/scale").astype(
            np.float32)[..., None]
    used = (_array(edges, f"{top}/positions") >= 0)[..., None]
    cases.update(layer_cases(vectors["clm-layers"], selections["clm-layers"]))
    cases["edges: int8 rounding ties"] = bool((used & (np.abs(ratio - np.trunc(ratio)) == 0.5)).any())
    cases["edges: an all-zero inner chunk (label 0 in row 0)"] = _array(edges, "label")[0] == 0
    cases.update(clm_cases(vectors["clm"], vectors["clm-sample"], selections))
    cases.update(seq2seq_cases(vectors["seq2seq"], selections["seq2seq"]))
    missing = [case for case, held in cases.items() if not held]
    if missing:
        raise SystemExit(f"the conformance vectors lost their cases: {'; '.join(missing)}")


def _midpoint_distance(x: np.ndarray) -> np.ndarray:
    """How far each float64 value lies from the float16 rounding midpoint next to it, in float16 ulps (0 to 0.5)."""
    rounded = x.astype(np.float16)
    neighbour = np.nextafter(rounded, np.where(x > rounded, np.inf, -np.inf).astype(np.float16))
    step = np.abs(neighbour.astype(np.float64) - rounded)
    return np.abs(x - (rounded.astype(np.float64) + neighbour) / 2) / step


def check_logprob_margins(work: Path, vectors: dict[str, dict], selections: dict[str, dict]) -> None:
    """Refuse LM vectors whose float16 log-probs a last-bit change would round otherwise: hsk's log-softmax is
    torch's float32 one (not exact: its exp and log differ between CPUs in the last float32 bits), so each
    stored log-prob must be float16(float64 log-softmax of the exact logits) and lie MIN_MARGIN from a midpoint."""
    import torch
    from transformers import AutoModelForCausalLM

    from hskstore.format.seq2seq import Seq2seqSelection
    from pipelines.core.pair_models import pair_model

    model = AutoModelForCausalLM.from_pretrained(work / "clm-teacher", dtype=torch.float64).eval()
    clm, s2s = vectors["clm"], vectors["seq2seq"]
    sel = Seq2seqSelection.from_dict(selections["seq2seq"])
    inputs = pair_model(sel.architecture).inputs(*(_array(s2s, name) for name in (
        "source_ids", "source_length", "teacher_ids", "teacher_length")), sel, "cpu")
    with torch.no_grad():
        logits = {"clm": model(input_ids=torch.as_tensor(_array(clm, "input_ids").astype(np.int64))).logits,
                  "seq2seq": inputs.target_logits(model(**inputs.kwargs).logits)}
    for name, vector in (("clm", clm), ("seq2seq", s2s)):
        kept = np.array(vector["decoded"]["kept"], dtype=bool)
        exact = np.take_along_axis(torch.log_softmax(logits[name], -1).numpy(),
                                   np.array(vector["decoded"]["ids"]), -1)[kept]
        stored = np.array(vector["decoded"]["logprobs"])[kept]
        margin = _midpoint_distance(exact).min()
        if not (exact.astype(np.float16) == stored).all() or margin < MIN_MARGIN:
            raise SystemExit(f"{name}: a float16 log-prob is {margin:.2g} of a float16 ulp from a rounding midpoint "
                             f"(under {MIN_MARGIN}), or not float16 of the exact log-prob: another CPU may round it "
                             "otherwise; change the teacher's seed")


def generate(out: Path) -> list[Path]:
    """Write every bundle and its JSON into `out`; returns the files written."""
    import exact_teachers

    from hskstore.share.bundle import pack

    out.mkdir(parents=True, exist_ok=True)
    exact_teachers.register()
    vectors, selections = {}, {}
    with tempfile.TemporaryDirectory(prefix="hsk-conformance-") as tmp:
        work = Path(tmp)
        build_teachers(work)
        for name in dump_stores(work):
            bundle = pack(str(work / f"{name}.zarr"), out / f"{name}.hsk.zip", overwrite=True)
            vectors[name] = {**expected(bundle), "source_texts": source_texts(name)}
            selections[name] = selection(bundle)
        vectors["edges"]["source_values"] = expected(work / "edges-float16.zarr")["decoded_values"]
        for name in ("clm", "clm-sample", "clm-hidden", "clm-layers"):
            vectors[name]["source_tokens"] = source_tokens(work)
        vectors["seq2seq"]["source_tokens"] = pair_tokens(work)
        check_logprob_margins(work, vectors, selections)
    check_coverage(vectors, selections)
    written = []
    for name, vector in vectors.items():
        doc = out / f"{name}.json"
        doc.write_text(json.dumps(vector, separators=(",", ":")) + "\n")
        written += [out / f"{name}.hsk.zip", doc]
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write the vectors to (default: here)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for path in generate(args.out):
        print(f"{path.stat().st_size:>8}  {path.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
