"""The conformance vectors' teachers: BERT and Llama whose every float32 result is exact, so any CPU computes it.

A float sum is rounded at each step, so its last bits depend on the order the terms are added in, and that
order depends on the CPU (SIMD width, threads, the BLAS code path). A sum of terms on a fine enough grid with
few enough bits is never rounded, so every order gives the same number. These teachers keep every value on
such a grid:

- weights are multiples of 1/8 (the generator draws them so, `exact_weights`);
- the norms (BERT's LayerNorm, Llama's RMSNorm) are replaced by `GridNorm`: round to a multiple of 1/8 in
  [-8, 8] (an elementwise, correctly rounded step), then the norm's own weight and bias;
- the activations (GELU, SiLU, the pooler's tanh) by ReLU or the identity, rounded the same way;
- attention by `exact_attention`: the score q . k (an exact sum), rounded after the model's scaling to an
  integer e in [-2, 2]; weight 2^e for a visible key, 0 for a hidden one; the output sum(weight x value) / 32.
  No exp, no division by a sum: nothing but exact sums and power-of-two scales;
- Llama's rotary embedding by the identity (cos 1, sin 0): cos and sin are CPU-dependent approximations.

With inputs bounded by 8 on a grid of 1/8, weights |w| <= 1/4 on a grid of 1/8 (the Llama's output layer: <= 1)
and widths <= 128, every product and partial sum needs well under float32's 24 bits; `check_exact`
confirms it on the real inputs by running the model in float32 and float64 and requiring every module's
output to be equal. hsk reads these models through its ordinary code paths (hooks on BERT's query/key
Linears, the Auto classes, generation): they are registered under their own `model_type` in the
generator's process only (`register`).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import (
    AttentionInterface,
    AttentionMaskInterface,
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
)
from transformers.models.llama.modeling_llama import LlamaRMSNorm

GRID, BOUND = 8, 8.0  # values: multiples of 1/GRID in [-BOUND, BOUND]
ATTENTION = "hsk_conformance_exact"
BERT, LLAMA = "hsk_conformance_bert", "hsk_conformance_llama"


def on_grid(x: torch.Tensor) -> torch.Tensor:
    return torch.round(x.clamp(-BOUND, BOUND) * GRID) / GRID


class GridNorm(nn.Module):
    """Stands in for a LayerNorm or RMSNorm (same parameter names, so the checkpoint is the norm's)."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight = norm.weight
        self.bias = getattr(norm, "bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = on_grid(x) * self.weight
        return y if self.bias is None else y + self.bias


class GridReLU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return on_grid(torch.relu(x))


class GridIdentity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return on_grid(x)


class NoRotation(nn.Module):
    """Llama's rotary embedding as the identity rotation: cos 1, sin 0 (q cos + rot(q) sin = q exactly)."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = head_dim

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        shape = (*position_ids.shape, self.head_dim)
        return x.new_ones(shape), x.new_zeros(shape)


def exact_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """[B, heads, T, d] -> [B, T, heads, d]: weights 2^e (e the scaled score rounded into [-2, 2]) on visible keys."""
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3))  # exact: grid values, few bits
    powers = scores.new_tensor([0.25, 0.5, 1.0, 2.0, 4.0])  # a table: no pow/exp approximation
    weights = powers[(torch.round(scores * scaling).clamp(-2, 2) + 2).long()]
    if attention_mask is not None:  # eager's additive mask (0: visible) or a boolean one (True: visible)
        visible = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
        weights = torch.where(visible, weights, torch.zeros_like(weights))
    return (torch.matmul(weights, value) / 32).transpose(1, 2).contiguous(), None


def _activation(child: nn.Module) -> nn.Module | None:
    if isinstance(child, nn.Tanh):
        return GridIdentity()
    if type(child).__module__ == "transformers.activations" or isinstance(child, (nn.GELU, nn.SiLU, nn.ReLU)):
        return GridReLU()
    return None


def make_exact(model: nn.Module) -> nn.Module:
    """Swap the model's norms, activations and rotary embedding for their exact stand-ins, in place."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, (nn.LayerNorm, LlamaRMSNorm)):
                setattr(module, name, GridNorm(child))
            elif (stand_in := _activation(child)) is not None:
                setattr(module, name, stand_in)
            elif name == "rotary_emb":
                config = model.config
                setattr(module, name, NoRotation(getattr(config, "head_dim", None)
                                                 or config.hidden_size // config.num_attention_heads))
    return model


class ExactBertConfig(BertConfig):
    model_type = BERT

    def __init__(self, **kwargs):
        kwargs.setdefault("attn_implementation", ATTENTION)
        super().__init__(**kwargs)


class ExactLlamaConfig(LlamaConfig):
    model_type = LLAMA

    def __init__(self, **kwargs):
        kwargs.setdefault("attn_implementation", ATTENTION)
        super().__init__(**kwargs)


class ExactBertForSequenceClassification(BertForSequenceClassification):
    config_class = ExactBertConfig

    def __init__(self, config):
        super().__init__(config)
        make_exact(self)


class ExactBertForMaskedLM(BertForMaskedLM):
    config_class = ExactBertConfig

    def __init__(self, config):
        super().__init__(config)
        make_exact(self)


class ExactLlamaForCausalLM(LlamaForCausalLM):
    config_class = ExactLlamaConfig

    def __init__(self, config):
        super().__init__(config)
        make_exact(self)


def register() -> None:
    """Make these teachers loadable by hsk in this process: the attention function, the Auto classes, and
    BERT's score reader (hooks on the query/key Linears, as for BERT)."""
    from pipelines.dump.scores import PROJECTIONS, SCORE_READERS

    AttentionInterface.register(ATTENTION, exact_attention)
    AttentionMaskInterface.register(ATTENTION, AttentionMaskInterface()["eager"])
    AutoConfig.register(BERT, ExactBertConfig, exist_ok=True)
    AutoConfig.register(LLAMA, ExactLlamaConfig, exist_ok=True)
    AutoModelForSequenceClassification.register(ExactBertConfig, ExactBertForSequenceClassification, exist_ok=True)
    AutoModelForMaskedLM.register(ExactBertConfig, ExactBertForMaskedLM, exist_ok=True)
    AutoModelForCausalLM.register(ExactLlamaConfig, ExactLlamaForCausalLM, exist_ok=True)
    SCORE_READERS[BERT] = PROJECTIONS


def exact_weights(model: nn.Module, seed: int) -> nn.Module:
    """Every parameter drawn from {-2, ..., 2} / 8 (norm weights 1), from `seed`, in place."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if isinstance(model.get_submodule(name.rsplit(".", 1)[0]), GridNorm) and name.endswith("weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randint(-2, 3, param.shape, generator=generator).to(param.dtype) / GRID)
    return model


def check_exact(model: nn.Module, **inputs: torch.Tensor) -> None:
    """Refuse a model whose float32 results are not exact: every module's output equal in float32 and float64."""
    wide = copy.deepcopy(model).double()
    outputs = []
    for m in (model, wide):
        seen: list[torch.Tensor] = []
        hooks = [mod.register_forward_hook(lambda _m, _a, out, seen=seen: seen.extend(
                 t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor)))
                 for mod in m.modules()]
        with torch.no_grad():
            m(**inputs)
        for h in hooks:
            h.remove()
        outputs.append(seen)
    inexact = sum(not torch.equal(a.double(), b) for a, b in zip(*outputs, strict=True) if a.is_floating_point())
    if inexact:
        raise SystemExit(f"{type(model).__name__}: {inexact} module outputs differ between float32 and float64: "
                         "its float32 results depend on the order of its sums")
