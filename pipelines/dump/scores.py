"""How hsk reads a teacher's [CLS] attention score rows, per architecture (`model_type` -> reader name).

A ranking layer needs the pre-softmax score row of the first token, [B, heads, T], as the model computes
it. Three readers, none of which asks the model for attention probabilities (that would force eager
attention and [T, T] probability maps):

- `projections` (BERT, RoBERTa, XLM-RoBERTa, ELECTRA, DistilBERT): the score is q . k / sqrt(d_head) of the
  query and key Linear outputs, so hooks on those Linears are enough (one module per layer).
- `attention-function` (ModernBERT, ALBERT): a registered transformers attention function sees query and
  key as the model passes them to attention (after ModernBERT's rotary embeddings; ALBERT's one shared
  layer, called once per layer), takes the [CLS] row with the model's own scaling and mask, and calls
  the fused SDPA kernel. Positions the mask hides ([CLS] outside a local-attention window) are marked.
- `deberta-v2`: DeBERTa-v2/v3 computes its scores in its own module (no attention function): a hook on
  each disentangled self-attention recomputes the [CLS] row, content-to-content plus the c2p and p2c
  relative terms, scaled by sqrt(d_head * factor) as the module does; masked positions are marked.

Marked positions get MASKED_SCORE: below any real score, and finite so that head averages and the
ranking's order stay defined (a hidden token is ranked after every visible one).
"""

from __future__ import annotations

import inspect
import math
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

from hskstore.errors import UserError

MASKED_SCORE = -1e30

PROJECTIONS, ATTENTION_FUNCTION, DEBERTA_V2 = "projections", "attention-function", "deberta-v2"

# model_type -> reader; every entry is backed by tests/test_architectures.py (hsk_bert: hsk's own BERT).
SCORE_READERS: dict[str, str] = {
    "bert": PROJECTIONS,
    "hsk_bert": PROJECTIONS,
    "roberta": PROJECTIONS,
    "camembert": PROJECTIONS,  # RoBERTa's architecture under another name
    "xlm-roberta": PROJECTIONS,
    "electra": PROJECTIONS,
    "distilbert": PROJECTIONS,
    "albert": ATTENTION_FUNCTION,
    "modernbert": ATTENTION_FUNCTION,
    "deberta-v2": DEBERTA_V2,
}
# Readers whose query/key are the model's whole score (TinyBERT's attention rows are q . k / sqrt(d_head)).
_QK_IS_SCORE = {PROJECTIONS, ATTENTION_FUNCTION}

# (query, key) projection names of the BERT-style self-attention blocks.
_QK_NAMES = (("query", "key"), ("q_lin", "k_lin"))


class UnsupportedTeacherError(UserError, RuntimeError):
    pass


def readable_architectures() -> str:
    return ", ".join(sorted(t for t in SCORE_READERS if not t.startswith("hsk_")))


def score_reader(config) -> str:
    """The reader of this teacher's [CLS] rows, or one line naming the architectures hsk reads."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SCORE_READERS:
        raise UnsupportedTeacherError(
            f"hsk cannot read the attention scores of a {model_type or 'model without a model_type'} teacher; "
            f"it reads {readable_architectures()} (a logits-only config 0,0,0 takes any classifier)"
        )
    return SCORE_READERS[model_type]


def check_attention_rows(config, layers: list[int]) -> None:
    """Refuse TinyBERT attention rows where q . k over every key is not the model's score for `layers`."""
    if not layers:
        return
    reader = score_reader(config)
    if reader not in _QK_IS_SCORE:
        raise UnsupportedTeacherError(
            f"--attention-rows stores q.k/sqrt(d_head) rows, but a {config.model_type} teacher adds relative-position "
            "terms to its scores: dump it without --attention-rows"
        )
    types = getattr(config, "layer_types", None) or []
    local = [j for j in layers if j - 1 < len(types) and types[j - 1] != "full_attention"]
    if local:
        raise UnsupportedTeacherError(
            f"--attention-rows stores rows over every key, but teacher layers {local} attend within a local window: "
            "keep only global-attention layers (--layers)"
        )


def score_record(config, ranking_layers: list[int], attention_layers: list[int]) -> dict:
    """The teacher metadata's record of how the [CLS] rows are read; refuses what hsk cannot read.

    `projections` is the format's default (what every store before the record holds): it is left unsaid, so
    such stores keep their bytes. Other readers add `model_type` and `scores`. A logits-only store reads none.
    """
    if not ranking_layers and not attention_layers:
        return {}
    check_attention_rows(config, attention_layers)
    reader = score_reader(config)
    return {} if reader == PROJECTIONS else {"model_type": config.model_type, "scores": reader}


def _layers_of(model: nn.Module, kind: type | tuple, what: str) -> list[nn.Module]:
    found = [m for m in model.modules() if isinstance(m, kind)]
    n_layers = model.config.num_hidden_layers
    if len(found) != n_layers:
        raise UnsupportedTeacherError(
            f"cannot find one {what} per layer in {type(model).__name__} (found {len(found)} for {n_layers} layers)"
        )
    return found


class ScoreReader:
    """Captures [CLS] rows (`cls_rows`, layer -> [B, heads, T]) and whole Q, K (`qk`) during one forward."""

    def __init__(self, model: nn.Module, ranking_layers: list[int], attention_layers: list[int]):
        self.model = model
        self.ranking_layers = set(ranking_layers)
        self.attention_layers = set(attention_layers)
        self.cls_rows: dict[int, torch.Tensor] = {}
        self.qk: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @contextmanager
    def active(self):
        """Capture during the block (one forward)."""
        self.cls_rows, self.qk = {}, {}
        yield

    def close(self) -> None:
        pass


class ProjectionReader(ScoreReader):
    """Hooks on the query and key Linears; the score is their product over sqrt(d_head)."""

    def __init__(self, model: nn.Module, ranking_layers: list[int], attention_layers: list[int], num_heads: int):
        super().__init__(model, ranking_layers, attention_layers)
        self.num_heads = num_heads
        self._captured: dict[tuple[int, str], torch.Tensor] = {}
        self._hooks = []
        projections = attention_projections(model)
        for layer in sorted(self.ranking_layers | self.attention_layers):
            q, k = projections[layer - 1]
            cls_only = layer not in self.attention_layers  # else the [CLS] row is all ranking needs
            self._hooks.append(q.register_forward_hook(self._keep(layer, "q", cls_only)))
            self._hooks.append(k.register_forward_hook(self._keep(layer, "k", False)))

    def _keep(self, layer: int, kind: str, cls_only: bool):
        def hook(_module, _inputs, output):
            self._captured[(layer, kind)] = output[:, 0] if cls_only else output

        return hook

    @contextmanager
    def active(self):
        self._captured.clear()
        yield
        self.cls_rows = {layer: self._row(layer) for layer in self.ranking_layers}
        self.qk = {layer: (self._captured[(layer, "q")], self._captured[(layer, "k")])
                   for layer in self.attention_layers}
        self._captured.clear()

    def _row(self, layer: int) -> torch.Tensor:
        q = self._captured[(layer, "q")]  # [B, d], or [B, T, d] when the layer's rows are kept too
        q = q[:, 0] if q.dim() == 3 else q
        k = self._captured[(layer, "k")]  # [B, T, d]
        b, t, d = k.shape
        head = d // self.num_heads
        s = torch.einsum("bhe,bthe->bht", q.view(b, self.num_heads, head), k.view(b, t, self.num_heads, head))
        return s / math.sqrt(head)

    def close(self) -> None:
        for h in self._hooks:
            h.remove()


def attention_projections(model: nn.Module) -> list[tuple[nn.Linear, nn.Linear]]:
    """(query, key) Linear modules of every self-attention block, bottom to top."""
    found = []
    for _, module in model.named_modules():
        for q_name, k_name in _QK_NAMES:
            q, k = getattr(module, q_name, None), getattr(module, k_name, None)
            if isinstance(q, nn.Linear) and isinstance(k, nn.Linear):
                found.append((q, k))
                break
    if len(found) != model.config.num_hidden_layers:
        raise UnsupportedTeacherError(
            f"cannot find one query/key projection per layer in {type(model).__name__} (found {len(found)}); "
            f"hsk reads {readable_architectures()}"
        )
    return found


def _marked(row: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """row [B, heads, T] float32 with the positions the [CLS] query may not attend to set to MASKED_SCORE.

    `mask` is the model's [B, 1 or heads, T, T] mask (True or 0 = attend), or None (nothing hidden).
    """
    if mask is None:
        return row
    first = mask[:, :, 0, :]
    visible = first if first.dtype == torch.bool else first == 0
    return row.masked_fill(~visible, MASKED_SCORE)


# --- the attention-function reader -----------------------------------------------------------------------
_FUNCTION_NAME = "hsk_cls_rows"
_ACTIVE: ContextVar[FunctionReader | None] = ContextVar("hsk_cls_rows", default=None)


def _cls_rows_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """SDPA attention that first hands query/key/mask to the active reader (query, key: [B, heads, T, d_head])."""
    from transformers import AttentionInterface

    reader = _ACTIVE.get()
    if reader is not None:
        reader.record(query, key, attention_mask, query.shape[-1] ** -0.5 if scaling is None else scaling)
    return AttentionInterface()["sdpa"](module, query, key, value, attention_mask, scaling=scaling, **kwargs)


def _register_function() -> None:
    """Register hsk's attention function, with SDPA's mask (a boolean [B, 1, T, T] mask, or None)."""
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(_FUNCTION_NAME, _cls_rows_attention)
    AttentionMaskInterface.register(_FUNCTION_NAME, AttentionMaskInterface()["sdpa"])


class FunctionReader(ScoreReader):
    """Runs the model on hsk's attention function during the forward: each call is the next layer."""

    def __init__(self, model: nn.Module, ranking_layers: list[int], attention_layers: list[int]):
        super().__init__(model, ranking_layers, attention_layers)
        _register_function()
        self._calls = 0
        # Every config object the model's modules read _attn_implementation from (usually just one).
        self._configs = list({id(c): c for m in model.modules() if (c := getattr(m, "config", None)) is not None
                              and hasattr(c, "_attn_implementation")}.values())

    @contextmanager
    def active(self):
        self.cls_rows, self.qk, self._calls = {}, {}, 0
        saved = [c._attn_implementation for c in self._configs]
        token = _ACTIVE.set(self)
        try:
            for c in self._configs:
                c._attn_implementation = _FUNCTION_NAME
            yield
        finally:
            _ACTIVE.reset(token)
            for c, name in zip(self._configs, saved):
                c._attn_implementation = name
        if self._calls != self.model.config.num_hidden_layers:
            raise UnsupportedTeacherError(f"{type(self.model).__name__} called attention {self._calls} times for "
                                          f"{self.model.config.num_hidden_layers} layers: hsk cannot tell its layers")

    def record(self, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scaling: float) -> None:
        self._calls += 1
        layer = self._calls
        if layer in self.ranking_layers:
            row = torch.einsum("bhe,bhte->bht", query[:, :, 0].float(), key.float()) * scaling
            self.cls_rows[layer] = _marked(row, mask)
        if layer in self.attention_layers:
            b, _, t, _ = query.shape
            self.qk[layer] = (query.transpose(1, 2).reshape(b, t, -1), key.transpose(1, 2).reshape(b, t, -1))


# --- DeBERTa-v2 ------------------------------------------------------------------------------------------
class DebertaV2Reader(ScoreReader):
    """A hook on each DisentangledSelfAttention recomputes its [CLS] row from the module's own inputs."""

    def __init__(self, model: nn.Module, ranking_layers: list[int], attention_layers: list[int]):
        super().__init__(model, ranking_layers, attention_layers)
        from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention

        modules = _layers_of(model, DisentangledSelfAttention, "disentangled self-attention")
        self._hooks = [modules[layer - 1].register_forward_hook(self._keep(layer), with_kwargs=True)
                       for layer in sorted(self.ranking_layers)]

    def _keep(self, layer: int):
        def hook(module, args, kwargs, _output):
            bound = inspect.signature(module.forward).bind(*args, **kwargs)
            self.cls_rows[layer] = deberta_cls_row(module, **bound.arguments)

        return hook

    def close(self) -> None:
        for h in self._hooks:
            h.remove()


def deberta_cls_row(module, hidden_states, attention_mask, output_attentions=False, query_states=None,
                    relative_pos=None, rel_embeddings=None) -> torch.Tensor:
    """[B, heads, T] pre-softmax [CLS] scores of a DisentangledSelfAttention, as its forward computes them.

    The module computes c2c + c2p + p2c over [T, T]; only the first query row is computed here.
    """
    heads = module.num_attention_heads
    b, t = hidden_states.shape[:2]
    queries = hidden_states if query_states is None else query_states
    q = module.transpose_for_scores(module.query_proj(queries[:, :1]), heads)  # [B*heads, 1, d_head]
    k = module.transpose_for_scores(module.key_proj(hidden_states), heads)  # [B*heads, T, d_head]
    factor = 1 + ("c2p" in module.pos_att_type) + ("p2c" in module.pos_att_type)
    scale = torch.sqrt(torch.tensor(q.size(-1), dtype=torch.float) * factor).to(q.dtype)
    row = torch.bmm(q, k.transpose(-1, -2) / scale)
    if module.relative_attention:
        row = row + _relative_row(module, q, k, relative_pos, rel_embeddings, scale)
    mask = attention_mask.bool()
    mask = mask.unsqueeze(1) if mask.dim() == 3 else mask
    return _marked(row.view(b, heads, t).float(), mask)


def _relative_row(module, q, k, relative_pos, rel_embeddings, scale) -> torch.Tensor:
    """The c2p and p2c terms of the [CLS] row: [B*heads, 1, T]."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

    heads, span, t = module.num_attention_heads, module.pos_ebd_size, k.size(1)
    if relative_pos is None:
        relative_pos = build_relative_position(k, k, module.position_buckets, module.max_relative_positions)
    relative = relative_pos.reshape(-1, t, t)[0].to(device=q.device, dtype=torch.long)  # [query, key]
    rel = module.pos_dropout(rel_embeddings)[: span * 2].unsqueeze(0)
    repeat = q.size(0) // heads
    score = 0
    if "c2p" in module.pos_att_type:
        proj = module.key_proj if module.share_att_key else module.pos_key_proj
        pos_key = module.transpose_for_scores(proj(rel), heads).repeat(repeat, 1, 1)  # [B*heads, 2 span, d_head]
        c2p = torch.bmm(q, pos_key.transpose(-1, -2))  # [B*heads, 1, 2 span]
        index = torch.clamp(relative[0] + span, 0, span * 2 - 1)  # the [CLS] query's row
        score = score + torch.gather(c2p, -1, index.expand(q.size(0), 1, t)) / scale
    if "p2c" in module.pos_att_type:
        proj = module.query_proj if module.share_att_key else module.pos_query_proj
        pos_query = module.transpose_for_scores(proj(rel), heads).repeat(repeat, 1, 1)
        p2c = torch.bmm(k, pos_query.transpose(-1, -2))  # [B*heads, T, 2 span]
        index = torch.clamp(-relative[:, 0] + span, 0, span * 2 - 1)  # each key's position relative to [CLS]
        score = score + torch.gather(p2c, -1, index.view(1, t, 1).expand(q.size(0), t, 1)).transpose(-1, -2) / scale
    return score


_READER_CLASSES = {ATTENTION_FUNCTION: FunctionReader, DEBERTA_V2: DebertaV2Reader}


def make_reader(model: nn.Module, ranking_layers: list[int], attention_layers: list[int], num_heads: int):
    """The reader of `model`'s architecture, capturing `ranking_layers`' [CLS] rows and `attention_layers`' Q, K."""
    reader = score_reader(model.config)
    check_attention_rows(model.config, attention_layers)
    if reader == PROJECTIONS:
        return ProjectionReader(model, ranking_layers, attention_layers, num_heads)
    return _READER_CLASSES[reader](model, ranking_layers, attention_layers)
