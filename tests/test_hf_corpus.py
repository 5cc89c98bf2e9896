"""A Hugging Face dataset as an LM dump's corpus (pipelines/dump/hf_corpus.py): a folder saved with save_to_disk,
and `hf:NAME@SPLIT` loaded with streaming=True (a local folder of data files here: the hub is out of reach), for
the causal-LM and seq2seq dumps: the bytes of the same text read from files, resume seeking to the row (a streamed
dataset taking up its recorded iteration state, the data files before it never opened), and the offline hub
refused in one line."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import zarr
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
from hskstore.io.outputs import LEASE_NAME
from pipelines.cli import main
from pipelines.core.data import DataError
from pipelines.dump import corpus as corpus_module
from pipelines.dump.corpus import STATES
from pipelines.dump.hf_corpus import SNAPSHOT_ROWS, dataset_rows, unversioned


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
    starts = recorded_starts(monkeypatch, corpus_module, "dataset_rows",
                             lambda location, kind, names, start, resume: start)
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


def _data_files(folder: Path, rows: int, kind: str) -> Path:
    """corpus_lines as six data files of `rows` rows each (Parquet in row groups of 8, or JSON lines)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    lines = [line.strip() for line in corpus_lines(6 * rows)]
    for f in range(6):
        part = lines[f * rows:(f + 1) * rows]
        if kind == "parquet":
            pq.write_table(pa.table({"text": part}), folder / f"part-{f:02d}.parquet", row_group_size=8)
        else:
            (folder / f"part-{f:02d}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in part),
                                                        encoding="utf-8")
    return folder


def _garbled(path: Path) -> None:
    """The file's bytes replaced by as many that no reader takes (its name and size kept)."""
    path.write_bytes(b"\xff" * path.stat().st_size)


def test_a_stream_taken_up_at_a_rows_state_gives_the_rows_after_it_without_the_files_before(tmp_path, capsys):
    folder = _data_files(tmp_path / "jsonl", 20, "jsonl")
    spec = f"hf:{folder}@train"
    rows = list(dataset_rows(spec, "hf-stream", ("text",), 0))
    assert [row for _, row, _ in rows] == list(range(120))
    assert rows[0][2] is None and rows[SNAPSHOT_ROWS][2].row == SNAPSHOT_ROWS  # a state every SNAPSHOT_ROWS rows
    other = replace(rows[70][2], state={**rows[70][2].state, "shuffled": None})  # not this datasets' layout
    assert [row for _, row, _ in dataset_rows(spec, "hf-stream", ("text",), 70, other)] == list(range(70, 120))
    assert "WARNING: --data-file hf:" in capsys.readouterr().err  # and the stream read from its start
    # a damaged record whose row is past the resume point: taken up there, rows 70-95 would be lost
    ahead = rows[96][2]
    assert [row for _, row, _ in dataset_rows(spec, "hf-stream", ("text",), 70, ahead)] == list(range(70, 120))
    assert "(row 96) is not at or before the resume point (row 70)" in capsys.readouterr().err
    _garbled(folder / "part-01.jsonl")  # rows 20-39: before the state of any row from 64 on
    for start in (64, 70, 99, 119):
        state = rows[start][2]
        assert start - SNAPSHOT_ROWS < state.row <= start
        again = list(dataset_rows(spec, "hf-stream", ("text",), start, state))
        assert [(values, row) for values, row, _ in again] == [(values, row) for values, row, _ in rows[start:]]
    with pytest.raises(DataError, match="cannot read row 20"):  # read from its first row, it meets the garbled file
        list(dataset_rows(spec, "hf-stream", ("text",), 70))
    sha = "0123456789abcdef" * 2 + "01234567"  # a hub file's path names the commit (datasets' load.py); not compared
    assert unversioned(f"hf://datasets/org/web@{sha}/data/00.parquet") == "hf://datasets/org/web/data/00.parquet"


def _kept(store: Path) -> dict[str, str]:
    """The store's files but the lease (the killed dump's, taken over and released by the refused rerun)."""
    return {name: digest for name, digest in tree_hashes(store).items() if name != LEASE_NAME}


def _stream_clm(teacher: Path, folder: Path) -> list[str]:
    return ["dump", "--objective", "clm", "--teacher", str(teacher), "--data-file", f"hf:{folder}", "--support",
            "topk:4", "--block-size", "32", "--shard-rows", "8", "--batch-size", "8", "--no-progress", "--device",
            "cpu"]


@pytest.mark.slow
def test_kill_9_takes_a_streamed_dataset_up_at_its_recorded_state(clm_teacher, tmp_path, capsys):
    folder = _data_files(tmp_path / "parquet", 24, "parquet")  # 144 rows: 23 shards
    args = _stream_clm(clm_teacher, folder)
    assert main([*args, "--out", str(tmp_path / "whole.zarr")]) == 0
    killed, other = tmp_path / "k.zarr", tmp_path / "other.zarr"
    kill_dump_midway(args, killed, shards=14)
    resume_at = resume_offset(killed)
    group = zarr.open_group(str(killed), mode="r")
    done = group["_progress/done"][:]
    pending = int(done.argmin()) if not done.all() else len(done)  # the arrays grow as a stream is read
    state = json.loads(bytes(group[STATES][pending - 1]).rstrip(b"\0"))
    assert 64 <= state["row"] <= resume_at < state["row"] + SNAPSHOT_ROWS  # in the third file or later
    shutil.copytree(killed, other)
    _garbled(folder / "part-01.parquet")  # rows 24-47: wholly before the state, never opened again
    assert main([*args, "--out", str(killed)]) == 0
    assert chunk_bytes(killed) == chunk_bytes(tmp_path / "whole.zarr")
    resumed, whole = (zarr.open_group(str(p), mode="r").attrs["hsk"] for p in (killed, tmp_path / "whole.zarr"))
    assert resumed["dataset"] == whole["dataset"]  # the fingerprint's chain taken up where the kill left it
    assert main(["verify", str(killed)]) == 0
    capsys.readouterr()

    before = _kept(other)
    shutil.copy(folder / "part-05.parquet", folder / "part-06.parquet")  # a data file more: not the stream it was
    assert main([*args, "--out", str(other)]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("hsk: error: --data-file hf:") and "6 files then, 7 now" in line and "--overwrite" in line
    assert _kept(other) == before  # the shards written, their cursors and states: all there to resume
    (folder / "part-06.parquet").unlink()
    del zarr.open_group(str(other))[STATES]  # no recorded state: the stream is read from its first row, as before
    assert main([*args, "--out", str(other)]) == 2
    assert "cannot read row 24" in capsys.readouterr().err
