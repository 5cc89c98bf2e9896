"""Classification heads a stage can train, swapped on the student between stages.

"task" is the student's own classifier (num_labels of the task). Other heads (e.g. PEA-KD's 4-way
"ptp4") are fresh Linear layers on the same pooled features, kept aside while not in use, so a later
stage gets the task head back untouched, unless it asks for a fresh one (`Stage.fresh_head`: PEA-KD's
KD stage, whose pooled features the PTP stage has retrained). New heads get BERT's initialisation
(normal, std `initializer_range`, zero bias). A checkpoint records every head and which one is on.
"""

from __future__ import annotations

import torch
from torch import nn

from hskstore.format.config import ConfigError

HEAD_SIZES: dict[str, int] = {"ptp4": 4}  # head name -> number of outputs (besides "task")


class Heads:
    """The heads of one student; `use(name)` puts that head on the model."""

    def __init__(self, model: nn.Module, own: str = "task"):
        self.model = model
        self.own = own  # the head the model comes with: "task" (a classifier), "mlm" (a BertForMaskedLM)
        self.current = own
        self.aside: dict[str, nn.Module] = {}

    def _classifier(self) -> nn.Linear:
        head = getattr(self.model, "classifier", None)
        if not isinstance(head, nn.Linear):
            raise ConfigError(
                f"swapping heads needs a student whose classifier is one Linear layer (BERT-like); "
                f"{type(self.model).__name__} has {type(head).__name__}"
            )
        return head

    def use(self, name: str, seed: int | None = None) -> None:
        """Put head `name` on the model; a head never used before is drawn fresh, from `seed` when given (the
        same head in one process and under N ranks, whose global RNGs differ)."""
        if name == self.current:
            return
        if name != self.own and name not in HEAD_SIZES:
            raise ConfigError(f"unknown head {name!r}; known: {self.own}, {', '.join(HEAD_SIZES)}")
        head = self._classifier()
        self.aside[self.current] = head
        new = self.aside.pop(name, None)
        if new is None:
            new = self._new_linear(head, HEAD_SIZES[name], seed)
        self.model.classifier = new
        self.model.num_labels = new.out_features
        self.current = name

    def _new_linear(self, like: nn.Linear, out_features: int, seed: int | None = None) -> nn.Linear:
        """A head on `like`'s features, initialised as BERT's (and as the PEA-KD authors' classifiers); with a
        seed, drawn from its own generator and leaving the global RNG (dropout's) untouched."""
        std = float(getattr(getattr(self.model, "config", None), "initializer_range", 0.02))
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            new = nn.Linear(like.in_features, out_features)
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        with torch.no_grad():
            new.weight.copy_(torch.randn(new.weight.shape, generator=generator) * std)
            new.bias.zero_()
        return new.to(like.weight.device)

    def reset(self, seed: int) -> None:
        """Replace the current head by a fresh one of the same size (a pure function of `seed`: a resumed run
        draws the very same head)."""
        head = self._classifier()
        self.model.classifier = self._new_linear(head, head.out_features, seed)

    def state_dict(self) -> dict:
        return {"current": self.current, "aside": {k: m.state_dict() for k, m in self.aside.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Recreate the heads of a checkpoint (before loading the model's own state)."""
        for name in state["aside"]:
            if name != self.own:
                self.use(name)
        self.use(state["current"])
        for name, weights in state["aside"].items():
            self.aside[name].load_state_dict(weights)
