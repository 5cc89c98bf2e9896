"""The dump's host schedule (pipelines/dump/pipeline.py): on a CPU, tokenizing and writing never run while the
teacher's forward does (a host thread on one of the forward's cores stalls all of them); off the CPU they
overlap it, with worker counts from the host's cores."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from conftest import save_tiny_teacher

from hskstore.format.config import HSKConfig
from hskstore.io.writer import StoreWriter
from pipelines.dump import pipeline
from pipelines.dump.probe import TeacherProbe
from pipelines.dump.stage import DumpOptions, dump


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, tiny_tokenizer) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher"), tiny_tokenizer, num_layers=4, seed=1)


def recorded_dump(teacher, glue_dir, out, monkeypatch, **kw) -> dict[str, list[tuple[float, float]]]:
    """Run a dump and return the (start, end) intervals of every forward, tokenizing piece and shard write."""
    spans: dict[str, list[tuple[float, float]]] = {"forward": [], "tokenize": [], "write": []}
    lock = threading.Lock()

    def timed(name, fn):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with lock:
                    spans[name].append((start, time.perf_counter()))
        return run

    monkeypatch.setattr(TeacherProbe, "__call__", timed("forward", TeacherProbe.__call__))
    monkeypatch.setattr(pipeline, "encode", timed("tokenize", pipeline.encode))
    monkeypatch.setattr(StoreWriter, "write_shard", timed("write", StoreWriter.write_shard))
    options = DumpOptions(config=HSKConfig.parse("3,4,0.25"), max_length=32, shard_rows=16, batch_size=8,
                          progress=False, **kw)
    dump("sst2", options, teacher=str(teacher), out=str(out), data_dir=str(glue_dir), limit=64, log=lambda *_: None)
    return spans


def overlapping(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> int:
    return sum(1 for s, e in a for s2, e2 in b if s < e2 and s2 < e)


def test_on_a_cpu_host_stages_run_between_forwards(teacher, glue_dir, tmp_path, monkeypatch):
    spans = recorded_dump(teacher, glue_dir, tmp_path / "s.zarr", monkeypatch, device="cpu")
    assert len(spans["write"]) == 4 and len(spans["forward"]) >= 8 and spans["tokenize"]
    assert overlapping(spans["forward"], spans["write"] + spans["tokenize"]) == 0


def test_the_defaults_follow_the_device_and_the_cores(monkeypatch):
    assert not pipeline.overlaps_forward("cpu") and pipeline.overlaps_forward("cuda:1")
    assert pipeline.default_write_depth("cpu") == 1
    monkeypatch.setattr(pipeline, "host_cores", lambda: 16)
    assert pipeline.default_write_depth("cuda") == 4 and pipeline.default_tokenize_threads("cuda") == 4
    assert pipeline.default_tokenize_threads("cpu") == 4
    monkeypatch.setattr(pipeline, "host_cores", lambda: 2)
    assert pipeline.default_write_depth("cuda") == 2 and pipeline.default_tokenize_threads("cpu") == 2
    monkeypatch.setattr(pipeline, "host_cores", lambda: 128)
    assert pipeline.default_write_depth("cuda") == 8 and pipeline.default_tokenize_threads("cuda") == 8
