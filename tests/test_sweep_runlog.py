"""A sweep run's log: transformers' warnings of a run go to that run's train.log, not the terminal, without
swapping the library's handlers (pipelines/sweep/runlog.py)."""

from __future__ import annotations

import io
import threading

import pytest
from transformers.utils import logging as hf_logging

from pipelines.sweep.runlog import no_progress_bars, run_log


@pytest.fixture(autouse=True)
def warnings_shown():
    """transformers at its default verbosity (warnings), whatever an earlier test (`hsk` quiets it) left."""
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    yield
    hf_logging.set_verbosity(level)


def test_a_runs_warnings_go_to_its_log_only():
    import logging

    root = hf_logging.get_logger()
    terminal = io.StringIO()
    screen = logging.StreamHandler(terminal)  # stands for the library's own stderr handler
    root.addHandler(screen)
    handlers = list(root.handlers)
    warn = hf_logging.get_logger("transformers.modeling_utils").warning
    log = io.StringIO()
    try:
        with run_log(log):
            warn("inside the run")
        warn("outside any run")
        with run_log(io.StringIO()):
            pass
    finally:
        root.removeHandler(screen)
    assert log.getvalue() == "inside the run\n"
    assert terminal.getvalue() == "outside any run\n"
    # the library's own handlers are all still there; the router was added once
    assert all(h in root.handlers for h in handlers if h is not screen)
    assert len(root.handlers) == len(set(root.handlers))


def test_concurrent_runs_each_keep_their_own_lines():
    logs = [io.StringIO() for _ in range(4)]
    barrier = threading.Barrier(len(logs))
    warn = hf_logging.get_logger("transformers.modeling_utils").warning

    def one_run(i: int) -> None:
        with run_log(logs[i]):
            barrier.wait()  # every run is inside its block before any logs
            for k in range(20):
                warn(f"run {i} line {k}")

    threads = [threading.Thread(target=one_run, args=(i,)) for i in range(len(logs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, log in enumerate(logs):
        assert log.getvalue().splitlines() == [f"run {i} line {k}" for k in range(20)]


def test_progress_bars_are_back_as_they_were_after_a_sweep():
    before = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    with no_progress_bars():
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    with no_progress_bars():
        pass
    assert not hf_logging.is_progress_bar_enabled()
    if before:
        hf_logging.enable_progress_bar()
