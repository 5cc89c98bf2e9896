"""Seq2seq distillation runs (`hsk train --method s2s-kd`): their pieces for the one training loop.

A seq2seq store (`hsk dump --objective seq2seq`, hskstore.format.seq2seq) holds pairs, the teacher's output
and per target token the teacher's distribution on a sparse support. The student reads a pair as the
store's teacher did (pipelines.core.pair_models): an encoder-decoder, or a decoder-only model on the prompt
then the target; `first<k>` is the teacher's first k layers (of the encoder and of the decoder), any other
name a folder with the teacher's vocabulary. The batch aligns the student's logits with the target's
positions, so that the causal-LM loss terms apply unchanged. There is no dev set: OUT/best is the final
model; `hsk eval OUT/best --pairs-file F` gives its BLEU, chrF and target perplexity.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hskstore.format.seq2seq import GROUP, Seq2seqSelection, decode
from pipelines.core.pair_models import PairModel, pair_model
from pipelines.methods.s2s_kd import sequence_of
from pipelines.registry import Stage
from pipelines.train.data.stream import StoreStream
from pipelines.train.kinds.clm import check_vocabulary, support_batch
from pipelines.train.kinds.store_run import plan_store_run
from pipelines.train.run.driver import RunRequest
from pipelines.train.run.loop import RunParts

if TYPE_CHECKING:
    from hskstore.io.seq2seq_store import Seq2seqStore

_FIRST = re.compile(r"first(\d+)")
INPUTS = ("source_ids", "source_length")


def seq2seq_student(student: str, teacher: str, arch: PairModel) -> tuple[Any, Any, str]:
    """(model, tokenizer, how it was made): first<k> = the teacher's first k layers; else that folder, loaded
    as the store's architecture."""
    from pipelines.core.models import load_tokenizer, resolve_model

    match = _FIRST.fullmatch(student.strip().lower())
    if match:
        model = arch.first_layers(teacher, int(match.group(1)), "cpu")
        return model, load_tokenizer(teacher), f"first {match.group(1)} layers of {teacher}"
    source = resolve_model(student)
    return arch.load(source, "cpu").train(), load_tokenizer(source), f"{arch.name} model {source}"


def pair_batch(raw: dict[str, np.ndarray], sel: Seq2seqSelection, on: str, kd: bool, device: str) -> dict:
    """A batch of pairs for the adapter and the loss terms: the model's inputs (`pair`), the target's ids as
    labels at its positions with the mask of its real tokens, and (kd) the stored support at the kept ones."""
    ids_name, length_name = sel.target_arrays(on)
    target, length = raw[ids_name].astype(np.int64), raw[length_name].astype(np.int64)
    pair = pair_model(sel.architecture).inputs(raw["source_ids"], raw["source_length"].astype(np.int64), target,
                                               length, sel, device)
    t = torch.arange(target.shape[1], device=device)[None, :]
    batch = {"pair": pair, "input_ids": pair.kwargs["input_ids"],
             "labels": torch.as_tensor(target, device=device),
             "ce_mask": t < torch.as_tensor(length, device=device)[:, None]}
    if kd:
        batch.update(support_batch(decode(raw, sel), device))
    return batch


def _kd(stage: Stage) -> bool:
    return any(term.loss != "clm_ce" for term in stage.terms)


class _Maker:
    def __init__(self, sel: Seq2seqSelection, on: str, kd: bool, device: str):
        self.sel, self.on, self.kd, self.device = sel, on, kd, device

    def __call__(self, raw: dict[str, np.ndarray]) -> dict[str, object]:
        return pair_batch(raw, self.sel, self.on, self.kd, self.device)

    def close(self) -> None:
        pass


@dataclass
class Seq2seqFeed:
    """A stage that reads "seq2seq" streams the sources, the target it learns and (with KD) the supports."""

    store: Seq2seqStore
    on: str

    def names(self, stage: Stage, kept: list[int]) -> list[str]:
        wanted = (*INPUTS, *self.store.s2s.target_arrays(self.on), *((f"{GROUP}/",) if _kd(stage) else ()))
        return [name for name in self.store.specs if name.startswith(wanted)]

    def maker(self, stage: Stage, kept: list[int], device: str, stream: StoreStream) -> _Maker:
        return _Maker(self.store.s2s, self.on, _kd(stage), device)


def seq2seq_feed(store: Seq2seqStore, method_options: Any) -> Seq2seqFeed:
    """The feed of a seq2seq store: the target the method's options learn (the Hugging Face Trainer's)."""
    return Seq2seqFeed(store, sequence_of(method_options, store.metadata.selection))


def prepare_seq2seq(request: RunRequest) -> RunParts:
    """The plan, student and feed of a seq2seq run, every check done before anything is written."""
    options, student, device, log = request.options, request.student, request.device, request.log
    plan = plan_store_run(request, "a seq2seq store", data_parallel=True)
    sel = plan.store.s2s
    on = sequence_of(plan.method_options, plan.source.metadata.selection)
    arch = pair_model(sel.architecture)
    teacher = plan.source.teacher_path(options.teacher, load=lambda name: arch.load(name, "cpu"),
                                       required=_FIRST.fullmatch(student.strip().lower()) is not None)
    model, tokenizer, init = seq2seq_student(student, teacher, arch)
    check_vocabulary(model, tokenizer, plan.source.metadata, log)
    learns = "the teacher's output" if on == "teacher" else "the reference"
    log(f"s2s-kd: {init}; {len(plan.store)} pairs, learning {learns}"
        + (f", KD on {sel.described}" if any(_kd(s) for s in plan.stages) else ", no KD"))
    prompt = f" --prompt {sel.prompt!r}" if sel.prompt else ""
    return plan.parts(student, plan.student_info(student, arch.name, init, teacher, model, tokenizer), model, "s2s",
                      Seq2seqFeed(plan.store, on), device, 8,
                      f"its BLEU and chrF: hsk eval OUT/best --pairs-file FILE --max-length {sel.max_source} "
                      f"--max-target {sel.max_target}{prompt}")
