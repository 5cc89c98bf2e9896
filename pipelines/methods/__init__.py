"""Distillation methods as data: one module per method, each registering a `Method` of pipelines.registry.

Importing this package registers the built-in methods; `get_method(name)`, `all_methods()`.
docs/methods/<name>.md describes each method and its paper; each module's docstring names where its
train-side pieces live (loss terms in pipelines/train/losses/terms.py, ...). Nothing here imports torch or
pipelines.train: methods see only the registry, pipelines.core.tasks and hskstore.
"""

from pipelines.methods import clm_kd, finetune, kd, lightpaff, mud, pea, pkd, s2s_kd, tinybert, xtok  # noqa: F401  (registers the built-in methods)
from pipelines.registry import Context, Method, MethodError, Stage, Term, all_methods, get_method, register

__all__ = ["Context", "Method", "MethodError", "Stage", "Term", "all_methods", "get_method", "register"]
