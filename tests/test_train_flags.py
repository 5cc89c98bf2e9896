"""`hsk train`'s flags as typed fields (pipelines/train_flags.py, the kinds' own in pipelines/kinds/): every
flag is a declared field, each becomes the TrainOptions field its name says, and the names TrainOptions refuses
with are the flags' own."""

from __future__ import annotations

import dataclasses

import pytest

from hskstore.format.config import ConfigError
from pipelines import runkinds
from pipelines.cli.train_commands import TRAIN_TABLE
from pipelines.core.flags import flag_fields, flag_name
from pipelines.train.options import TrainOptions, cli_flag
from pipelines.train_flags import MethodCommon, RunSource, TrainCommon

# TrainCommon fields that are not TrainOptions fields of the same name, and the TrainOptions field each fills
RENAMED = {"read_threads": "workers", "shuffle_window": "buffer_shards", "compile_mode": "compile"}
NOT_OPTIONS = {"store", "student", "out"}  # the driver's arguments


def test_every_train_option_is_a_declared_field():
    declared = {f.name for f, _ in flag_fields(TrainCommon)} | {f.name for f, _ in flag_fields(MethodCommon)}
    for kind in runkinds.builtin_kinds():
        for options in (kind.method_flags, kind.train_options):
            if options is not None:
                declared |= {f.name for f, _ in flag_fields(options)}
    assert set(TRAIN_TABLE.params) == declared | {"set_"}


def test_each_flag_fills_its_train_options_field_and_is_named_as_train_options_names_it():
    common = TrainCommon(student="bert2", out="runs/x", seed=3, read_threads=0, shuffle_window=7, compile=True,
                         compile_mode="max-autotune", max_steps=5, evaluate=False, teacher="moved")
    options = common.options({"epochs": 2.0}, threads=4)
    assert (options.seed, options.workers, options.buffer_shards, options.compile) == (3, 0, 7, "max-autotune")
    assert (options.max_steps, options.evaluate, options.threads, options.method_options) == (5, False, 4,
                                                                                               {"epochs": 2.0})
    assert options.teacher is None and common.source() == RunSource(None, "moved")  # no store: online mode
    moved = dataclasses.replace(common, store="s.zarr")  # with a store: where its teacher is now
    assert moved.options({}, None).teacher == "moved" and moved.source() == RunSource("s.zarr", None)
    names = {f.name for f in dataclasses.fields(TrainOptions)}
    for f, _ in flag_fields(TrainCommon):
        if f.name in NOT_OPTIONS or f.name == "compile":
            continue
        field = RENAMED.get(f.name, f.name)
        assert field in names, f.name
        if field != "compile":
            assert cli_flag(field) == flag_name(f), f.name


def test_online_choices_are_read_before_torch_and_a_bad_one_is_refused():
    from pipelines.kinds.task import TaskTrainOptions

    with pytest.raises(ConfigError, match="--config"):
        TaskTrainOptions(config="3-8-0.2")
    options, source = TaskTrainOptions(task="sst2", train_limit=8).apply(TrainOptions(), RunSource("s.zarr"))
    assert (source.store, source.task, options.train_limit, options.online) == ("s.zarr", "sst2", 8, None)


def test_a_run_identity_reads_back_as_written_and_names_what_differs():
    from pipelines.train.run.checkpoints import RunIdentity

    mine = RunIdentity("kd", {"epochs": 4.0, "stages": ("pred",)}, "bert2", "sha256:ab", batch_size=8,
                       options={"seed": 0, "max_steps": 5})
    assert RunIdentity.read(mine.to_json()).to_json() == mine.to_json()
    assert RunIdentity.read({"student": "bert2"}) is None and RunIdentity.read(None) is None
    other = dataclasses.replace(mine, options={"seed": 0, "max_steps": 3}, student="bert3")
    assert mine.differences(other) == "--max-steps 3 there, 5 here; --student bert3 there, bert2 here"
