"""The causal-LM dump: run a causal LM once over a corpus and keep its next-token distributions on a sparse
support (`hsk dump --objective clm`; the format is hskstore.format.clm).

The corpus is packed into blocks as LM training packs it (hskstore.format.clm.pack_blocks). Per batch of
blocks the teacher's logits become float32 log-probs on the device, where the support is chosen: the top K
(`torch.topk`), or `draws` samples from the distribution (`torch.multinomial`, one generator per block seeded
by (sample_seed, row), so that resume, shard layout and batch size never change a draw), reduced to distinct
ids and counts. Only the support leaves the device: [b, T, S] ids and weights, never [b, T, V].

Same guarantees as every store (hskstore.io.writer): whole shards, digests, resumable bit-identically,
provenance (teacher weights hash, tokenizer vocabulary hash, corpus fingerprint).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm.auto import tqdm

from hskstore import __version__, codecs
from hskstore.format.clm import (
    ACTUAL,
    CLM,
    HIDDEN,
    TEXT,
    TOKEN_BYTES,
    ClmSelection,
    PackedRows,
    Support,
    actual_logprobs,
    block_hashes,
    encode_support,
    head_digest,
    kept_positions,
    pack_blocks,
    pack_stream,
    text_array,
)
from hskstore.format.clm_layers import check_stride
from hskstore.format.config import ConfigError
from hskstore.format.hidden_fit import FitEncoder, check_fit_request
from hskstore.format.meta import DataRef, Layout, StoreMeta, TaskRef, TeacherRef, TokenizerRef
from hskstore.io.clm_store import stored_fit, write_fit, write_head
from hskstore.io.writer import StoreWriter, writing
from pipelines.core.data import DataError
from pipelines.core.models import (
    ModelLoadError,
    load_tokenizer,
    model_revision,
    resolve_model,
    vocab_hash,
    weights_hash,
)
from pipelines.core.precision import FP32, forward_precision, resolve_forward
from pipelines.dump.clm_hidden import (
    TeacherHead,
    compute_hidden_shard,
    fit_hidden,
    folded_head,
    head_arrays,
    hidden_selection,
    measure_reconstruction,
)
from pipelines.dump.clm_layers import capturing_layers, with_layers
from pipelines.dump.corpus import CorpusSource, ShardCursors, ahead, tokenized
from pipelines.dump.stage import compute_record
from pipelines.dump.streamed import STREAM_KEY, LocalShards, StreamedShards, resumed_record

CLM_TEACHER_KEYS = ("name", "revision", "weights_hash", "architecture", "model_type", "num_layers", "hidden_size",
                    "vocab_size", "precision")
CLM_TOKENIZER_KEYS = ("name", "vocab_hash", "vocab_size", "pad_id")

if TYPE_CHECKING:
    from transformers import PreTrainedModel as Teacher
    from transformers import PreTrainedTokenizerBase as Tokenizer


@dataclass(frozen=True)
class ClmRequest:
    """What a causal-LM dump is asked for (the CLI's options, checked before the teacher loads)."""

    support: Support
    logprob_codec: str = "float16"
    block_size: int = 256
    positions: float = 1.0
    sample_seed: int = 0
    max_tokens: int | None = None
    batch_size: int = 8
    shard_rows: int = 64
    precision: str = "auto"
    dtype: str = "auto"  # the teacher's weights: auto (the checkpoint's), float32, bfloat16, float16
    device_map: str | None = None  # "auto": accelerate spreads the teacher over the visible devices
    max_documents: int | None = None  # --limit: the corpus's first N documents
    workers: int | None = None  # a local dask cluster of N processes (pipelines/dump/clm_distributed.py)
    scheduler: str | None = None  # or a running one
    threads_per_worker: int | None = None
    layers: tuple[int, ...] | None = None  # --hidden-layers: teacher layers kept beside the support
    layer_stride: int = 1
    layer_codec: str = "float16"
    hidden_kl: float = 0.01  # --support hidden:fit: the target mean KL of the fitted basis's steps
    hidden_fit_tokens: int = 8192  # --support hidden:fit: the corpus's first kept positions the fit reads

    def check(self) -> None:
        for name, value in (("--block-size", self.block_size), ("--batch-size", self.batch_size),
                            ("--shard-rows", self.shard_rows)):
            if not 1 <= value <= 1 << 20:
                raise ConfigError(f"{name} {value}: pass a whole number from 1 to {1 << 20}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigError(f"--limit-tokens {self.max_tokens}: pass a positive number of tokens")
        if self.dtype not in DTYPES:
            raise ConfigError(f"--dtype {self.dtype!r}: pass one of {', '.join(DTYPES)}")
        if self.support.basis is not None:
            check_fit_request(self.hidden_kl, self.hidden_fit_tokens)
        if self.layers is not None:
            check_stride(self.layer_stride, self.block_size)
            codecs.chosen(self.layer_codec, "--layer-codec")
        if self.device_map not in (None, "auto"):
            raise ConfigError(f"--device-map {self.device_map!r}: pass auto (accelerate places the teacher's layers "
                              "on the visible devices), or leave it out for --device")


DTYPES = ("auto", "float32", "bfloat16", "float16")


def teacher_dtype(teacher: str, dtype: str) -> torch.dtype:
    """The weights' dtype: the one asked for, or with auto the checkpoint's (`dtype`/`torch_dtype` in its
    config; float32 where it records none)."""
    if dtype != "auto":
        return getattr(torch, dtype)
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(resolve_model(teacher))
    except Exception:  # the model load below says what is wrong with the teacher
        return torch.float32
    recorded = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(recorded, str):
        recorded = getattr(torch, recorded, None)
    return recorded if isinstance(recorded, torch.dtype) and recorded.is_floating_point else torch.float32


def load_clm_teacher(teacher: str, device: str, dtype: str = "float32", device_map: str | None = None) -> Teacher:
    """Any AutoModelForCausalLM (GPT-2, Llama, Qwen2, SmolLM2, ...), its weights loaded in `dtype` (not float32
    under autocast), on `device` or spread by accelerate (`device_map="auto"`), in eval mode."""
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": teacher_dtype(teacher, dtype)}
    if device_map:
        kwargs["device_map"] = device_map
    try:
        model = AutoModelForCausalLM.from_pretrained(resolve_model(teacher), **kwargs)
    except Exception as exc:  # transformers raises many kinds; say what to pass instead
        raise ModelLoadError(f"cannot load a causal-LM teacher from {teacher} ({str(exc).splitlines()[0][:200]}): "
                             "pass a folder or hub id of an AutoModelForCausalLM (GPT-2, Llama, Qwen2, ...)") from None
    return (model if device_map else model.to(device)).eval()


def input_device(model: Teacher, device: str) -> str:
    """Where a batch's ids go: the device of the teacher's embeddings (its first layer under a device map)."""
    return str(model.get_input_embeddings().weight.device) if getattr(model, "hf_device_map", None) else device


def check_block_size(model: Teacher, block_size: int, teacher: str) -> None:
    """A block longer than the teacher's positions is refused before any forward (it would run on, wrong)."""
    cfg = model.config
    limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    if limit and block_size > limit:
        raise ConfigError(f"--block-size {block_size}: {teacher} has {limit} positions; pass --block-size {limit} "
                          "or less")


def eos_of(tokenizer: Tokenizer, teacher: str) -> int:
    if tokenizer.eos_token_id is None:
        from pipelines.core.models import load_config

        saved_as = getattr(load_config(teacher), "architectures", None) or []
        if saved_as and not any(str(a).endswith(("ForCausalLM", "LMHeadModel")) for a in saved_as):
            raise ModelLoadError(f"{teacher} is a {saved_as[0]}, not a causal LM: pass an AutoModelForCausalLM "
                                 "teacher (e.g. smollm2) to --objective clm")
        raise ModelLoadError(f"the tokenizer of {teacher} has no EOS token, which separates the corpus's documents")
    return int(tokenizer.eos_token_id)


def tokenize_corpus(tokenizer: Tokenizer, texts: list[str], block_size: int, eos_id: int,
                    max_tokens: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(blocks, lengths) of a list of documents: each tokenized without special tokens, then packed."""
    documents = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return pack_blocks(documents, block_size, eos_id, max_tokens)


def text_bytes_bound(tokenizer: Tokenizer, block_size: int) -> int | None:
    """The width of a block's text in the store (`clm/text`), known before the corpus is read: block_size x the
    UTF-8 bytes of the longest token of the vocabulary (at least a character's 4; the zero padding compresses
    away). None for a slow tokenizer, which gives no offsets: the store keeps no text arrays."""
    if not getattr(tokenizer, "is_fast", False):
        return None
    pieces = tokenizer.backend_tokenizer.decode_batch([[i] for i in range(len(tokenizer))], skip_special_tokens=False)
    return block_size * max([4, *(len(piece.encode("utf-8")) for piece in pieces)])


def shard_text(rows: PackedRows, sel: ClmSelection) -> tuple[np.ndarray, np.ndarray] | None:
    """The rows' (token_bytes, text) arrays when the store keeps them."""
    if sel.text_bytes is None or rows.texts is None:
        return None
    return rows.token_bytes, text_array(rows.texts, sel.text_bytes)


def _row_generator(seed: int, row: int, device: torch.device) -> torch.Generator:
    state = int(np.random.SeedSequence([seed, row]).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))
    return torch.Generator(device=device).manual_seed(state)


def sample_support(logprobs: torch.Tensor, draws: int, seed: int, row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One block's [T, V] log-probs -> (ids, counts) [T, draws]: the distinct ids of `draws` samples per position
    in increasing order, then unused slots (id 0, count 0)."""
    generator = _row_generator(seed, row, logprobs.device)
    drawn = torch.multinomial(logprobs.exp(), draws, replacement=True, generator=generator)
    drawn, _ = drawn.sort(-1)
    first = torch.ones_like(drawn, dtype=torch.bool)
    first[:, 1:] = drawn[:, 1:] != drawn[:, :-1]
    slot = first.long().cumsum(-1) - 1
    ids = torch.zeros_like(drawn).scatter_(1, slot, drawn)
    counts = torch.zeros_like(drawn).scatter_add_(1, slot, torch.ones_like(drawn))
    return ids, counts


def _by_value_then_id(logprobs: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """`ids` reordered by descending log-prob, equal log-probs by increasing id."""
    ids = ids.sort(-1).values
    order = torch.sort(logprobs.gather(-1, ids), dim=-1, descending=True, stable=True).indices
    return ids.gather(-1, order)


def top_ids(logprobs: torch.Tensor, k: int) -> torch.Tensor:
    """[..., V] -> the k ids of highest log-prob [..., k], equal log-probs taken by lower id first: a prefix of
    this order is the order at a smaller k, so a derived top-K' is the dump's. topk(k + 1) finds the set unless
    the k-th and (k+1)-th tie; those positions (rare) are sorted whole."""
    vocab = logprobs.shape[-1]
    if k >= vocab:
        return _by_value_then_id(logprobs, torch.arange(vocab, device=logprobs.device).expand_as(logprobs))
    values, ids = logprobs.topk(k + 1, dim=-1)
    ids = _by_value_then_id(logprobs, ids)[..., :k]
    tied = values[..., k - 1] == values[..., k]
    if bool(tied.any()):  # one host read per batch: the support is copied to the host right after anyway
        whole = torch.arange(vocab, device=logprobs.device).expand(int(tied.sum()), vocab)
        ids[tied] = _by_value_then_id(logprobs[tied], whole)[..., :k]
    return ids


@torch.no_grad()
def teacher_support(model: Teacher, input_ids: torch.Tensor, rows: np.ndarray, sel: ClmSelection,
                    precision: str) -> tuple[torch.Tensor, ...]:
    """(ids [b, T, S] int32, weights [b, T, S], entropy [b, T] or None when every position is kept, the log-prob
    of each position's next token [b, T]) of a batch of blocks, on the teacher's device: weights are float16
    log-probs (top-K) or counts (sampled)."""
    with forward_precision(precision, str(input_ids.device)):
        logits = model(input_ids=input_ids).logits
    return (*support_of(logits, rows, sel), next_token_logprobs(logits, input_ids))


def next_token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """[b, T]: log_softmax(logits)[t, input_ids[t + 1]] (the last position: of id 0, zeroed on the host)."""
    following = torch.cat([input_ids[:, 1:], torch.zeros_like(input_ids[:, :1])], 1)
    logits = logits.float()
    return logits.gather(-1, following[..., None].long())[..., 0] - torch.logsumexp(logits, -1)


def support_of(logits: torch.Tensor, rows: np.ndarray, sel: ClmSelection) -> tuple[torch.Tensor, torch.Tensor,
                                                                             torch.Tensor | None]:
    """A batch's [b, T, V] logits -> (ids [b, T, S] int32, weights [b, T, S], entropy [b, T] or None when every
    position is kept), on their device: the support `sel` names (causal-LM and seq2seq stores alike)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    entropy = -(logprobs.exp() * logprobs).sum(-1) if sel.positions < 1.0 else None
    if sel.support == "topk":
        ids = top_ids(logprobs, sel.k)
        weights = logprobs.gather(-1, ids).half()
    else:
        pairs = [sample_support(logprobs[i], sel.draws, sel.sample_seed, int(row)) for i, row in enumerate(rows)]
        ids, weights = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs]).to(torch.int16)
    return ids.to(torch.int32), weights, entropy


def compute_clm_shard(model: Teacher, blocks: np.ndarray, lengths: np.ndarray, rows: np.ndarray, sel: ClmSelection,
                      batch_size: int, device: str, precision: str,
                      text: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Every array of one shard's rows. The supports stay on the device until the shard is done: one copy to
    the host per shard, and the teacher's next batch is queued while the last one runs."""
    parts = [teacher_support(model, torch.as_tensor(blocks[start:start + batch_size], device=device),
                             rows[start:start + batch_size], sel, precision)
             for start in range(0, len(blocks), batch_size)]
    ids = torch.cat([part[0] for part in parts]).cpu().numpy()
    weights = torch.cat([part[1] for part in parts]).cpu().numpy()
    entropy = torch.cat([part[2] for part in parts]).cpu().numpy() if sel.positions < 1.0 else np.zeros(ids.shape[:2])
    kept = kept_positions(entropy, lengths, sel.positions)
    arrays = encode_support(ids, weights, kept, sel)
    arrays.update(row=rows, text_hash=block_hashes(blocks), input_ids=blocks, length=lengths)
    if text is not None:  # the rows' (token_bytes, text): a student with another tokenizer re-tokenizes them
        actual = torch.cat([part[3] for part in parts]).cpu().numpy()
        arrays.update({ACTUAL: actual_logprobs(actual, lengths), TOKEN_BYTES: text[0], TEXT: text[1]})
    return arrays


SHARD_COMPUTE: dict[str, Callable[..., dict[str, np.ndarray]]] = {HIDDEN: compute_hidden_shard}


def shard_compute(sel: ClmSelection, encoder: FitEncoder | None = None) -> Callable[..., dict[str, np.ndarray]]:
    """What computes a shard's arrays for the store's support (compute_clm_shard's arguments), with a fitted
    basis's encoder where the store has one."""
    compute = SHARD_COMPUTE.get(sel.support, compute_clm_shard)
    return compute if encoder is None else partial(compute, encoder=encoder)


def lm_teacher_ref(teacher: str, model: Teacher, precision: str) -> TeacherRef:
    """An LM teacher's provenance (causal-LM and seq2seq stores): where it was found, its weights and shape; its
    forward's precision and its weights' dtype recorded only when not float32, as task stores record them."""
    cfg = model.config
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    written = CLM_TEACHER_KEYS if precision != FP32 else CLM_TEACHER_KEYS[:-1]
    return TeacherRef(
        teacher, revision=model_revision(teacher), weights_hash=weights_hash(model),
        architecture=type(model).__name__, model_type=cfg.model_type, num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size, precision=None if precision == FP32 else precision,
        dtype=None if dtype == "float32" else dtype, written=written + (("dtype",) if dtype != "float32" else ()),
    )


def lm_tokenizer_ref(teacher: str, tokenizer: Tokenizer, pad_id: int) -> TokenizerRef:
    return TokenizerRef(teacher, vocab_hash=vocab_hash(tokenizer), vocab_size=len(tokenizer), pad_id=pad_id,
                        written=CLM_TOKENIZER_KEYS)


def clm_metadata(corpus: CorpusSource, teacher: str, model: Teacher, tokenizer: Tokenizer, sel: ClmSelection,
                 n_rows: int, shard_rows: int, precision: str) -> dict:
    """The store's record at creation: a streamed corpus's fingerprint and row count are known only at its end
    (`finalize`); until then the dataset records the corpus's signature, the layout the rows made room for."""
    return StoreMeta(
        objective=CLM,
        task=TaskRef(CLM, "train"),
        dataset=DataRef(corpus.described, f"stream:{corpus.signature}", None),
        teacher=lm_teacher_ref(teacher, model, precision),
        tokenizer=lm_tokenizer_ref(teacher, tokenizer, sel.eos_id),
        max_length=sel.block_size,
        selection=sel.to_dict(),
        layout=Layout.of(n_rows, sel.slots, shard_rows),
    ).to_dict() | {STREAM_KEY: {"signature": corpus.signature}}


def initial_rows(request: ClmRequest) -> int:
    """Rows a new store makes room for: all that --limit-tokens can fill, else 16 shards (it grows)."""
    if request.max_tokens is not None:
        return max(1, -(-request.max_tokens // request.block_size))
    return 16 * request.shard_rows


@dataclass
class ClmPlan:
    """A causal-LM dump made ready to run: the tokenizer, the teacher, the support and the store's record (and a
    hidden-state store's head, written once before its shards)."""

    tokenizer: Tokenizer
    model: Teacher
    sel: ClmSelection
    meta: StoreMeta
    head: TeacherHead | None = None
    encoder: FitEncoder | None = None  # a fitted basis's (--support hidden:fit)

    def write_head(self, group: Any) -> None:
        """A hidden-state store's head (and a fitted basis's encoder), written once before its shards."""
        if self.head is not None:
            write_head(group, *head_arrays(self.head))
        if self.encoder is not None:
            write_fit(group, self.encoder)


def plan_clm(teacher: str, out: str, corpus: CorpusSource, request: ClmRequest, *, device: str, overwrite: bool,
             compute: dict, extra_meta: dict | None = None, device_map: str | None = None,
             load_on: str | None = None) -> ClmPlan:
    """Load the tokenizer and teacher (on `load_on`, default `device`, where the forward runs), check the request
    against them, and make the store's record (`compute`: how its bytes are computed; a resume must match it)."""
    request.check()
    precision = resolve_forward(request.precision, device)
    tokenizer = load_tokenizer(teacher)
    eos = eos_of(tokenizer, teacher)
    model = load_clm_teacher(teacher, load_on or device, request.dtype, device_map)
    check_block_size(model, request.block_size, teacher)
    where = input_device(model, load_on or device)
    sel, head = _selection(model, tokenizer, corpus, request, eos, teacher, where, precision)
    encoder = None
    if request.support.basis is not None:
        sel, head, encoder = _fitted(model, tokenizer, corpus, request, eos, sel, head, where, precision,
                                     None if overwrite else out)
    sel = with_layers(sel, model, request, teacher)
    meta = clm_metadata(corpus, teacher, model, tokenizer, sel, initial_rows(request), request.shard_rows, precision)
    meta = meta if overwrite else resumed_record(out, meta)
    return ClmPlan(tokenizer, model, sel, StoreMeta.parse({**meta, **(extra_meta or {}), "compute": compute}), head,
                   encoder)


def _fitted(model: Teacher, tokenizer: Tokenizer, corpus: CorpusSource, request: ClmRequest, eos: int,
            sel: ClmSelection, head: TeacherHead, device: str, precision: str, resume: str | None
            ) -> tuple[ClmSelection, TeacherHead, FitEncoder]:
    """A fitted basis's selection, folded head and encoder: the store's own when a dump of it is resumed (never
    refitted), else fitted to the corpus's first shards; the reconstruction measured through it."""
    found = stored_fit(resume, request.hidden_kl) if resume else None
    if found is None:
        shards = corpus_rows(corpus, tokenizer, request, eos, request.shard_rows)
        found = fit_hidden(model, shards, sel, head, request.hidden_kl, request.hidden_fit_tokens,
                           request.batch_size, device, precision)
    sel = sel.fitted(found.record, head_digest(found.weight, found.bias))
    head = folded_head(found, head.softcap, device)
    first = first_block(corpus, tokenizer, request, eos)
    return (measure_reconstruction(model, first.blocks, first.lengths, sel, head, device, precision, found.encoder),
            head, found.encoder)


def _selection(model: Teacher, tokenizer: Tokenizer, corpus: CorpusSource, request: ClmRequest, eos: int, teacher: str,
               device: str, precision: str) -> tuple[ClmSelection, TeacherHead | None]:
    """The store's selection, and for the hidden support the head it stores once, with the reconstruction
    measured on the corpus's first block (a hidden-state store keeps no block text: text_bytes None)."""
    vocab = model.config.vocab_size
    if request.support.kind != HIDDEN:
        return ClmSelection.make(request.support, vocab_size=vocab, block_size=request.block_size, eos_id=eos,
                                 logprob_codec=request.logprob_codec, positions=request.positions,
                                 sample_seed=request.sample_seed, limit_tokens=request.max_tokens,
                                 text_bytes=text_bytes_bound(tokenizer, request.block_size)), None
    sel, head = hidden_selection(model, request.support, vocab_size=vocab, block_size=request.block_size,
                                 eos_id=eos, positions=request.positions, seed=request.sample_seed,
                                 limit_tokens=request.max_tokens)
    first = first_block(corpus, tokenizer, request, eos)
    check_ids(first.blocks, vocab, teacher)
    if request.support.basis is not None:  # measured once fitted (_fitted)
        return sel, head
    return measure_reconstruction(model, first.blocks, first.lengths, sel, head, device, precision), head


def first_block(corpus: CorpusSource, tokenizer: Tokenizer, request: ClmRequest, eos: int) -> PackedRows:
    """The corpus's first block (read from its start, as the dump packs it)."""
    for rows in corpus_rows(corpus, tokenizer, request, eos, 1):
        return rows
    raise DataError(f"{corpus.described} holds no text")


def corpus_rows(corpus: CorpusSource, tokenizer: Tokenizer, request: ClmRequest, eos: int, rows: int
                ) -> Iterator[PackedRows]:
    """The corpus's blocks from its start, `rows` at a time, as the dump packs them."""
    documents = corpus.documents()
    if request.max_documents is not None:
        documents = islice(documents, request.max_documents)
    return pack_stream(tokenized(documents, tokenizer), request.block_size, eos, rows, request.max_tokens)


def dump_clm(teacher: str, out: str, corpus: CorpusSource, request: ClmRequest, *, device: str = "cpu",
             overwrite: bool = False, progress: bool = True, log: Callable[[str], Any] = print,
             extra_meta: dict | None = None) -> dict:
    """Write (or finish) the causal-LM store at `out` from a streamed corpus; returns its metadata."""
    # the float bits depend on the device, batch and threads: a resume must compute as the first run did
    plan = plan_clm(teacher, out, corpus, request, device=device, overwrite=overwrite, extra_meta=extra_meta,
                    compute=compute_record(request.batch_size, device), device_map=request.device_map)
    with writing(out, plan.meta, overwrite=overwrite, software_version=__version__, log=log) as writer:
        if writer.complete:
            log(f"{out} is already complete, nothing to do")
            return writer.meta
        plan.write_head(writer.group)
        run = ShardRun(plan.model, plan.sel, request, input_device(plan.model, device),
                       resolve_forward(request.precision, device), teacher, plan.encoder)
        return write_stream(writer, out, corpus, plan.tokenizer, run, progress, log)


def check_ids(blocks: np.ndarray, vocab: int, teacher: str) -> None:
    if int(blocks.max(initial=0)) >= vocab:
        raise ModelLoadError(f"the tokenizer of {teacher} gives ids up to {int(blocks.max())} but the model's "
                             f"vocabulary has {vocab}: pass a teacher saved with its own tokenizer")


@dataclass(frozen=True)
class ShardRun:
    """What computes a shard's arrays from its blocks: the teacher, the support, the batch, device, precision."""

    model: Teacher
    sel: ClmSelection
    request: ClmRequest
    device: str
    precision: str
    teacher: str
    encoder: FitEncoder | None = None  # a fitted basis's (--support hidden:fit)

    def arrays(self, rows: PackedRows, first_row: int) -> dict[str, np.ndarray]:
        check_ids(rows.blocks, self.sel.vocab_size, self.teacher)
        index = np.arange(first_row, first_row + len(rows.blocks), dtype=np.int64)
        with capturing_layers(self.model, self.sel) as captured:  # the support's own forwards, layers kept too
            arrays = shard_compute(self.sel, self.encoder)(self.model, rows.blocks, rows.lengths, index, self.sel,
                                             self.request.batch_size, self.device, self.precision,
                                             shard_text(rows, self.sel))
        if captured is not None:
            arrays.update(captured.arrays(rows.lengths))
        return arrays


def teacher_line(model: Teacher) -> str:
    """The teacher's dtype and memory, for the progress bar."""
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return f"teacher {dtype} {model.get_memory_footprint() / 2**30:.2f} GiB"


def write_stream(writer: StoreWriter, out: str, corpus: CorpusSource, tokenizer: Tokenizer, run: ShardRun,
                 progress: bool, log: Callable[[str], Any], sink: Any = None) -> dict:
    """Stream the corpus into the store's pending shards (`sink` computes and writes each: this process's
    LocalShards, or a cluster's), then finalize it with the corpus's fingerprint."""
    request, shard_rows = run.request, writer.metadata.layout.shard_rows
    stream = StreamedShards(writer, out, corpus, log)
    consumed = stream.first * shard_rows * request.block_size
    started, tokens = time.perf_counter(), []
    bar = tqdm(total=request.max_tokens, initial=min(consumed, request.max_tokens or consumed), unit="tok",
               unit_scale=True, desc="dump clm", disable=not progress or None)
    bar.set_postfix_str(teacher_line(run.model))

    def update(rows: PackedRows) -> None:
        tokens.append(int(rows.lengths.sum()))
        bar.update(tokens[-1])

    shards = _packed(corpus, tokenizer, request, run.sel, shard_rows, stream.cursors, stream.first)
    try:
        stream.run(shards, sink or LocalShards(writer, run.arrays, run.device), lambda rows: len(rows.blocks),
                   update, "holds no text")
    finally:
        bar.close()
    meta = stream.finalize()
    log(f"wrote {stream.written} shards ({sum(tokens)} tokens, support {run.sel.described}) in "
        f"{time.perf_counter() - started:.1f}s to {out}")
    return meta


def _packed(corpus: CorpusSource, tokenizer: Tokenizer, request: ClmRequest, sel: ClmSelection, shard_rows: int,
            cursors: ShardCursors, first: int) -> Iterator[PackedRows]:
    """The rows of shard `first` on, read from where it starts in the corpus (the end the shard before it
    recorded), tokenized and packed by a thread a shard ahead of the teacher (with each block's text when the
    store keeps it)."""
    start, skip = cursors.resume_point(first)
    documents = corpus.documents(start)
    if request.max_documents is not None:  # those before the resume point were counted shard by shard
        documents = islice(documents, request.max_documents - cursors.documents_before(first) + bool(skip))
    consumed = first * shard_rows * request.block_size
    budget = None if request.max_tokens is None else request.max_tokens - consumed
    stream = tokenized(documents, tokenizer, text=sel.text_bytes is not None)
    return ahead(pack_stream(stream, request.block_size, sel.eos_id, shard_rows, budget, skip))
