"""What every run from a store without a task settles first (masked-LM, causal-LM and seq2seq runs): the
source, the method and its stages checked against the store, the seed, and at the end the run's identity and
parts for the loop. Each run kind (pipelines.train.kinds.lightpaff_pretrain, .clm, .seq2seq) adds its student
and its feed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hskstore import HSKStore, open_store
from hskstore.format.config import ConfigError
from pipelines.methods import Context, get_method
from pipelines.registry import Method, Stage
from pipelines.train.data.sources import StoreSource, check_expected_store
from pipelines.train.options import TrainOptions, run_options
from pipelines.train.run.checkpoints import RunIdentity
from pipelines.train.run.driver import RunRequest
from pipelines.train.run.loop import Feed, RunParts, Student
from pipelines.train.students.build import StudentInfo
from pipelines.train.students.heads import Heads

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase


@dataclass
class StorePlan:
    """A store run's source, method and stages, every check against the store done."""

    options: TrainOptions
    source: StoreSource
    method: Method
    method_options: object  # an instance of the method's options dataclass
    stages: list[Stage]

    @property
    def store(self) -> HSKStore:
        return self.source.store

    def student_info(self, student: str, kind: str, init: str, teacher: str, model: nn.Module,
                     tokenizer: PreTrainedTokenizerBase) -> StudentInfo:
        return StudentInfo.of_model(student, model, tokenizer, kind=kind, init=init, source=teacher,
                                    vocab=self.source.metadata.tokenizer.vocab_hash)

    def identity(self, student: str, batch_size: int) -> RunIdentity:
        """What a checkpoint must share with the run that resumes it."""
        return RunIdentity(self.method.name, self.method.option_dict(self.method_options), student,
                           self.store.content_address or str(self.store.url), self.source.mode, batch_size,
                           run_options(self.options))

    def parts(self, student: str, info: StudentInfo, model: nn.Module, head: str, feed: Feed, device: str,
              default_batch: int, done_note: str, pairs: list[list] | None = None,
              projection: nn.Module | None = None) -> RunParts:
        """The loop's parts; `pairs` (per stage) and `projection` for a stage with a layer term (clm-kd)."""
        batch_size = self.options.batch_size or default_batch
        projection = None if projection is None else projection.to(device)
        return RunParts(self.source, self.method, self.method_options, self.stages,
                        Student(model.to(device), info, projection, Heads(model, head)),
                        pairs or [[] for _ in self.stages], feed, None, batch_size, self.identity(student, batch_size),
                        done_note=done_note)


def plan_store_run(request: RunRequest, needs: str, *, data_parallel: bool = False) -> StorePlan:
    """Open the request's store and plan the method's stages on it; `needs` says what --store must be, for the
    error. `data_parallel`: the kind runs under torchrun (its terms average over the global batch: losses.Counter)."""
    options, store, ranks, task = request.options, request.store, request.ranks, request.task
    if store is None:
        raise ConfigError(f"--method {options.method} distils from {needs}: give --store")
    if ranks.distributed and not data_parallel:
        raise ConfigError(f"--method {options.method} runs in one process: start it without torchrun")
    source = StoreSource(open_store(store))
    if task is not None:  # a task of the command line that this run would not read
        raise ConfigError(f"--task {task}: {store} is a {source.store.objective} store, which holds no task: drop "
                          "--task")
    check_expected_store(source, options.expect_store)
    method = get_method(options.method)
    method_options = method.make_options(options.method_options)
    stages = method.stages(method_options, Context(None, None, source.metadata))
    torch.manual_seed(options.seed)
    return StorePlan(options, source, method, method_options, stages)
