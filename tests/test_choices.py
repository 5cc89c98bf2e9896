"""The dump's choices, defaults and bounds are declared once (hskstore.format.config); the CLI, DumpOptions and
Selection read them from there, and a value outside them is refused in one line naming the flag."""

from __future__ import annotations

import dataclasses

import pytest

from hskstore.format.config import (
    DUMP_BOUNDS,
    DUMP_CHOICES,
    MLM_BOUNDS,
    STORE_CHOICES,
    STUDENT_LAYERS,
    ConfigError,
    HSKConfig,
    Selection,
    check_at_least,
    check_between,
)
from pipelines.cli import main
from pipelines.dump.stage import DumpOptions


def _flat(text: str) -> str:
    return "".join(text.split())  # the help is wrapped to the terminal, at spaces and after hyphens


def test_dump_help_names_every_choice_its_default_and_every_bound(capsys):
    assert main(["dump", "--help"]) == 0
    text = _flat(capsys.readouterr().out)
    for choice in DUMP_CHOICES:
        assert choice.flag in text and _flat(choice.help) in text, choice.flag
        assert _flat(f"[default: {choice.default}]") in text
    for bound in {*DUMP_BOUNDS, *MLM_BOUNDS, STUDENT_LAYERS}:
        assert bound.flag in text and _flat(bound.help) in text, bound.flag


def test_dump_options_and_selection_take_their_defaults_from_the_declarations():
    defaults = {f.name: f.default for f in dataclasses.fields(DumpOptions)}
    for declared in (*DUMP_CHOICES, *DUMP_BOUNDS, STUDENT_LAYERS):
        assert defaults[declared.field] == declared.default, declared.flag
    selection = {f.name: f.default for f in dataclasses.fields(Selection)}
    for choice in STORE_CHOICES:
        assert selection[choice.field] == choice.default, choice.flag


@pytest.mark.parametrize("choice", DUMP_CHOICES, ids=lambda c: c.flag)
def test_an_unknown_choice_is_refused_in_one_line_naming_the_flag_and_the_choices(choice, capsys, tmp_path):
    out = tmp_path / "s.zarr"
    args = ["dump", "--task", "sst2", "--config", "3,8,0.2", "--out", str(out), choice.flag, "nope"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"hsk: error: unknown {choice.flag} 'nope'; choose one of {', '.join(choice.values)}"
    assert not out.exists()


def test_a_store_selection_names_the_choice_by_its_metadata_label():
    with pytest.raises(ConfigError, match="unknown token strategy 'nope'; choose one of att-nosep, att, left, cls"):
        Selection(HSKConfig(1, 1, 1.0), 8, 2, (2,), (2,), (2,), token_strategy="nope")


@pytest.mark.parametrize("bound", MLM_BOUNDS, ids=lambda b: b.flag)
def test_an_mlm_dump_refuses_a_number_below_its_bound_before_reading_anything(bound, capsys, tmp_path):
    out = tmp_path / "m.zarr"
    args = ["dump", "--objective", "mlm", "--text-file", str(tmp_path / "absent.txt"), "--teacher",
            str(tmp_path / "no-teacher"), "--out", str(out), bound.flag, str(bound.low - 1)]
    assert main(args) == 2
    assert capsys.readouterr().err.strip() == (
        f"hsk: error: {bound.flag} must be an integer >= {bound.low}, got {bound.low - 1}")
    assert not out.exists()


def test_range_checks_say_the_range_and_the_value():
    check_between("--alpha", None, 0.0, 1.0)  # not given: the default applies
    check_between("--alpha", 1.0, 0.0, 1.0)
    with pytest.raises(ConfigError, match=r"^--alpha must be in \[0, 1\], got 1.5$"):
        check_between("--alpha", 1.5, 0.0, 1.0)
    with pytest.raises(ConfigError, match=r"^--set warmup_ratio must be in \[0, 1\), got 1.0$"):
        check_between("--set warmup_ratio", 1.0, 0.0, 1.0, ends="[)")
    with pytest.raises(ConfigError, match="got nan"):
        check_between("--alpha", float("nan"), 0.0, 1.0)
    with pytest.raises(ConfigError, match="--batch-size must be an integer >= 1, got True"):
        check_at_least("--batch-size", True, 1)
    check_at_least("--l-top", None, 1)
