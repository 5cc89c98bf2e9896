"""What the command line keeps off the terminal: transformers' own load/save progress bars and its
MISSING/UNEXPECTED load-report tables (hsk says what matters in its own words). Set through the
environment before transformers is imported (no import here: a refused argument must not cost it);
where it already is (tests, notebooks calling `main`), through its logging module."""

from __future__ import annotations

import os
import sys


def quiet_libraries() -> None:
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
