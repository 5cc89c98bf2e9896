"""One teacher forward that yields logits, hidden states and the [CLS] attention score rows.

Only the [CLS] query row of a ranking layer is needed, so we hook the query and key projections
instead of asking the model for attention probabilities: that would force the slow eager
attention and materialise every [T, T] map. The model keeps its default (fused) attention.
For TinyBERT's attention rows (`attention_layers`), the whole query and key projections of those
layers are kept instead: which query rows are stored is decided after ranking, on the host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from hskstore.errors import UserError

# (query, key) projection names of the self-attention blocks hsk knows how to read.
_QK_NAMES = (("query", "key"), ("q_lin", "k_lin"), ("q_proj", "k_proj"))


class UnsupportedTeacherError(UserError, RuntimeError):
    pass


def attention_projections(model: nn.Module) -> list[tuple[nn.Linear, nn.Linear]]:
    """(query, key) Linear modules of every self-attention block, bottom to top."""
    found = []
    for _, module in model.named_modules():
        for q_name, k_name in _QK_NAMES:
            q, k = getattr(module, q_name, None), getattr(module, k_name, None)
            if isinstance(q, nn.Linear) and isinstance(k, nn.Linear):
                found.append((q, k))
                break
    n_layers = model.config.num_hidden_layers if hasattr(model.config, "num_hidden_layers") else None
    if not found or (n_layers is not None and len(found) != n_layers):
        raise UnsupportedTeacherError(
            f"cannot find one query/key projection per layer in {type(model).__name__} "
            f"(found {len(found)}); hsk reads BERT-style encoders (BERT, RoBERTa, ELECTRA, DistilBERT, MiniLM)"
        )
    return found


@dataclass
class ProbeOutput:
    logits: torch.Tensor  # [B, C]
    hidden: dict[int, torch.Tensor]  # teacher layer (0 = embeddings) -> [B, T, d]
    cls_scores: dict[int, torch.Tensor]  # attention layer (1..L) -> [B, heads, T] pre-softmax [CLS] rows
    qk: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # layer -> [B, T, d] Q, K

    def start_host_copy(self) -> tuple[ProbeOutput, torch.cuda.Event | None]:
        """A host copy of this output, started without waiting: wait on the event before reading it.

        Copying right after the forward, before the next forward is queued, lets the device run
        that forward while the host selects from this one. Outputs already on the CPU come back
        as they are, with no event.
        """
        if self.logits.device.type != "cuda":
            return self, None

        def start(x: torch.Tensor) -> torch.Tensor:
            return torch.empty(x.shape, dtype=x.dtype, pin_memory=True).copy_(x, non_blocking=True)

        copy = ProbeOutput(
            start(self.logits),
            {j: start(h) for j, h in self.hidden.items()},
            {layer: start(s) for layer, s in self.cls_scores.items()},
            {layer: (start(q), start(k)) for layer, (q, k) in self.qk.items()},
        )
        done = torch.cuda.Event()
        done.record()
        return copy, done


class TeacherProbe:
    """Wraps a sequence classifier; call it on a batch to get a ProbeOutput."""

    def __init__(self, model: nn.Module, ranking_layers: list[int], attention_layers: list[int] = ()):
        self.model = model
        cfg = model.config
        self.num_heads = getattr(cfg, "num_attention_heads", None) or cfg.n_heads
        if ranking_layers and getattr(cfg, "pruned_heads", None):
            # Head-averaged [CLS] rows assume the config's head count in every layer.
            raise UnsupportedTeacherError(
                "this teacher has pruned attention heads (a ROSITA student): dump its plain/ export, or a "
                "logits-only config (0,0,0)"
            )
        self._captured: dict[tuple[int, str], torch.Tensor] = {}
        self._hooks = []
        self.ranking_layers = sorted(set(ranking_layers))
        self.attention_layers = sorted(set(attention_layers))
        projections = attention_projections(model) if self.ranking_layers or self.attention_layers else []
        for layer in sorted(set(self.ranking_layers) | set(self.attention_layers)):
            q, k = projections[layer - 1]
            full_q = layer in self.attention_layers  # else the [CLS] row is all ranking needs
            self._hooks.append(q.register_forward_hook(self._keep(layer, "q", cls_only=not full_q)))
            self._hooks.append(k.register_forward_hook(self._keep(layer, "k", cls_only=False)))

    def _keep(self, layer: int, kind: str, cls_only: bool):
        def hook(_module, _inputs, output):
            self._captured[(layer, kind)] = output[:, 0] if cls_only else output

        return hook

    def close(self) -> None:
        for h in self._hooks:
            h.remove()

    @torch.inference_mode()
    def __call__(self, input_ids, token_type_ids, attention_mask, hidden_layers: list[int]) -> ProbeOutput:
        self._captured.clear()
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None and getattr(self.model.config, "type_vocab_size", 0):
            kwargs["token_type_ids"] = token_type_ids
        out = self.model(**kwargs, output_hidden_states=bool(hidden_layers))
        hidden = {j: out.hidden_states[j] for j in hidden_layers}
        scores = {}
        for layer in self.ranking_layers:
            q = self._captured[(layer, "q")]  # [B, d], or [B, T, d] when the layer's rows are kept too
            q = q[:, 0] if q.dim() == 3 else q
            k = self._captured[(layer, "k")]  # [B, T, d]
            b, t, d = k.shape
            head = d // self.num_heads
            s = torch.einsum(
                "bhe,bthe->bht", q.view(b, self.num_heads, head), k.view(b, t, self.num_heads, head)
            )
            scores[layer] = s / math.sqrt(head)
        qk = {layer: (self._captured[(layer, "q")], self._captured[(layer, "k")]) for layer in self.attention_layers}
        self._captured.clear()
        return ProbeOutput(out.logits, hidden, scores, qk)
