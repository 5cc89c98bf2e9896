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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from hskstore import __version__
from hskstore.format.clm import (
    ACTUAL,
    CLM,
    TEXT,
    TOKEN_BYTES,
    ClmSelection,
    Support,
    actual_logprobs,
    block_hashes,
    encode_support,
    kept_positions,
    pack_blocks,
    pack_token_bytes,
    text_array,
    token_ends,
)
from hskstore.format.config import ConfigError
from hskstore.format.meta import DataRef, Layout, StoreMeta, TaskRef, TeacherRef, TokenizerRef
from hskstore.io.writer import StoreWriter, writing
from pipelines.core.data import Examples
from pipelines.core.models import (
    ModelLoadError,
    load_tokenizer,
    model_revision,
    resolve_model,
    vocab_hash,
    weights_hash,
)
from pipelines.core.precision import FP32, forward_precision, resolve_forward
from pipelines.dump.pipeline import ShardWrites, default_write_depth, overlaps_forward
from pipelines.dump.stage import compute_record

CLM_TEACHER_KEYS = ("name", "revision", "weights_hash", "architecture", "model_type", "num_layers", "hidden_size",
                    "vocab_size", "precision")
CLM_TOKENIZER_KEYS = ("name", "vocab_hash", "vocab_size", "pad_id")


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

    def check(self) -> None:
        for name, value in (("--block-size", self.block_size), ("--batch-size", self.batch_size),
                            ("--shard-rows", self.shard_rows)):
            if not 1 <= value <= 1 << 20:
                raise ConfigError(f"{name} {value}: pass a whole number from 1 to {1 << 20}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigError(f"--limit-tokens {self.max_tokens}: pass a positive number of tokens")


def load_clm_teacher(teacher: str, device: str) -> Any:
    """Any AutoModelForCausalLM (GPT-2, Llama, Qwen2, SmolLM2, ...), in float32, in eval mode."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(resolve_model(teacher), dtype=torch.float32)
    except Exception as exc:  # transformers raises many kinds; say what to pass instead
        raise ModelLoadError(f"cannot load a causal-LM teacher from {teacher} ({str(exc).splitlines()[0][:200]}): "
                             "pass a folder or hub id of an AutoModelForCausalLM (GPT-2, Llama, Qwen2, ...)") from None
    return model.to(device).eval()


def eos_of(tokenizer: Any, teacher: str) -> int:
    if tokenizer.eos_token_id is None:
        from pipelines.core.models import load_config

        saved_as = getattr(load_config(teacher), "architectures", None) or []
        if saved_as and not any(str(a).endswith(("ForCausalLM", "LMHeadModel")) for a in saved_as):
            raise ModelLoadError(f"{teacher} is a {saved_as[0]}, not a causal LM: pass an AutoModelForCausalLM "
                                 "teacher (e.g. smollm2) to --objective clm")
        raise ModelLoadError(f"the tokenizer of {teacher} has no EOS token, which separates the corpus's documents")
    return int(tokenizer.eos_token_id)


def tokenize_corpus(tokenizer: Any, texts: list[str], block_size: int, eos_id: int,
                    max_tokens: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(blocks, lengths) of a list of documents: each tokenized without special tokens, then packed."""
    documents = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return pack_blocks(documents, block_size, eos_id, max_tokens)


@dataclass(frozen=True)
class CorpusBlocks:
    """The corpus packed into blocks, with each block's text and its tokens' byte lengths (None: a slow
    tokenizer gives no offsets, and the store keeps no text arrays)."""

    blocks: np.ndarray
    lengths: np.ndarray
    token_bytes: np.ndarray | None = None
    texts: list[bytes] | None = None

    @property
    def text_bytes(self) -> int | None:
        return None if self.texts is None else max([len(t) for t in self.texts] + [1])


def tokenize_corpus_text(tokenizer: Any, texts: list[str], block_size: int, eos_id: int,
                         max_tokens: int | None = None) -> CorpusBlocks:
    """As tokenize_corpus, and (a fast tokenizer) where each token ends in the text: char offsets -> bytes."""
    if not getattr(tokenizer, "is_fast", False):
        return CorpusBlocks(*tokenize_corpus(tokenizer, texts, block_size, eos_id, max_tokens))
    encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    blocks, lengths = pack_blocks(encoded["input_ids"], block_size, eos_id, max_tokens)
    ends = [token_ends(offsets, text) for offsets, text in zip(encoded["offset_mapping"], texts, strict=True)]
    token_bytes, block_text = pack_token_bytes(ends, texts, block_size, max_tokens)
    return CorpusBlocks(blocks, lengths, token_bytes, block_text)


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
def teacher_support(model: Any, input_ids: torch.Tensor, rows: np.ndarray, sel: ClmSelection,
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


def support_of(logits: torch.Tensor, rows: np.ndarray, sel: Any) -> tuple[torch.Tensor, torch.Tensor,
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


def compute_clm_shard(model: Any, blocks: np.ndarray, lengths: np.ndarray, rows: np.ndarray, sel: ClmSelection,
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


def lm_teacher_ref(teacher: str, model: Any, precision: str) -> TeacherRef:
    """An LM teacher's provenance (causal-LM and seq2seq stores): where it was found, its weights and shape."""
    cfg = model.config
    return TeacherRef(
        teacher, revision=model_revision(teacher), weights_hash=weights_hash(model),
        architecture=type(model).__name__, model_type=cfg.model_type, num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size, precision=None if precision == FP32 else precision,
        # the precision recorded only when not fp32, as task stores record it
        written=CLM_TEACHER_KEYS if precision != FP32 else CLM_TEACHER_KEYS[:-1],
    )


def lm_tokenizer_ref(teacher: str, tokenizer: Any, pad_id: int) -> TokenizerRef:
    return TokenizerRef(teacher, vocab_hash=vocab_hash(tokenizer), vocab_size=len(tokenizer), pad_id=pad_id,
                        written=CLM_TOKENIZER_KEYS)


def clm_metadata(corpus: Examples, teacher: str, model: Any, tokenizer: Any, sel: ClmSelection, n_blocks: int,
                 shard_rows: int, precision: str) -> dict:
    return StoreMeta(
        objective=CLM,
        task=TaskRef(CLM, "train"),
        dataset=DataRef(corpus.source, corpus.fingerprint, len(corpus)),
        teacher=lm_teacher_ref(teacher, model, precision),
        tokenizer=lm_tokenizer_ref(teacher, tokenizer, sel.eos_id),
        max_length=sel.block_size,
        selection=sel.to_dict(),
        layout=Layout.of(n_blocks, sel.slots, shard_rows),
    ).to_dict()


def dump_clm(teacher: str, out: str, corpus: Examples, request: ClmRequest, *, device: str = "cpu",
             overwrite: bool = False, progress: bool = True, log: Callable[[str], Any] = print,
             extra_meta: dict | None = None) -> dict:
    """Write (or finish) the causal-LM store at `out`; returns its metadata."""
    request.check()
    precision = resolve_forward(request.precision, device)
    tokenizer = load_tokenizer(teacher)
    eos = eos_of(tokenizer, teacher)
    model = load_clm_teacher(teacher, device)
    vocab = model.config.vocab_size
    packed = tokenize_corpus_text(tokenizer, list(corpus.texts[0]), request.block_size, eos, request.max_tokens)
    blocks = packed.blocks
    sel = ClmSelection.make(request.support, vocab_size=vocab, block_size=request.block_size, eos_id=eos,
                            logprob_codec=request.logprob_codec, positions=request.positions,
                            sample_seed=request.sample_seed, limit_tokens=request.max_tokens,
                            text_bytes=packed.text_bytes)
    if int(blocks.max(initial=0)) >= vocab:
        raise ModelLoadError(f"the tokenizer of {teacher} gives ids up to {int(blocks.max())} but the model's "
                             f"vocabulary has {vocab}: pass a teacher saved with its own tokenizer")
    meta = clm_metadata(corpus, teacher, model, tokenizer, sel, len(blocks), request.shard_rows, precision)
    # the float bits depend on the device, batch and threads: a resume must compute as the first run did
    meta = StoreMeta.parse({**meta, **(extra_meta or {}), "compute": compute_record(request.batch_size, device)})
    with writing(out, meta, overwrite=overwrite, software_version=__version__, log=log) as writer:
        if writer.complete:
            log(f"{out} is already complete, nothing to do")
            return writer.meta
        return _write_shards(writer, out, model, packed, sel, request, device, precision, progress, log)


def _shard_text(packed: CorpusBlocks, sel: ClmSelection, start: int, stop: int) -> tuple[np.ndarray, np.ndarray] | None:
    if packed.texts is None:
        return None
    return packed.token_bytes[start:stop], text_array(packed.texts[start:stop], sel.text_bytes)


def _write_shards(writer: StoreWriter, out: str, model: Any, packed: CorpusBlocks, sel: ClmSelection,
                  request: ClmRequest, device: str, precision: str, progress: bool, log: Callable[[str], Any]) -> dict:
    blocks, lengths = packed.blocks, packed.lengths
    pending = writer.pending_shards()
    if len(pending) < writer.n_shards:
        log(f"resuming {out}: {writer.n_shards - len(pending)}/{writer.n_shards} shards already written")
    started = time.perf_counter()
    # Off the CPU, shards are compressed and written by threads while the teacher computes the next one (on a
    # CPU the forward already has every core: pipelines.dump.pipeline says why they take turns there)
    writes = ShardWrites(writer, default_write_depth(device)) if overlaps_forward(device) else None
    try:
        for shard in tqdm(pending, unit="shard", desc="dump clm", disable=not progress or None):
            start, stop = writer.shard_bounds(shard)
            rows = np.arange(start, stop, dtype=np.int64)
            arrays = compute_clm_shard(model, blocks[start:stop], lengths[start:stop], rows, sel, request.batch_size,
                                       device, precision, _shard_text(packed, sel, start, stop))
            if writes:
                writes.submit(shard, arrays, {})
            else:
                writer.write_shard(shard, arrays)
        if writes:
            writes.drain()
    finally:
        if writes:
            writes.close()
    meta = writer.finalize().to_dict()
    tokens = int(lengths.sum())
    log(f"wrote {len(pending)} shards ({tokens} tokens, support {sel.described}) in "
        f"{time.perf_counter() - started:.1f}s to {out}")
    return meta
