"""Run kinds, registered by name: the compute half of a store kind (its format half is hskstore.format.kinds).

    from pipelines import runkinds
    kind = runkinds.get("clm")                  # the name is the store kind's (meta["objective"])
    kind.dump_options                           # its `hsk dump` flags, a typed dataclass
    kind.load("dump")(options, common, log)     # its dump
    kind.load("prepare")                        # its `hsk train` run plan (RunRequest -> RunParts)
    kind.default_method                         # what `hsk train` runs on its stores without --method

A `RunKind` declares, for one store kind: its dump (an entry point and the typed options it takes), its run plan
for `hsk train` and the method that runs when none is named, its teacher fine-tuning (`hsk teacher --objective`)
and its evaluation (`hsk eval`) if it has them. Entry points are "module:attribute" strings, imported when first
used, so that this module and every kind's declaration stay torch-free (the CLI builds its flags from them before
torch is imported). The built-in kinds are declared below by module (pipelines/kinds/<name>.py, imported on first
lookup); a package adds one through the entry point group `hsk.run_kinds` (hskstore.plugins), named after its
store kind and naming its `RunKind` (or a module that calls `register`). Only the entry point of the kind asked
for is imported: a broken plugin fails its own kind, in one line naming its package, and no other.
docs/guide/adding-a-store-kind.md walks through a kind's files.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module

from hskstore.errors import UserError
from hskstore.plugins import RUN_KINDS, plugin
from pipelines.core.flags import flag
from pipelines.core.threads import THREADS_HELP

# name -> "module:attribute" of the built-in kinds' declarations
_DECLARED = {"task": "pipelines.kinds.task:RUN_KIND", "mlm": "pipelines.kinds.mlm:RUN_KIND",
             "clm": "pipelines.kinds.clm:RUN_KIND", "seq2seq": "pipelines.kinds.seq2seq:RUN_KIND"}
_KINDS: dict[str, RunKind] = {}


Log = Callable[[str], object]  # where a kind's command says what it did (typer.echo on the command line)


class UnknownRunKindError(UserError, ValueError):
    """A store kind whose compute no built-in run kind and no installed package declares."""


@dataclass(frozen=True)
class RunKind:
    """A store kind's compute: how its stores are dumped, trained from, evaluated, and its teacher fine-tuned."""

    name: str  # the store kind's name (hskstore.format.kinds), what --objective takes
    summary: str  # what its stores hold, in a few words ("a causal LM's next-token distributions")
    dump: str  # "module:function" (options, DumpCommon, log) -> None
    dump_options: type  # a dataclass: the kind's `hsk dump` flags (pipelines.core.flags)
    prepare: str  # "module:function": `hsk train`'s run plan on its stores (driver.RunRequest -> loop.RunParts)
    default_method: str  # the method `hsk train` runs on its stores when none is named
    heading: str = ""  # the `hsk dump --help` heading of its flags [default: "<name> stores (--objective <name>)"]
    teacher: str | None = None  # "module:function" (options, TeacherCommon, log) -> None: `hsk teacher`
    teacher_options: type | None = None
    evaluate: str | None = None  # "module:function" (model, options, EvalCommon, log) -> None: `hsk eval`
    eval_options: type | None = None
    eval_by: str = ""  # the `hsk eval` option whose presence selects this kind's evaluation (e.g. "text_file")
    # "module:function" (store, method options) -> the batches a transformers.Trainer reads through
    # pipelines.integrations.hf.LMStoreDataset (None: the task-store dataset, or none)
    feed: str | None = None
    # `hsk train`: the flags of its methods' options (a dataclass; gathered into TrainOptions.method_options,
    # where each method refuses what it does not take) and its own run flags (a dataclass with
    # `apply(TrainOptions, RunSource) -> (TrainOptions, RunSource)`, listed under `train_heading`)
    method_flags: type | None = None
    train_options: type | None = None
    train_heading: str = ""

    @property
    def help_heading(self) -> str:
        return self.heading or f"{self.name} stores (--objective {self.name})"

    def load(self, part: str) -> Callable[..., None]:
        """The object one of its entry points names ("dump", "prepare", "teacher", "evaluate")."""
        where = getattr(self, part)
        if where is None:
            raise UserError(f"the {self.name} kind has no {part}")
        module, _, attr = where.partition(":")
        return getattr(import_module(module), attr)


def warn(line: str) -> None:
    """A warning of a kind's command, on stderr (its results go to stdout)."""
    print(line, file=sys.stderr, flush=True)


def register(kind: RunKind) -> RunKind:
    """Add a run kind (a built-in one at its module's import, a plugin's from its entry point)."""
    if kind.name in _KINDS and _KINDS[kind.name] is not kind:
        raise ValueError(f"run kind {kind.name!r} is registered twice")
    _KINDS[kind.name] = kind
    return kind


def _import(value: str) -> object:
    module, _, attr = value.partition(":")
    loaded = import_module(module)
    return getattr(loaded, attr) if attr else loaded


def _load_plugin(name: str) -> None:
    """Import the `hsk.run_kinds` entry point called `name` alone (a broken one fails here, naming its package)."""
    found = plugin(RUN_KINDS, name)
    if found is None:
        return
    loaded = found.load()
    if isinstance(loaded, RunKind):
        register(loaded)


def get(name: str) -> RunKind:
    """The run kind called `name`: a built-in one, or the one an installed package declares under that name."""
    if name not in _KINDS and name in _DECLARED:
        loaded = _import(_DECLARED[name])
        if isinstance(loaded, RunKind):
            register(loaded)
    if name not in _KINDS:
        _load_plugin(name)
    if name not in _KINDS:
        raise UnknownRunKindError(f"no run kind {name!r}: this hsk dumps and trains {', '.join(builtin())}; a kind "
                                  "of a package needs that package installed (entry point group hsk.run_kinds)")
    return _KINDS[name]


def builtin() -> list[str]:
    """The built-in kinds' names, in their declared order (no plugin is imported)."""
    return list(_DECLARED)


def builtin_kinds() -> list[RunKind]:
    return [get(name) for name in _DECLARED]


# --------------------------------------------------------------------------------------------------
# What every kind's commands share: the flags the commands declare once, given to each kind's entry point

# `hsk dump --help` headings shared by the kinds
FORWARD = "The teacher's forward and the writing"
SHARING = "Sharing (recorded in the store's card and Croissant)"
TOP = ""  # listed first, under "Options" (what the command is: task, teacher, out, data)
# `hsk train --help`: where a kind's `method_flags` are listed (pipelines/train_flags.py has the other headings)
METHOD = "Method options (each method takes its own: `hsk methods`)"


@dataclass(frozen=True)
class DumpCommon:
    """The `hsk dump` flags of every kind: its teacher, its output and how it runs."""

    teacher: str | None = flag(None, "The teacher: a checkpoint (hub id or folder) the kind's dump runs "
                               "[task stores: default runs/teacher-<task>, where `hsk teacher` saves].",
                               "--teacher", section=TOP)
    out: str | None = flag(None, "Store path or fsspec URL [task stores: default <task>.zarr].", "--out", "-o",
                           section=TOP)
    device: str | None = flag(None, "torch device [default: cuda when available, else cpu].", section=FORWARD)
    threads: int | None = flag(None, f"{THREADS_HELP} With --workers/--scheduler: per worker process [default: "
                               "cores / workers]; equal threads give a single-process dump's bytes.", "--threads",
                               section=FORWARD)
    progress: bool = flag(True, "Show a progress bar.", section=FORWARD)
    overwrite: bool = flag(False, "Replace an hsk store at --out (swapped in once the new one is complete).",
                           "--overwrite", section=FORWARD)
    license: str | None = flag(None, "The store's licence (e.g. an SPDX id such as cc-by-4.0), from what the "
                               "teacher's and the data's licences allow; recorded in the metadata and croissant.json "
                               "[default: unknown, said so].", "--license", section=SHARING)
    creator: str | None = flag(None, "Who made the store (a person or team; several separated by ';'); in "
                               "croissant.json.", "--creator", section=SHARING)

    def sharing(self) -> dict:
        """What `--license`/`--creator` put in the metadata (key `sharing`); nothing when neither is given."""
        if self.license is not None and not self.license.strip():
            raise UserError("--license needs a value (e.g. cc-by-4.0, or leave it out: the store then says unknown)")
        creators = [name.strip() for name in (self.creator or "").split(";") if name.strip()]
        if not self.license and not creators:
            return {}
        return {"sharing": {"license": self.license.strip() if self.license else None, "creators": creators}}

    def needs(self, what: str) -> tuple[str, str]:
        """(teacher, out), refused in one line naming what the kind's dump needs when either is missing."""
        if not self.teacher or not self.out:
            raise UserError(f"{what} needs --teacher and --out")
        return self.teacher, self.out


@dataclass(frozen=True)
class TeacherCommon:
    """The `hsk teacher` flags of every kind."""

    out: str | None = flag(None, "Folder for the fine-tuned checkpoint [default: runs/teacher-<task>].", "--out", "-o")
    base: str = flag("minilm", "Base model: hub id, local folder, or 'minilm' (offline).")
    epochs: float = flag(3.0, "Training epochs (fractions allowed).")
    lr: float = flag(5e-5, "Peak learning rate (linear decay, 10% warmup).")
    batch_size: int = flag(32, "Batch size.")
    seed: int = flag(0, "Random seed.")
    device: str | None = flag(None, "torch device [default: cuda when available, else cpu].")
    threads: int | None = flag(None, THREADS_HELP, "--threads")
    precision: str = flag("auto", "Step precision: auto (bf16 on a GPU that has it, else fp32), fp32, bf16 or fp16.")
    overwrite: bool = flag(False, "Replace a teacher folder at --out (only once the new one is complete).",
                           "--overwrite")
    progress: bool = flag(True, "Show progress bars (off in logs).", "--progress/--no-progress")


@dataclass(frozen=True)
class EvalCommon:
    """The `hsk eval` flags of every kind (the model is the command's argument)."""

    batch_size: int = flag(64, "Evaluation batch size.")
    device: str | None = flag(None, "torch device [default: cuda when available, else cpu].")
    limit: int | None = flag(None, "Evaluate on the first N examples only.", "--eval-limit")
    threads: int | None = flag(None, THREADS_HELP, "--threads")
    as_json: bool = flag(False, "Print the result as JSON.", "--json")
