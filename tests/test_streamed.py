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


def test_a_dump_stopped_when_every_shard_it_had_room_for_was_done_reads_on(clm_teacher, clm_corpus, tmp_path,
                                                                          monkeypatch):
    """A streamed store grows (doubling) as the corpus comes: stopped after the last shard it had room for, before
    it grew, every progress row is done but the corpus is not; the resume reads on and writes the whole store."""
    import zarr
    from conftest import chunk_bytes

    from hskstore.format.schema import PROGRESS_DONE

    more = ("--limit", "120")  # past the 16 shards a store starts with room for
    assert main(clm_dump_args(clm_teacher, clm_corpus, tmp_path / "whole.zarr", *more)) == 0
    grow = streamed.StreamedShards._make_room

    def stopping(self, shard, rows, last):
        if shard >= 2 and shard * self.writer.metadata.layout.shard_rows + rows > self.writer.metadata.layout.n_rows:
            raise RuntimeError(f"stopped before shard {shard}")
        return grow(self, shard, rows, last)

    monkeypatch.setattr(streamed.StreamedShards, "_make_room", stopping)
    out = tmp_path / "stopped.zarr"
    with pytest.raises(RuntimeError, match="stopped before shard"):
        main(clm_dump_args(clm_teacher, clm_corpus, out, *more))
    group = zarr.open_group(str(out), mode="r")
    assert group[PROGRESS_DONE][:].all() and not group.attrs["hsk"].get("complete")  # the case, not a kill's luck
    monkeypatch.setattr(streamed.StreamedShards, "_make_room", grow)
    assert main(clm_dump_args(clm_teacher, clm_corpus, out, *more)) == 0
    assert chunk_bytes(out) == chunk_bytes(tmp_path / "whole.zarr")
