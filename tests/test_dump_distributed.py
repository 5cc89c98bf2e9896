"""The dump on dask.distributed: the same bytes as one process, and a killed worker costs only its shard.

A tiny 4-layer teacher, SST-2 rows, shards of 4; clusters of 2 worker processes on loopback.
"""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import chunk_bytes, dump_killing_a_worker
from conftest import dump_args as shared_dump_args

from hskstore import open_store
from pipelines.cli import main

SHARD = 4


dump_args = functools.partial(shared_dump_args, config="2,4,0.5", student_layers=2, shard_rows=SHARD, batch_size=4)


def same_threads() -> list[str]:
    """Workers with the torch threads of this process's single-process dump: on CPU, float32 sums
    (logits, attention scores) depend on the thread count."""
    return ["--threads-per-worker", str(torch.get_num_threads())]


@pytest.mark.slow
def test_workers_write_the_bytes_of_a_single_process_dump(teacher_dir, glue_dir, tmp_path, capsys):
    rows = 24
    assert main(dump_args(teacher_dir, glue_dir, tmp_path / "one.zarr", rows=rows)) == 0
    capsys.readouterr()
    assert main(dump_args(teacher_dir, glue_dir, tmp_path / "two.zarr", rows=rows) + ["--workers", "2"]
                + same_threads()) == 0
    assert "local cluster of 2 processes" in capsys.readouterr().out
    one, two = open_store(str(tmp_path / "one.zarr")), open_store(str(tmp_path / "two.zarr"))
    assert two.meta["checksums"] == one.meta["checksums"] and two.verify() == []
    assert chunk_bytes(tmp_path / "two.zarr") == chunk_bytes(tmp_path / "one.zarr")
    assert main(dump_args(teacher_dir, glue_dir, tmp_path / "x.zarr", rows=rows) + ["--workers", "0"]) == 2
    both = ["--workers", "2", "--scheduler", "tcp://127.0.0.1:1"]
    assert main(dump_args(teacher_dir, glue_dir, tmp_path / "x.zarr", rows=rows) + both) == 2
    err = capsys.readouterr().err
    assert err.count("hsk: error:") == 2 and "Traceback" not in err


def test_killed_worker_has_its_shard_recomputed(teacher_dir, glue_dir, tmp_path, dask_cluster):
    local_cluster, client = dask_cluster
    rows = 64  # 16 shards
    assert main(dump_args(teacher_dir, glue_dir, tmp_path / "ref.zarr", rows=rows)) == 0
    out = tmp_path / "k.zarr"
    args = dump_args(teacher_dir, glue_dir, out, rows=rows) + ["--scheduler", local_cluster.scheduler_address]
    code, _ = dump_killing_a_worker(args + same_threads(), out, client)
    assert code == 0
    assert open_store(str(out)).meta["checksums"] == open_store(str(tmp_path / "ref.zarr")).meta["checksums"]
    assert chunk_bytes(out) == chunk_bytes(tmp_path / "ref.zarr")
    assert main(["verify", str(out)]) == 0
