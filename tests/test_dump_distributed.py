"""The dump on dask.distributed: the same bytes as one process, and a killed worker costs only its shard.

A tiny 4-layer teacher, SST-2 rows, shards of 4; clusters of 2 worker processes on loopback.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time

import pytest
import torch
import zarr
from conftest import chunk_bytes
from conftest import dump_args as shared_dump_args

from hskstore import open_store
from hskstore.format.schema import PROGRESS_DONE
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


@pytest.fixture
def cluster():
    """A LocalCluster of 2 worker processes (with nannies, which restart a killed worker)."""
    import logging

    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as c, Client(c) as client:
        yield c, client


def test_killed_worker_has_its_shard_recomputed(teacher_dir, glue_dir, tmp_path, cluster):
    local_cluster, client = cluster
    rows = 64  # 16 shards
    assert main(dump_args(teacher_dir, glue_dir, tmp_path / "ref.zarr", rows=rows)) == 0
    out = tmp_path / "k.zarr"
    args = dump_args(teacher_dir, glue_dir, out, rows=rows) + ["--scheduler", local_cluster.scheduler_address]
    args += same_threads()
    status: dict = {}
    driver = threading.Thread(target=lambda: status.update(code=main(args)))
    driver.start()
    killed = None
    deadline = time.time() + 180
    while killed is None and driver.is_alive() and time.time() < deadline:
        try:
            done = zarr.open_group(str(out), mode="r")[PROGRESS_DONE][:]
        except Exception:  # the store is not created yet
            done = None
        busy = [addr for addr, tasks in client.processing().items() if tasks]
        if done is not None and done.sum() >= 2 and busy:
            pids = client.run(os.getpid)
            killed = (busy[0], pids[busy[0]], int(done.sum()), len(done))
            os.kill(killed[1], signal.SIGKILL)  # the worker process itself, mid-shard
        time.sleep(0.02)
    driver.join(timeout=300)
    assert killed is not None, "the kill should land mid-dump"
    assert killed[2] < killed[3], "the dump was not finished at the kill"
    assert status.get("code") == 0
    assert open_store(str(out)).meta["checksums"] == open_store(str(tmp_path / "ref.zarr")).meta["checksums"]
    assert chunk_bytes(out) == chunk_bytes(tmp_path / "ref.zarr")
    assert main(["verify", str(out)]) == 0
    assert killed[1] not in client.run(os.getpid).values()  # that process is gone; the nanny started another
