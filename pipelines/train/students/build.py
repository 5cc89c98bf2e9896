"""Students a store can train (METHOD.md section 6): TinyBERT4, BERT_k (PKD), any Hugging Face encoder.

`build_student(name, ...)` returns a sequence classifier (an `AutoModelForSequenceClassification`,
so a saved student loads with plain transformers) and a `StudentInfo`: how it was initialised, its
depth and width, the projection W: Linear(d_S -> d_T) when its width differs from the teacher's, and
its tokenizer with the vocab hash that is checked against the store's.

A student that could not get its pre-trained weights is random-initialised only with a loud warning
(logging.warning, and `init == "random"` in the info and the run summary), never silently.
"""

from __future__ import annotations

import logging
import os
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

from pipelines.core.models import (
    ModelLoadError,
    check_encoder,
    expected_load_notices,
    load_config,
    load_tokenizer,
    resolve_model,
    vocab_hash,
)
from pipelines.core.pruned_bert import MODEL_TYPE as PRUNED_BERT
from pipelines.train.students.sps import sps_from_bert

if TYPE_CHECKING:
    from transformers import PreTrainedConfig, PreTrainedTokenizerBase

logger = logging.getLogger("hsk.students")

TINYBERT4_HUB_ID = "huawei-noah/TinyBERT_General_4L_312D"
TINYBERT_ENV = "HSK_TINYBERT_PATH"
_BERT_K = re.compile(r"^bert(\d+)$")
_SPS_K = re.compile(r"^sps(\d+)$")

# TinyBERT4's shape (METHOD.md section 6).
TINYBERT4_CONFIG = dict(
    vocab_size=30522,
    hidden_size=312,
    num_hidden_layers=4,
    num_attention_heads=12,
    intermediate_size=1200,
    max_position_embeddings=512,
    type_vocab_size=2,
    hidden_act="gelu",
)


@dataclass
class StudentInfo:
    """What was built, and from what."""

    name: str  # as asked ("tinybert4", "bert3", a hub id or a folder)
    kind: str  # "tinybert4" | "bert_k" | "sps" | "rosita" | "hf"
    init: str  # "pretrained" | "teacher-layers" | "teacher-pruned" | "random"
    source: str | None  # where the weights came from (None for random)
    num_layers: int
    hidden_size: int
    projection: nn.Linear | None  # W: Linear(d_S -> d_T), shared by all kept layers; None when d_S = d_T
    tokenizer: PreTrainedTokenizerBase | None = None
    vocab_hash: str | None = None
    tokenizer_source: str | None = None
    warnings: list[str] = field(default_factory=list)

    def describe(self) -> dict:
        """JSON-able summary (no modules)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "init": self.init,
            "source": self.source,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "projection": None
            if self.projection is None
            else [self.projection.in_features, self.projection.out_features],
            "tokenizer": self.tokenizer_source,
            "vocab_hash": self.vocab_hash,
            "warnings": list(self.warnings),
        }

    @classmethod
    def of_model(cls, name: str, model: nn.Module, tokenizer: PreTrainedTokenizerBase, *, kind: str = "hf",
                 init: str = "pretrained", source: str | None = None, vocab: str | None = None) -> StudentInfo:
        """A model trained as it is (no projection): its depth and width read from its config. `source` (default
        `name`) is where its weights and tokenizer came from; `vocab` the vocab hash (default: the tokenizer's)."""
        source = source or name
        return cls(name=name, kind=kind, init=init, source=source, num_layers=model.config.num_hidden_layers,
                   hidden_size=model.config.hidden_size, projection=None, tokenizer=tokenizer,
                   vocab_hash=vocab or vocab_hash(tokenizer), tokenizer_source=source)


def encoder_depth(config: PreTrainedConfig) -> int:
    # An SPS student runs more layers than it holds: its depth is the effective one.
    for key in ("sps_effective_layers", "num_hidden_layers", "n_layers", "num_layers"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    raise ModelLoadError(f"cannot tell the depth of a {type(config).__name__} student")


def _layers_of(name: str, match: re.Match) -> int:
    """k of bert<k> / sps<k>: at least one layer."""
    k = int(match.group(1))
    if k < 1:
        raise ModelLoadError(f"student {name}: a student needs at least one layer (e.g. {name.rstrip('0123456789')}3)")
    return k


def student_depth(name: str, weights: str | None = None) -> int:
    """The depth a student `name` will have (what `build_student` reports as num_layers), without
    building it: what a sweep checks each planned run's layer pairs with before anything trains."""
    from pipelines.train.students.sps import SPSConfig

    key = name.strip().lower()
    if key == "tinybert4" and not weights:
        return TINYBERT4_CONFIG["num_hidden_layers"]
    local = Path(name).expanduser().is_dir()
    if _BERT_K.match(key) and not local:
        return _layers_of(name, _BERT_K.match(key))
    if _SPS_K.match(key) and not local:
        return encoder_depth(SPSConfig(num_hidden_layers=_layers_of(name, _SPS_K.match(key))))
    return encoder_depth(load_config(weights or name))


def encoder_width(config: PreTrainedConfig) -> int:
    for key in ("hidden_size", "dim", "d_model"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    raise ModelLoadError(f"cannot tell the hidden size of a {type(config).__name__} student")


def _from_pretrained(path: str, what: str, **kwargs: Any) -> nn.Module:
    """AutoModelForSequenceClassification.from_pretrained with hsk's error message."""
    kwargs.setdefault("dtype", torch.float32)
    try:
        load_config(path)  # resolves aliases, fails fast and clearly when offline / missing
        with expected_load_notices():  # a new head, a teacher's dropped top layers: expected, not alarming
            return AutoModelForSequenceClassification.from_pretrained(resolve_model(path), **kwargs)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"cannot load {what} from {path}: {exc}") from exc


def width_projection(student_width: int, teacher_width: int | None) -> nn.Linear | None:
    """W: Linear(d_S -> d_T), TinyBERT's fit_dense, shared by all kept layers; None when the widths agree
    (METHOD.md 5). `hsk train` and the Hugging Face Trainer integration both build it here."""
    if teacher_width is None or teacher_width == student_width:
        return None
    return nn.Linear(student_width, teacher_width)


def _tinybert_sources(weights: str | None) -> list[str]:
    sources = [s for s in (weights, os.environ.get(TINYBERT_ENV)) if s]
    return [*sources, TINYBERT4_HUB_ID]


def _build_tinybert4(
    num_labels: int, weights: str | None, tokenizer_fallback: str | None
) -> tuple[nn.Module, str, str | None, Any, str | None, list[str]]:
    """(model, init, source, tokenizer, tokenizer source, warnings)."""
    tried = []
    for source in _tinybert_sources(weights):
        try:
            model = _from_pretrained(source, "TinyBERT4 weights", num_labels=num_labels)
            tokenizer = load_tokenizer(source)
            return model, "pretrained", source, tokenizer, source, []
        except ModelLoadError as exc:
            if source == weights:  # an explicit path that fails is the user's error, not a fallback
                raise
            tried.append(f"{source}: {textwrap.shorten(str(exc).splitlines()[0], 240, placeholder=' ...')}")
    if tokenizer_fallback is None:
        raise ModelLoadError(
            "TinyBERT4 weights not found (tried " + "; ".join(tried) + ") and no tokenizer to fall back on: "
            f"pass --student-weights DIR or set {TINYBERT_ENV}"
        )
    tokenizer = load_tokenizer(tokenizer_fallback)
    cfg = dict(TINYBERT4_CONFIG)
    cfg["vocab_size"] = max(len(tokenizer), 1)  # the embedding must cover the tokenizer the store used
    model = BertForSequenceClassification(BertConfig(**cfg, num_labels=num_labels))
    msg = (
        "STUDENT IS RANDOMLY INITIALISED: TinyBERT4's pre-trained weights could not be had ("
        + "; ".join(tried)
        + f"). Accuracy will be far below the paper's. Pass --student-weights DIR or set {TINYBERT_ENV} "
        f"to a folder holding {TINYBERT4_HUB_ID}. Using the tokenizer of {tokenizer_fallback}."
    )
    return model, "random", None, tokenizer, tokenizer_fallback, [msg]


def _build_bert_k(k: int, num_labels: int, base: str | None) -> tuple[nn.Module, str]:
    if base is None:
        raise ModelLoadError(
            f"bert{k} takes the first {k} layers of a checkpoint: pass --student-base (the teacher or its "
            "pre-trained base); by default hsk uses the teacher named in the store's provenance"
        )
    config = load_config(base)
    depth = encoder_depth(config)
    if not 1 <= k <= depth:
        raise ModelLoadError(f"bert{k} needs 1..{depth} layers of {base}, which has {depth}")
    # from_pretrained with num_hidden_layers=k loads layers 0..k-1 and drops the rest (PKD's init); a
    # per-layer attention list (ModernBERT's layer_types) keeps its first k entries.
    layers = {"num_hidden_layers": k}
    if getattr(config, "layer_types", None):
        layers["layer_types"] = list(config.layer_types[:k])
    model = _from_pretrained(base, f"bert{k}", num_labels=num_labels, ignore_mismatched_sizes=True, **layers)
    return model, base


def _build_pretrained(name: str, weights: str | None, num_labels: int) -> tuple[nn.Module, str, Any, str, str,
                                                                                list[str]]:
    """(model, source, tokenizer, init, kind, warnings) of a student loaded as saved (a hub id or a folder)."""
    source = weights or name
    note = check_encoder(load_config(source), "student")  # a family hsk cannot train is refused before loading
    model = _from_pretrained(source, f"student {name}", num_labels=num_labels, ignore_mismatched_sizes=True)
    pruned = model.config.model_type == PRUNED_BERT  # a folder of `hsk student build rosita`
    init, kind = ("teacher-pruned", "rosita") if pruned else ("pretrained", "hf")
    return model, source, load_tokenizer(source), init, kind, [note] if note else []


def build_student(
    name: str,
    *,
    num_labels: int,
    teacher_hidden_size: int | None,
    base: str | None = None,
    weights: str | None = None,
    tokenizer_fallback: str | None = None,
) -> tuple[nn.Module, StudentInfo]:
    """Build a student classifier and describe it.

    name: "tinybert4" (weights from `weights`, $HSK_TINYBERT_PATH or the hub; else random init with a
    loud warning and the `tokenizer_fallback` tokenizer), "bert<k>" (the first k layers of `base`,
    PKD's init), or any Hugging Face encoder id / local folder (a `hsk student build rosita` folder
    included: kind "rosita"). A projection Linear(d_S -> d_T) is
    returned in the info when the student's width differs from `teacher_hidden_size`.
    """
    key = name.strip().lower()
    warnings: list[str] = []
    if key == "tinybert4":
        model, init, source, tokenizer, tok_source, warnings = _build_tinybert4(num_labels, weights, tokenizer_fallback)
        kind = "tinybert4"
    elif _BERT_K.match(key) and not Path(name).expanduser().is_dir():
        k = _layers_of(name, _BERT_K.match(key))
        model, source = _build_bert_k(k, num_labels, base)
        tokenizer, tok_source, init, kind = load_tokenizer(source), source, "teacher-layers", "bert_k"
    elif _SPS_K.match(key) and not Path(name).expanduser().is_dir():
        # PEA-KD: bert<k>'s parameters run as an SPS student (pipelines/train/students/sps.py).
        k = _layers_of(name, _SPS_K.match(key))
        model, source = _build_bert_k(k, num_labels, base)
        if not isinstance(model, BertForSequenceClassification):
            raise ModelLoadError(f"sps{k} runs BERT layers twice: its base {base} is a {model.config.model_type} "
                                 f"model (use bert{k}, or pass a BERT checkpoint as --student-base)")
        model = sps_from_bert(model)
        tokenizer, tok_source, init, kind = load_tokenizer(source), source, "teacher-layers", "sps"
    else:
        model, source, tokenizer, init, kind, warnings = _build_pretrained(name, weights, num_labels)
        tok_source = source
    for msg in warnings:
        logger.warning(msg)
    width = encoder_width(model.config)
    info = StudentInfo(
        name=name,
        kind=kind,
        init=init,
        source=source,
        num_layers=encoder_depth(model.config),
        hidden_size=width,
        projection=width_projection(width, teacher_hidden_size),
        tokenizer=tokenizer,
        vocab_hash=vocab_hash(tokenizer),
        tokenizer_source=tok_source,
        warnings=warnings,
    )
    return model, info
