"""What a value on the command line may be, checked once for every command before its body runs.

Typer reads `float` options with Python's float(), which takes 'inf' and 'nan' (and 1e999), and `int`
options without bounds. Neither makes sense for any hsk option: a learning rate of inf trains a NaN
student, a seed outside what numpy accepts fails deep inside a run. `typed(app)` is the app's command
with every command's parsed values checked first: each float finite, each seed (`--seed`, `--*-seed`)
in 0..2**32-1, every other integer within a C int, no empty string; and a file:// URL (any option or
argument) is read as the local path it names, so that every command writes it as it writes that path.
A bad value is one `hsk: error:` line before anything is imported or written, and option declarations
stay plain Python types.

Options whose meaning is the same in every command are checked here too, by their parameter's name, so
that a typo is refused before torch and transformers are imported (a minute on a loaded machine): a
count (`--batch-size`, `--limit`, `--max-steps`, ...) is at least its least value, an epoch count or a
learning rate is > 0, a `--task` names a GLUE task (pipelines.core.tasks, pure Python). The libraries
check the same values again for their Python callers. Ranges particular to one method's option
(--alpha in [0, 1], --epochs-hsk >= 0) are checked where its meaning lives (the method's options).
"""

from __future__ import annotations

import functools
import math

import typer

from hskstore.errors import UserError

SEED_MAX = 2**32 - 1  # numpy's np.random.seed takes 0..2**32-1 (torch takes more)
# Any other whole number: counts, sizes and steps are C ints in torch and the OS (threads, workers), and no
# option means anything past this; beyond it they fail deep inside a run, or hang trying.
INT_MAX = 2**31 - 1

# Parameter name -> least value, wherever a command has it. Counts of rows, steps, layers, threads: 0 is never
# meant (options where 0 means something, --read-ahead, --write-processes, --emb-rank, are not here).
AT_LEAST = {
    "batch_size": 1, "limit": 1, "train_limit": 1, "eval_limit": 1, "max_steps": 1, "eval_every": 1,
    "checkpoint_every": 1, "log_every": 1, "shard_rows": 1, "shuffle_window": 1, "threads": 1, "workers": 1,
    "top_k": 1, "student_layers": 1, "l_top": 1, "layers": 1, "heads": 1, "ffn": 1, "per_amount": 1,
    "dump_examples": 1, "teacher_examples": 1,
    "max_length": 2,  # [CLS] and [SEP] (hskstore.format.config.MAX_LENGTH)
}
POSITIVE = ("epochs", "lr", "lr_hsk", "lr_pred", "temperature")  # > 0: zero trains nothing or divides by it


def check_seed(flag: str, value: int) -> None:
    """Refuse a seed numpy would refuse, in one line (also for seeds given in lists, such as --seeds)."""
    if value < 0:  # worded as hskstore.format.config's bounds word it
        raise UserError(f"{flag} must be an integer >= 0, got {value}")
    if value > SEED_MAX:
        raise UserError(f"{flag} must be at most {SEED_MAX} (numpy's largest seed), got {value}")


def read_value(flag: str, name: str, value):
    """One parsed option value under the rules of the module docstring; a file:// URL becomes its local path."""
    if isinstance(value, (list, tuple)):  # a repeatable option, a list of arguments
        return type(value)(read_value(flag, name, item) for item in value)
    _check_number(flag, name, value)
    if isinstance(value, str) and not value.strip():  # a name, a path, a choice: never nothing
        raise UserError(f"{flag} needs a value, got {value!r}")
    check_range(flag, name, value)
    if isinstance(value, str) and value[:7].lower() == "file://":
        return value[7:]  # as hskstore.io.location.local_path reads it (not imported here: fsspec and zarr are slow)
    return value


def _check_number(flag: str, name: str, value) -> None:
    """Refuse a float that is not finite, a seed numpy cannot take, an integer past a C int."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{flag} takes a finite number, got {value}")
    if not isinstance(value, int) or isinstance(value, bool):
        return
    if name == "seed" or name.endswith("_seed"):
        check_seed(flag, value)
    elif abs(value) > INT_MAX:
        raise UserError(f"{flag} takes an integer up to {INT_MAX}, got {value}")


def check_range(flag: str, name: str, value) -> None:
    """Refuse a count below its least value, an epoch count or learning rate <= 0, an unknown --task."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int) and value < AT_LEAST.get(name, value):
        raise UserError(f"{flag} must be an integer >= {AT_LEAST[name]}, got {value}")
    if name in POSITIVE and isinstance(value, (int, float)) and not value > 0:
        raise UserError(f"{flag} must be > 0, got {value:g}")
    if name == "task" and isinstance(value, str):
        from pipelines.core.tasks import get_task  # pure Python: no torch

        get_task(value)


def _checked(callback, flags: dict[str, str]):
    @functools.wraps(callback)
    def run(*args, **kwargs):
        kwargs = {name: read_value(flags.get(name, name), name, value) for name, value in kwargs.items()}
        return callback(*args, **kwargs)

    return run


def _flag(param) -> str:
    """The option's first long name (the one the help shows first; aliases come after it)."""
    opts = [o for o in getattr(param, "opts", None) or [] if o.startswith("--")]
    return opts[0] if opts else str(param.name).upper()  # an argument: as the usage line names it


def _harden(command) -> None:
    if command.callback is not None:
        command.callback = _checked(command.callback, {p.name: _flag(p) for p in command.params})
    for sub in (getattr(command, "commands", None) or {}).values():
        _harden(sub)


def typed(app: typer.Typer):
    """The click command of `app`, every command's numbers checked before it runs (module docstring)."""
    command = typer.main.get_command(app)
    _harden(command)
    return command
