"""The seq2seq dump on dask.distributed (pipelines/dump/seq2seq_distributed.py): the driver streams and tokenizes
the pairs, workers decode and compute whole shards; the bytes of one process, also when a worker is killed."""

from __future__ import annotations

import pytest
import torch
from conftest import chunk_bytes, dump_killing_a_worker

from hskstore import open_store
from pipelines.cli import main


def _args(teacher, pairs, out, *extra: str) -> list[str]:
    return ["dump", "--objective", "seq2seq", "--teacher", str(teacher), "--data-file", str(pairs), "--support",
            "topk:4", "--decode", "greedy", "--max-length", "40", "--max-target", "16", "--shard-rows", "2",
            "--batch-size", "2", "--no-progress", "--device", "cpu", "--threads", str(torch.get_num_threads()),
            "--out", str(out), *extra]


@pytest.fixture(scope="module")
def one_process(s2s_teachers, s2s_pairs, tmp_path_factory):
    out = tmp_path_factory.mktemp("s2s_dask") / "one.zarr"
    assert main(_args(s2s_teachers["t5"], s2s_pairs, out)) == 0
    return out


@pytest.mark.slow
def test_a_worker_killed_mid_run_has_its_shard_recomputed_and_the_bytes_are_one_process(
        one_process, s2s_teachers, s2s_pairs, tmp_path, dask_cluster):
    local_cluster, client = dask_cluster
    out = tmp_path / "k.zarr"
    code, _ = dump_killing_a_worker(_args(s2s_teachers["t5"], s2s_pairs, out, "--scheduler",
                                          local_cluster.scheduler_address), out, client)
    assert code == 0
    assert open_store(str(out)).meta["checksums"] == open_store(str(one_process)).meta["checksums"]
    assert chunk_bytes(out) == chunk_bytes(one_process)
    assert open_store(str(out)).meta["dataset"] == open_store(str(one_process)).meta["dataset"]
    assert main(["verify", str(out)]) == 0


@pytest.mark.slow
def test_two_local_workers_write_the_bytes_of_one_process(one_process, s2s_teachers, s2s_pairs, tmp_path, capsys):
    out = tmp_path / "two.zarr"
    assert main(_args(s2s_teachers["t5"], s2s_pairs, out, "--workers", "2")) == 0
    assert "local cluster of 2 processes" in capsys.readouterr().out
    assert chunk_bytes(out) == chunk_bytes(one_process)


def test_a_bad_cluster_request_is_one_line_and_writes_nothing(s2s_teachers, s2s_pairs, tmp_path, capsys):
    before = s2s_pairs.read_bytes()
    for extra, says in ((("--workers", "0"), "--workers"), (("--workers", "2", "--scheduler", "tcp://h:1"),
                                                             "not both"),
                        (("--scheduler", "http://h:1"), "not a dask scheduler address")):
        assert main(_args(s2s_teachers["t5"], s2s_pairs, tmp_path / "bad.zarr", *extra)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "bad.zarr").exists() and s2s_pairs.read_bytes() == before
