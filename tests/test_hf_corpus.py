"""A Hugging Face dataset as an LM dump's corpus (pipelines/dump/hf_corpus.py): a folder saved with save_to_disk,
and `hf:NAME@SPLIT` loaded with streaming=True (a local folder of data files here: the hub is out of reach), for
the causal-LM and seq2seq dumps: the bytes of the same text read from files, resume seeking to the row, and the
offline hub refused in one line."""

from __future__ import annotations

import json

import pytest
from conftest import (
    chunk_bytes,
    corpus_lines,
    hsk,
    kill_dump_midway,
    one_error_line,
    recorded_starts,
    resume_offset,
    tree_hashes,
)

from hskstore import open_store
from pipelines.cli import main
from pipelines.dump import corpus as corpus_module


def _clm(teacher, *source: str) -> list[str]:
    return ["dump", "--objective", "clm", "--teacher", str(teacher), *source, "--support", "topk:4", "--block-size",
            "16", "--shard-rows", "4", "--batch-size", "4", "--limit-tokens", "640", "--no-progress", "--device", "cpu"]


def _s2s(teacher, *source: str) -> list[str]:
    return ["dump", "--objective", "seq2seq", "--teacher", str(teacher), *source, "--support", "topk:4",
            "--max-length", "40", "--max-target", "16", "--shard-rows", "4", "--batch-size", "4", "--no-progress",
            "--device", "cpu"]


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """80 documents: as a text file, a saved Dataset and a folder of JSON lines (for hf:FOLDER@train)."""
    import datasets

    root = tmp_path_factory.mktemp("hf_corpus")
    lines = [line.strip() for line in corpus_lines(80)]
    (root / "corpus.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    datasets.Dataset.from_dict({"id": list(range(80)), "text": lines}).save_to_disk(str(root / "saved"))
    (root / "files").mkdir()
    (root / "files" / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines),
                                                encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def from_text(clm_teacher, texts):
    out = texts / "text.zarr"
    assert main([*_clm(clm_teacher, "--text-file", str(texts / "corpus.txt")), "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("given", ["saved", "stream"])
def test_a_dataset_gives_the_bytes_of_its_text_file(clm_teacher, texts, from_text, tmp_path, given):
    data = str(texts / "saved") if given == "saved" else f"hf:{texts / 'files'}@train"
    out = tmp_path / "hf.zarr"
    assert main([*_clm(clm_teacher, "--data-file", data), "--out", str(out)]) == 0
    assert chunk_bytes(out) == chunk_bytes(from_text)
    meta, text_meta = open_store(str(out)).meta, open_store(str(from_text)).meta
    assert meta["dataset"]["fingerprint"] == text_meta["dataset"]["fingerprint"]  # the same documents, in order
    assert meta["data_origin"]["kind"] == "stream"


def test_seq2seq_pairs_from_a_saved_dataset_are_the_tsvs(s2s_teachers, s2s_pairs, tmp_path):
    import datasets

    rows = [line.split("\t") for line in s2s_pairs.read_text(encoding="utf-8").splitlines()[1:]]
    datasets.Dataset.from_dict({"tgt": [r[1] for r in rows], "src": [r[0] for r in rows]}).save_to_disk(
        str(tmp_path / "pairs"))
    assert main([*_s2s(s2s_teachers["t5"], "--data-file", str(s2s_pairs)), "--out", str(tmp_path / "tsv.zarr")]) == 0
    assert main([*_s2s(s2s_teachers["t5"], "--data-file", str(tmp_path / "pairs"), "--text-columns", "src,tgt"),
                 "--out", str(tmp_path / "hf.zarr")]) == 0
    assert chunk_bytes(tmp_path / "hf.zarr") == chunk_bytes(tmp_path / "tsv.zarr")


@pytest.mark.slow
def test_kill_9_resumes_a_saved_dataset_at_its_row(clm_teacher, texts, from_text, tmp_path, monkeypatch):
    args = _clm(clm_teacher, "--data-file", str(texts / "saved"))
    kill_dump_midway(args, tmp_path / "k.zarr", shards=2)
    resume_at = resume_offset(tmp_path / "k.zarr")  # the row of the document the first pending shard starts in
    assert resume_at > 0
    starts = recorded_starts(monkeypatch, corpus_module, "dataset_rows", lambda location, kind, names, start: start)
    assert main([*args, "--out", str(tmp_path / "k.zarr")]) == 0
    assert starts == [resume_at]
    assert chunk_bytes(tmp_path / "k.zarr") == chunk_bytes(from_text)
    assert main(["verify", str(tmp_path / "k.zarr")]) == 0


def test_a_hub_dataset_offline_is_one_line_and_writes_nothing(clm_teacher, texts, tmp_path):
    before = tree_hashes(texts)
    result = hsk(*_clm(clm_teacher, "--data-file", "hf:someone/no-such-corpus:plain@train"), "--out",
                 str(tmp_path / "hub.zarr"))
    one_error_line(result, "hf:someone/no-such-corpus", "cannot load the Hugging Face dataset", "save_to_disk")
    assert not (tmp_path / "hub.zarr").exists() and tree_hashes(texts) == before
    assert main([*_clm(clm_teacher, "--data-file", str(texts / "saved"), "--text-columns", "body"), "--out",
                 str(tmp_path / "x.zarr")]) == 2  # a column the dataset lacks
    assert not (tmp_path / "x.zarr").exists()
