"""Each sweep run's own log: transformers' warnings of a run go to the run's train.log, not the terminal.

No handler is swapped. One handler, installed once on transformers' library logger, writes a record to
the log of the run executing in the current context (a contextvar: a dask worker with several threads
runs several runs at once, each in its own thread); a filter, added once to that logger's other
handlers, keeps a run's records off them. Records emitted outside a run pass as before.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TextIO

_RUN_LOG: ContextVar[TextIO | None] = ContextVar("hsk_sweep_run_log", default=None)
_INSTALL_LOCK = threading.Lock()


class _ToRunLog(logging.Handler):
    """Writes a record to the log of the run in the current context; nothing outside a run."""

    def emit(self, record: logging.LogRecord) -> None:
        handle = _RUN_LOG.get()
        if handle is not None:
            with contextlib.suppress(Exception):  # a log line never fails a run
                handle.write(self.format(record) + "\n")


def _outside_runs(record: logging.LogRecord) -> bool:
    return _RUN_LOG.get() is None


_HANDLER = _ToRunLog(logging.WARNING)


def _install(logger: logging.Logger) -> None:
    """Idempotent: the router once, and the filter on every other handler the logger has now."""
    with _INSTALL_LOCK:
        if _HANDLER not in logger.handlers:
            logger.addHandler(_HANDLER)
        for handler in logger.handlers:
            if handler is not _HANDLER and _outside_runs not in handler.filters:
                handler.addFilter(_outside_runs)


@contextlib.contextmanager
def run_log(handle: TextIO) -> Iterator[None]:
    """Within the block, transformers' warnings in this context go to `handle` only."""
    from transformers.utils import logging as hf_logging

    _install(hf_logging.get_logger())  # the "transformers" library root logger
    token = _RUN_LOG.set(handle)
    try:
        yield
    finally:
        _RUN_LOG.reset(token)


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' load bars off for a whole sweep (many runs, one line each), as they were after it."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
