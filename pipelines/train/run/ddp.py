"""Data-parallel training under torchrun: `torchrun --nproc_per_node N $(command -v hsk) train ...`.

torchrun starts N copies of `hsk train` and sets RANK, WORLD_SIZE and LOCAL_RANK (plus the
rendezvous address) in each one's environment. `Ranks.from_env` reads them and joins the process
group (nccl on CUDA, gloo on CPU); without them a run is the one process it always was.

What each rank does (the rest of the trainer asks `run.ranks`): it streams its slice of every global
batch of the epoch's one order (StoreStream's rank/world_size; the order does not depend on N, so a
checkpoint made under N ranks resumes under M), a local batch of global batch / N: the shares of its
canonical streams when N divides them (stream.py), so it reads 1/N of the store, through the
student wrapped in DistributedDataParallel, whose backward averages the gradients of the ranks, so
one step is the step of one process on the whole global batch (the losses are means over examples).
Only rank 0 evaluates, saves, logs, writes checkpoints and the summary; the others wait for it at a
barrier. Every rank resumes from the same checkpoint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from hskstore.format.config import ConfigError


@dataclass(frozen=True)
class Ranks:
    """This process's place in a data-parallel run (rank 0 of 1 when not under torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    joined: bool = False  # this process initialised the process group (and so destroys it)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_env(cls, device: str | None) -> Ranks:
        """Join torchrun's process group when its variables are set and there is more than one rank."""
        env = os.environ
        if "RANK" not in env or "WORLD_SIZE" not in env or int(env["WORLD_SIZE"]) <= 1:
            return cls()
        import torch.distributed as dist

        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", rank))
        if dist.is_initialized():
            return cls(rank, world, local)
        cuda = torch.cuda.is_available() and (device is None or device.startswith("cuda"))
        if cuda:
            torch.cuda.set_device(local)
        dist.init_process_group("nccl" if cuda else "gloo")
        return cls(rank, world, local, joined=True)

    def device(self, device: str) -> str:
        """One GPU per process: rank r on this node uses cuda:LOCAL_RANK."""
        if self.distributed and device == "cuda":
            return f"cuda:{self.local_rank}"
        return device

    def local_batch(self, global_batch: int) -> int:
        """Each rank's share of the global batch (--batch-size is the global batch)."""
        if global_batch % self.world_size:
            raise ConfigError(f"--batch-size {global_batch} does not split over {self.world_size} ranks: give a "
                              f"multiple of {self.world_size}")
        return global_batch // self.world_size

    def wrap(self, model: nn.Module) -> nn.Module | None:
        """The student in DistributedDataParallel (None when alone). Unused parameters are allowed:
        a stage may leave the task head (or the pooler) out of its loss."""
        if not self.distributed:
            return None
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.local_rank] if next(model.parameters()).is_cuda else None
        return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=True)

    def average_grads(self, modules: list[nn.Module]) -> None:
        """Average the gradients of modules trained outside the DDP wrapper (the projection W)."""
        if not self.distributed:
            return
        import torch.distributed as dist

        for module in modules:
            for p in module.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                    p.grad.div_(self.world_size)

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """The mean over the ranks of each value (a step's loss and terms, as logged for the global batch),
        on the device (the caller reads it once). Every rank calls it at the same step."""
        if not self.distributed:
            return values
        import torch.distributed as dist

        t = values.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t / self.world_size

    def mean_count(self, count: torch.Tensor) -> torch.Tensor:
        """The denominator of a loss term averaged over `count` things on this rank (losses.Counter): the
        global count over the ranks, divided by N since DDP averages the ranks' gradients. So each rank's
        loss is N * its sum / the global count, their mean the global batch's loss whatever the ranks hold
        (a mean of the ranks' means would weigh a rank with fewer kept tokens up). An all-reduce on the
        device, no host sync; one process: the count itself (at least 1)."""
        if not self.distributed:
            return count.clamp(min=1)
        import torch.distributed as dist

        total = count.detach().to(torch.float64)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return (total.clamp(min=1) / self.world_size).to(count.dtype if count.is_floating_point() else torch.float32)

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        """Leave the process group this process joined (after a failure too: no barrier here)."""
        if self.joined:
            import torch.distributed as dist

            dist.destroy_process_group()


def env_rank() -> int:
    """This process's torchrun rank (0 when not under torchrun): the CLI prints on rank 0 only."""
    return int(os.environ.get("RANK", "0"))


class SilentLog:
    """metrics.jsonl on ranks other than 0: rank 0 writes the run's records."""

    def write(self, record: dict) -> None:
        pass
