"""Where a training run's batches and targets come from, one class per kind of source.

`StoreTaskSource` (a task store: the targets are stored), `OnlineTaskSource` (a live teacher computes each
batch's targets), `MemorySource` (labelled rows only, for `hsk teacher`) and `StoreSource` (the LM stores)
all answer what the loop and the run read (`TrainingSource`); what differs between them is a method of
each, never a branch on a mode name. Also here: the stage's stream arrays, tokenizer provenance, and turning
raw stream batches into device tensors (`BatchMaker`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from torch import nn

from hskstore.errors import ProvenanceError
from hskstore.format.config import ConfigError, HSKConfig, Selection
from hskstore.format.meta import StoreMeta
from hskstore.format.schema import array_specs
from hskstore.io.reader import HSKStore, open_store
from pipelines.core.data import DataError, Examples, load_examples
from pipelines.core.tasks import Task, get_task
from pipelines.train.data.decode import PinnedStaging, decode_batch
from pipelines.train.options import TrainOptions
from pipelines.train.students.build import StudentInfo

logger = logging.getLogger("hsk.train")

INPUT_NAMES = ["row", "text_hash", "label", "input_ids", "token_type_ids", "length"]
INPUT_ARRAYS = ["label", "input_ids", "token_type_ids", "length", "text_hash"]


# --------------------------------------------------------------------------------------------------
# What the loop reads of a source


class RowSource(Protocol):
    """What a StoreStream reads: an HSKStore, or rows in memory laid out as one (`ShardedRows`)."""

    url: str
    metadata: Any  # StoreMeta-like: `complete` and `layout` (rows, shard rows)
    specs: dict

    @property
    def n_shards(self) -> int: ...

    def __len__(self) -> int: ...

    def shard_bounds(self, shard: int) -> tuple[int, int]: ...

    def read_shard(self, shard: int, *, verify: bool = True, names: list[str] | None = None) -> dict: ...


class TrainingSource(Protocol):
    """What a run trains from, as the loop, the run's checks and its summary read it."""

    mode: ClassVar[str]  # reported in summary.json and the checkpoint identity: "offline" | "online" | "memory"
    store: RowSource  # an HSKStore, or rows in memory laid out as one
    task: Task | None
    teacher: nn.Module | None  # a live teacher (online; a causal-LM store's live target), else None

    @property
    def metadata(self) -> StoreMeta: ...

    @property
    def selection(self) -> Selection | None: ...

    @property
    def content_address(self) -> str | None: ...

    def teacher_path(self, override: str | None, *, load: Callable[[str], nn.Module] | None = None,
                     required: bool = False) -> str: ...

    def stores_read(self) -> list[dict]: ...

    def bytes_read(self, names: list[str]) -> dict: ...


def _store_bytes(store: HSKStore, names: list[str]) -> dict:
    sizes = {n: int(store.group[n].nbytes_stored()) for n in store.specs}
    return {"total": sum(sizes.values()), "read": sum(sizes[n] for n in names if n in sizes)}


def store_teacher(metadata: StoreMeta, override: str | None, *, load: Callable[[str], nn.Module] | None = None,
                  near: str | None = None, required: bool = False) -> str:
    """Where a store's teacher is now (bert<k> init, tokenizer fallback): `override` (--teacher), else the
    recorded path or hub id, else the name as typed, from here or beside the local store `near`
    (core.models.resolve_teacher). Its weights are checked against the store's hash whichever way it was
    found (loaded with `load`, default as a classifier): a teacher retrained in place is refused, not
    silently used. Not found: the recorded name, unless the run `required` it (then the refusal naming the fix)."""
    from pipelines.core.models import ModelLoadError, check_weights, resolve_teacher

    recorded = metadata.teacher.record
    if override:
        found = resolve_teacher(recorded, override)
    else:
        try:
            found = resolve_teacher(recorded, near=near)
        except ModelLoadError:
            if required:
                raise
            # Not every student needs the teacher (tinybert4, hub encoders): bert<k> says where it looked.
            return recorded.get("path") or metadata.teacher.name
    check_weights(load(found) if load else found, recorded.get("weights_hash"), override or found)
    return found


class _StoredTargets:
    """What a source whose targets a store holds shares: the store's address, teacher and bytes."""

    mode: ClassVar[str] = "offline"
    store: HSKStore

    @property
    def metadata(self) -> StoreMeta:
        return self.store.metadata

    @property
    def teacher_name(self) -> str:
        return self.store.metadata.teacher.name

    @property
    def content_address(self) -> str | None:
        return getattr(self.store, "content_address", None)

    def teacher_path(self, override: str | None, *, load: Callable[[str], nn.Module] | None = None,
                     required: bool = False) -> str:
        url = str(self.store.url)
        return store_teacher(self.store.metadata, override, load=load, near=None if "://" in url else url,
                             required=required)

    def stores_read(self) -> list[dict]:
        return [{"url": str(self.store.url), "content_address": self.store.content_address}]

    def bytes_read(self, names: list[str]) -> dict:
        return _store_bytes(self.store, names)


@dataclass
class StoreSource(_StoredTargets):
    """What a run trains from when its store has no task (masked-LM, causal-LM): the store, and the live teacher
    of a run that computes its targets beside the student (none: every target comes from the store)."""

    store: HSKStore
    teacher: nn.Module | None = None
    task: ClassVar[None] = None
    selection: ClassVar[None] = None

    @property
    def meta(self) -> dict:
        return self.store.meta


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


# --------------------------------------------------------------------------------------------------
# Task sources: a store, a live teacher, labelled rows


# Stage.reads -> the store arrays it needs: fn(store specs, kept layer indices of the stage's pairs).
def _layer_arrays(specs: dict, kept: list[int]) -> list[str]:
    names = []
    for i in kept:
        names += [n for n in specs if n.startswith(f"layers/{i}/") and not n.endswith(("scores", "attention"))]
    return names


STORE_READS: dict[str, Callable[[dict, list[int]], list[str]]] = {
    "logits": lambda specs, kept: ["logits"],
    "labels": lambda specs, kept: [],  # gold labels are always read
    "layers": _layer_arrays,
    "attention": lambda specs, kept: [f"layers/{i}/attention" for i in kept if f"layers/{i}/attention" in specs],
}


@dataclass
class StoreTaskSource(_StoredTargets):
    """A task store: every target is read from it."""

    store: HSKStore
    task: Task
    teacher: ClassVar[None] = None

    @property
    def selection(self) -> Selection:
        return self.store.selection

    def stream_names(self, reads: tuple[str, ...], kept: list[int]) -> list[str]:
        """The inputs, plus the stored targets the stage reads."""
        names = list(INPUT_ARRAYS)
        for what in reads:
            if what not in STORE_READS:
                raise ConfigError(f"a stage reads {what!r}, which no reader knows; known: {', '.join(STORE_READS)}")
            names += [n for n in STORE_READS[what](self.store.specs, kept) if n not in names]
        return names

    def stored_targets(self) -> Callable[[], tuple[Any, Any]] | None:
        """The store's logits and gold labels, read only when a method asks (PEA-KD checks its PTP labels)."""
        if self.task.is_regression:
            return None

        def read() -> tuple[Any, Any]:
            data = self.store.read(slice(None), ["logits", "label"])
            return data["logits"], data["label"]

        return read

    def training_examples(self, data_dir: str | None, log: Callable) -> Examples:
        """The store's training texts, loaded from the data they were dumped from (re-tokenizing)."""
        rows = self.store.read(slice(None), ["row"])["row"]
        task, split = self.task, self.metadata.task.split
        examples = load_examples(task, split, data_dir=data_dir, limit=int(rows.max()) + 1 if len(rows) else 0)
        log(f"re-tokenizing {len(examples)} {task.name}/{split} texts with the student's tokenizer")
        return examples

    def live_targets(self, layers: list, device: str) -> None:
        return None  # the store holds them


@dataclass
class _RowsSource:
    """Tokenized rows in memory, laid out as the store a dump of them would write (`OnlineSource`)."""

    store: OnlineSource
    task: Task
    teacher_name: str
    selection: Selection
    examples: Examples

    @property
    def metadata(self) -> StoreMeta:
        return self.store.metadata

    @property
    def content_address(self) -> None:
        return None  # nothing was written

    def teacher_path(self, override: str | None, *, load: Callable[[str], nn.Module] | None = None,
                     required: bool = False) -> str:
        return self.metadata.teacher.record.get("path") or self.teacher_name

    def stream_names(self, reads: tuple[str, ...], kept: list[int]) -> list[str]:
        return list(INPUT_ARRAYS)  # the targets (if any) are computed per batch

    def stores_read(self) -> list[dict]:
        return []

    def bytes_read(self, names: list[str]) -> dict:
        return {"total": 0, "read": 0}

    def stored_targets(self) -> None:
        return None

    def training_examples(self, data_dir: str | None, log: Callable) -> Examples:
        return self.examples


@dataclass
class OnlineTaskSource(_RowsSource):
    """A live teacher standing in for a store: it computes each batch's targets with the dump's own code."""

    mode: ClassVar[str] = "online"
    teacher: nn.Module | None = None
    selection_engine: str = "torch"  # where the targets are selected (as `hsk dump --selection-engine`)

    def live_targets(self, layers: list, device: str) -> LiveTargets:
        return LiveTargets(self, layers, device)


@dataclass
class MemorySource(_RowsSource):
    """Labelled rows only, no teacher (`hsk teacher` fine-tunes from them)."""

    mode: ClassVar[str] = "memory"
    teacher: ClassVar[None] = None

    def live_targets(self, layers: list, device: str) -> None:
        return None


TaskSource = StoreTaskSource | OnlineTaskSource | MemorySource


def open_offline(url: str, task: str | None) -> StoreTaskSource:
    store = open_store(url)  # refuses incomplete stores; damaged shards fail their digests when read
    store.refuse_task_training()  # a masked-LM store names the method that trains from it
    store_task = get_task(store.metadata.task.name)
    if task is not None and get_task(task) != store_task:
        raise ConfigError(f"--task {task} but the store {url} holds task {store_task.name}")
    return StoreTaskSource(store, store_task)


def _rows_in_memory(meta: dict, enc: dict, examples: Examples, url: str) -> OnlineSource:
    inputs = dict(enc, row=examples.rows, text_hash=examples.text_hashes(), label=examples.labels)
    return OnlineSource(dict(meta, complete=True), inputs, url)  # it stands in for a finished store


def open_online(
    teacher: str,
    task_name: str,
    config: str | None,
    options: TrainOptions,
    data_dir: str | None,
    log: Callable,
) -> OnlineTaskSource:
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
    rows = _rows_in_memory(meta, encode(tokenizer, examples.texts, max_length), examples, f"online:{teacher}")
    log(
        f"online: teacher {teacher} computes the targets of each batch "
        f"({len(examples)} examples, config {selection.config})"
    )
    return OnlineTaskSource(rows, task, teacher, selection, examples, teacher=model,
                            selection_engine=dump_options.selection_engine)


def memory_source(task: Task, examples: Examples, name: str, model: nn.Module, tokenizer, max_length: int,
                  shard_rows: int = 1024) -> MemorySource:
    """Labelled examples in memory, laid out as a logits-only store would be (no teacher).

    `hsk teacher` fine-tunes through the one training loop with this source: the same stream, batches,
    schedule, evaluation and checkpoints as distillation.
    """
    from pipelines.core.tokenize import encode
    from pipelines.dump.stage import DumpOptions, build_selection, store_metadata

    cfg = model.config
    selection = build_selection(DumpOptions(config=HSKConfig.parse("0,0,0")), cfg.num_hidden_layers, cfg.hidden_size)
    meta = store_metadata(task, "train", examples, name, model, tokenizer, selection, max_length, shard_rows)
    rows = _rows_in_memory(meta, encode(tokenizer, examples.texts, max_length), examples, f"memory:{examples.source}")
    return MemorySource(rows, task, name, selection, examples)


def check_expected_store(source: TrainingSource, expected: str | None) -> None:
    """--expect-store: refuse a store whose content address is not the one the user pinned."""
    if expected is None:
        return
    found = source.content_address
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


def check_provenance(source: TaskSource, info: StudentInfo, token_level: bool, log: Callable) -> bool:
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


@dataclass
class LiveTargets:
    """An online source's teacher on each batch: the dump's own computation, cast to the store's dtypes."""

    source: OnlineTaskSource
    layers: list
    device: str
    probe: Any = field(init=False)

    def __post_init__(self) -> None:
        from pipelines.dump.probe import TeacherProbe
        from pipelines.dump.stage import attention_probe_layers

        ranking = list(self.source.selection.ranking_layers) if self.layers else []
        attention = attention_probe_layers(self.source.selection) if self.layers else []
        self.probe = TeacherProbe(self.source.teacher, ranking, attention)

    def close(self) -> None:
        self.probe.close()

    def __call__(self, batch: dict[str, np.ndarray]) -> None:
        from pipelines.dump.select_torch import encode_batch_on_device
        from pipelines.dump.targets import encode_batch

        source, sel, dev = self.source, self.source.selection, self.device
        ids = batch["input_ids"].astype(np.int64)
        lengths = batch["length"].astype(np.int64)
        mask = (np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64)
        out = self.probe(
            torch.from_numpy(ids).to(dev),
            torch.from_numpy(batch["token_type_ids"].astype(np.int64)).to(dev),
            torch.from_numpy(mask).to(dev),
            hidden_layers=sorted(set(sel.teacher_layers)) if self.layers else [],
        )
        if self.layers:
            encode = encode_batch if source.selection_engine == "numpy" else encode_batch_on_device
            arrays = encode(out, ids, lengths, sel, source.metadata.tokenizer.sep_id, source.metadata.max_length)
        else:
            arrays = {"logits": out.logits.float().cpu().numpy()}
        specs = source.store.specs
        for name, value in arrays.items():
            batch[name] = np.asarray(value).astype(specs[name].dtype, copy=False)


class BatchMaker:
    """Raw stream batch (numpy) -> dict of tensors on the device, with the teacher targets decoded."""

    def __init__(
        self,
        source: TaskSource,
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
        self.live = source.live_targets(layers, device)  # None: the store holds the targets (or there are none)

    def close(self) -> None:
        if self.live is not None:
            self.live.close()

    def _pad(self, batch: dict[str, np.ndarray], pad_to: int) -> None:
        for name, fill in (("input_ids", self.pad_id), ("token_type_ids", 0)):
            arr = batch[name]
            if arr.shape[1] < pad_to:
                extra = np.full((arr.shape[0], pad_to - arr.shape[1]), fill, dtype=arr.dtype)
                batch[name] = np.concatenate([arr, extra], axis=1)

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
        if self.live is not None:
            self.live(batch)
        if self.student_inputs is not None:
            self._restudent(batch)
        return decode_batch(batch, self.layers, self.source.selection.hidden_size, self.device,
                            self.source.selection.value_dtype, self.staging)


def student_encoding(source: TaskSource, tokenizer, data_dir: str | None, log: Callable) -> dict[str, np.ndarray]:
    """Row-indexed student token ids of the store's training texts (for another tokenizer)."""
    from pipelines.core.tokenize import encode

    examples = source.training_examples(data_dir, log)
    if not np.array_equal(examples.rows, np.arange(len(examples))):
        raise DataError("re-tokenizing needs the split's rows in source order")
    enc = encode(tokenizer, examples.texts, source.metadata.max_length)
    enc["text_hash"] = examples.text_hashes()
    return enc
