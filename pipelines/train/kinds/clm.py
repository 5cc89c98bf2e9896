"""Causal-LM distillation runs (`hsk train --method clm-kd`): their pieces for the one training loop.

A causal-LM store (`hsk dump --objective clm`, hskstore.format.clm) holds packed blocks and, per kept
position, the teacher's next-token distribution on a sparse support. The student is an
AutoModelForCausalLM with the teacher's vocabulary: `first<k>` (the teacher's embeddings, first k layers
and LM head) or any causal-LM folder. The loop (pipelines.train.run.loop) runs the stage as every other:
optimiser, schedule, shuffled stream, checkpoints and resume, metrics. What differs lives here: the source
(a `StoreSource`: the store, and the live teacher of `--set target=live`), the batches (`ClmFeed`: targets
decoded on the host from the stored bytes, or the live teacher's logits) and the student (`clm_student`).
There is no dev set: OUT/best is the final model; `hsk eval OUT/best --text-file F` gives its perplexity.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from hskstore.format.clm import HIDDEN, TEXT_ARRAYS, ClmSelection, LMTargets, decode, require_text
from hskstore.format.clm_layers import LAYER_ARRAYS
from hskstore.format.config import ConfigError
from hskstore.format.meta import StoreMeta
from hskstore.io.clm_store import ClmStore
from pipelines.core import codecs_torch
from pipelines.dump.clm_hidden import TeacherHead
from pipelines.registry import Context, Stage
from pipelines.train.data.sources import StoreSource
from pipelines.train.data.stream import StoreStream
from pipelines.train.data.xtok import XtokMaker, check_fast, mined_table, student_eos
from pipelines.train.kinds.clm_layers import LAYER_TERMS, LayerBatch, clm_layer_pairs, layer_projection
from pipelines.train.kinds.store_run import plan_store_run
from pipelines.train.run.driver import RunRequest
from pipelines.train.run.loop import RunParts

_FIRST = re.compile(r"first(\d+)")


def clm_student(student: str, teacher: str) -> tuple[nn.Module, Any, str]:
    """(AutoModelForCausalLM, tokenizer, how it was made): first<k> = the teacher's first k layers with its
    embeddings and LM head; a folder or hub id = that model as saved."""
    from transformers import AutoModelForCausalLM

    from pipelines.core.models import ModelLoadError, load_config, load_tokenizer, resolve_model

    match = _FIRST.fullmatch(student.strip().lower())
    # a named base ("smollm2") is its offline folder, never a hub id
    source = resolve_model(teacher) if match else resolve_model(student)
    kwargs = {}
    if match:
        depth = load_config(teacher).num_hidden_layers
        k = int(match.group(1))
        if not 1 <= k <= depth:
            raise ModelLoadError(f"first{k} needs 1..{depth} layers of the store's teacher {teacher}")
        kwargs["num_hidden_layers"] = k
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **kwargs)
    except Exception as exc:  # transformers raises many kinds; say what to pass instead
        raise ModelLoadError(f"cannot load {student} as a causal LM ({str(exc).splitlines()[0][:200]}): pass "
                             "first<k> or an AutoModelForCausalLM folder") from None
    init = f"first {kwargs['num_hidden_layers']} layers of {teacher}" if match else f"causal LM {source}"
    return model, load_tokenizer(source), init


def check_vocabulary(model: nn.Module, tokenizer: Any, meta: StoreMeta, log: Callable[[str], object],
                     others: tuple[str, ...] = ()) -> None:
    """The KD compares token ids: the student must tokenize as the teacher did (`others`: the methods that take
    another tokenizer, named in the refusal). Embedding sizes may differ by padding only (both cover the
    tokenizer), which is said, not refused."""
    from pipelines.core.models import vocab_hash

    mine, theirs = vocab_hash(tokenizer), meta.tokenizer.vocab_hash
    size, teacher_size = model.config.vocab_size, meta.teacher.vocab_size
    if mine != theirs:
        raise ConfigError(f"the student's vocabulary ({len(tokenizer)} tokens, {mine[:19]}) is not the store's "
                          f"teacher's ({meta.tokenizer.vocab_size} tokens, {theirs[:19]}): distillation compares token "
                          "ids; use first<k> or a student with the teacher's tokenizer"
                          + (f", or a method that takes another tokenizer: --method {' or '.join(others)}" if others
                             else ""))
    if size < meta.tokenizer.vocab_size:
        raise ConfigError(f"the student's embeddings have {size} rows but the tokenizer has "
                          f"{meta.tokenizer.vocab_size} tokens: pass a student whose embeddings cover its tokenizer")
    if size != teacher_size:
        log(f"note: the student's vocabulary has {size} rows and the teacher's {teacher_size}: the same tokenizer "
            "(padding only), accepted")


def lm_batch(raw: dict[str, np.ndarray], sel: ClmSelection | None, device: str, live: nn.Module | None,
             head: TeacherHead | None = None) -> dict:
    """A batch of blocks for the adapter and the loss terms: inputs, next-token labels and the masks of the
    positions each term averages over; the stored support at the kept positions ([N, S]), or the live
    teacher's logits at every real position ([N, V]), or neither (no selection: a teacher's own fine-tuning)."""
    ids = torch.as_tensor(raw["input_ids"].astype(np.int64), device=device)
    length = torch.as_tensor(raw["length"].astype(np.int64), device=device)
    t = torch.arange(ids.shape[1], device=device)[None, :]
    labels = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], 1)
    batch = {"input_ids": ids, "attention_mask": (t < length[:, None]).long(), "labels": labels,
             "ce_mask": t + 1 < length[:, None]}
    if live is not None:
        batch["kd_mask"] = t < length[:, None]
        with torch.no_grad():
            batch["teacher_logits"] = live(input_ids=ids).logits[batch["kd_mask"]]
        return batch
    if sel is None:
        return batch
    if head is not None:
        batch.update(hidden_batch(raw, sel, head, device))
    else:
        batch.update(support_batch(decode(raw, sel), device, ids.shape[1]))
    return batch


def hidden_batch(raw: dict[str, np.ndarray], sel: ClmSelection, head: TeacherHead, device: str
                 ) -> dict[str, torch.Tensor]:
    """A hidden-state store's batch for the full-vocabulary KL: the kept positions' stored bytes go to the device
    as they are, where the codec's twin decodes them and the store's head makes the teacher's logits [N kept, V]
    (no [N, V] ever crosses from the host)."""
    kept = np.unpackbits(raw["clm/kept"], axis=-1, count=sel.block_size).astype(bool)
    values = torch.as_tensor(raw["clm/hidden"][kept], device=device)
    scale = raw.get("clm/hidden_scale")
    scale = None if scale is None else torch.as_tensor(scale[kept], device=device)
    hidden = codecs_torch.get(sel.hidden_codec).decode(values, scale, sel.hidden_size)
    return {"kd_mask": torch.as_tensor(kept, device=device), "teacher_logits": head.logits(hidden)}


def support_batch(targets: LMTargets, device: str, width: int | None = None) -> dict[str, torch.Tensor]:
    """The stored support of a batch for the KD terms: the kept positions' mask [B, T] and their ids,
    probabilities and used slots [N kept, S]. `width`: the batch's inputs were cut to its longest row (the
    stream trims input_ids), so the mask is cut with them; positions past every row's length keep nothing."""
    kept = targets.kept[:, :width]
    return {"kd_mask": torch.as_tensor(kept, device=device),
            "kd_ids": torch.as_tensor(targets.ids[:, :width][kept], device=device),
            "kd_probs": torch.as_tensor(targets.probs[:, :width][kept], device=device),
            "kd_used": torch.as_tensor(targets.used[:, :width][kept], device=device)}


class _Maker:
    def __init__(self, sel: ClmSelection, device: str, live: nn.Module | None, head: TeacherHead | None = None,
                 layers: LayerBatch | None = None):
        self.sel, self.device, self.live, self.head, self.layers = sel, device, live, head, layers

    def __call__(self, raw: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        batch = lm_batch(raw, self.sel, self.device, self.live, self.head)
        if self.layers is not None:  # the intermediate-layer term's targets (clm-kd --set layer_weight)
            batch.update(self.layers(raw))
        return batch

    def close(self) -> None:
        pass


@dataclass
class ClmFeed:
    """A stage that reads "clm" streams the blocks and, unless the teacher runs live, their stored supports."""

    store: ClmStore
    live: nn.Module | None = None

    text: XtokMaker | None = None  # a student with another tokenizer: its maker (the stage reads clm-text)

    def names(self, stage: Stage, kept: list[int]) -> list[str]:
        wanted = ("input_ids", "length") if self.live is not None else ("input_ids", "length", "clm/")
        skip = () if self.text is not None else TEXT_ARRAYS  # the text only for a student that re-tokenizes it
        if not reads_layers(stage):  # the intermediate layers only for a stage with a layer term
            skip = (*skip, *LAYER_ARRAYS)
        return [name for name in self.store.specs if name.startswith(wanted) and name not in skip]

    def maker(self, stage: Stage, kept: list[int], device: str, stream: StoreStream) -> _Maker | XtokMaker:
        if self.text is not None:
            return replace(self.text, device=device)
        head = None
        if self.live is None and self.store.clm.support == HIDDEN:  # the stored head, once, on the device
            weight, bias = self.store.head()
            head = TeacherHead(torch.as_tensor(weight, device=device),
                               None if bias is None else torch.as_tensor(bias, device=device),
                               self.store.clm.logit_softcap)
        layers = LayerBatch(self.store.clm.layer_states, self.store.clm.block_size, device) if reads_layers(stage) \
            else None
        return _Maker(self.store.clm, device, self.live, head, layers)


def reads_layers(stage: Stage | None) -> bool:
    """Whether the stage has an intermediate-layer term (None: a reader without stages, the HF Trainer's)."""
    return stage is not None and any(term.loss in LAYER_TERMS for term in stage.terms)


def clm_feed(store: ClmStore, method_options: object) -> ClmFeed:
    """The feed of a causal-LM store read without a live teacher (the Hugging Face Trainer's)."""
    return ClmFeed(store)


def _teacher(source: StoreSource, override: str | None, required: bool) -> str:
    """Where the store's teacher is, its weights checked against the store's hash (loaded as a causal LM);
    `required` (a first<k> student, a live teacher): not found is refused naming --teacher."""
    from pipelines.dump.clm import load_clm_teacher

    return source.teacher_path(override, load=lambda name: load_clm_teacher(name, "cpu"), required=required)


TEXT_READ = "clm-text"
LIVE_TERM = "clm_full_kl"  # the term that reads the live teacher's logits (clm-kd --set target=live)
MINED_TERM = "mined_kl"  # the term that maps the support's ids through both tokenizers (alm)


def other_tokenizer_methods(meta: StoreMeta) -> tuple[str, ...]:
    """The registered causal-LM methods whose stages (default options) re-tokenize the store's text."""
    from pipelines.methods import all_methods
    from pipelines.registry import MethodError

    names = []
    for method in all_methods():
        if "clm" not in method.kinds:
            continue
        try:
            stages = method.stages(method.make_options(), Context(None, None, meta))
        except MethodError:
            continue
        if any(TEXT_READ in stage.reads for stage in stages):
            names.append(method.name)
    return tuple(names)


def _text_maker(plan: Any, store: Any, teacher: str, student: str, tokenizer: Any) -> XtokMaker:
    """The maker of a student with another tokenizer: the store must keep its text; MinED's id table when a
    stage has the mined_kl term."""
    from pipelines.core.models import load_tokenizer

    require_text(store.clm, str(store.url))
    check_fast(tokenizer, student)
    table = None
    if _has_term(plan.stages, MINED_TERM):
        table = mined_table(load_tokenizer(teacher), tokenizer, store.clm.vocab_size)
    return XtokMaker(store.clm, tokenizer, student_eos(tokenizer, student), "cpu", table,
                     getattr(plan.method_options, "max_student_tokens", 0))


def _has_term(stages: list[Stage], loss: str) -> bool:
    """Whether a stage of the plan has a term of this loss."""
    return any(term.loss == loss for stage in stages for term in stage.terms)


def prepare_clm(request: RunRequest) -> RunParts:
    """The plan, student and feed of a causal-LM run, every check done before anything is written."""
    options, student, device, log = request.options, request.student, request.device, request.log
    plan = plan_store_run(request, "a causal-LM store (with --set target=live its teacher runs beside the student)",
                          data_parallel=True)
    source = plan.source
    live = _has_term(plan.stages, LIVE_TERM)
    # MinED maps ids through the teacher's tokenizer: it needs the teacher as a first<k> student or a live one does
    mined = _has_term(plan.stages, MINED_TERM)
    teacher = _teacher(source, options.teacher, live or mined or _FIRST.fullmatch(student.strip().lower()) is not None)
    if live:
        from pipelines.dump.clm import load_clm_teacher

        source.teacher = load_clm_teacher(teacher, device).requires_grad_(False)
    model, tokenizer, init = clm_student(student, teacher)
    text = None
    if any(TEXT_READ in stage.reads for stage in plan.stages):
        text = _text_maker(plan, source.store, teacher, student, tokenizer)
    else:
        check_vocabulary(model, tokenizer, source.metadata, log, other_tokenizer_methods(source.metadata))
    target = "live" if live else "store"
    log(f"{plan.method.name}: {init}; {len(source.store)} blocks of {source.store.clm.block_size} tokens, support "
        f"{source.store.clm.described}, target {target}")
    pairs, projection = _layer_parts(plan, model, log)
    return plan.parts(student, plan.student_info(student, "causal_lm", init, teacher, model, tokenizer), model, "clm",
                      ClmFeed(source.store, source.teacher, text), device, 8,
                      f"its perplexity: hsk eval OUT/best --text-file FILE --block-size {source.store.clm.block_size}",
                      pairs=pairs, projection=projection)


def _layer_parts(plan: Any, model: nn.Module, log: Callable[[str], Any]) -> tuple[list[list], nn.Module | None]:
    """Each stage's layer pairs and the shared projection (None where the widths agree) of a run whose stages
    have an intermediate-layer term (no pairs and no projection otherwise)."""
    states, o = plan.store.clm.layer_states, plan.method_options
    if not any(reads_layers(stage) for stage in plan.stages) or states is None:
        return [[] for _ in plan.stages], None
    projection = layer_projection(states, model.config.hidden_size)
    pairs = [clm_layer_pairs(states, model.config.num_hidden_layers, o.layer_map,
                             next(t.loss for t in stage.terms if t.loss in LAYER_TERMS), projection is not None, log)
             if reads_layers(stage) else [] for stage in plan.stages]
    return pairs, projection
