"""What a distillation method is, as data, and every name a method may use: torch-free, below methods and train.

A `Method` names typed options and builds a list of `Stage`s. A Stage says everything the one
training loop (pipelines.train.run.loop) needs to run it: how long and at what learning rate, what it
reads from the store, what the student must output, which head it trains and what else trains,
whether it keeps the best dev checkpoint, and its loss as a weighted sum of named `Term`s, each
logged on its own in metrics.jsonl. Layer pairs are not written by hand: a Stage names a pairing
rule, which pipelines.train.losses.pairs computes from the store's layer map and the student's depth.

Every name a Stage or Term holds is one of the vocabularies declared here, and is checked when the
Stage or Term is built (a misspelt loss term is a one-line MethodError listing the known ones, before
any model is loaded), as torchdistill looks its names up when it builds a run and TextBrewer's
IntermediateMatch asserts them in its constructor. This module declares the names; pipelines.train
implements them, keyed by the same names (tests/test_registry.py checks the two sets agree):

    LOSS_TERMS  -> pipelines.train.losses.terms.LOSS_TERMS
    HEADS       -> pipelines.train.students.heads
    STORE_READS -> pipelines.train.data.sources.STORE_READS
    PAIR_RULES  -> pipelines.train.losses.pairs.RULES
    HEAD_MAPS   -> pipelines.train.losses.attention.HEAD_MAPS
    SCHEDULES   -> pipelines.train.run.loop.schedule_factor

Methods (pipelines.methods, one module each) import this module and never pipelines.train, so
`import pipelines.methods` loads no torch. A method that needs a new loss term declares its name
with `declare_loss_term` and implements it with pipelines.train.losses.terms.loss_term.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hskstore.format.config import ConfigError, Selection
from hskstore.format.meta import StoreMeta
from hskstore.plugins import METHODS, Plugin, PluginError, plugins
from pipelines.core.tasks import Task

# --------------------------------------------------------------------------------------------------
# The vocabularies: name -> one line on what it is (and, for method-specific names, whose it is)

LOSS_TERMS: dict[str, str] = {
    "ce": "cross-entropy to the gold label; rows without one are left out",
    "kl": "T^2 KL(softmax(teacher/T) || softmax(student/T)), batch mean",
    "soft_ce": "soft cross-entropy to softmax(teacher/T) (mud's prediction stage)",
    "gold_mse": "MSE to the gold score (regression tasks)",
    "teacher_mse": "MSE to the teacher's score (regression KD)",
    "hsk_mse": "HSK loss: MSE(W h_student, zero-filled stored teacher vector), summed over layer pairs (mud)",
    "hsk_masked_mse": "as hsk_mse, averaged over the kept teacher elements only (mud --hsk-loss masked-mse)",
    "pkd_cls": "Patient KD: MSE of L2-normalised [CLS] vectors over the layer pairs (pkd-skip, pkd-last, pea)",
    "attention_mse": "TinyBERT: MSE of pre-softmax attention rows over the layer pairs (tinybert-att)",
    "ptp_ce": "PEA-KD: cross-entropy of the 4-way ptp4 head to the PTP labels (pea)",
    "lightpaff_ft": "LightPAFF: (1 - lam) CE(gold) + lam KL(teacher) on labelled rows, KL alone on others",
    "mlm_mle": "LightPAFF pre-training: cross-entropy of the original token at every masked position",
    "mlm_topk_kl": "LightPAFF pre-training: KL over the stored top-k ids plus a tail bucket",
    "clm_ce": "causal LM: cross-entropy of each real position's next token (clm-kd)",
    "clm_topk_kl": "causal LM: KL over a top-K store's ids plus the tail bucket, or renormalized over them (clm-kd)",
    "clm_sampled_ce": "causal LM: RS-KD's unbiased estimate, -sum count/draws log q, on a sampled store (clm-kd)",
    "clm_full_kl": "causal LM: KL over the whole vocabulary from the live teacher (clm-kd --set target=live)",
    "clm_hidden_kl": "causal LM: KL over the whole vocabulary from the stored final hidden state and head "
    "(clm-kd on a --support hidden store)",
    "clm_layer_mse": "causal LM: MSE(W h_student, stored teacher layer state) per element at the stored positions, "
    "summed over layer pairs (clm-kd --set layer_weight)",
    "clm_layer_cos": "causal LM: 1 - cosine(W h_student, stored teacher layer state) per stored position, summed "
    "over layer pairs (clm-kd --set layer_weight --set layer_loss=cosine)",
    "uld": "another tokenizer: L1 of the sorted teacher support (with its tail) and the student's sorted top "
    "probabilities at shared byte boundaries (uld)",
    "alm_chunks": "another tokenizer: binary KL of teacher and student likelihoods of the chunks between shared "
    "byte boundaries (alm)",
    "mined_kl": "another tokenizer: KL to the stored support mapped onto the student's ids by exact string (alm)",
}
HEADS: dict[str, str] = {
    "task": "the student's own classifier (the task's labels)",
    "ptp4": "PEA-KD's 4-way PTP head on the pooled features (pea)",
    "mlm": "a masked-LM student's MLM head (lightpaff-pretrain)",
    "clm": "a causal LM's own LM head (clm-kd)",
    "s2s": "a seq2seq student's LM head at the target's positions (s2s-kd)",
}
STORE_READS: dict[str, str] = {
    "logits": "the teacher's logits",
    "labels": "the gold labels (always read)",
    "layers": "the stored hidden-state vectors of the stage's layer pairs",
    "attention": "the stored attention rows of the stage's layer pairs (`hsk dump --attention-rows`)",
    "mlm": "a masked-LM store's masked positions, original tokens and teacher top-k (`hsk dump --objective mlm`)",
    "clm": "a causal-LM store's blocks and per-position teacher support (`hsk dump --objective clm`)",
    "clm-text": "a causal-LM store's block text, token offsets and actual-token log-probs, re-tokenized by a "
    "student with another tokenizer (uld, alm)",
    "seq2seq": "a seq2seq store's pairs, teacher output and per-target-token support (`hsk dump --objective seq2seq`)",
}
PAIR_RULES: dict[str, str] = {
    "store": "the store's layer map, fitted to the student's depth (mud, tinybert-att)",
    "pkd-skip": "Patient KD Skip: student layers 1..S-1 <- every (L/S)-th teacher layer",
    "pkd-last": "Patient KD Last: student layers 1..S-1 <- the S-1 teacher layers below the top",
}
OUTPUTS: dict[str, str] = {
    "logits": "the head's outputs",
    "hidden_states": "every layer's hidden states (0 = embeddings)",
    "attentions": "every layer's attention probabilities",
    "attention_scores": "pre-softmax (q, k) of every self-attention call (pipelines/train/losses/attention.py)",
}
TRAINS: dict[str, str] = {
    "student": "the student model",
    "projection": "the shared Linear W: d_S -> d_T",
}
SCHEDULES: dict[str, str] = {
    "constant": "the stage's LR throughout",
    "linear": "linear decay to 0",
    "warmup-linear": "linear warmup over warmup_ratio of the steps, then linear decay",
}
HEAD_MAPS: dict[str, str] = {
    "same": "student head h <- teacher head h (equal head counts)",
    "mean": "head-averaged rows on both sides",
}


class MethodError(ConfigError):
    """A method cannot run on this store / student, or got a bad option (one line, says what to do)."""


def check_names(where: str, what: str, names: Iterable[str], vocabulary: Mapping[str, str]) -> None:
    """MethodError (one line, listing the known names) when a name is not in the vocabulary."""
    bad = [n for n in names if n not in vocabulary]
    if bad:
        raise MethodError(f"{where}: unknown {what} {', '.join(map(repr, bad))}; known: {', '.join(vocabulary)}")


def _declare(vocabulary: dict[str, str], what: str, name: str, description: str) -> str:
    if vocabulary.get(name, description) != description:
        raise ValueError(f"{what} {name!r} is already declared as: {vocabulary[name]}")
    vocabulary[name] = description
    return name


def declare_loss_term(name: str, description: str) -> str:
    """Declare a new loss term name (then implement it with pipelines.train.losses.terms.loss_term)."""
    return _declare(LOSS_TERMS, "loss term", name, description)


def declare_head(name: str, description: str) -> str:
    """Declare a head a stage may train (Stage.head), then say what the student's forward returns for it with
    pipelines.train.students.adapter.student_adapter: a kind whose student needs its own forward."""
    return _declare(HEADS, "head", name, description)


def declare_store_read(name: str, description: str) -> str:
    """Declare what a stage of a kind of a package reads from its stores (Stage.reads), for that kind's feed
    (pipelines.train.run.loop.Feed) to stream: a run kind's own store read, as "mlm" or "clm" are hsk's."""
    return _declare(STORE_READS, "store read", name, description)


# --------------------------------------------------------------------------------------------------
# Stage, Term, Context, Method


@dataclass(frozen=True)
class Term:
    """One named part of a stage's loss: weight * `pipelines.train.losses.terms.LOSS_TERMS[loss](inputs, **params)`."""

    name: str  # as logged in metrics.jsonl ("ce", "kl", "hsk", "pkd", ...)
    loss: str  # a name of LOSS_TERMS
    weight: float = 1.0
    params: tuple[tuple[str, Any], ...] = ()  # keyword arguments of the loss, e.g. (("T", 10.0),)

    def __post_init__(self) -> None:
        check_names(f"term {self.name}", "loss term", [self.loss], LOSS_TERMS)

    @property
    def kwargs(self) -> dict[str, object]:
        return dict(self.params)


MAX_EPOCHS = 1e6  # a stage's steps are counted as epochs x batches: past this they stop being a number a run reaches


@dataclass(frozen=True)
class Stage:
    """One stage of a method (see the module docstring); every name is checked against its vocabulary."""

    name: str
    epochs: float
    lr: float
    terms: tuple[Term, ...]
    schedule: str = "linear"  # SCHEDULES
    warmup_ratio: float = 0.0
    reads: tuple[str, ...] = ()  # STORE_READS besides the inputs: "logits", "layers", ...
    outputs: tuple[str, ...] = ("logits",)  # OUTPUTS: what the student's forward must return
    head: str = "task"  # HEADS: the head this stage trains (pipelines.train.students.heads)
    fresh_head: bool = False  # start from a newly initialised head instead of the one kept aside
    trains: tuple[str, ...] = ("student",)  # TRAINS
    select_best: bool = False  # evaluate on dev (epoch ends, --eval-every) and keep the best checkpoint
    pairs: str | None = None  # PAIR_RULES: the layer pairing rule (pipelines.train.losses.pairs)
    pair_loss: str | None = None  # the loss term(s) the pairs feed, "+"-joined (recorded with each pair)

    def __post_init__(self) -> None:
        where = f"stage {self.name}"
        if self.epochs < 0 or self.lr <= 0:
            raise MethodError(f"{where}: epochs must be >= 0 and lr > 0 (got {self.epochs}, {self.lr})")
        if self.epochs > MAX_EPOCHS:
            raise MethodError(f"{where}: {self.epochs:g} epochs is more than a run can count (at most {MAX_EPOCHS:g}): "
                              "pass fewer epochs")
        if not self.terms:
            raise MethodError(f"{where} has no loss terms")
        check_names(where, "schedule", [self.schedule], SCHEDULES)
        check_names(where, "store read", self.reads, STORE_READS)
        check_names(where, "output", self.outputs, OUTPUTS)
        check_names(where, "head", [self.head], HEADS)
        check_names(where, "trains", self.trains, TRAINS)
        check_names(where, "pairing rule", [self.pairs] if self.pairs else [], PAIR_RULES)
        check_names(where, "pair loss term", self.pair_loss.split("+") if self.pair_loss else [], LOSS_TERMS)

    def describe(self) -> dict:
        """JSON-able (summary.json, metrics.jsonl)."""
        out = dataclasses.asdict(self)
        out["terms"] = [{"name": t.name, "loss": t.loss, "weight": t.weight, **t.kwargs} for t in self.terms]
        return out


@dataclass(frozen=True)
class Context:
    """What a method may look at when it builds its stages: the task and the store's selection."""

    task: Task | None  # None: a masked-LM store (no task, no layer selection)
    selection: Selection | None
    meta: StoreMeta  # the store's metadata, typed (hskstore.format.meta)
    warnings: list[str] = field(default_factory=list)  # what the run should say (and record) about its plan
    student: str | None = None  # the student asked for, when known (a sweep's plan, a run)
    student_layers: int | None = None  # its depth (effective layers of an SPS student), when known
    # offline runs: () -> (teacher logits [N, C], gold labels [N]) of every stored row, read when called
    stored_targets: Callable[[], tuple[Any, Any]] | None = None


@dataclass(frozen=True)
class Method:
    """A distillation method: typed options and the stages they give."""

    name: str
    summary: str  # one line for `hsk methods`
    store_needs: str  # what a store must hold to serve it, in words (`hsk methods`)
    paper: str  # where it comes from
    options: type  # a dataclass; every field has a default, __post_init__ validates
    build: Callable[[Any, Context], list[Stage]]
    check: Callable[[Any, Context], str | None] = field(default=lambda options, ctx: None)
    # the store kinds it reads (hskstore.format.kinds names): the generic train code refuses any other store, naming
    # the methods that read it (pipelines.train)
    kinds: tuple[str, ...] = ("task",)
    # `hsk sweep` runs it over a grid of configs derived from the source store, with its options `stages` and
    # `alpha` as the grid's pred-only and no-KD arms (mud); other methods run once per student and seed
    sweep_grid: bool = False

    def make_options(self, values: Mapping[str, object] | None = None) -> Any:
        """The options dataclass from `values` (strings are converted to the field's type)."""
        values = dict(values or {})
        hints = typing.get_type_hints(self.options)
        known = {f.name for f in dataclasses.fields(self.options)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise MethodError(
                f"method {self.name} has no option {', '.join(unknown)}; its options: {', '.join(sorted(known))}"
            )
        coerced = {k: _coerce(k, v, hints[k]) for k, v in values.items()}
        for name, value in coerced.items():  # --set lr=inf reaches here past the command line's check
            if isinstance(value, float) and not math.isfinite(value):
                raise MethodError(f"option {name} takes a finite number, got {value}")
        return self.options(**coerced)

    def stages(self, options: Any, ctx: Context) -> list[Stage]:
        """Check the store against the method, then build its stages."""
        problem = self.check(options, ctx)
        if problem:
            raise MethodError(f"method {self.name}: {problem}")
        stages = self.build(options, ctx)
        if not stages:
            raise MethodError(f"method {self.name}: nothing to train with these options")
        return stages

    def option_dict(self, options: Any) -> dict[str, object]:
        return dataclasses.asdict(options)


def _coerce(name: str, value: Any, hint: Any) -> Any:
    """A CLI string (or a number) as the option field's declared type."""
    if not isinstance(value, str):
        return tuple(value) if isinstance(value, list) else value
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    kind = args[0]
    origin = typing.get_origin(kind) or kind
    if value.lower() == "none" and type(None) in typing.get_args(hint):
        return None
    try:
        return _parse(value, origin)
    except (TypeError, ValueError):
        raise MethodError(f"option {name}: cannot read {value!r} as {getattr(origin, '__name__', origin)}") from None


def _parse(value: str, origin: type) -> object:
    """A CLI string as `origin`: a bool from true/false/1/0/yes/no, a tuple from a comma list, else origin(value)."""
    if origin is bool:
        if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(value)
        return value.lower() in ("true", "1", "yes")
    if origin is tuple:
        return tuple(s.strip() for s in value.split(",") if s.strip())
    return origin(value)


# --------------------------------------------------------------------------------------------------
# The method registry (pipelines.methods registers the built-in methods when imported)

_REGISTRY: dict[str, Method] = {}
_FROM_PACKAGE: dict[str, str] = {}  # method name -> the installed package whose `hsk.methods` entry point added it
_FAULTS: dict[str, Exception] = {}  # entry point name -> why its package could not be loaded
_PLUGINS_LOADED = False


def register(method: Method) -> Method:
    """Add a method to the registry (its name is what `hsk train --method` takes)."""
    if method.name in _REGISTRY and _REGISTRY[method.name] is not method:
        raise ValueError(f"a method named {method.name!r} is already registered")
    _REGISTRY[method.name] = method
    return method


def load_plugins() -> None:
    """Register the methods of installed packages (entry point group `hsk.methods`, hskstore.plugins), once.

    An entry point names a module (its import registers its methods) or a `Method` (registered here). A package
    that fails to load is set aside with its one-line error: the others, and hsk's own methods, still work, and
    asking for a method it would have declared raises that error (`method_faults()` lists them)."""
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED = True
    for plugin in plugins(METHODS):
        _load_one(plugin)


def _load_one(plugin: Plugin) -> None:
    before = set(_REGISTRY)
    try:
        loaded = plugin.load()
        if isinstance(loaded, Method):
            register(loaded)
    except PluginError as exc:
        _FAULTS[plugin.name] = exc
    except ValueError as exc:  # register(): the name is taken
        _FAULTS[plugin.name] = PluginError(f"{plugin.package}: {exc}; uninstall one of the two")
    for name in set(_REGISTRY) - before:
        _FROM_PACKAGE[name] = plugin.package


def method_faults() -> list[Exception]:
    """The installed method packages that could not be loaded, each as its one-line error."""
    load_plugins()
    return [_FAULTS[name] for name in sorted(_FAULTS)]


def method_package(name: str) -> str | None:
    """The installed package a method comes from (None: built into hsk)."""
    return _FROM_PACKAGE.get(name)


def get_method(name: str) -> Method:
    """The registered method called `name` (what `hsk train --method` takes); installed packages' methods
    are loaded the first time a name is not a built-in one."""
    key = name.strip().lower()
    if key not in _REGISTRY:
        load_plugins()
    if key in _FAULTS and key not in _REGISTRY:
        raise _FAULTS[key]
    if key not in _REGISTRY:
        broken = f"; not loaded: {'; '.join(str(f) for f in method_faults())}" if _FAULTS else ""
        raise MethodError(f"unknown method {name!r}; known: {', '.join(sorted(_REGISTRY))} (see `hsk methods`)"
                          + broken)
    return _REGISTRY[key]


def methods_reading(kind: str) -> list[str]:
    """The names of the methods that read stores of `kind` (hskstore.format.kinds)."""
    return [m.name for m in all_methods() if kind in m.kinds]


def check_reads(method: Method, kind: str, store: str) -> None:
    """Refuse, in one line naming the methods that fit, a method that cannot read a store of this kind."""
    if kind not in method.kinds:
        from hskstore.format import kinds

        fits = methods_reading(kind)
        fit = f"pass --method {' or '.join(fits)}" if fits else "no installed method reads it"
        raise MethodError(f"method {method.name} reads {' or '.join(method.kinds)} stores, and {store} is a {kind} "
                          f"store ({kinds.get(kind).summary}): {fit} (or leave --method out: its kind's default)")


def all_methods() -> list[Method]:
    """Every method: hsk's own and those of installed packages."""
    load_plugins()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]
