"""Stores on a real object store: every store command against SeaweedFS's S3 gateway on loopback.

The server (tests/s3_server.py) is started once per session; the client side reads the standard
AWS variables only, as a user's would. A tiny 4-layer teacher, 64 SST-2 rows, shards of 4.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import dump_args as shared_dump_args
from conftest import save_tiny_teacher

from hskstore import open_store
from pipelines.cli import main

ROOT = Path(__file__).resolve().parents[1]
ROWS, SHARD = 64, 4  # 16 shards: a kill lands mid-dump


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher"), tiny_tokenizer, num_layers=4, seed=1)


dump_args = functools.partial(shared_dump_args, config="2,4,0.5", student_layers=2, rows=ROWS, shard_rows=SHARD,
                              batch_size=8)


def s3_url(name: str) -> str:
    from s3_server import BUCKET

    return f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/{name}"


@pytest.fixture(scope="module")
def local_store(tmp_path_factory, teacher_dir, glue_dir) -> str:
    out = str(tmp_path_factory.mktemp("local") / "s.zarr")
    assert main(dump_args(teacher_dir, glue_dir, out)) == 0
    return out


def test_dump_verify_info_derive_train_on_s3(s3, teacher_dir, glue_dir, local_store, tmp_path, capsys):
    url = s3_url("s.zarr")
    assert main(dump_args(teacher_dir, glue_dir, url)) == 0
    store = open_store(url)
    assert store.meta["complete"] and store.meta["checksums"] == open_store(local_store).meta["checksums"]
    capsys.readouterr()
    assert main(["verify", url]) == 0
    assert f"ok: {url} is complete" in capsys.readouterr().out
    assert main(["info", url]) == 0
    out = capsys.readouterr().out
    assert f"store      {url}" in out and f"rows {ROWS}" in out
    small = s3_url("small.zarr")
    assert main(["derive", url, "--config", "1,2,0.25", "--out", small]) == 0
    local_small = str(tmp_path / "small.zarr")
    assert main(["derive", local_store, "--config", "1,2,0.25", "--out", local_small]) == 0
    assert open_store(small).meta["checksums"] == open_store(local_small).meta["checksums"]
    run = tmp_path / "run"
    code = main([
        "train", "--store", small, "--student", "bert2", "--out", str(run), "--stages", "hsk,pred",
        "--max-steps", "2", "--batch-size", "8", "--data-dir", str(glue_dir), "--eval-limit", "16",
        "--no-progress", "--workers", "1",
    ])
    assert code == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["source"] == small and summary["steps"] == 4 and summary["mode"] == "offline"
    # The endpoint and the credentials come from the environment and are written nowhere.
    secrets = [s3.endpoint.split("//")[1].encode(), *(v.encode() for k, v in s3.env.items() if "KEY" in k)]
    fs = s3.filesystem()
    written = [fs.cat(p) for p in fs.find(url.removeprefix("s3://")) + fs.find(small.removeprefix("s3://"))]
    written += [p.read_bytes() for p in run.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl", ".md")]
    assert len(written) > 20 and not [s for s in secrets for blob in written if s in blob]


@pytest.mark.slow
def test_dump_to_s3_killed_then_rerun_matches_local(s3, teacher_dir, glue_dir, local_store):
    """kill -9 mid-dump, rerun the same command: the S3 store equals a local dump of the same rows."""
    import zarr

    from hskstore.format.schema import PROGRESS_DONE

    url = s3_url("k.zarr")
    args = dump_args(teacher_dir, glue_dir, url)
    proc = subprocess.Popen(
        [sys.executable, "-c", "from pipelines.cli import run; run()", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    done = None
    deadline = time.time() + 300  # a loaded 2-core machine can take minutes to start the process
    while time.time() < deadline and proc.poll() is None:
        try:
            done = zarr.open_group(url, mode="r")[PROGRESS_DONE][:]
            if done.sum() >= 3:
                break
        except Exception:  # the store is not created yet
            pass
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = zarr.open_group(url, mode="r")[PROGRESS_DONE][:]
    assert 0 < done.sum() < len(done), "the kill should land mid-dump"
    assert main(["verify", url]) == 1
    assert main(args) == 0
    assert open_store(url).meta["checksums"] == open_store(local_store).meta["checksums"]
    assert main(["verify", url]) == 0


def test_bundle_on_s3_opens_directly(s3, local_store, tmp_path, capsys):
    bundle = tmp_path / "s.hsk.zip"
    assert main(["pack", local_store, str(bundle), "--no-progress"]) == 0
    url = s3_url("s.hsk.zip")
    s3.filesystem().put(str(bundle), url.removeprefix("s3://"))
    capsys.readouterr()
    assert main(["verify", url]) == 0
    assert "is complete" in capsys.readouterr().out
    assert main(["info", "--card", url]) == 0
    assert capsys.readouterr().out == (Path(local_store) / "README.md").read_text()
    assert main(["unpack", url, str(tmp_path / "copy.zarr")]) == 0
    assert open_store(str(tmp_path / "copy.zarr")).meta == open_store(local_store).meta


def test_clm_kd_streams_a_causal_lm_store_from_s3(s3, clm_teacher, clm_corpus, tmp_path):
    """A causal-LM store on S3 trains as a local one: the same steps and losses, read through the stream."""
    local = tmp_path / "clm.zarr"
    assert main(["dump", "--objective", "clm", "--teacher", str(clm_teacher), "--text-file", str(clm_corpus),
                 "--support", "topk:4", "--block-size", "32", "--limit", "30", "--shard-rows", "4", "--no-progress",
                 "--device", "cpu", "--out", str(local)]) == 0
    url = s3_url("clm.zarr")
    s3.filesystem().put(str(local), url.removeprefix("s3://"), recursive=True)
    runs = {}
    for name, store in (("local", str(local)), ("s3", url)):
        runs[name] = tmp_path / name
        assert main(["train", "--store", store, "--student", "first2", "--method", "clm-kd", "--max-steps", "3",
                     "--batch-size", "4", "--log-every", "1", "--workers", "1", "--device", "cpu", "--no-progress",
                     "--out", str(runs[name])]) == 0
    assert json.loads((runs["s3"] / "summary.json").read_text())["source"] == url
    losses = {name: [json.loads(line).get("loss") for line in (run / "metrics.jsonl").read_text().splitlines()]
              for name, run in runs.items()}
    assert losses["s3"] == losses["local"] and len([x for x in losses["s3"] if x is not None]) == 3


def test_seq2seq_pairs_read_from_s3_give_the_local_bytes(s3, s2s_teachers, s2s_pairs, tmp_path):
    """Pairs in JSON lines on S3 (a glob of two files), streamed into a store on S3: the local TSV's store."""
    rows = [line.split("\t") for line in s2s_pairs.read_text(encoding="utf-8").splitlines()[1:]]
    folder = s3_url("pairs")
    for part, chunk in enumerate((rows[:10], rows[10:])):
        (tmp_path / f"{part}.jsonl").write_text("".join(json.dumps({"src": s, "tgt": t}) + "\n" for s, t in chunk),
                                                encoding="utf-8")
        s3.filesystem().put(str(tmp_path / f"{part}.jsonl"), f"{folder.removeprefix('s3://')}/{part}.jsonl")
    common = ["dump", "--objective", "seq2seq", "--teacher", str(s2s_teachers["t5"]), "--support", "topk:4",
              "--max-length", "40", "--max-target", "16", "--shard-rows", "8", "--no-progress", "--device", "cpu"]
    local, url = tmp_path / "local.zarr", s3_url("s2s.zarr")
    assert main([*common, "--data-file", str(s2s_pairs), "--out", str(local)]) == 0
    assert main([*common, "--data-file", f"{folder}/*.jsonl", "--text-columns", "src,tgt", "--out", url]) == 0
    assert main(["verify", url]) == 0
    remote = open_store(url)
    assert remote.meta["checksums"] == open_store(str(local)).meta["checksums"]
    assert remote.meta["dataset"]["fingerprint"] == open_store(str(local)).meta["dataset"]["fingerprint"]
