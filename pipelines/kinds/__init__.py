"""The built-in run kinds, one module each: a store kind's flags (typed options) and its compute's entry points.

Each module declares `RUN_KIND` (pipelines.runkinds) and the option dataclasses of its commands; it imports
torch-free modules only at its top (the CLI reads the flags before torch loads), the compute inside its functions.
"""
