"""The causal-LM dump on dask.distributed (pipelines/dump/clm_distributed.py): the driver streams and packs the
corpus, workers compute and write whole shards; the bytes of one process, also when a worker is killed."""

from __future__ import annotations

import pytest
import torch
from conftest import chunk_bytes, dump_killing_a_worker

from hskstore import open_store
from pipelines.cli import main


def _args(teacher, corpus, out, *extra: str) -> list[str]:
    return ["dump", "--objective", "clm", "--teacher", str(teacher), "--text-file", str(corpus), "--support",
            "topk:4", "--block-size", "16", "--shard-rows", "4", "--batch-size", "4", "--limit-tokens", "1600",
            "--no-progress", "--device", "cpu", "--out", str(out), *extra]


@pytest.fixture(scope="module")
def one_process(clm_teacher, clm_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("clm_dask") / "one.zarr"
    assert main(_args(clm_teacher, clm_corpus, out)) == 0
    return out


@pytest.mark.slow
def test_a_worker_killed_mid_run_has_its_shard_recomputed_and_the_bytes_are_one_process(
        one_process, clm_teacher, clm_corpus, tmp_path, dask_cluster):
    local_cluster, client = dask_cluster
    out = tmp_path / "k.zarr"
    args = _args(clm_teacher, clm_corpus, out, "--scheduler", local_cluster.scheduler_address, "--threads",
                 str(torch.get_num_threads()))
    code, _ = dump_killing_a_worker(args, out, client)
    assert code == 0
    assert open_store(str(out)).meta["checksums"] == open_store(str(one_process)).meta["checksums"]
    assert chunk_bytes(out) == chunk_bytes(one_process)
    assert main(["verify", str(out)]) == 0


@pytest.mark.slow
def test_two_local_workers_write_the_bytes_of_one_process(one_process, clm_teacher, clm_corpus, tmp_path, capsys):
    out = tmp_path / "two.zarr"
    assert main(_args(clm_teacher, clm_corpus, out, "--workers", "2", "--threads", str(torch.get_num_threads()))) == 0
    assert "local cluster of 2 processes" in capsys.readouterr().out
    assert chunk_bytes(out) == chunk_bytes(one_process)
    assert open_store(str(out)).meta["dataset"] == open_store(str(one_process)).meta["dataset"]


@pytest.mark.slow
@pytest.mark.parametrize("support", [("hidden:int8",), ("hidden:fit", "--hidden-fit-tokens", "96")])
def test_a_hidden_state_dump_on_the_cluster_writes_the_bytes_and_head_of_one_process(support, clm_teacher, clm_corpus,
                                                                                        tmp_path, dask_cluster):
    """--support hidden: the driver measures the reconstruction and writes the head once (a fitted basis: fits it
    and writes its encoder, which the workers' jobs carry), the workers compute hidden shards: the selection, head
    and chunks of a one-process dump."""
    hidden = ["--support", *support, "--limit-tokens", "320", "--threads", str(torch.get_num_threads())]
    one, spread = tmp_path / "one.zarr", tmp_path / "spread.zarr"
    assert main([*_args(clm_teacher, clm_corpus, one), *hidden]) == 0
    assert main([*_args(clm_teacher, clm_corpus, spread), *hidden, "--scheduler",
                 dask_cluster[0].scheduler_address]) == 0
    store = open_store(str(spread))
    assert store.clm.support == "hidden" and store.meta["selection"] == open_store(str(one)).meta["selection"]
    assert chunk_bytes(spread) == chunk_bytes(one)
    assert [a.tobytes() for a in store.head() if a is not None] == [
        a.tobytes() for a in open_store(str(one)).head() if a is not None]
    assert main(["verify", str(spread)]) == 0
