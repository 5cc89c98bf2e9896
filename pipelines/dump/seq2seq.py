"""The seq2seq dump: run a teacher once over source/target pairs and keep its own output (sequence-level KD)
and, per target token, its distribution under teacher forcing on a sparse support (word-level KD)
(`hsk dump --objective seq2seq`; the format is hskstore.format.seq2seq).

Per shard of pairs: with `--decode`, the teacher decodes each source (greedy or beam search); with
`--support`, it reads each pair's target (the reference, or its own output) under teacher forcing and the
support is chosen on the device as a causal-LM dump chooses it (pipelines.dump.clm: `top_ids`,
`sample_support`). Encoder-decoder and decoder-only teachers differ only in how they read a pair
(pipelines.core.pair_models). Same guarantees as every store: whole shards, digests, bit-identical resume.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

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
from pipelines.dump.stage import compute_record

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

    def check(self) -> Decoding | None:
        for name, value in (("--max-length", self.max_source), ("--max-target", self.max_target),
                            ("--batch-size", self.batch_size), ("--shard-rows", self.shard_rows)):
            if not 1 <= value <= 1 << 20:
                raise ConfigError(f"{name} {value}: pass a whole number from 1 to {1 << 20}")
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


def tokenize_pairs(tokenizer: PreTrainedTokenizerBase, pairs: Examples, sel: Seq2seqSelection) -> dict[str, np.ndarray]:
    """source_ids/source_length and reference_ids/reference_length of every pair. An encoder-decoder's source
    and target are tokenized as its tokenizer does for each (special tokens included); a decoder-only
    teacher's source goes into the prompt template. Targets end with EOS."""
    sources, targets = pairs.texts
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
    """Every array of one shard's pairs: the pairs, the teacher's output, the supports."""
    arch = pair_model(sel.architecture)
    arrays = {name: values[rows] for name, values in pairs.items()}
    arrays.update(row=rows, text_hash=pair_hashes(arrays["source_ids"], arrays["reference_ids"]))
    if sel.decoding is not None:
        arrays.update(_decode_shard(model, arch, arrays, sel, batch_size, device, precision))
    if sel.support is not None:
        arrays.update(_support_shard(model, arch, arrays, sel, batch_size, device, precision))
    return arrays


def seq2seq_metadata(pairs: Examples, teacher: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                     sel: Seq2seqSelection, shard_rows: int, precision: str) -> dict:
    return StoreMeta(
        objective=SEQ2SEQ,
        task=TaskRef(SEQ2SEQ, "train"),
        dataset=DataRef(pairs.source, pairs.fingerprint, len(pairs)),
        teacher=lm_teacher_ref(teacher, model, precision),
        tokenizer=lm_tokenizer_ref(teacher, tokenizer, sel.pad_id),
        max_length=sel.max_source,
        selection=sel.to_dict(),
        layout=Layout.of(len(pairs), sel.slots, shard_rows),  # n_width = S: 0 without a support, as `slots`
    ).to_dict()


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


def dump_seq2seq(teacher: str, out: str, pairs: Examples, request: Seq2seqRequest, *, device: str = "cpu",
                 overwrite: bool = False, progress: bool = True, log: Callable[[str], object] = print,
                 extra_meta: dict | None = None) -> dict:
    """Write (or finish) the seq2seq store at `out`; returns its metadata."""
    decoding = request.check()
    if len(pairs.texts) != 2:
        raise DataError(f"{pairs.source}: a seq2seq dump needs two text columns, the source and the target")
    precision = resolve_forward(request.precision, device)
    architecture = architecture_of(teacher)
    tokenizer = load_tokenizer(teacher)
    model = pair_model(architecture).load(teacher, device)
    sel = make_selection(request, decoding, architecture, model, tokenizer, teacher)
    arrays = tokenize_pairs(tokenizer, pairs, sel)
    if int(arrays["source_ids"].max(initial=0)) >= sel.vocab_size:
        raise ModelLoadError(f"the tokenizer of {teacher} gives ids beyond the model's vocabulary of "
                             f"{sel.vocab_size}: pass a teacher saved with its own tokenizer")
    meta = seq2seq_metadata(pairs, teacher, model, tokenizer, sel, request.shard_rows, precision)
    meta = StoreMeta.parse({**meta, **(extra_meta or {}), "compute": compute_record(request.batch_size, device)})
    with writing(out, meta, overwrite=overwrite, software_version=__version__, log=log) as writer:
        if writer.complete:
            log(f"{out} is already complete, nothing to do")
            return writer.meta
        return _write_shards(writer, out, model, arrays, sel, request, device, precision, progress, log)


def _write_shards(writer: StoreWriter, out: str, model: PreTrainedModel, pairs: dict[str, np.ndarray],
                  sel: Seq2seqSelection, request: Seq2seqRequest, device: str, precision: str, progress: bool,
                  log: Callable[[str], object]) -> dict:
    pending = writer.pending_shards()
    if len(pending) < writer.n_shards:
        log(f"resuming {out}: {writer.n_shards - len(pending)}/{writer.n_shards} shards already written")
    started = time.perf_counter()
    for shard in tqdm(pending, unit="shard", desc="dump seq2seq", disable=not progress or None):
        rows = np.arange(*writer.shard_bounds(shard), dtype=np.int64)
        writer.write_shard(shard, compute_seq2seq_shard(model, pairs, rows, sel, request.batch_size, device,
                                                        precision))
    meta = writer.finalize().to_dict()
    log(f"wrote {len(pending)} shards ({len(pairs['source_ids'])} pairs in the store) "
        f"in {time.perf_counter() - started:.1f}s to {out}")
    return meta
