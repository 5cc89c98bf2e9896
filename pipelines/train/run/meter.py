"""A stage's loss and loss terms, kept on the training device between the steps that read them.

Reading a device value (`float(loss)`) makes the host wait for the device, every step: the GPU then
idles while Python prepares the next step. So each step's values stay on the device, stacked into one
small tensor, and the loop reads them (one copy to the host) only when a step writes a record, is
evaluated or checkpointed. The logged values are the same as a per-step read would give: the loss of
the step (under N ranks the mean of the ranks', the loss of the global batch).

A non-finite loss is caught the same way: every step adds its values into a running sum on the
device (one tiny kernel; NaN and inf stay in a sum), checked when the values are read, so a loss
that turned NaN at any step since the last read stops the run before anything is saved.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hskstore.errors import UserError


class NonFiniteLoss(UserError):
    """The training loss became NaN or infinite: the run stops, its last good checkpoint is kept."""


@dataclass
class Reading:
    """The values read at a step: the step's loss and its terms, and whether every step since the last
    reading had finite values."""

    loss: float
    terms: dict[str, float]
    finite: bool


class LossMeter:
    """The last step's loss and terms, and their sum since the last reading, on the device."""

    def __init__(self):
        self.names: list[str] = []
        self.last: torch.Tensor | None = None
        self.total: torch.Tensor | None = None
        self.loss = float("nan")  # the last values read (the stage's final loss in its results)
        self.terms: dict[str, float] = {}

    def add(self, loss: torch.Tensor, terms: dict[str, torch.Tensor]) -> None:
        """One step's values (detached), stacked on their device: no host sync."""
        values = torch.stack([loss.detach().float(), *(t.float() for t in terms.values())])  # one dtype to stack
        values = values.to(torch.float32 if values.device.type == "mps" else torch.float64)  # mps has no float64
        self.names, self.last = list(terms), values
        self.total = values.clone() if self.total is None else self.total.add_(values)

    def read(self, reduce=None) -> Reading:
        """The last step's values and the finite check since the last reading: one copy to the host.
        `reduce(tensor) -> tensor`: the mean over the ranks (every rank must read at the same step).
        Nothing added since the last reading: that reading again (no copy, no collective)."""
        if self.total is None:
            return Reading(self.loss, dict(self.terms), True)
        both = torch.cat([self.last, self.total])
        if reduce is not None:
            both = reduce(both)
        values = both.tolist()
        n = len(values) // 2
        self.total = None
        self.loss, self.terms = values[0], dict(zip(self.names, values[1:n]))
        return Reading(self.loss, dict(self.terms), all(map(_finite, values[n:])))


def _finite(x: float) -> bool:
    return x - x == 0.0  # False for NaN and +-inf
