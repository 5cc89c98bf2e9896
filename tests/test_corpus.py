"""A causal-LM dump's streamed corpus (pipelines/dump/corpus.py, hskstore.format.clm.pack_stream): the same blocks
as the whole-corpus packing, read from files, folders, JSON lines and Parquet, resumed from the recorded cursor
without reading the corpus before it; refusals of what it cannot read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import chunk_bytes, hsk, kill_dump_midway, recorded_starts, resume_offset, tree_hashes

from hskstore.format.clm import (
    DocumentText,
    documents_owned,
    owned_bytes,
    pack_blocks,
    pack_stream,
    pack_token_bytes,
    token_ends,
)
from hskstore.format.config import ConfigError
from pipelines.cli import main
from pipelines.dump import corpus as corpus_module
from pipelines.dump.corpus import CURSORS, Cursor, open_corpus


def _args(teacher: Path, text: Path, *extra: str) -> list[str]:
    return ["dump", "--objective", "clm", "--teacher", str(teacher), "--text-file", str(text), "--support", "topk:4",
            "--block-size", "16", "--shard-rows", "4", "--batch-size", "4", "--no-progress", "--device", "cpu",
            *extra]


@pytest.mark.parametrize("seed", range(4))
def test_streamed_packing_is_the_whole_corpus_packing_and_resumes_from_any_end(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        docs = [list(rng.integers(1, 50, rng.integers(0, 12))) for _ in range(rng.integers(0, 30))]
        block, rows = int(rng.integers(1, 7)), int(rng.integers(1, 4))
        limit = None if rng.random() < 0.5 else int(rng.integers(1, 200))
        blocks, lengths = pack_blocks(docs, block, 0, limit)
        parts = list(pack_stream(((d, i) for i, d in enumerate(docs)), block, 0, rows, limit))
        assert sum(len(p.blocks) for p in parts) == len(blocks)
        if not parts:
            continue
        assert (np.concatenate([p.blocks for p in parts]) == blocks).all()
        assert (np.concatenate([p.lengths for p in parts]) == lengths).all()
        assert [p.last for p in parts] == [False] * (len(parts) - 1) + [True]
        for k, part in enumerate(parts[:-1]):  # a resume from the end a part records: the rest, exactly
            used = (k + 1) * rows * block
            rest = pack_stream(((d, i) for i, d in enumerate(docs) if i >= part.end), block, 0, rows,
                               None if limit is None else limit - used, part.end_skip)
            assert (np.concatenate([p.blocks for p in rest]) == blocks[(k + 1) * rows:]).all()


@pytest.mark.parametrize("seed", range(2))
def test_streamed_text_is_the_whole_corpus_text_and_resumes_from_any_end(seed):
    """The blocks' token byte lengths and texts, packed a few rows at a time and resumed where a part ends, are
    the whole corpus's (pack_token_bytes): every byte once, in order, each block's own."""
    rng = np.random.default_rng(seed)
    for _ in range(30):
        texts = ["".join(rng.choice(list("ab é€"), rng.integers(1, 14))) for _ in range(rng.integers(1, 12))]
        ends = [np.sort(rng.integers(0, len(t.encode()) + 1, rng.integers(0, 8))) for t in texts]
        block, rows = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        limit = None if rng.random() < 0.5 else int(rng.integers(1, 60))
        token_bytes, whole = pack_token_bytes(ends, texts, block, limit)
        docs = [(np.zeros(len(e), dtype=np.int64), i, DocumentText(owned_bytes(e, len(t.encode())), t.encode()))
                for i, (e, t) in enumerate(zip(ends, texts, strict=True))]
        parts = list(pack_stream(iter(docs), block, 0, rows, limit))
        assert b"".join(whole) == b"".join(t.encode() for t in texts)[: int(token_bytes.sum())]
        assert [t for p in parts for t in p.texts] == whole
        np.testing.assert_array_equal(np.concatenate([p.token_bytes for p in parts]), token_bytes)
        for k, part in enumerate(parts[:-1]):
            used = (k + 1) * rows * block
            rest = list(pack_stream(iter(docs[part.end:]), block, 0, rows, None if limit is None else limit - used,
                                    part.end_skip))
            assert [t for p in rest for t in p.texts] == whole[(k + 1) * rows:]


def test_documents_owned_is_each_documents_owned_bytes_of_its_token_ends():
    """The batched byte ownership (array operations over all documents at once) is the per-document one, for
    characters of 1 to 4 UTF-8 bytes and offsets past the text, out of order or repeated."""
    rng = np.random.default_rng(0)
    for _ in range(30):
        texts = ["".join(rng.choice(list("ab é€😀"), rng.integers(1, 14))) for _ in range(rng.integers(1, 9))]
        offsets = [sorted(rng.integers(0, len(t) + 3, rng.integers(0, 9))) for t in texts]
        offsets = [list(o) if rng.random() < 0.7 else list(rng.permutation(o)) for o in offsets]
        char_ends = np.array([end for o in offsets for end in o], dtype=np.int64)
        counts = np.array([len(o) for o in offsets])
        batched = documents_owned(char_ends, counts, texts)
        for text, ends, owned in zip(texts, offsets, batched, strict=True):
            expected = owned_bytes(token_ends([(0, e) for e in ends], text), len(text.encode()))
            np.testing.assert_array_equal(owned, expected)
    with pytest.raises(ConfigError, match="spans 70000 bytes"):
        documents_owned(np.array([1, 70001]), np.array([2]), ["a" * 70001])


def test_encode_offsets_are_the_tokenizers_own(clm_teacher):
    """The backend called directly gives the wrapper's ids and offsets; with truncation set on the backend, the
    wrapper (which lifts it) is called."""
    from pipelines.core.models import load_tokenizer

    tokenizer = load_tokenizer(str(clm_teacher))
    texts = ["The cat sat.", "é€ 😀 naïve  spaces ", "x" * 300, "a"]
    wrapper = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    for truncated in (False, True):
        if truncated:
            tokenizer.backend_tokenizer.enable_truncation(max_length=4)
        ids, char_ends, counts = corpus_module.encode_offsets(tokenizer, texts)
        assert ids == wrapper["input_ids"] and counts.tolist() == [len(i) for i in wrapper["input_ids"]]
        assert char_ends.tolist() == [end for o in wrapper["offset_mapping"] for _, end in o]


def test_folders_globs_json_lines_and_parquet_read_their_documents_and_seek(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("one\n\n two \nthree\r\n", encoding="utf-8")
    (tmp_path / "d" / "b.txt").write_text("four\x0cfive\nsix", encoding="utf-8")
    folder = open_corpus(str(tmp_path / "d"), None, None)
    docs = list(folder.documents())
    assert [t for t, _ in docs] == ["one", "two", "three", "four", "five", "six"]  # as str.splitlines split them
    assert [t for t, _ in open_corpus(str(tmp_path / "d" / "*.txt"), None, None).documents()] == [t for t, _ in docs]
    for i, (_, cursor) in enumerate(docs):  # every document's cursor seeks to it
        assert [t for t, _ in folder.documents(cursor)] == [t for t, _ in docs[i:]]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t, "n": i}) + "\n" for i, t in enumerate("xyz")))
    jsonl = list(open_corpus(None, str(tmp_path / "c.jsonl"), "text").documents())
    assert [t for t, _ in jsonl] == ["x", "y", "z"]
    pq.write_table(pa.table({"body": [f"row {i}" for i in range(10)]}), tmp_path / "c.parquet", row_group_size=3)
    table = open_corpus(None, str(tmp_path / "c.parquet"), "body")
    assert [t for t, _ in table.documents(Cursor(0, 7))] == ["row 7", "row 8", "row 9"]


@pytest.fixture(scope="module")
def reference(clm_teacher, clm_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("stream") / "ref.zarr"
    assert main(_args(clm_teacher, clm_corpus, "--limit-tokens", "1200", "--out", str(out))) == 0
    return out


def test_the_streamed_store_holds_the_whole_corpus_packing(reference, clm_teacher, clm_corpus):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(clm_teacher)
    lines = [line.strip() for line in clm_corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    blocks, lengths = pack_blocks(tokenizer(lines, add_special_tokens=False)["input_ids"], 16,
                                  tokenizer.eos_token_id, 1200)
    group = zarr.open_group(str(reference), mode="r")
    assert (group["input_ids"][:] == blocks).all() and (group["length"][:] == lengths).all()
    meta = group.attrs["hsk"]
    assert meta["layout"]["n_rows"] == len(blocks) and meta["dataset"]["n_rows"] > 0
    assert meta["dataset"]["fingerprint"] != meta["stream"]["signature"]  # the documents', computed as read
    assert CURSORS.split("/")[1] not in group["_progress"]
    assert main(["verify", str(reference)]) == 0


@pytest.mark.slow
def test_kill_9_mid_corpus_resumes_from_the_cursor_without_rereading(reference, clm_teacher, clm_corpus, tmp_path,
                                                                      monkeypatch):
    args = _args(clm_teacher, clm_corpus, "--limit-tokens", "1200")
    kill_dump_midway(args, tmp_path / "k.zarr", shards=3)
    resume_at = resume_offset(tmp_path / "k.zarr")  # the byte offset where the first pending shard's rows start
    assert resume_at > 0
    seeks = recorded_starts(monkeypatch, corpus_module, "_lines", lambda source, index, start: start.offset)
    assert main(args + ["--out", str(tmp_path / "k.zarr")]) == 0
    assert seeks == [resume_at]  # one read, from the recorded cursor: nothing before it read again
    assert chunk_bytes(tmp_path / "k.zarr") == chunk_bytes(reference)
    resumed, whole = (zarr.open_group(str(p), mode="r").attrs["hsk"] for p in (tmp_path / "k.zarr", reference))
    assert resumed["dataset"] == whole["dataset"]  # the fingerprint's chain taken up where the kill left it
    assert main(["verify", str(tmp_path / "k.zarr")]) == 0


def test_unreadable_corpora_and_blocks_past_the_teacher_are_one_line(clm_teacher, clm_corpus, tmp_path, capsys):
    (tmp_path / "bin.txt").write_bytes(b"text\n\x00\x01\x02binary\n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    (tmp_path / "empty").mkdir()
    cases = [(["--text-file", str(tmp_path / "bin.txt")], "binary"), (["--text-file", str(tmp_path / "latin1.txt")],
             "not UTF-8"), (["--text-file", str(tmp_path / "empty")], "no files there"),
             (["--block-size", "100000"], "has 256 positions"), (["--workers", "0"], "--workers")]
    before = tree_hashes(tmp_path)
    for extra, words in cases:
        assert main(_args(clm_teacher, clm_corpus, "--out", str(tmp_path / "out.zarr"), *extra)) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hsk: error:") and words in lines[0], (extra, lines)
        assert tree_hashes(tmp_path) == before


def test_fp16_on_a_cpu_is_warned_as_the_encoder_dump_warns(clm_teacher, clm_corpus, tmp_path):
    rc, _, err = hsk(*_args(clm_teacher, clm_corpus, "--precision", "fp16", "--limit-tokens", "64", "--out",
                            str(tmp_path / "h.zarr")))
    assert rc == 0 and "WARNING: --precision fp16 on cpu" in err


def test_the_byte_table_writes_the_offsets_store(clm_teacher, tmp_path, monkeypatch):
    """A byte-level BPE's text arrays from its ids' byte lengths (pipelines/dump/byte_ends.py) are the ones its
    offsets give: the same chunks and content address as with the table turned off, on a corpus of accents,
    emojis, combining characters, CJK, special tokens and runs of spaces."""
    from pipelines.core.models import load_tokenizer

    assert corpus_module.text_table(load_tokenizer(str(clm_teacher))) is not None
    lines = ["naïve café 😀 👩\u200d👩\u200d👧 e\u0301 a\u0308\u0323", "日本語 中文 مرحبا", "<eos> inside",
             "tabs\tand  spaces\u00a0nbsp", "x" * 70, "🇫🇷 1234 3.14"] * 6
    corpus = tmp_path / "tricky.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    stores = []
    for table in (True, False):
        if not table:
            monkeypatch.setattr(corpus_module, "text_table", lambda tokenizer: None)
        stores.append(tmp_path / f"table-{table}.zarr")
        assert main(_args(clm_teacher, corpus, "--out", str(stores[-1]))) == 0
    assert chunk_bytes(stores[0]) == chunk_bytes(stores[1])
    addresses = [zarr.open_group(str(s), mode="r").attrs["hsk"]["manifest"] for s in stores]
    assert addresses[0] == addresses[1]
