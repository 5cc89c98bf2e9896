"""The seq2seq dump: run a teacher once over source/target pairs and keep its own output (sequence-level KD)
and, per target token, its distribution under teacher forcing on a sparse support (word-level KD)
(`hsk dump --objective seq2seq`; the format is hskstore.format.seq2seq).

The pairs are read as a stream (pipelines.dump.corpus: JSON lines, Parquet, CSV/TSV, Hugging Face datasets; or a
GLUE pair task), tokenized a shard ahead of the teacher, each shard's corpus cursors recorded so that a resumed
dump seeks to its first pending shard (pipelines.dump.streamed). Per shard of pairs: with `--decode`, the
teacher decodes each source (greedy or beam search); with `--support`, it reads each pair's target (the
reference, or its own output) under teacher forcing and the support is chosen on the device as a causal-LM
dump chooses it (pipelines.dump.clm: `top_ids`, `sample_support`). Encoder-decoder and decoder-only teachers
differ only in how they read a pair (pipelines.core.pair_models). Same guarantees as every store: whole
shards, digests, bit-identical resume.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm.auto import tqdm

from hskstore import __version__
from hskstore.format.clm import Support, encode_support, kept_positions
from hskstore.format.config import ConfigError
from hskstore.format.meta import DataRef, Layout, StoreMeta, TaskRef
from hskstore.format.seq2seq import GROUP, SEQ2SEQ, Decoding, Seq2seqSelection, pad_rows, pair_hashes
from hskstore.io.writer import StoreWriter, writing
from pipelines.core.data import DataError, Examples, _read_table, load_examples
from pipelines.core.models import ModelLoadError, load_tokenizer
from pipelines.core.pair_models import PairModel, architecture_of, pair_model
from pipelines.core.precision import forward_precision, resolve_forward
from pipelines.dump.clm import lm_teacher_ref, lm_tokenizer_ref, support_of
from pipelines.dump.corpus import CorpusSource, Cursor, ahead, open_corpus, rows_from
from pipelines.dump.stage import compute_record
from pipelines.dump.streamed import STREAM_KEY, LocalShards, StreamedShards, resumed_record

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_PROMPT = "{source}\n"  # a decoder-only teacher's template when none is given


def typed_prompt(text: str | None) -> str | None:
    """A --prompt as typed in a shell: \\n and \\t stand for a newline and a tab. Text that is not UTF-8 (bytes
    the shell passed undecoded arrive as lone surrogates) is refused: no tokenizer reads it."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"--prompt {text.encode('utf-8', 'backslashreplace').decode()!r} is not UTF-8 text "
                        f"(character {exc.start}): pass the template in UTF-8") from None
    return text.replace("\\n", "\n").replace("\\t", "\t")


@dataclass(frozen=True)
class Seq2seqRequest:
    """What a seq2seq dump is asked for (the CLI's options, checked before the teacher loads)."""

    support: Support | None
    decoding: str = "none"  # none | greedy | beam:N
    supports_on: str | None = None  # reference | teacher (default: teacher with --decode, else reference)
    logprob_codec: str = "float16"
    max_source: int = 128
    max_target: int = 64
    prompt: str | None = None
    positions: float = 1.0
    sample_seed: int = 0
    batch_size: int = 8
    shard_rows: int = 256
    precision: str = "auto"
    max_pairs: int | None = None  # --limit: the corpus's first N pairs
    workers: int | None = None  # a local dask cluster of N processes (pipelines/dump/seq2seq_distributed.py)
    scheduler: str | None = None  # or a running one
    threads_per_worker: int | None = None

    def check(self) -> Decoding | None:
        for name, value in (("--max-length", self.max_source), ("--max-target", self.max_target),
                            ("--batch-size", self.batch_size), ("--shard-rows", self.shard_rows)):
            if not 1 <= value <= 1 << 20:
                raise ConfigError(f"{name} {value}: pass a whole number from 1 to {1 << 20}")
        if self.max_pairs is not None and self.max_pairs < 1:
            raise ConfigError(f"--limit {self.max_pairs}: pass a positive number of pairs")
        if self.prompt is not None and "{source}" not in self.prompt:
            raise ConfigError(f"--prompt {self.prompt!r}: the template must contain {{source}}, where the source goes")
        return Decoding.parse(self.decoding, self.max_target)


def _pair_columns(path: Path, text_columns: str | None) -> tuple[list[str], list[str]]:
    columns = _read_table(path)
    names = text_columns.split(",") if text_columns else list(columns)[:2]
    if len(names) != 2 or any(name not in columns for name in names):
        raise DataError(f"{path}: pass --text-columns SOURCE,TARGET naming two of its columns "
                        f"({', '.join(columns)})")
    return [str(v) for v in columns[names[0]]], [str(v) for v in columns[names[1]]]


def _file_pairs(data_file: str, text_columns: str | None, limit: int | None) -> Examples:
    path = Path(data_file).expanduser()
    if not path.is_file():
        raise DataError(f"--data-file {data_file}: no such file")
    sources, targets = _pair_columns(path, text_columns)
    pairs = Examples(texts=(sources, targets), labels=np.full(len(sources), -1), rows=np.arange(len(sources)),
                     source=f"table:{path}")
    return pairs.select(np.arange(min(limit, len(pairs)))) if limit else pairs


def _check_pairs(pairs: Examples) -> Examples:
    """Pairs with both sides non-empty (else the first empty side, by its row)."""
    for i, (source, target) in enumerate(zip(*pairs.texts)):
        if not source.strip() or not target.strip():
            raise DataError(f"{pairs.source}: row {int(pairs.rows[i])} has an empty "
                            f"{'source' if not source.strip() else 'target'}: remove it or fill it in")
    if not len(pairs):
        raise DataError(f"{pairs.source} holds no pairs")
    return pairs


def load_pairs(*, task: str | None = None, split: str = "train", data_dir: str | None = None,
               data_file: str | None = None, text_columns: str | None = None, limit: int | None = None) -> Examples:
    """Source/target pairs: two columns of a table file (--data-file, --text-columns SOURCE,TARGET or its first
    two), or a GLUE pair task's two sentences (--task). A pair with an empty side is refused by its row."""
    if bool(task) == bool(data_file):
        raise ConfigError("a seq2seq dump reads pairs: pass --data-file (a table with a source and a target column) "
                          "or --task (a GLUE pair task: its first sentence to its second)")
    if data_file:
        return _check_pairs(_file_pairs(data_file, text_columns, limit))
    pairs = load_examples(task, split, data_dir=data_dir, limit=limit)
    if len(pairs.texts) != 2:
        raise DataError(f"--task {task} has one text column: a seq2seq dump needs pairs (mrpc, qqp, stsb, ...)")
    return _check_pairs(pairs)


@dataclass(frozen=True)
class ExamplePairs:
    """A GLUE pair task's two sentences (read whole: a GLUE split is small) as a corpus of pairs, a row's index
    its cursor."""

    examples: Examples

    @property
    def described(self) -> str:
        return self.examples.source

    @property
    def signature(self) -> str:
        return self.examples.fingerprint

    def records(self, start: Cursor) -> Iterator[tuple[tuple, Cursor]]:
        yield from rows_from(list(self.examples.texts), 0, start.offset, 0)

    def place(self, cursor: Cursor) -> str:
        return f"{self.described}: row {cursor.offset}"


def open_pairs(*, task: str | None = None, split: str = "train", data_dir: str | None = None,
               data_file: str | None = None, text_columns: str | None = None) -> CorpusSource | ExamplePairs:
    """The pairs a seq2seq dump streams: two columns of --data-file (JSON lines, Parquet, CSV/TSV, a Hugging Face
    dataset; local or a URL; a file, folder or glob), --text-columns SOURCE,TARGET or its first two; or a GLUE
    pair task's two sentences (--task)."""
    if bool(task) == bool(data_file):
        raise ConfigError("a seq2seq dump reads pairs: pass --data-file (a table with a source and a target column) "
                          "or --task (a GLUE pair task: its first sentence to its second)")
    if data_file:
        names = tuple(n.strip() for n in text_columns.split(",")) if text_columns else (None, None)
        if text_columns and (len(names) != 2 or not all(names)):
            raise DataError(f"--text-columns {text_columns}: a seq2seq dump takes two columns, SOURCE,TARGET")
        return open_corpus(None, data_file, None, pair=names)
    pairs = load_examples(task, split, data_dir=data_dir)
    if len(pairs.texts) != 2:
        raise DataError(f"--task {task} has one text column: a seq2seq dump needs pairs (mrpc, qqp, stsb, ...)")
    return ExamplePairs(pairs)


def pair_digest(source: str, target: str) -> bytes:
    """BLAKE2b-128 of a pair: its source's then its target's UTF-8 bytes, each length-prefixed (8 bytes,
    little-endian); the corpus fingerprint chains these as a causal-LM corpus chains its documents."""
    data = b"".join(len(b).to_bytes(8, "little") + b for b in (source.encode("utf-8"), target.encode("utf-8")))
    return hashlib.blake2b(data, digest_size=16).digest()


def checked_pairs(source: CorpusSource | ExamplePairs, start: Cursor) -> Iterator[tuple[tuple[str, str], Cursor]]:
    """((source, target), cursor) from `start` on; a pair with an empty side is refused by its place."""
    for values, cursor in source.records(start):
        for side, text in zip(("source", "target"), values, strict=True):
            if text is None or not str(text).strip():
                raise DataError(f"{source.place(cursor)} has an empty {side}: remove it or fill it in")
        yield (str(values[0]), str(values[1])), cursor


@dataclass(frozen=True)
class PairRows:
    """One shard's pairs, tokenized, and where they are in the corpus (as pipelines.dump.corpus.ShardCursors
    records a shard): `marks` (cursor, digest) per pair, `end` the next pair's (None after the last)."""

    arrays: dict[str, np.ndarray]
    marks: list
    start: tuple
    end: tuple | None
    last: bool
    start_skip: int = 0
    end_skip: int = 0


def pair_shards(pairs: Iterator[tuple[tuple[str, str], Cursor]], tokenizer: PreTrainedTokenizerBase,
                sel: Seq2seqSelection, shard_rows: int) -> Iterator[PairRows]:
    """The pairs `shard_rows` at a time, tokenized (a shard is read ahead: whether one is the last)."""
    pending = list(islice(pairs, shard_rows))
    while pending:
        following = list(islice(pairs, shard_rows))
        sources, targets = [p[0][0] for p in pending], [p[0][1] for p in pending]
        marks = [(cursor, pair_digest(*texts)) for texts, cursor in pending]
        yield PairRows(tokenize_texts(tokenizer, sources, targets, sel), marks, marks[0],
                       (following[0][1],) if following else None, not following)
        pending = following


def tokenize_pairs(tokenizer: PreTrainedTokenizerBase, pairs: Examples, sel: Seq2seqSelection) -> dict[str, np.ndarray]:
    """tokenize_texts of Examples of two columns."""
    return tokenize_texts(tokenizer, list(pairs.texts[0]), list(pairs.texts[1]), sel)


def tokenize_texts(tokenizer: PreTrainedTokenizerBase, sources: list[str], targets: list[str],
                   sel: Seq2seqSelection) -> dict[str, np.ndarray]:
    """source_ids/source_length and reference_ids/reference_length of every pair. An encoder-decoder's source
    and target are tokenized as its tokenizer does for each (special tokens included); a decoder-only
    teacher's source goes into the prompt template. Targets end with EOS."""
    if sel.architecture == "encoder-decoder":
        source_seqs = tokenizer(list(sources))["input_ids"]
        target_seqs = tokenizer(text_target=list(targets))["input_ids"]
    else:
        source_seqs = tokenizer([sel.prompt.replace("{source}", s) for s in sources])["input_ids"]
        target_seqs = tokenizer(list(targets), add_special_tokens=False)["input_ids"]
    # every target ends with EOS (the student learns to stop), added where the tokenizer does not add it
    target_seqs = [ids if ids[-1:] == [sel.eos_id] else [*ids, sel.eos_id] for ids in target_seqs]
    source_ids, source_length = pad_rows(source_seqs, sel.max_source, sel.pad_id)
    reference_ids, reference_length = pad_rows(target_seqs, sel.max_target, sel.pad_id)
    return {"source_ids": source_ids, "source_length": source_length, "reference_ids": reference_ids,
            "reference_length": reference_length}


def _support_batch(model: PreTrainedModel, arch: PairModel, source: np.ndarray, source_length: np.ndarray,
                   target: np.ndarray, target_length: np.ndarray, rows: np.ndarray, sel: Seq2seqSelection, device: str,
                   precision: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(ids [b, T, S], weights [b, T, S], entropy [b, T] or None) of a batch of pairs, on the device."""
    inputs = arch.inputs(source, source_length, target, target_length, sel, device)
    with torch.no_grad():
        with forward_precision(precision, device):
            logits = inputs.target_logits(model(**inputs.kwargs).logits)
        return support_of(logits, rows, sel)


def _decode_shard(model: PreTrainedModel, arch: PairModel, arrays: dict[str, np.ndarray], sel: Seq2seqSelection,
                  batch_size: int, device: str, precision: str) -> dict[str, np.ndarray]:
    decoding, outputs = sel.decoded, []
    for start in range(0, len(arrays["row"]), batch_size):
        part = slice(start, start + batch_size)
        with forward_precision(precision, device):
            outputs += arch.generate(model, arrays["source_ids"][part], arrays["source_length"][part], decoding, sel)
    teacher_ids, teacher_length = pad_rows(outputs, sel.max_target, sel.pad_id)
    return {"teacher_ids": teacher_ids, "teacher_length": teacher_length}


def _support_shard(model: PreTrainedModel, arch: PairModel, arrays: dict[str, np.ndarray], sel: Seq2seqSelection,
                   batch_size: int, device: str, precision: str) -> dict[str, np.ndarray]:
    ids_name, length_name = sel.target_arrays(sel.supports_on)
    target, target_length = arrays[ids_name], arrays[length_name]
    parts = []
    for s in range(0, len(target), batch_size):
        part = slice(s, s + batch_size)
        parts.append(_support_batch(model, arch, arrays["source_ids"][part], arrays["source_length"][part],
                                    target[part], target_length[part], arrays["row"][part], sel, device, precision))
    ids = torch.cat([part[0] for part in parts]).cpu().numpy()
    weights = torch.cat([part[1] for part in parts]).cpu().numpy()
    entropy = torch.cat([p[2] for p in parts]).cpu().numpy() if sel.positions < 1.0 else np.zeros(ids.shape[:2])
    return encode_support(ids, weights, kept_positions(entropy, target_length, sel.positions), sel, GROUP)


def compute_seq2seq_shard(model: PreTrainedModel, pairs: dict[str, np.ndarray], rows: np.ndarray, sel: Seq2seqSelection,
                          batch_size: int, device: str, precision: str) -> dict[str, np.ndarray]:
    """Every array of one shard's pairs (`pairs`: their tokenized arrays, `rows`: their rows in the store): the
    pairs, the teacher's output, the supports."""
    arch = pair_model(sel.architecture)
    arrays = dict(pairs)
    arrays.update(row=rows, text_hash=pair_hashes(arrays["source_ids"], arrays["reference_ids"]))
    if sel.decoding is not None:
        arrays.update(_decode_shard(model, arch, arrays, sel, batch_size, device, precision))
    if sel.support is not None:
        arrays.update(_support_shard(model, arch, arrays, sel, batch_size, device, precision))
    return arrays


def seq2seq_metadata(source: CorpusSource | ExamplePairs, teacher: str, model: PreTrainedModel,
                     tokenizer: PreTrainedTokenizerBase, sel: Seq2seqSelection, n_rows: int, shard_rows: int,
                     precision: str) -> dict:
    """The store's record at creation: a streamed corpus's fingerprint and row count are known only at its end
    (`finalize`); until then the dataset records the corpus's signature, the layout the rows made room for."""
    return StoreMeta(
        objective=SEQ2SEQ,
        task=TaskRef(SEQ2SEQ, "train"),
        dataset=DataRef(source.described, f"stream:{source.signature}", None),
        teacher=lm_teacher_ref(teacher, model, precision),
        tokenizer=lm_tokenizer_ref(teacher, tokenizer, sel.pad_id),
        max_length=sel.max_source,
        selection=sel.to_dict(),
        layout=Layout.of(n_rows, sel.slots, shard_rows),  # n_width = S: 0 without a support, as `slots`
    ).to_dict() | {STREAM_KEY: {"signature": source.signature}}


def _special_ids(request: Seq2seqRequest, architecture: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 teacher: str) -> tuple[int, int, int | None]:
    """(EOS, pad, decoder start) of the teacher: pad is EOS where the tokenizer has none; the decoder start of an
    encoder-decoder from its config."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ModelLoadError(f"the tokenizer of {teacher} has no EOS token, which ends every target")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    if architecture == "decoder-only":
        return int(eos), int(pad), None
    start = getattr(model.config, "decoder_start_token_id", None)
    if start is None:
        raise ModelLoadError(f"{teacher}'s config has no decoder_start_token_id, which starts its decoder")
    if request.prompt is not None:
        raise ConfigError("--prompt: an encoder-decoder teacher reads the source as it is (the template is for "
                          "decoder-only teachers)")
    return int(eos), int(pad), int(start)


def make_selection(request: Seq2seqRequest, decoding: Decoding | None, architecture: str, model: PreTrainedModel,
                   tokenizer: PreTrainedTokenizerBase, teacher: str) -> Seq2seqSelection:
    """The store's selection from the request and what the teacher's config and tokenizer say."""
    eos, pad, start = _special_ids(request, architecture, model, tokenizer, teacher)
    prompt = (request.prompt or DEFAULT_PROMPT) if architecture == "decoder-only" else None
    return Seq2seqSelection.make(
        request.support, decoding, architecture=architecture, vocab_size=model.config.vocab_size,
        max_source=request.max_source, max_target=request.max_target, eos_id=eos, pad_id=pad,
        decoder_start_id=start, prompt=prompt, supports_on=request.supports_on,
        logprob_codec=request.logprob_codec, positions=request.positions, sample_seed=request.sample_seed)


@dataclass
class Seq2seqPlan:
    """A seq2seq dump made ready to run: the tokenizer, the teacher, the selection and the store's record."""

    tokenizer: PreTrainedTokenizerBase
    model: PreTrainedModel
    sel: Seq2seqSelection
    meta: StoreMeta


def plan_seq2seq(teacher: str, out: str, source: CorpusSource | ExamplePairs, request: Seq2seqRequest, *,
                 device: str, overwrite: bool, compute: dict, extra_meta: dict | None = None,
                 load_on: str | None = None) -> Seq2seqPlan:
    """Load the tokenizer and teacher (on `load_on`, default `device`), check the request against them, and make
    the store's record (`compute`: how its bytes are computed; a resume must match it)."""
    decoding = request.check()
    precision = resolve_forward(request.precision, device)
    architecture = architecture_of(teacher)
    tokenizer = load_tokenizer(teacher)
    model = pair_model(architecture).load(teacher, load_on or device)
    sel = make_selection(request, decoding, architecture, model, tokenizer, teacher)
    n_rows = request.max_pairs or 16 * request.shard_rows  # grown as the pairs come, cut to their count at the end
    meta = seq2seq_metadata(source, teacher, model, tokenizer, sel, n_rows, request.shard_rows, precision)
    meta = meta if overwrite else resumed_record(out, meta)
    return Seq2seqPlan(tokenizer, model, sel, StoreMeta.parse({**meta, **(extra_meta or {}), "compute": compute}))


@dataclass(frozen=True)
class Seq2seqRun:
    """What computes a shard's arrays from its pairs: the teacher, the selection, the batch, device, precision."""

    model: PreTrainedModel
    sel: Seq2seqSelection
    request: Seq2seqRequest
    device: str
    precision: str
    teacher: str

    def arrays(self, rows: PairRows, first_row: int) -> dict[str, np.ndarray]:
        check_pair_ids(rows.arrays, self.sel.vocab_size, self.teacher)
        index = np.arange(first_row, first_row + len(rows.marks), dtype=np.int64)
        return compute_seq2seq_shard(self.model, rows.arrays, index, self.sel, self.request.batch_size, self.device,
                                     self.precision)


def check_pair_ids(arrays: dict[str, np.ndarray], vocab: int, teacher: str) -> None:
    if int(arrays["source_ids"].max(initial=0)) >= vocab:
        raise ModelLoadError(f"the tokenizer of {teacher} gives ids beyond the model's vocabulary of "
                             f"{vocab}: pass a teacher saved with its own tokenizer")


def dump_seq2seq(teacher: str, out: str, source: CorpusSource | ExamplePairs, request: Seq2seqRequest, *,
                 device: str = "cpu", overwrite: bool = False, progress: bool = True,
                 log: Callable[[str], object] = print, extra_meta: dict | None = None) -> dict:
    """Write (or finish) the seq2seq store at `out` from a stream of pairs; returns its metadata."""
    plan = plan_seq2seq(teacher, out, source, request, device=device, overwrite=overwrite, extra_meta=extra_meta,
                        compute=compute_record(request.batch_size, device))
    with writing(out, plan.meta, overwrite=overwrite, software_version=__version__, log=log) as writer:
        if writer.complete:
            log(f"{out} is already complete, nothing to do")
            return writer.meta
        run = Seq2seqRun(plan.model, plan.sel, request, device, resolve_forward(request.precision, device), teacher)
        return write_pairs(writer, out, source, plan.tokenizer, run, progress, log)


def write_pairs(writer: StoreWriter, out: str, source: CorpusSource | ExamplePairs,
                tokenizer: PreTrainedTokenizerBase, run: Seq2seqRun, progress: bool, log: Callable[[str], object],
                sink: Any = None) -> dict:
    """Stream the pairs into the store's pending shards (`sink` computes and writes each: this process's
    LocalShards, or a cluster's), then finalize it with the corpus's fingerprint."""
    request, shard_rows = run.request, writer.metadata.layout.shard_rows
    stream = StreamedShards(writer, out, source, log)
    started = time.perf_counter()
    bar = tqdm(total=request.max_pairs, initial=stream.first * shard_rows, unit="pair", desc="dump seq2seq",
               disable=not progress or None)
    pairs = checked_pairs(source, stream.start[0])
    if request.max_pairs is not None:  # those before the resume point were counted shard by shard
        pairs = islice(pairs, max(request.max_pairs - stream.cursors.documents_before(stream.first), 0))
    shards = ahead(pair_shards(pairs, tokenizer, run.sel, shard_rows))
    try:
        stream.run(shards, sink or LocalShards(writer, run.arrays, run.device), lambda rows: len(rows.marks),
                   lambda rows: bar.update(len(rows.marks)), "holds no pairs")
    finally:
        bar.close()
    meta = stream.finalize()
    log(f"wrote {stream.written} shards ({meta['layout']['n_rows']} pairs in the store) "
        f"in {time.perf_counter() - started:.1f}s to {out}")
    return meta
