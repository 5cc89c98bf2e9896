"""How many CPU threads torch computes with: `--threads N` on every command that computes, and a default
that does not oversubscribe the machine.

torch's own default is one thread per logical CPU; with the loader's, the tokenizer's and the writer's
threads on top, a CPU dump then runs more busy threads than there are cores, and on a shared machine the
threads wait on each other (on a loaded 2-core machine a dump ran several times slower at torch's default
than with one thread). The default here is the physical cores this process may run on, less
the threads the command's own pipeline keeps busy (BUSY), at least 1 (under torchrun, the host's cores
are shared by its ranks first). OMP_NUM_THREADS, when set, is the
user's choice and wins over the default; `--threads` wins over both.

The thread count changes float bits on CPU: checked by hand on torch 2.13 (CPU build), the logits after
one AdamW step of a 3-layer, 384-wide BERT differ in the last bits between 1, 2 and 4 threads (the forward
alone did not, for that model). A dump records it in the store's `compute` record, and a resume with
another count is refused (a store's bytes equal an uninterrupted dump's). A CPU training run records it in
its summary (`torch_threads`) and `hsk teacher` in its card, as the rank count is recorded: neither is
part of a run's identity, since runs resume elastically under another rank count, which changes the last
bits as well.

torch is imported only by `use_threads`: the CLI's help text is read before torch is.
"""

from __future__ import annotations

import os

# Threads a command's own pipeline keeps busy beside torch's: the training's store readers (decoding).
# A CPU dump tokenizes and writes between its forwards, not beside them (pipelines/dump/pipeline.py), so
# it keeps none busy while torch computes (on a quiet 2-core machine it dumps faster with 2 threads than with 1).
# The quickstart's time is its teacher's and its dump's. Teacher fine-tuning and evaluation have none.
BUSY = {"dump": 0, "train": 1, "teacher": 0, "eval": 0, "quickstart": 0}

# More threads than any machine has cores only makes them wait on each other; OpenMP would try to start them all.
MAX_THREADS = 1024

THREADS_HELP = ("torch CPU threads [default: the physical cores this process may use, less the command's own busy "
                "threads, at least 1; OMP_NUM_THREADS if set]. On CPU the result's last bits depend on it "
                "(recorded).")


def logical_cpus() -> int:
    """The logical CPUs this process may run on (its affinity mask, cgroup-pinned containers included)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def physical_cores() -> int:
    """The physical cores behind `logical_cpus()`: hyperthreads share a core's arithmetic units."""
    machine_logical = os.cpu_count() or 1
    try:
        import psutil  # a dask dependency

        machine_physical = psutil.cpu_count(logical=False) or machine_logical
    except ImportError:
        machine_physical = machine_logical
    per_core = max(1, machine_logical // max(1, machine_physical))
    return max(1, logical_cpus() // per_core)


def default_threads(command: str) -> int:
    """The thread count `command` uses when --threads is not given (see the module's docstring)."""
    from_env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if from_env.isascii() and from_env.isdigit() and int(from_env) > 0:
        return int(from_env)
    ranks = os.environ.get("LOCAL_WORLD_SIZE", "1")  # torchrun: the ranks on this host share its cores
    per_rank = physical_cores() // max(1, int(ranks)) if ranks.isascii() and ranks.isdigit() else physical_cores()
    return max(1, per_rank - BUSY.get(command, 0))


def check_threads(requested: int | None) -> None:
    """Refuse a thread count below 1 or above MAX_THREADS in one line (before anything is loaded)."""
    from hskstore.format.config import check_at_least

    check_at_least("--threads", requested, 1, high=MAX_THREADS)


def use_threads(requested: int | None, command: str) -> int:
    """Set torch's intra-op threads for this process: `requested`, else the command's default. Returns it."""
    import torch

    check_threads(requested)
    threads = requested or default_threads(command)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads
