"""LightPAFF pre-training distillation (`hsk train --method lightpaff-pretrain`): its pieces for the one loop.

A masked-LM store (`hsk dump --objective mlm`) holds the masked inputs and, per masked position,
the original token and the teacher's top-k ids, logits and full log-sum-exp. The student is a
BertForMaskedLM (decoder tied to the word embeddings): its encoder and MLM head are trained on the
stage's terms (pipelines.methods.lightpaff) at the masked positions only. The one training loop
(pipelines.train.run.loop) runs the stage as it runs every other: optimiser, schedule, stream,
checkpoints (OUT/checkpoint/state.pt every --checkpoint-every steps: a rerun of the same command
continues from there and computes the same steps) and metrics. What differs lives here: the source
(a `StoreSource`), the arrays the stage streams and how its batches are made (`MaskedLMFeed`), and
the student (`mlm_student`). There is no task, dev set or classifier: OUT/best is the final model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from hskstore.format.config import ConfigError
from hskstore.format.meta import StoreMeta
from pipelines.registry import Stage
from pipelines.train.data.stream import StoreStream
from pipelines.train.kinds.store_run import plan_store_run
from pipelines.train.run.driver import RunRequest
from pipelines.train.run.loop import RunParts
from pipelines.train.students.adapter import masked_lm_batch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from hskstore.io.mlm_store import MLMStore

MLM_ARRAYS = ["input_ids", "token_type_ids", "length", "mlm/positions", "mlm/labels", "mlm/topk_ids",
              "mlm/topk_logits", "mlm/lse"]

def mlm_student(student: str, teacher: str) -> tuple[nn.Module, PreTrainedTokenizerBase, str]:
    """(BertForMaskedLM, tokenizer, how it was made): bert<k> = the MLM teacher's first k layers and its head;
    a folder = that encoder, with its MLM head when it has one, else a fresh head tied to its embeddings."""
    from transformers import BertForMaskedLM

    from pipelines.core.models import ModelLoadError, load_tokenizer, resolve_model

    match = re.fullmatch(r"bert(\d+)", student.strip().lower())
    source = teacher if match else resolve_model(student)
    kwargs = {"num_hidden_layers": _depth(int(match.group(1)), teacher)} if match else {}
    try:
        model = BertForMaskedLM.from_pretrained(source, **kwargs)
    except Exception as exc:  # transformers raises many kinds; say what to pass instead
        reason = str(exc).splitlines()[0][:200]
        raise ModelLoadError(f"cannot load {student} as a BERT masked LM ({reason}): pass bert<k> or a BERT "
                             "encoder folder") from None
    try:
        tokenizer = load_tokenizer(source)
    except ModelLoadError:
        tokenizer = load_tokenizer(teacher)
    init = f"first {kwargs['num_hidden_layers']} layers + MLM head of {teacher}" if match else f"encoder {source}"
    return model, tokenizer, init


def _depth(k: int, teacher: str) -> int:
    from pipelines.core.models import ModelLoadError, load_config

    depth = load_config(teacher).num_hidden_layers
    if not 1 <= k <= depth:
        raise ModelLoadError(f"bert{k} needs 1..{depth} layers of the store's teacher {teacher}, which has {depth}")
    return k


def _check_student(model: nn.Module, tokenizer: PreTrainedTokenizerBase, meta: StoreMeta) -> None:
    """The KL compares vocabulary ids: the student must share the teacher's vocabulary."""
    from pipelines.core.models import vocab_hash

    want = meta.teacher.vocab_size
    if want is not None and model.config.vocab_size != want:
        raise ConfigError(f"the student's vocabulary has {model.config.vocab_size} ids but the store's teacher "
                          f"{want}: pre-training distillation needs the teacher's vocabulary (use bert<k>)")
    if vocab_hash(tokenizer) != meta.tokenizer.vocab_hash:
        raise ConfigError("the student's tokenizer is not the one the store was tokenized with: pre-training "
                          "distillation compares token ids, so use bert<k> or a student with the teacher's vocabulary")


def mlm_batch(raw: dict[str, np.ndarray], device: str) -> dict[str, torch.Tensor]:
    """The masked-LM batch (adapter.masked_lm_batch) and, per used slot, the teacher's stored top-k targets."""
    batch = masked_lm_batch(raw["input_ids"], raw["token_type_ids"], raw["length"], raw["mlm/positions"],
                            raw["mlm/labels"], device)
    used = batch["used"]
    return {**batch, "topk_ids": torch.as_tensor(raw["mlm/topk_ids"].astype(np.int64), device=device)[used],
            "topk_logits": torch.as_tensor(raw["mlm/topk_logits"], device=device)[used],
            "lse": torch.as_tensor(raw["mlm/lse"], device=device)[used]}


class _Maker:
    def __init__(self, device: str):
        self.device = device

    def __call__(self, raw: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return mlm_batch(raw, self.device)

    def close(self) -> None:
        pass


@dataclass
class MaskedLMFeed:
    """A stage that reads "mlm" streams the masked inputs and the teacher's stored top-k targets."""

    store: MLMStore

    def names(self, stage: Stage, kept: list[int]) -> list[str]:
        return list(MLM_ARRAYS)

    def maker(self, stage: Stage, kept: list[int], device: str, stream: StoreStream) -> _Maker:
        return _Maker(device)


def prepare_pretraining(request: RunRequest) -> RunParts:
    """The plan, student and feed of a pre-training run, every check done before anything is written."""
    options, student, device, log = request.options, request.student, request.device, request.log
    plan = plan_store_run(request, "a masked-LM store")
    from pipelines.dump.mlm import load_mlm_teacher

    teacher = plan.source.teacher_path(options.teacher, load=lambda name: load_mlm_teacher(name, "cpu"))
    model, tokenizer, init = mlm_student(student, teacher)
    _check_student(model, tokenizer, plan.source.metadata)
    log(f"lightpaff-pretrain: {init}; {len(plan.store)} rows")
    return plan.parts(student, plan.student_info(student, "bert_mlm", init, teacher, model, tokenizer), model, "mlm",
                      MaskedLMFeed(plan.store), device, 32, "use it as --init of --method lightpaff")
