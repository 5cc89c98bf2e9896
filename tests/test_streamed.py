"""pipelines/dump/streamed.py: a streamed dump's shard loop."""

from __future__ import annotations

import gc

import pytest
from conftest import clm_dump_args

from pipelines.cli import main
from pipelines.dump import streamed


def test_the_heap_is_frozen_while_shards_stream_and_thawed_after(clm_teacher, clm_corpus, tmp_path, monkeypatch):
    """Objects alive before the stream are out of the collector's passes while shards are written (a full pass
    over them cost 0.3-0.5 s a time), and back in them after the dump, or after one that fails."""
    frozen = []
    put = streamed.LocalShards.put

    def recording(self, shard, rows, first_row):
        frozen.append(gc.get_freeze_count())
        return put(self, shard, rows, first_row)

    monkeypatch.setattr(streamed.LocalShards, "put", recording)
    before = gc.get_freeze_count()
    assert main(clm_dump_args(clm_teacher, clm_corpus, tmp_path / "lm.zarr")) == 0
    assert frozen and min(frozen) > before + 1000 and gc.get_freeze_count() == before

    def failing(self, shard, rows, first_row):
        raise RuntimeError("a shard failed")

    monkeypatch.setattr(streamed.LocalShards, "put", failing)
    with pytest.raises(RuntimeError, match="a shard failed"):
        main(clm_dump_args(clm_teacher, clm_corpus, tmp_path / "failed.zarr"))
    assert gc.get_freeze_count() == before
