"""The intermediate layers of a causal-LM dump (`hsk dump --objective clm --hidden-layers 4,8`): the teacher's
hidden states of chosen layers, taken from the forwards the support already runs (the format is
hskstore.format.clm_layers).

While a shard is computed, the teacher returns every layer's hidden states (output_hidden_states, set on its
config for the shard) and a forward hook keeps the chosen layers at every `stride`-th position, rotated by R
and cast to float16 on the device: [b, P, L, d] per batch, one copy to the host per shard, as the support's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from hskstore.format.clm import ClmSelection
from hskstore.format.clm_layers import LayerStates, encode_layers
from pipelines.dump.clm_hidden import rotation_matrix


def with_layers(sel: ClmSelection, model: Any, request: Any, teacher: str) -> ClmSelection:
    """The selection with the layer states the request asks for (a one-line ConfigError for a layer the teacher
    lacks), or as it is."""
    if request.layers is None:
        return sel
    cfg = model.config
    states = LayerStates.make(request.layers, request.layer_stride, request.layer_codec, width=cfg.hidden_size,
                              depth=cfg.num_hidden_layers, seed=request.sample_seed, block_size=request.block_size,
                              teacher=teacher)
    return replace(sel, layer_states=states)


class CapturedLayers:
    """The chosen layers of every forward of a shard, rotated, float16, on their device until `arrays`."""

    def __init__(self, states: LayerStates, block_size: int):
        self.states, self.block_size = states, block_size
        self.parts: list[torch.Tensor] = []
        self._rotations: dict[torch.device, torch.Tensor] = {}

    def _rotation(self, device: torch.device) -> torch.Tensor:
        if device not in self._rotations:
            self._rotations[device] = rotation_matrix(self.states.width, self.states.rotation_seed, device)
        return self._rotations[device]

    @torch.no_grad()
    def hook(self, _module: Any, _args: Any, output: Any) -> None:
        hidden = output.hidden_states
        picked = torch.stack([hidden[j] for j in self.states.layers], 2)[:, :: self.states.stride].float()
        self.parts.append((picked @ self._rotation(picked.device).T).half())

    def arrays(self, lengths: np.ndarray) -> dict[str, np.ndarray]:
        states = torch.cat([p.to(self.parts[0].device) for p in self.parts]).cpu().numpy()
        return encode_layers(states, lengths, self.states, self.block_size)


@contextmanager
def capturing_layers(model: Any, sel: ClmSelection) -> Iterator[CapturedLayers | None]:
    """Within: every forward of `model` also keeps the selection's layer states (None when it has none)."""
    if sel.layer_states is None:
        yield None
        return
    captured = CapturedLayers(sel.layer_states, sel.block_size)
    before = model.config.output_hidden_states
    model.config.output_hidden_states = True
    handle = model.register_forward_hook(captured.hook)
    try:
        yield captured
    finally:
        handle.remove()
        model.config.output_hidden_states = before
