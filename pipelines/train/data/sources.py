"""Where a training run's batches and targets come from: a store (offline) or a live teacher (online).

Opening a source, mapping the student's layers onto the stored ones, checking tokenizer provenance, and
turning raw stream batches into device tensors (`BatchMaker`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from hskstore.errors import ProvenanceError
from hskstore.format.config import ConfigError, HSKConfig
from hskstore.format.meta import StoreMeta
from hskstore.format.schema import array_specs
from hskstore.io.reader import open_store
from pipelines.core.data import DataError, Examples, load_examples
from pipelines.core.tasks import Task, get_task
from pipelines.train.data.decode import PinnedStaging, decode_batch
from pipelines.train.options import TrainOptions
from pipelines.train.students.build import StudentInfo

logger = logging.getLogger("hsk.train")

INPUT_NAMES = ["row", "text_hash", "label", "input_ids", "token_type_ids", "length"]


# --------------------------------------------------------------------------------------------------
# Sources of training rows


@dataclass
class StoreSource:
    """What a run trains from when its store has no task (masked-LM, causal-LM): the store, and the live teacher
    of a run that computes its targets beside the student (none: every target comes from the store)."""

    store: Any
    teacher: Any = None
    mode: str = "offline"
    task: None = None
    selection: None = None

    @property
    def meta(self) -> dict:
        return self.store.meta

    @property
    def metadata(self) -> StoreMeta:
        return self.store.metadata

    @property
    def teacher_name(self) -> str:
        return self.store.metadata.teacher.name


class ShardedRows:
    """Arrays held in memory, read shard by shard the way a StoreStream reads a store (nothing is written).

    `metadata` needs what the stream reads of a store's: `complete` and `layout` (rows, shard rows)."""

    def __init__(self, metadata: Any, arrays: dict[str, np.ndarray], url: str):
        self.metadata, self.arrays, self.url = metadata, arrays, url

    @property
    def n_shards(self) -> int:
        return self.metadata.layout.n_shards

    def __len__(self) -> int:
        return self.metadata.layout.n_rows

    def shard_bounds(self, shard: int) -> tuple[int, int]:
        return self.metadata.layout.shard_bounds(shard)

    def read_shard(self, shard: int, *, verify: bool = True, names: list[str] | None = None) -> dict:
        start, stop = self.shard_bounds(shard)
        return {n: self.arrays[n][start:stop] for n in (names or list(self.arrays))}


class OnlineSource(ShardedRows):
    """The parts of an HSKStore a StoreStream reads, holding only the tokenized inputs in memory.

    Same metadata, layout and array dtypes as the store a dump of the same data would write, so the
    stream plans the very same batches; the teacher targets are computed per batch instead.
    """

    def __init__(self, meta: dict, inputs: dict[str, np.ndarray], url: str):
        self.meta = meta
        self.specs = {s.name: s for s in array_specs(meta)}
        arrays = {name: inputs[name].astype(self.specs[name].dtype) for name in INPUT_NAMES}
        super().__init__(StoreMeta.parse(meta), arrays, url)


@dataclass
class Source:
    """What a run trains from: a store, or a teacher + data that stand in for one."""

    mode: str  # "offline" (a store) | "online" (a teacher computes targets) | "memory" (labelled rows only)
    store: Any  # HSKStore or OnlineSource
    meta: dict
    task: Task
    teacher_name: str
    teacher: nn.Module | None = None
    teacher_tokenizer: Any = None
    examples: Examples | None = None  # online: the training texts
    selection_engine: str = "torch"  # online: where the targets are selected (as `hsk dump --selection-engine`)

    @property
    def selection(self):
        return self.store.selection if self.mode == "offline" else self._selection

    @property
    def metadata(self) -> StoreMeta:
        """The typed metadata of the store (or of the store an online source stands in for)."""
        return self.store.metadata

    _selection: Any = None


def open_offline(url: str, task: str | None) -> Source:
    store = open_store(url)  # refuses incomplete stores; damaged shards fail their digests when read
    store.refuse_task_training()  # a masked-LM store names the method that trains from it
    store_task = get_task(store.metadata.task.name)
    if task is not None and get_task(task) != store_task:
        raise ConfigError(f"--task {task} but the store {url} holds task {store_task.name}")
    return Source("offline", store, store.meta, store_task, store.metadata.teacher.name)


def open_online(
    teacher: str,
    task_name: str,
    config: str | None,
    options: TrainOptions,
    data_dir: str | None,
    log: Callable,
) -> Source:
    from pipelines.core.models import load_classifier, load_tokenizer
    from pipelines.core.tokenize import encode
    from pipelines.dump.stage import DumpOptions, build_selection, store_metadata, teacher_heads

    task = get_task(task_name)
    dump_options = options.online or DumpOptions(config=HSKConfig.parse(config or "0,0,0"))
    if config is not None:
        dump_options = dataclasses.replace(dump_options, config=HSKConfig.parse(config))
    tokenizer = load_tokenizer(teacher)
    model = load_classifier(teacher, num_labels=task.num_labels, device=run_device(options))
    examples = load_examples(task, options.train_split, data_dir=data_dir, limit=options.train_limit)
    max_length = dump_options.max_length or task.max_length
    selection = build_selection(dump_options, model.config.num_hidden_layers, model.config.hidden_size,
                                teacher_heads(model))
    meta = store_metadata(task, options.train_split, examples, teacher, model, tokenizer, selection, max_length,
                          dump_options.shard_rows)
    meta = dict(meta, complete=True)  # it stands in for a finished store
    enc = encode(tokenizer, examples.texts, max_length)
    inputs = dict(enc, row=examples.rows, text_hash=examples.text_hashes(), label=examples.labels)
    log(
        f"online: teacher {teacher} computes the targets of each batch "
        f"({len(examples)} examples, config {selection.config})"
    )
    source = Source(
        "online",
        OnlineSource(meta, inputs, f"online:{teacher}"),
        meta,
        task,
        teacher,
        model,
        tokenizer,
        examples,
        selection_engine=dump_options.selection_engine,
    )
    source._selection = selection
    return source


def memory_source(task: Task, examples: Examples, name: str, model: nn.Module, tokenizer, max_length: int,
                  shard_rows: int = 1024) -> Source:
    """Labelled examples in memory, laid out as a logits-only store would be (mode "memory": no teacher).

    `hsk teacher` fine-tunes through the one training loop with this source: the same stream, batches,
    schedule, evaluation and checkpoints as distillation.
    """
    from pipelines.core.tokenize import encode
    from pipelines.dump.stage import DumpOptions, build_selection, store_metadata

    cfg = model.config
    selection = build_selection(DumpOptions(config=HSKConfig.parse("0,0,0")), cfg.num_hidden_layers, cfg.hidden_size)
    meta = store_metadata(task, "train", examples, name, model, tokenizer, selection, max_length, shard_rows)
    meta = dict(meta, complete=True)  # it stands in for a finished store
    enc = encode(tokenizer, examples.texts, max_length)
    inputs = dict(enc, row=examples.rows, text_hash=examples.text_hashes(), label=examples.labels)
    source = Source("memory", OnlineSource(meta, inputs, f"memory:{examples.source}"), meta, task, name,
                    examples=examples)
    source._selection = selection
    return source


def store_teacher(source: Source, override: str | None, *, load: Callable[[str], nn.Module] | None = None) -> str:
    """Where the store's teacher is now (bert<k> init, tokenizer fallback): `override` (--teacher), else the
    recorded path or hub id (core.models.resolve_teacher). Its weights are checked against the store's hash
    whichever way it was found (loaded with `load`, default as a classifier): a teacher retrained in place
    is refused, not silently used."""
    from pipelines.core.models import ModelLoadError, check_weights, resolve_teacher

    recorded = source.metadata.teacher.record
    if source.mode != "offline":
        return recorded.get("path") or source.teacher_name
    if override:
        found = resolve_teacher(recorded, override)
    else:
        try:
            found = resolve_teacher(recorded)
        except ModelLoadError:
            # Not every student needs the teacher (tinybert4, hub encoders): bert<k> says where it looked.
            return recorded.get("path") or source.teacher_name
    check_weights(load(found) if load else found, recorded.get("weights_hash"), override or found)
    return found


def check_expected_store(source: Source, expected: str | None) -> None:
    """--expect-store: refuse a store whose content address is not the one the user pinned."""
    if expected is None:
        return
    found = getattr(source.store, "content_address", None)
    if found is None:
        raise ConfigError(
            f"--expect-store {expected}: the store {source.store.url} has no content address (no manifest covers "
            f"its metadata); cover it with `hsk upgrade {source.store.url}` or drop --expect-store"
        )
    if found != expected:
        raise ConfigError(f"--expect-store {expected}: the store {source.store.url} is {found}")


def run_device(options: TrainOptions) -> str:
    from pipelines.core.devices import pick_device

    return pick_device(options.device)


# --------------------------------------------------------------------------------------------------
# What a stage reads, and provenance

INPUT_ARRAYS = ["label", "input_ids", "token_type_ids", "length", "text_hash"]


def _layer_arrays(specs: dict, kept: list[int]) -> list[str]:
    names = []
    for i in kept:
        names += [n for n in specs if n.startswith(f"layers/{i}/") and not n.endswith(("scores", "attention"))]
    return names


# Stage.reads -> the store arrays it needs: fn(store specs, kept layer indices of the stage's pairs).
STORE_READS: dict[str, Callable[[dict, list[int]], list[str]]] = {
    "logits": lambda specs, kept: ["logits"],
    "labels": lambda specs, kept: [],  # gold labels are always read
    "layers": _layer_arrays,
    "attention": lambda specs, kept: [f"layers/{i}/attention" for i in kept if f"layers/{i}/attention" in specs],
}


def stream_names(source: Source, reads: tuple[str, ...], kept: list[int]) -> list[str]:
    """The arrays a stage streams: the inputs, plus (offline) what it reads; online targets come per batch."""
    names = list(INPUT_ARRAYS)
    if source.mode != "offline":
        return names
    for what in reads:
        if what not in STORE_READS:
            raise ConfigError(f"a stage reads {what!r}, which no reader knows; known: {', '.join(STORE_READS)}")
        names += [n for n in STORE_READS[what](source.store.specs, kept) if n not in names]
    return names



def check_provenance(source: Source, info: StudentInfo, token_level: bool, log: Callable) -> bool:
    """True when the student shares the store's tokenizer; raises when token-level HSK needs it."""
    stored = source.metadata.tokenizer.vocab_hash
    if info.vocab_hash == stored:
        return True
    what = (
        f"the student's tokenizer ({info.tokenizer_source}, {str(info.vocab_hash)[:19]}) is not the one the "
        f"store was tokenized with ({source.metadata.tokenizer.name}, {stored[:19]})"
    )
    if token_level:
        raise ProvenanceError(
            f"{what}: token-level HSK gathers the student's states at the teacher's token positions, so it "
            "needs the teacher's tokenizer. Use a student with the teacher's vocabulary (e.g. bert<k>, or "
            "--student-base), or train logits only with --stages pred."
        )
    msg = f"{what}: logits-only KD re-tokenizes the training texts with the student's tokenizer"
    logger.warning(msg)
    log(f"WARNING: {msg}")
    return False


# --------------------------------------------------------------------------------------------------
# Batches


class BatchMaker:
    """Raw stream batch (numpy) -> dict of tensors on the device, with the teacher targets decoded."""

    def __init__(
        self,
        source: Source,
        layers: list,
        device: str,
        pad_to: int | None,
        student_inputs: dict[str, np.ndarray] | None,
        pad_id: int,
    ):
        self.source = source
        self.layers = layers  # KeptLayer-like objects with .name, or names
        self.device = device
        self.pad_to = pad_to
        self.student_inputs = student_inputs  # row-indexed student encoding (other tokenizer) or None
        self.pad_id = pad_id
        # on CUDA the targets go through reused pinned buffers (one per batch in flight), not pinned afresh
        self.staging = PinnedStaging(device) if torch.device(device).type == "cuda" else None
        self.probe = None
        if source.mode == "online":
            from pipelines.dump.probe import TeacherProbe
            from pipelines.dump.stage import attention_probe_layers

            ranking = list(source.selection.ranking_layers) if layers else []
            attention = attention_probe_layers(source.selection) if layers else []
            self.probe = TeacherProbe(source.teacher, ranking, attention)

    def close(self) -> None:
        if self.probe is not None:
            self.probe.close()

    def _pad(self, batch: dict[str, np.ndarray], pad_to: int) -> None:
        for name, fill in (("input_ids", self.pad_id), ("token_type_ids", 0)):
            arr = batch[name]
            if arr.shape[1] < pad_to:
                extra = np.full((arr.shape[0], pad_to - arr.shape[1]), fill, dtype=arr.dtype)
                batch[name] = np.concatenate([arr, extra], axis=1)

    def _teacher_targets(self, batch: dict[str, np.ndarray]) -> None:
        """Online: the dump's own computation on this batch, cast to the store's dtypes."""
        from pipelines.dump.select_torch import encode_batch_on_device
        from pipelines.dump.targets import encode_batch

        sel = self.source.selection
        ids = batch["input_ids"].astype(np.int64)
        lengths = batch["length"].astype(np.int64)
        mask = (np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64)
        dev = self.device
        out = self.probe(
            torch.from_numpy(ids).to(dev),
            torch.from_numpy(batch["token_type_ids"].astype(np.int64)).to(dev),
            torch.from_numpy(mask).to(dev),
            hidden_layers=sorted(set(sel.teacher_layers)) if self.layers else [],
        )
        if self.layers:
            encode = encode_batch if self.source.selection_engine == "numpy" else encode_batch_on_device
            arrays = encode(out, ids, lengths, sel, self.source.metadata.tokenizer.sep_id,
                            self.source.metadata.max_length)
        else:
            arrays = {"logits": out.logits.float().cpu().numpy()}
        specs = self.source.store.specs
        for name, value in arrays.items():
            batch[name] = np.asarray(value).astype(specs[name].dtype, copy=False)

    def _restudent(self, batch: dict[str, np.ndarray]) -> None:
        """Swap in the student's own token ids for these rows (logits-only KD, other tokenizer)."""
        rows = batch["row"].astype(np.int64)
        inputs = self.student_inputs
        if not np.array_equal(inputs["text_hash"][rows], batch["text_hash"]):
            raise ProvenanceError(
                "the training texts loaded for re-tokenizing do not match the store's rows (text hashes "
                "differ): pass the --data-dir the store was dumped from"
            )
        lengths = inputs["length"][rows]
        width = self.pad_to or max(1, int(lengths.max()))
        batch["input_ids"] = inputs["input_ids"][rows, :width]
        batch["token_type_ids"] = inputs["token_type_ids"][rows, :width]
        batch["length"] = lengths

    def __call__(self, raw: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        batch = dict(raw)
        if self.pad_to:
            self._pad(batch, self.pad_to)
        if self.probe is not None:
            self._teacher_targets(batch)
        if self.student_inputs is not None:
            self._restudent(batch)
        return decode_batch(batch, self.layers, self.source.selection.hidden_size, self.device,
                            self.source.selection.value_dtype, self.staging)


def student_encoding(source: Source, tokenizer, data_dir: str | None, log: Callable) -> dict[str, np.ndarray]:
    """Row-indexed student token ids of the store's training texts (for another tokenizer)."""
    from pipelines.core.tokenize import encode

    if source.examples is not None:
        examples = source.examples
    else:
        rows = source.store.read(slice(None), ["row"])["row"]
        task, split = source.task, source.metadata.task.split
        examples = load_examples(task, split, data_dir=data_dir, limit=int(rows.max()) + 1 if len(rows) else 0)
        log(f"re-tokenizing {len(examples)} {task.name}/{split} texts with the student's tokenizer")
    if not np.array_equal(examples.rows, np.arange(len(examples))):
        raise DataError("re-tokenizing needs the split's rows in source order")
    enc = encode(tokenizer, examples.texts, source.metadata.max_length)
    enc["text_hash"] = examples.text_hashes()
    return enc
