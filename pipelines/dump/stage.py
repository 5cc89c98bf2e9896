"""The dump stage: run a fine-tuned teacher once over a task split and write an hsk store.

Rows are processed shard by shard in source order; inside a shard, batches are length-bucketed
so padding does not dominate, and results go back to source order before the shard is written.
Shard k+1 is tokenized and earlier shards written in the background while the teacher computes
shard k (pipelines/dump/pipeline.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from hskstore import __version__
from hskstore.errors import printable
from hskstore.format.config import (
    BATCH_SIZE,
    DUMP_BOUNDS,
    DUMP_CHOICES,
    ENGINE,
    PRECISION,
    RANKING,
    REF_STUDENT_LAYERS,
    SCORES,
    SHARD_ROWS,
    STUDENT_LAYERS,
    TOKENS,
    VALUES,
    WIDTH,
    WIDTH_SEED,
    ConfigError,
    HSKConfig,
    Selection,
    check_at_least,
    check_choices,
)
from hskstore.format.meta import (
    TASK,
    TASK_TEACHER_KEYS,
    TASK_TOKENIZER_KEYS,
    DataRef,
    Layout,
    StoreMeta,
    TaskRef,
    TeacherRef,
    TokenizerRef,
)
from hskstore.format.schema import attention_row_layers
from hskstore.io.outputs import STORE, claim_output
from hskstore.io.writer import StoreWriter, writing
from hskstore.method.layermap import check_chosen_depth, default_l_top, select_depth
from pipelines.core.batching import batch_inputs, length_bucketed_batches
from pipelines.core.data import DataError, Examples, load_examples
from pipelines.core.devices import check_device
from pipelines.core.models import (
    TOKENIZER_FILES,
    ModelLoadError,
    has_tokenizer_files,
    load_classifier,
    load_tokenizer,
    model_reference,
    resolve_model,
    teacher_identity,
    vocab_hash,
    weights_hash,
)
from pipelines.core.precision import FP32, forward_precision, resolve_forward
from pipelines.core.tasks import Task, check_task_fit, get_task
from pipelines.dump.heap import release_free_memory
from pipelines.dump.pipeline import (
    ShardWrites,
    Tokenized,
    default_tokenize_threads,
    default_write_depth,
    overlaps_forward,
)
from pipelines.dump.probe import ProbeOutput, TeacherProbe
from pipelines.dump.scores import score_record
from pipelines.dump.select_torch import HostCopies, host_arrays, select_batch
from pipelines.dump.targets import encode_batch


@dataclass
class DumpResult:
    meta: dict
    examples_written: int  # this run (fewer than the store's rows when it resumed)
    seconds: float  # tokenizing, teacher forward, selection, encoding and writing; not model loading

    @property
    def examples_per_s(self) -> float:
        return self.examples_written / self.seconds if self.seconds else float("nan")


@dataclass
class DumpOptions:
    """Every choice of `hsk dump`, with the product's defaults (declared in hskstore.format.config)."""

    config: HSKConfig
    ref_student_layers: int | None = STUDENT_LAYERS.default
    l_top: int | None = None
    layers: list[int] | None = None  # explicit teacher layers instead of a reference student map
    token_strategy: str = TOKENS.default
    ranking_map: str = RANKING.default
    attention_scores: str = SCORES.default
    width_strategy: str = WIDTH.default
    width_seed: int = WIDTH_SEED.default
    value_dtype: str = VALUES.default
    attention_rows: bool = False  # TinyBERT: keep the kept tokens' pre-softmax attention rows
    max_length: int | None = None  # task default
    batch_size: int = BATCH_SIZE.default
    shard_rows: int = SHARD_ROWS.default
    device: str = "cpu"
    selection_engine: str = ENGINE.default  # torch: on the teacher's device; numpy: the hskstore reference
    precision: str = PRECISION.default  # the teacher forward's arithmetic (pipelines/core/precision.py)
    # The host pipeline's depth (pipelines/dump/pipeline.py); the store's bytes never depend on it.
    write_depth: int | None = None  # shards written at once; None: from the host's cores off the CPU, 1 on it
    tokenize_threads: int | None = None  # threads (and pieces) a shard is tokenized in; None: from the cores
    host_overlap: bool | None = None  # host stages alongside the forward; None: off the CPU only
    write_processes: int = 0  # processes that compress and write shards (0: threads of this process)
    overwrite: bool = False
    progress: bool = True
    allow_task_mismatch: bool = False  # use a teacher whose labels say it was made for another task
    extra_meta: dict = field(default_factory=dict)

    @classmethod
    def from_flags(cls, flags: Mapping[str, object], **fields: Any) -> DumpOptions:
        """The options a command's flags ask for: each declared flag (hskstore.format.config: `--tokens` is
        `token_strategy`) found in `flags` under its parameter name (`tokens`), then `fields` as given."""
        declared = {d.flag[2:].replace("-", "_"): d.field for d in (*DUMP_CHOICES, *DUMP_BOUNDS, STUDENT_LAYERS)}
        chosen = {field_name: flags[name] for name, field_name in declared.items() if name in flags}
        return cls(**chosen, **fields)

    def validate(self) -> None:
        """Refuse any out-of-range choice (ConfigError, one line) before anything on disk changes.

        Numbers are refused, never replaced by others: a store must be what the command asked for.
        """
        for bound in DUMP_BOUNDS:
            bound.check(getattr(self, bound.field))
        if self.layers is None:
            STUDENT_LAYERS.check(self.ref_student_layers)
        elif not self.layers or any(not isinstance(j, int) or j < 0 for j in self.layers):
            raise ConfigError(f"--layers takes teacher layer numbers >= 0 (0 = embeddings), got {self.layers}")
        check_choices([(c.flag, getattr(self, c.field), c.values) for c in DUMP_CHOICES])
        if self.max_length is not None and self.config.n_tokens > self.max_length:
            raise ConfigError(f"N^L={self.config.n_tokens} exceeds --max-length {self.max_length}")
        check_at_least("--write-processes", self.write_processes, 0, high=256)  # each holds a shard and a writer
        check_device(self.device)
        resolve_forward(self.precision, self.device)  # one line when it cannot run there (tf32 on a CPU)


def teacher_heads(model) -> int:
    cfg = model.config
    return int(getattr(cfg, "num_attention_heads", None) or cfg.n_heads)


def build_selection(
    options: DumpOptions, num_layers: int, hidden_size: int, num_heads: int | None = None
) -> Selection:
    """The selection a dump with `options` keeps; `num_heads` (the teacher's) is needed for attention rows."""
    if options.attention_rows and not num_heads:
        raise ValueError("build_selection: --attention-rows needs the teacher's head count")
    ref_student_layers = None if options.layers else (options.ref_student_layers or REF_STUDENT_LAYERS)
    teacher_layers, entries, ranking = select_depth(
        options.config.n_layers,
        num_layers,
        ref_student_layers=ref_student_layers,
        l_top=options.l_top,
        explicit_layers=options.layers,
        ranking_map=options.ranking_map,
    )
    if options.ref_student_layers is not None and not options.layers:  # a depth the user chose: no repeats
        check_chosen_depth(options.config.n_layers, num_layers, options.ref_student_layers, options.l_top,
                           teacher_layers)
    return Selection(
        config=options.config,
        hidden_size=hidden_size,
        teacher_num_layers=num_layers,
        teacher_layers=tuple(teacher_layers),
        student_entries=None if entries is None else tuple(entries),
        ranking_layers=tuple(ranking),
        ref_student_layers=ref_student_layers,
        l_top=None if options.layers else (options.l_top or default_l_top(num_layers)),
        token_strategy=options.token_strategy,
        ranking_map=options.ranking_map,
        attention_scores=options.attention_scores,
        width_strategy=options.width_strategy,
        width_seed=options.width_seed,
        value_dtype=options.value_dtype,
        attention_heads=num_heads if options.attention_rows else 0,
    )


def load_teacher(
    teacher: str, task: Task, *, device: str = "cpu", allow_task_mismatch: bool = False
) -> tuple[torch.nn.Module, object, dict]:
    """(model, tokenizer, identity) of a fine-tuned teacher fit for `task`, or one line saying why not.

    Refused: a checkpoint whose classification head is not in its files (a base encoder), a folder
    without tokenizer files (transformers would build a vocabulary of special tokens only), a teacher
    whose label names or task say it was made for another task (unless `allow_task_mismatch`), or one
    whose number of outputs differs from the task's. `identity` (teacher_identity plus "task_fit") goes
    into the store.
    """
    model = load_classifier(teacher, device=device, require_head=True)
    identity = teacher_identity(teacher, model.config)
    identity["task_fit"] = check_task_fit(
        task, identity, f"teacher {printable(teacher)}", allow_mismatch=allow_task_mismatch
    )
    if not has_tokenizer_files(resolve_model(teacher)):
        raise ModelLoadError(
            f"teacher {printable(teacher)} has no tokenizer (none of {', '.join(TOKENIZER_FILES[:3])}, ... in the "
            "folder): save the tokenizer it was fine-tuned with next to it (tokenizer.save_pretrained(folder))"
        )
    tokenizer = load_tokenizer(teacher)
    return model, tokenizer, identity


def position_limit(config) -> int | None:
    """The longest input the teacher's position embeddings take (RoBERTa-style models offset by padding_idx + 1)."""
    limit = getattr(config, "max_position_embeddings", None)
    if not limit:
        return None
    if getattr(config, "model_type", "") in {"roberta", "xlm-roberta", "camembert", "longformer"}:
        limit -= (getattr(config, "pad_token_id", 1) or 1) + 1
    return int(limit)


def resolve_max_length(requested: int | None, task: Task, config) -> int:
    """--max-length, or the task's default capped by the teacher's positions; above the positions is refused."""
    limit = position_limit(config)
    if requested is None:
        return min(task.max_length, limit) if limit else task.max_length
    if limit and requested > limit:
        raise ConfigError(f"--max-length {requested} exceeds the teacher's {limit} positions: use at most {limit}")
    return requested


def store_metadata(
    task: Task,
    split: str,
    examples: Examples,
    teacher: str,
    model,
    tokenizer,
    selection: Selection,
    max_length: int,
    shard_rows: int,
    identity: dict | None = None,
    precision: str = FP32,
) -> dict:
    """The store's hsk metadata. Teacher and tokenizer are recorded by a portable reference (absolute
    path, or hub id + revision) with their hashes, and `identity` (what the teacher was fine-tuned for).
    `precision` (resolved) is recorded with the teacher unless fp32: fp32 stores keep their former bytes."""
    cfg = model.config
    reference = model_reference(teacher)
    identity = identity or teacher_identity(teacher, cfg)
    name = reference["path"] or reference["hub_id"]
    scores = score_record(cfg, list(selection.ranking_layers), attention_probe_layers(selection))
    recorded = {**scores, **({} if precision == FP32 else {"precision": precision})}
    return StoreMeta(
        objective=TASK,
        task=TaskRef(task.name, split, task.labels, task.is_regression, task.metric),
        dataset=DataRef(examples.source, examples.fingerprint, len(examples)),
        teacher=TeacherRef(
            name, **reference, weights_hash=weights_hash(model), architecture=type(model).__name__,
            num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size, num_labels=cfg.num_labels,
            max_positions=position_limit(cfg),
            **{k: identity.get(k) for k in ("task", "labels", "problem_type", "identity_from", "task_fit")},
            **recorded, written=teacher_keys(scores, precision),
        ),
        tokenizer=TokenizerRef(
            name, **reference, vocab_hash=vocab_hash(tokenizer), vocab_size=len(tokenizer),
            cls_id=tokenizer.cls_token_id, sep_id=tokenizer.sep_token_id, pad_id=tokenizer.pad_token_id,
            written=TASK_TOKENIZER_KEYS,
        ),
        max_length=max_length,
        selection=selection.to_dict(),
        layout=Layout.of(len(examples), selection.n_width, shard_rows),
    ).to_dict()


def teacher_keys(scores: dict, precision: str) -> tuple[str, ...]:
    """The teacher record's keys in the order stores have them: the score reader after `architecture` and the
    precision last, each only where it is not the format's default (older stores keep their bytes)."""
    at = TASK_TEACHER_KEYS.index("architecture") + 1
    return (TASK_TEACHER_KEYS[:at] + tuple(scores) + TASK_TEACHER_KEYS[at:]
            + (() if precision == FP32 else ("precision",)))


def compute_record(batch_size: int, device: str, torch_threads: int | None = None) -> dict:
    """How the teacher's outputs are computed, beyond the metadata: their bytes depend on it (length-bucketed
    batches pad to their longest row; kernels differ by device and, on CPU, by thread count). Recorded at
    creation; a resume must match it (hskstore.io.writer), so the finished store equals an uninterrupted dump."""
    kind = torch.device(device).type
    threads = (torch_threads or torch.get_num_threads()) if kind == "cpu" else None
    return {"batch_size": batch_size, "device": kind, "torch_threads": threads}


def attention_probe_layers(selection: Selection) -> list[int]:
    """Teacher attention layers whose query/key projections the probe must keep whole."""
    return sorted({j for j in selection.teacher_layers if j >= 1}) if selection.attention_rows else []


def _select_on_host(out: ProbeOutput, copied: torch.cuda.Event | None, *args) -> dict[str, np.ndarray]:
    if copied is not None:
        copied.synchronize()
    return encode_batch(out, *args)


def _submit_selection(host, engine: str, copies: HostCopies, out: ProbeOutput, *args) -> Future:
    """Queue one batch's selection; the future gives its arrays as numpy on the host.

    numpy: every kept hidden state goes to the host, where a worker selects and encodes. torch:
    selection and encoding are queued on the teacher's device right here, only their results are
    copied back (into reused pinned buffers), and the worker merely waits for that copy.
    """
    if engine == "numpy":
        return host.submit(_select_on_host, *out.start_host_copy(), *args)
    return host.submit(host_arrays, *copies.start(select_batch(out, *args)))


class _Inline:
    """The executor interface, running each job at once on the calling thread."""

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def submit(self, fn, *args) -> Future:
        job: Future = Future()
        job.set_result(fn(*args))
        return job


def compute_shard(
    probe: TeacherProbe,
    enc: dict[str, np.ndarray],
    selection: Selection,
    sep_id: int | None,
    batch_size: int,
    device: str,
    progress=None,
    overlap: bool | None = None,
    engine: str = "torch",
    buffers: dict[str, np.ndarray] | None = None,
    precision: str = FP32,
) -> dict[str, np.ndarray]:
    """Teacher forward + selection + encoding for the rows of one shard, back in source order.

    With `overlap` (default: when the forward runs off the CPU), selection and encoding of batch k
    run on a worker thread while the main thread starts the forward of batch k+1, so the host's
    work hides behind the device's. A CPU forward already uses every core: there it only competes.
    `engine` picks where selection runs (torch: on the device; numpy: the reference, on the host).
    `buffers`: the arrays of an earlier shard, no longer in use, to fill again (every row of every
    array is overwritten); new arrays where their shapes differ. Reuse keeps the dump's heap flat.
    `precision` (resolved, pipelines/core/precision.py): the forward's arithmetic; selection stays float32.
    """
    if overlap is None:
        overlap = torch.device(device).type != "cpu"
    n = len(enc["length"])
    result: dict[str, np.ndarray] = {}  # each batch goes straight into the shard's buffers
    spare = buffers or {}

    def place(batch: np.ndarray, job: Future) -> None:
        for name, array in job.result().items():
            if name not in result:
                old = spare.get(name)
                fits = old is not None and old.shape == (n, *array.shape[1:]) and old.dtype == array.dtype
                result[name] = old if fits else np.zeros((n, *array.shape[1:]), dtype=array.dtype)
            result[name][batch] = array
        if progress is not None:
            progress.update(len(batch))

    copies = HostCopies()  # at most two batches are in flight below: its three buffer sets never collide
    with ThreadPoolExecutor(max_workers=1) if overlap else _Inline() as host:
        pending: tuple[np.ndarray, Future] | None = None
        for batch in length_bucketed_batches(enc["length"], batch_size):
            inputs = batch_inputs(enc, batch, device)
            ids = enc["input_ids"][batch, : inputs["input_ids"].shape[1]]
            with forward_precision(precision, device):
                out = probe(**inputs, hidden_layers=sorted(set(selection.teacher_layers)))
            job = _submit_selection(
                host, engine, copies, out, ids, enc["length"][batch], selection, sep_id, enc["input_ids"].shape[1]
            )
            if pending is not None:
                place(*pending)  # at most two batches' outputs wait: one encoding, one queued
            pending = (batch, job)
        if pending is not None:
            place(*pending)
    return result


@dataclass
class DumpPlan:
    """What a dump knows before anything on disk changes: the rows, the teacher and the store's metadata."""

    task: Task
    split: str
    examples: Examples
    model: torch.nn.Module | None
    tokenizer: object
    selection: Selection
    max_length: int
    meta: StoreMeta  # what the writer is handed (the dump's description, its extra records and `compute`)
    precision: str = FP32  # resolved: what the teacher's forward runs in


def plan_dump(
    task_name: str,
    options: DumpOptions,
    *,
    teacher: str,
    out: str,
    split: str = "train",
    data_dir: str | None = None,
    data_file: str | None = None,
    text_columns: list[str] | None = None,
    label_column: str | None = None,
    limit: int | None = None,
    device: str | None = None,
) -> DumpPlan:
    """Check every option, the output, the data and the teacher, and build the store's metadata.

    `device` overrides where the teacher is loaded (the distributed driver needs it only for metadata).
    """
    options.validate()
    if options.write_processes and str(out).startswith("memory://"):
        raise ConfigError("--write-processes writes from other processes, which cannot reach a memory:// store")
    task = get_task(task_name)
    if limit is not None and (isinstance(limit, bool) or limit < 1):
        raise ConfigError(f"--limit must be >= 1 (the number of examples to dump), got {limit}")
    claim_output(out, STORE, overwrite=options.overwrite)  # refuse a foreign --out before loading anything
    examples = load_examples(
        task,
        split,
        data_dir=data_dir,
        data_file=data_file,
        text_columns=text_columns,
        label_column=label_column,
        limit=limit,
    )
    if len(examples) == 0:
        raise DataError(f"{printable(examples.source)} holds no examples: nothing to dump")
    model, tokenizer, identity = load_teacher(
        teacher, task, device=device or options.device, allow_task_mismatch=options.allow_task_mismatch
    )
    max_length = resolve_max_length(options.max_length, task, model.config)
    selection = build_selection(
        options, model.config.num_hidden_layers, model.config.hidden_size, teacher_heads(model)
    )
    if selection.config.n_tokens > max_length:
        raise ConfigError(f"N^L={selection.config.n_tokens} exceeds --max-length {max_length}")
    if selection.attention_rows and not attention_row_layers(selection.to_dict()):
        raise ConfigError(f"--attention-rows keeps the rows of kept layers above the embeddings, but config "
                          f"{selection.config} keeps only teacher layers {list(selection.teacher_layers)}")
    precision = resolve_forward(options.precision, options.device)
    meta = store_metadata(
        task, split, examples, teacher, model, tokenizer, selection, max_length, options.shard_rows, identity,
        precision,
    )
    compute = compute_record(options.batch_size, options.device)
    meta = StoreMeta.parse({**meta, **options.extra_meta, "compute": compute})
    return DumpPlan(task, split, examples, model, tokenizer, selection, max_length, meta, precision)


def shard_payload(
    computed: dict[str, np.ndarray],
    enc: dict[str, np.ndarray],
    rows: np.ndarray,
    text_hash: np.ndarray,
    label: np.ndarray,
) -> dict[str, np.ndarray]:
    """Every array of one shard: the teacher's outputs plus the rows' identity and tokenized inputs."""
    return dict(
        computed,
        row=rows,
        text_hash=text_hash,
        label=label,
        input_ids=enc["input_ids"],
        token_type_ids=enc["token_type_ids"],
        length=enc["length"],
    )


def dump(
    task_name: str,
    options: DumpOptions,
    *,
    teacher: str,
    out: str,
    split: str = "train",
    data_dir: str | None = None,
    data_file: str | None = None,
    text_columns: list[str] | None = None,
    label_column: str | None = None,
    limit: int | None = None,
    log=print,
) -> DumpResult:
    """Write (or finish) the store at `out`; a complete store of the same identity there is left as it is.

    Every option, the data and the teacher are checked before anything on disk changes.
    """
    plan = plan_dump(
        task_name, options, teacher=teacher, out=out, split=split, data_dir=data_dir, data_file=data_file,
        text_columns=text_columns, label_column=label_column, limit=limit,
    )
    # Everything is validated above: only now may anything on disk change.
    with writing(out, plan.meta, overwrite=options.overwrite, software_version=__version__, log=log) as writer:
        pending = pending_shards(writer, out, log)
        if pending is None:
            return DumpResult(writer.meta, 0, 0.0)
        return _write_pending(writer, pending, out, plan, options, log)


def pending_shards(writer: StoreWriter, out: str, log) -> list[int] | None:
    """The shards still to write (saying so when some are done), or None for a complete store."""
    if writer.complete:
        log(f"{out} is already complete, nothing to do")
        return None
    pending = writer.pending_shards()
    if len(pending) < writer.n_shards:
        log(f"resuming {out}: {writer.n_shards - len(pending)}/{writer.n_shards} shards already written")
    return pending


def _write_pending(
    writer: StoreWriter, pending: list[int], out: str, plan: DumpPlan, options: DumpOptions, log
) -> DumpResult:
    """Compute and write the shards still pending, then finalize the store."""
    task, split, examples, tokenizer, selection = plan.task, plan.split, plan.examples, plan.tokenizer, plan.selection
    max_length = plan.max_length
    probe = TeacherProbe(plan.model, list(selection.ranking_layers), attention_probe_layers(selection))
    labels = examples.labels
    hashes = examples.text_hashes()
    todo_rows = sum(writer.shard_bounds(s)[1] - writer.shard_bounds(s)[0] for s in pending)
    bar = tqdm(total=todo_rows, unit="ex", desc=f"dump {task.name}/{split}", disable=not options.progress or None)
    started = time.perf_counter()
    threads = options.tokenize_threads or default_tokenize_threads(options.device)
    tokenizing = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="hsk-tokenize")
    writes = ShardWrites(writer, options.write_depth or default_write_depth(options.device), options.write_processes)
    overlap = overlaps_forward(options.device) if options.host_overlap is None else options.host_overlap

    def tokenized(shard: int) -> Tokenized:
        start, stop = writer.shard_bounds(shard)
        return Tokenized(tokenizing, tokenizer, tuple(col[start:stop] for col in examples.texts), max_length, threads)

    # Off the CPU three stages overlap (pipelines/dump/pipeline.py): shard k+1 is tokenized while shard k is
    # computed and earlier shards are written. On a CPU they take turns: shard k is computed, then written
    # while shard k+1 is tokenized. Each shard's arrays are filled again once it is written.
    next_enc = tokenized(pending[0]) if pending else None
    try:
        for i, shard in enumerate(pending):
            enc = next_enc.result()
            if overlap and i + 1 < len(pending):
                next_enc = tokenized(pending[i + 1])
            computed = compute_shard(
                probe, enc, selection, tokenizer.sep_token_id, options.batch_size, options.device, bar,
                engine=options.selection_engine, buffers=writes.spare(), precision=plan.precision,
            )
            start, stop = writer.shard_bounds(shard)
            arrays = shard_payload(computed, enc, examples.rows[start:stop], hashes[start:stop], labels[start:stop])
            writes.submit(shard, arrays, computed)
            if not overlap:  # between forwards: this write and the next shard's tokenizing, on the cores
                if i + 1 < len(pending):
                    next_enc = tokenized(pending[i + 1])
                writes.drain()
                next_enc.wait()
            release_free_memory()  # the heap's free pages back to the OS once per shard (heap.py)
        writes.drain()
    finally:
        writes.close()
        tokenizing.shutdown(wait=True, cancel_futures=True)
        probe.close()
        bar.close()
    result = DumpResult(writer.finalize().to_dict(), todo_rows, time.perf_counter() - started)
    if todo_rows:
        log(
            f"wrote {todo_rows} examples in {result.seconds:.1f}s ({result.examples_per_s:.0f} ex/s) to {out}"
        )
    return result
