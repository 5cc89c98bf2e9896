"""The causal-LM store kind (`objective: clm`): a corpus packed into blocks and, per position, the teacher's
next-token distribution on a sparse support (docs/STORE_FORMAT.md, "Causal-LM stores").

Rows are blocks of `block_size` tokens: documents tokenized, each followed by EOS, concatenated and cut
into blocks as LM training packs them (the last block padded with EOS, its real tokens in `length`).
Position t of a row holds the teacher's distribution over token t+1 at temperature 1, on one of two
supports:

- `topk`: the K most probable ids, by descending probability, and their normalized log-probs through a
  value codec (hskstore.codecs: float16, int8, int4, ...); the mass outside them, the tail, is
  1 - sum(exp(log-probs)), so nothing else is stored for it.
- `sample`: `draws` ids drawn from the teacher's distribution (RS-KD), kept as the distinct ids in
  increasing order with their counts; counts / draws is an unbiased estimate of the distribution.

Ids are bit-packed at ceil(log2 V) bits (`pack_ids`). `clm/kept` marks the positions that carry a support
(all real positions, or the fraction with the highest teacher entropy); the others hold zeros. Pure numpy:
the dump (pipelines/dump/clm.py) and the readers share these functions.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from .. import codecs
from . import kinds
from .clm_layers import (
    LAYER_DESCRIBED,
    LAYERS_SECTION,
    LayerStates,
    layer_checks,
    layer_dims,
    layer_specs,
    layers_problem,
)
from .config import ConfigError
from .domain import (
    MAX_VOCAB,
    MAX_WIDTH,
    Arrays,
    Breach,
    DomainCheck,
    first_problem,
    ids_below,
    int_within,
    is_int,
    lengths_within,
)
from .hidden_fit import FIT_CODEC, FIT_ENCODER, FIT_MEAN, FitEncoder, FitRecord, fit_problem
from .schema import INTEGRITY, ROWS, SPEC_DOC, ArraySpec, ids_dtype

CLM = "clm"
GROUP = "clm"
ROW_ARRAYS = ("row", "text_hash", "input_ids", "length")
SUPPORTS = ("topk", "sample", "hidden")
HIDDEN = "hidden"  # the support that keeps the teacher's final hidden state (and its head once per store)
HEAD, HEAD_BIAS = f"{GROUP}/head", f"{GROUP}/head_bias"  # a hidden store's head: not row arrays
HIDDEN_FIELDS = ("hidden_size", "hidden_codec", "rotation_seed", "head_sha256", "head_bias", "logit_softcap",
                 "reconstruction_kl", "reconstruction_top1", "reconstruction_tokens", "reconstruction_reference",
                 "hidden_fit")
# `hidden:NAME` that fits a basis to the teacher (hskstore.format.hidden_fit) -> the value codec of its indices
FITTED_BASES = {"fit": FIT_CODEC}
MAX_DRAWS = 255  # counts are one byte
_SECTION = SPEC_DOC + "#causal-lm-stores-objective-clm"
_UNIT = ("per position t: the teacher's distribution over token t+1 at temperature 1, on the support; "
         "positions outside clm/kept hold zeros")


@dataclass(frozen=True)
class Support:
    """What a position keeps: the top `k` ids and log-probs, the ids of `draws` samples with counts, or the
    teacher's final hidden state through a value codec (`hidden:CODEC`, size 0)."""

    kind: str  # "topk" | "sample" | "hidden"
    size: int  # k, or draws (0: hidden)
    codec: str | None = None  # hidden: the value codec of the hidden state
    basis: str | None = None  # hidden: a fitted basis (FITTED_BASES) before the codec; None: the rotation alone

    @classmethod
    def parse(cls, text: str) -> Support:
        """`topk:K`, `sample:N` or `hidden[:CODEC]` (a one-line ConfigError naming the value otherwise)."""
        kind, _, number = str(text).strip().partition(":")
        if kind == HIDDEN:
            return cls._hidden(text, number or codecs.FULL)
        if kind not in SUPPORTS or not (number.isascii() and number.isdigit()) or int(number) < 1:
            raise ConfigError(f"--support {text!r}: pass topk:K (the K most probable ids, K >= 1) or sample:N "
                              f"(N draws from the teacher, 1 <= N <= {MAX_DRAWS})")
        if kind == "sample" and int(number) > MAX_DRAWS:
            raise ConfigError(f"--support {text!r}: at most {MAX_DRAWS} draws (counts are stored in one byte)")
        return cls(kind, int(number))

    @classmethod
    def _hidden(cls, text: str, codec: str) -> Support:
        if codec in FITTED_BASES:
            return cls(HIDDEN, 0, FITTED_BASES[codec], codec)
        if codec not in codecs.choices():
            raise ConfigError(f"--support {text!r}: hidden:CODEC takes a value codec ({', '.join(codecs.choices())}) "
                              f"or a fitted basis ({', '.join(FITTED_BASES)})")
        return cls(HIDDEN, 0, codec)

    def __str__(self) -> str:
        return f"{self.kind}:{(self.basis or self.codec) if self.kind == HIDDEN else self.size}"

    @property
    def slots(self) -> int:
        """Ids stored per position: k, or draws (distinct ids never outnumber the draws)."""
        return self.size


@dataclass(frozen=True)
class ClmSelection:
    """A causal-LM store's `selection`: the support, its codec, the blocks and which positions are kept."""

    support: str  # "topk" | "sample"
    k: int | None  # topk: ids per position
    draws: int | None  # sample: draws per position
    slots: int  # ids stored per position
    logprob_codec: str | None  # topk: the value codec of the log-probs
    id_bits: int  # bits per stored id: ceil(log2 vocab)
    vocab_size: int
    block_size: int
    eos_id: int
    positions: float  # the fraction of real positions kept (1.0: all)
    positions_by: str  # how a fraction is chosen: "entropy" (the teacher's, highest first)
    sample_seed: int | None  # sample: draws of row r come from a generator seeded (sample_seed, r)
    temperature: float = 1.0
    unit: str = _UNIT
    limit_tokens: int | None = None  # `--limit-tokens`: the stream was cut after this many tokens (None: not cut)
    # bytes per block of clm/text (the widest block's text); None: a store written before the text arrays
    text_bytes: int | None = None
    # hidden: the final hidden state's width and codec, the rotation's seed (None: not rotated), the stored
    # head's digest and shape, and the reconstruction measured at dump time (HIDDEN_FIELDS; absent otherwise)
    hidden_size: int | None = None
    hidden_codec: str | None = None
    rotation_seed: int | None = None
    head_sha256: str | None = None
    head_bias: bool = False
    logit_softcap: float | None = None
    reconstruction_kl: float | None = None
    reconstruction_top1: float | None = None
    reconstruction_tokens: int | None = None
    reconstruction_reference: str | None = None  # "teacher", or "source store" for a derived codec
    # hidden:fit: the fitted basis's record (hskstore.format.hidden_fit; None: not fitted, and no hidden_fit key)
    hidden_fit: FitRecord | None = None
    # `--hidden-layers`: the teacher's intermediate hidden states kept beside the support (hskstore.format.clm_layers;
    # None: none, and the record has no layer_states key)
    layer_states: LayerStates | None = None

    @classmethod
    def make(cls, support: Support, *, vocab_size: int, block_size: int, eos_id: int, logprob_codec: str = "float16",
             positions: float = 1.0, sample_seed: int = 0, limit_tokens: int | None = None,
             text_bytes: int | None = None) -> ClmSelection:
        check_positions(positions)
        if support.kind == HIDDEN:
            raise ConfigError("a hidden support is made with ClmSelection.hidden (it needs the teacher's width)")
        topk = support.kind == "topk"
        if topk and not 1 <= support.size <= vocab_size:
            raise ConfigError(f"--support {support}: K must be in 1..{vocab_size} (the teacher's vocabulary)")
        if topk:
            codecs.chosen(logprob_codec, "--logprobs")  # an unknown codec is refused before anything runs
        return cls(support.kind, support.size if topk else None, None if topk else support.size, support.slots,
                   logprob_codec if topk else None, id_bits(vocab_size), vocab_size, block_size, eos_id,
                   float(positions), "entropy", None if topk else sample_seed, limit_tokens=limit_tokens,
                   text_bytes=text_bytes)

    @classmethod
    def hidden(cls, codec: str, *, hidden_size: int, vocab_size: int, block_size: int, eos_id: int,
               rotation_seed: int | None, head_sha256: str, head_bias: bool, logit_softcap: float | None,
               positions: float = 1.0, limit_tokens: int | None = None) -> ClmSelection:
        """The selection of a hidden-state store (the teacher's width, its head's digest and shape known)."""
        check_positions(positions)
        codecs.get(codec)
        return cls(HIDDEN, None, None, hidden_size, None, id_bits(vocab_size), vocab_size, block_size, eos_id,
                   float(positions), "entropy", None, limit_tokens=limit_tokens, hidden_size=hidden_size,
                   hidden_codec=codec,
                   rotation_seed=rotation_seed, head_sha256=head_sha256, head_bias=head_bias,
                   logit_softcap=logit_softcap)

    def fitted(self, record: FitRecord, head_sha256: str) -> ClmSelection:
        """With a fitted basis: its indices in FIT_CODEC, the head and bias that fold it (head_sha256)."""
        return replace(self, hidden_codec=FIT_CODEC, hidden_fit=record, head_sha256=head_sha256, head_bias=True)

    def measured(self, kl: float, top1: float, tokens: int, reference: str) -> ClmSelection:
        """With the reconstruction's mean KL(reference || stored) per token and top-1 agreement recorded."""
        return replace(self, reconstruction_kl=round(float(kl), 8), reconstruction_top1=round(float(top1), 6),
                       reconstruction_tokens=int(tokens), reconstruction_reference=reference)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ClmSelection:
        sel = cls(**{key: d[key] for key in cls.__dataclass_fields__ if key in d})
        if isinstance(sel.layer_states, Mapping):
            sel = replace(sel, layer_states=LayerStates.from_dict(sel.layer_states))
        if isinstance(sel.hidden_fit, Mapping):
            sel = replace(sel, hidden_fit=FitRecord.from_dict(sel.hidden_fit))
        problem = first_problem((vocabulary_problem(sel.vocab_size, sel.id_bits),
                                 int_within("block_size", sel.block_size, 1, MAX_WIDTH),
                                 int_within("eos_id", sel.eos_id, 0, sel.vocab_size - 1),
                                 support_problem(sel), fraction_problem("positions", sel.positions),
                                 positive_problem("temperature", sel.temperature),
                                 None if sel.layer_states is None or isinstance(sel.layer_states, LayerStates) else
                                 "layer_states is not a mapping",
                                 layers_problem(sel.layer_states, sel.block_size)))
        if problem:
            raise ValueError(f"selection.{problem}")
        return sel

    def to_dict(self) -> dict:
        out = asdict(self)
        if self.layer_states is None:  # a store without intermediate layers records none
            out.pop("layer_states")
        else:
            out["layer_states"]["layers"] = list(self.layer_states.layers)
        if self.support != HIDDEN:  # the other supports' records stay as they were written
            for key in HIDDEN_FIELDS:
                out.pop(key)
        elif self.hidden_fit is None:  # nor do the hidden stores' written before fitted bases
            out.pop("hidden_fit")
        return out

    @property
    def described(self) -> Support:
        if self.support == HIDDEN:
            basis = next((name for name, codec in FITTED_BASES.items() if codec == self.hidden_codec), None)
            return Support(HIDDEN, 0, self.hidden_codec, basis if self.hidden_fit is not None else None)
        return Support(self.support, self.k if self.support == "topk" else self.draws)

    def label(self) -> tuple[str, str | None]:
        """(config, codec): how a catalog and the card's title name this selection."""
        return str(self.described), self.logprob_codec or self.hidden_codec

    def kept(self) -> str:
        """What the store keeps, in one clause (the card, croissant's rai:dataPreprocessingProtocol)."""
        if self.layer_states is not None:
            return f"{self._kept()}; and the {self.layer_states.described()}"
        return self._kept()

    def _kept(self) -> str:
        if self.support == HIDDEN:
            how = "rotated" if self.hidden_fit is None else f"rotated, indices in a {self.hidden_fit.described()}"
            return (f"the teacher's final hidden state per position ({self.hidden_codec}, {how}) and its LM head "
                    "once per store: the full next-token distribution")
        if self.support == "topk":
            return (f"top-{self.k} next-token ids and log-probs ({self.logprob_codec}) per position, the tail mass "
                    "recoverable")
        return f"{self.draws} ids drawn from the teacher per position (RS-KD), distinct ids and counts"

    @property
    def id_bytes(self) -> int:
        return math.ceil(self.slots * self.id_bits / 8)

    def derived(self, support: Support, logprob_codec: str | None) -> ClmSelection:
        """The selection of a store derived from this one (a smaller K, fewer draws, another codec)."""
        if self.support == HIDDEN or support.kind == HIDDEN:
            return self._derived_hidden(support, logprob_codec)
        if support.kind != self.support or support.size > self.slots:
            raise ConfigError(f"--support {support}: a store of support {self.described} gives {self.support}:N "
                              f"with N <= {self.slots} only (derive keeps a subset; the teacher is not run)")
        if support.kind == "topk":
            return replace(self, k=support.size, slots=support.size, logprob_codec=logprob_codec or self.logprob_codec)
        if logprob_codec:
            raise ConfigError("--logprobs: a sampled store holds counts, not log-probs")
        return replace(self, draws=support.size, slots=support.size)

    def _derived_hidden(self, support: Support, logprob_codec: str | None) -> ClmSelection:
        if support.kind != self.support:
            raise ConfigError(f"--support {support}: a store of support {self.described} gives "
                              f"{self.support}:CODEC only (derive keeps a subset; the teacher is not run)")
        if logprob_codec:
            raise ConfigError("--logprobs: a hidden-state store holds hidden states; name the codec as "
                              "--support hidden:CODEC")
        if self.hidden_fit is not None:
            raise ConfigError(f"--support {support}: a store of support {self.described} holds indices in its "
                              "fitted basis, which give no other codec; derive from the float16 store it came from")
        if support.basis is not None and self.hidden_codec != codecs.FULL:
            raise ConfigError(f"--support {support}: a basis is fitted to float16 states, and this store's are "
                              f"{self.hidden_codec}; derive from a float16 store (`--support hidden:float16`)")
        if not codecs.can_convert(self.hidden_codec, support.codec):
            raise ConfigError(f"--support {support}: {support.codec} cannot be made from {self.hidden_codec} "
                              f"(precision only goes down: {support.codec} is quantised through "
                              f"{' <- '.join(codecs.get(support.codec).chain())})")
        return replace(self, hidden_codec=support.codec, reconstruction_kl=None, reconstruction_top1=None,
                       reconstruction_tokens=None, reconstruction_reference=None)


def vocabulary_problem(vocab_size: object, bits: object) -> str | None:
    """A selection's vocabulary size and id bits out of their domain (None: in it)."""
    wanted = id_bits(vocab_size) if is_int(vocab_size) else None
    return int_within("vocab_size", vocab_size, 1, MAX_VOCAB) or (
        None if bits == wanted else f"id_bits {bits!r} is not ceil(log2 vocab_size) = {wanted}")


def support_problem(sel: Any) -> str | None:
    """A selection's support fields out of their domain or contradicting each other (None: none). `sel` is a
    causal-LM or seq2seq selection with a support."""
    if sel.support not in SUPPORTS:
        return f"support {sel.support!r} is not one of {', '.join(SUPPORTS)}"
    if sel.support == HIDDEN:
        return _hidden_problem(sel)
    if sel.support == "topk":
        return first_problem((int_within("k", sel.k, 1, sel.vocab_size),
                              None if sel.slots == sel.k else f"slots {sel.slots!r} is not k {sel.k!r}",
                              None if isinstance(sel.logprob_codec, str) else
                              f"logprob_codec {sel.logprob_codec!r} is not a codec name"))
    return first_problem((int_within("draws", sel.draws, 1, MAX_DRAWS),
                          None if sel.slots == sel.draws else f"slots {sel.slots!r} is not draws {sel.draws!r}",
                          None if sel.sample_seed is None or is_int(sel.sample_seed) else
                          f"sample_seed {sel.sample_seed!r} is not an integer"))


def _hidden_problem(sel: Any) -> str | None:
    """A hidden-state selection's fields out of their domain (None: none)."""
    width = getattr(sel, "hidden_size", None)
    return first_problem((int_within("hidden_size", width, 1, MAX_WIDTH),
                          None if sel.slots == width else f"slots {sel.slots!r} is not hidden_size {width!r}",
                          None if isinstance(getattr(sel, "hidden_codec", None), str) else
                          f"hidden_codec {getattr(sel, 'hidden_codec', None)!r} is not a codec name",
                          None if isinstance(getattr(sel, "head_sha256", None), str) else
                          "head_sha256 is not a digest",
                          fit_problem(getattr(sel, "hidden_fit", None), width)))


def fraction_problem(field: str, value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:  # NaN fails 0 < value
        return f"{field} {value!r} is not a fraction in (0, 1]"
    return None


def positive_problem(field: str, value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        return f"{field} {value!r} is not a positive finite number"
    return None


def check_positions(fraction: float) -> None:
    if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
        raise ConfigError(f"--positions {fraction!r}: pass the fraction of positions to keep, in (0, 1]")


def id_bits(vocab_size: int) -> int:
    """Bits per stored id: enough for every id below vocab_size (at least 1)."""
    return max(1, math.ceil(math.log2(max(vocab_size, 2))))


_BYTE_IDS = {8: "<u1", 16: "<u2", 32: "<u4"}  # widths whose packing is the ids' own little-endian bytes


def pack_ids(ids: np.ndarray, bits: int) -> np.ndarray:
    """ids [..., S] (each < 2**bits) -> uint8 [..., ceil(S * bits / 8)]: each id's bits least significant first,
    ids in slot order, bytes filled from their least significant bit (numpy packbits, bitorder little)."""
    if bits in _BYTE_IDS:  # the same bits, as the ids' little-endian bytes
        return np.ascontiguousarray(ids.astype(_BYTE_IDS[bits])).view(np.uint8)
    # each id shifted into the bytes its bits fall in (ids' bits never overlap, so OR places them): a few array
    # operations per slot, not a bit plane per bit of every id
    slots = ids.shape[-1]
    columns = np.ascontiguousarray(ids.reshape(-1, slots).T, dtype=np.uint64)
    out = np.zeros((-(-slots * bits // 8), columns.shape[1]), dtype=np.uint8)
    for j in range(slots):
        first, shift = divmod(j * bits, 8)
        value = columns[j] << np.uint64(shift)
        for k in range((shift + bits + 7) // 8):
            out[first + k] |= (value >> np.uint64(8 * k)).astype(np.uint8)
    return np.ascontiguousarray(out.T).reshape(*ids.shape[:-1], len(out))


def unpack_ids(packed: np.ndarray, bits: int, slots: int) -> np.ndarray:
    """The inverse of pack_ids: int64 [..., slots]."""
    if bits in _BYTE_IDS:
        return np.ascontiguousarray(packed).view(_BYTE_IDS[bits]).astype(np.int64)
    planes = np.unpackbits(packed, axis=-1, count=slots * bits, bitorder="little")
    planes = planes.reshape(*packed.shape[:-1], slots, bits)
    whole = np.zeros((*planes.shape[:-1], 32), dtype=np.uint8)
    whole[..., :bits] = planes
    return np.packbits(whole, axis=-1, bitorder="little").view("<u4")[..., 0].astype(np.int64)


def block_hashes(input_ids: np.ndarray) -> np.ndarray:
    """uint64 per row: the first 8 bytes (little-endian) of BLAKE2b-512 over the row's ids as int32 little-endian."""
    rows = np.ascontiguousarray(input_ids.astype("<i4"))
    digests = b"".join(hashlib.blake2b(row.tobytes()).digest()[:8] for row in rows)
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


def pack_blocks(documents: list[list[int]], block_size: int, eos_id: int,
                max_tokens: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(blocks [n, block_size] int64, lengths [n]): each document then EOS, concatenated, cut into blocks; the
    last block padded with EOS (its length says how many tokens are real). `max_tokens` cuts the stream."""
    stream = np.fromiter((t for doc in documents for t in (*doc, eos_id)), dtype=np.int64)
    if max_tokens is not None:
        stream = stream[:max_tokens]
    n = -(-len(stream) // block_size)
    blocks = np.full((n, block_size), eos_id, dtype=np.int64)
    blocks.reshape(-1)[: len(stream)] = stream
    lengths = np.full(n, block_size, dtype=np.int32)
    if n and len(stream) % block_size:
        lengths[-1] = len(stream) % block_size
    return blocks, lengths


@dataclass(frozen=True)
class DocumentText:
    """A document's UTF-8 bytes and how many of them each of its tokens owns (its ids then its EOS; `owned_bytes`):
    what a streamed dump packs beside the ids to keep each block's text (`clm/text`, `clm/token_bytes`)."""

    owned: np.ndarray  # [tokens + 1] int64, summing to len(data)
    data: bytes


@dataclass(frozen=True)
class PackedRows:
    """Consecutive rows of a packed stream (`pack_stream`): blocks, lengths, and where they start and end in the
    stream of documents: the mark of the document holding the first (next) token and how many of its tokens (its
    ids then EOS) earlier rows hold; `marks` are those of the documents whose first token is in these rows. With
    documents' text, each block's token byte lengths and its text (else None)."""

    blocks: np.ndarray  # [n, block_size] int64
    lengths: np.ndarray  # [n] int32
    start: Any
    start_skip: int
    end: Any
    end_skip: int
    marks: list
    last: bool  # no rows follow
    token_bytes: np.ndarray | None = None  # [n, block_size] uint16
    texts: list[bytes] | None = None


@dataclass(frozen=True)
class _Piece:
    """Tokens held by pack_stream, with the bytes each owns and those bytes (None: no text)."""

    tokens: np.ndarray
    owned: np.ndarray | None = None
    data: bytes | None = None

    def part(self, lo: int, hi: int | None = None) -> _Piece:
        if self.owned is None:
            return _Piece(self.tokens[lo:hi])
        owned = self.owned[lo:hi]
        first = int(self.owned[:lo].sum())
        return _Piece(self.tokens[lo:hi], owned, self.data[first:first + int(owned.sum())])

    @staticmethod
    def joined(pieces: list[_Piece]) -> _Piece:
        if pieces[0].owned is None:
            return _Piece(np.concatenate([p.tokens for p in pieces]))
        return _Piece(np.concatenate([p.tokens for p in pieces]), np.concatenate([p.owned for p in pieces]),
                      b"".join(p.data for p in pieces))


def _document(ids: Sequence[int], eos_id: int, text: list) -> _Piece:
    doc = np.empty(len(ids) + 1, dtype=np.int64)
    doc[:-1] = ids
    doc[-1] = eos_id
    return _Piece(doc, text[0].owned, text[0].data) if text else _Piece(doc)


def pack_stream(documents: Iterable[tuple], block_size: int, eos_id: int, rows: int,
                max_tokens: int | None = None, skip: int = 0) -> Iterator[PackedRows]:
    """pack_blocks over a stream of (ids, mark) documents, `rows` blocks at a time, holding no more than one
    document beyond them: the same blocks for the same documents. The first document's first `skip` tokens (its
    ids then EOS) are dropped: earlier rows hold them (a resumed stream). Documents given as (ids, mark,
    DocumentText) also give each block's text and its tokens' byte lengths (pack_token_bytes' bytes)."""
    chunk = rows * block_size
    budget = max_tokens if max_tokens is not None else -1
    held: list[_Piece] = []
    size, starts = 0, []  # starts: (offset in held tokens, mark, tokens of that document before it)
    out = None
    for ids, mark, *text in documents:
        doc = _document(ids, eos_id, text)
        starts_at, skip = skip, 0
        if budget >= 0:
            doc = doc.part(starts_at, starts_at + budget)
            budget -= len(doc.tokens)
        elif starts_at:
            doc = doc.part(starts_at)
        if len(doc.tokens):
            starts.append((size, mark, starts_at))
            held.append(doc)
            size += len(doc.tokens)
        while size >= chunk:
            whole = _Piece.joined(held)
            if out is not None:
                yield out
            out = _rows(whole.part(0, chunk), starts, chunk, block_size, eos_id)
            held, size = [whole.part(chunk)], size - chunk
            starts = _after(starts, chunk)
        if budget == 0:
            break
    if size:
        if out is not None:
            yield out
        out = _rows(_Piece.joined(held), starts, size, block_size, eos_id)
    if out is not None:
        yield replace(out, last=True)


def _rows(piece: _Piece, starts: list, cut: int, block_size: int, eos_id: int) -> PackedRows:
    tokens = piece.tokens
    n = -(-len(tokens) // block_size)
    blocks = np.full((n, block_size), eos_id, dtype=np.int64)
    blocks.reshape(-1)[: len(tokens)] = tokens
    lengths = np.full(n, block_size, dtype=np.int32)
    if len(tokens) % block_size:
        lengths[-1] = len(tokens) % block_size
    _, end, end_skip = _after(starts, cut)[0]
    marks = [mark for offset, mark, before in starts if offset < cut and before == 0]
    token_bytes, texts = _block_text(piece, n, block_size) if piece.owned is not None else (None, None)
    return PackedRows(blocks, lengths, starts[0][1], starts[0][2], end, end_skip, marks, False, token_bytes, texts)


def _block_text(piece: _Piece, n: int, block_size: int) -> tuple[np.ndarray, list[bytes]]:
    """Each block's tokens' byte lengths and its text: the bytes its tokens own, in order."""
    token_bytes = np.zeros((n, block_size), dtype=np.uint16)
    token_bytes.reshape(-1)[: len(piece.owned)] = piece.owned
    cut = np.concatenate([[0], np.cumsum(token_bytes.sum(1, dtype=np.int64))])
    return token_bytes, [piece.data[cut[i]:cut[i + 1]] for i in range(n)]


def _after(starts: list, cut: int) -> list:
    """The document starts of the held tokens from `cut` on: first the document holding token `cut` (or, when
    a document ends there, the one that ended, all its tokens counted), with the tokens it had before `cut`."""
    i = max(j for j, (offset, _, _) in enumerate(starts) if offset <= cut)
    offset, mark, before = starts[i]
    if offset == cut:
        return [(o - cut, m, b) for o, m, b in starts[i:]]
    return [(0, mark, before + cut - offset), *((o - cut, m, b) for o, m, b in starts[i + 1:])]


def kept_positions(entropy: np.ndarray, lengths: np.ndarray, fraction: float) -> np.ndarray:
    """bool [n, T]: the real positions kept, all of them at fraction 1, else the ceil(fraction * length) with the
    highest teacher entropy (ties: the earlier position)."""
    n, t = entropy.shape
    real = np.arange(t)[None, :] < lengths[:, None]
    if fraction >= 1.0:
        return real
    kept = np.zeros((n, t), dtype=bool)
    for i in range(n):
        order = np.argsort(-entropy[i, : lengths[i]], kind="stable")
        kept[i, order[: math.ceil(fraction * lengths[i])]] = True
    return kept


@dataclass(frozen=True)
class LMTargets:
    """A block of rows' stored teacher distributions, decoded: ids [n, T, S] and their probabilities [n, T, S]
    (top-K: exp(log-prob); sampled: count / draws), `used` [n, T, S] (the slots that hold an id), `kept` [n, T]."""

    input_ids: np.ndarray
    length: np.ndarray
    kept: np.ndarray
    ids: np.ndarray
    probs: np.ndarray
    used: np.ndarray

    @property
    def tail(self) -> np.ndarray:
        """[n, T] float32 the mass outside the stored ids (0 for a sampled support, whose counts sum to 1, and at
        positions that keep no support): 1 - the used slots' float32 probabilities added one slot at a time in slot
        order, in float32, clipped to [0, 1]. The order is fixed so that any reader gets these bits
        (docs/STORE_FORMAT.md, "Causal-LM stores"): numpy's own sum adds in an order of its choosing."""
        mass = np.zeros(self.probs.shape[:-1], dtype=np.float32)
        for slot in range(self.probs.shape[-1]):
            mass += np.where(self.used[..., slot], self.probs[..., slot], np.float32(0))
        return np.where(self.kept, np.clip(np.float32(1) - mass, np.float32(0), np.float32(1)), np.float32(0))


def decode_support(data: Mapping[str, np.ndarray], sel: Any, width: int, group: str = GROUP
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(kept [n, width], ids, probs, used [n, width, S]) of the `group`/ arrays of rows: a support over `width`
    positions, as causal-LM and sequence-to-sequence stores keep it (`sel` names the support and its codec)."""
    kept = np.unpackbits(data[f"{group}/kept"], axis=-1, count=width).astype(bool)
    ids = unpack_ids(data[f"{group}/ids"], sel.id_bits, sel.slots)
    if sel.support == "topk":
        codec = codecs.get(sel.logprob_codec)
        logprobs = codec.decode(data[f"{group}/values"], data.get(f"{group}/scale"), sel.slots)
        used = np.broadcast_to(kept[..., None], ids.shape)
        probs = np.where(used, np.exp(logprobs.astype(np.float64)), 0.0).astype(np.float32)
    else:
        counts = data[f"{group}/counts"]
        used = counts > 0
        probs = counts.astype(np.float32) / sel.draws
    return kept, ids, probs, np.ascontiguousarray(used)


@dataclass(frozen=True)
class HiddenTargets:
    """A block of rows' stored final hidden states, decoded: hidden [n, T, d] float32 (rotated when the store
    is: the store's head reads them as they are), `kept` [n, T]."""

    input_ids: np.ndarray
    length: np.ndarray
    kept: np.ndarray
    hidden: np.ndarray


def decode_hidden(data: Mapping[str, np.ndarray], sel: ClmSelection) -> HiddenTargets:
    """A hidden-state store's rows -> HiddenTargets (positions outside `kept` decode to zeros)."""
    kept = np.unpackbits(data[f"{GROUP}/kept"], axis=-1, count=sel.block_size).astype(bool)
    hidden = codecs.get(sel.hidden_codec).decode(data[f"{GROUP}/hidden"], data.get(f"{GROUP}/hidden_scale"),
                                                 sel.hidden_size)
    return HiddenTargets(data["input_ids"], data["length"], kept, hidden)


def encode_hidden(hidden: np.ndarray, kept: np.ndarray, sel: ClmSelection, encoder: FitEncoder | None = None
                  ) -> dict[str, np.ndarray]:
    """The clm/ arrays of a hidden-state store's rows: hidden [n, T, d] (already rotated), kept [n, T]; with a
    fitted basis's `encoder`, its indices (zeros where not kept) through the codec."""
    hidden = np.where(kept[..., None], hidden, 0).astype(np.float16)
    codec = codecs.get(sel.hidden_codec)
    if encoder is None:
        values, scale = codec.encode(hidden)
    else:
        values, scale = codec.quantize(np.where(kept[..., None], encoder.coordinates(hidden), 0.0))
    out = {f"{GROUP}/kept": np.packbits(kept, axis=-1), f"{GROUP}/hidden": values}
    if scale is not None:
        out[f"{GROUP}/hidden_scale"] = scale
    return out


def head_digest(weight: np.ndarray, bias: np.ndarray | None) -> str:
    """`sha256:` over the head's float32 little-endian bytes, [V, d] row-major, then the bias's [V] if any."""
    digest = hashlib.sha256(np.ascontiguousarray(weight, dtype="<f4").tobytes())
    if bias is not None:
        digest.update(np.ascontiguousarray(bias, dtype="<f4").tobytes())
    return "sha256:" + digest.hexdigest()


def head_logits(hidden: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, softcap: float | None
                ) -> np.ndarray:
    """The teacher's logits of stored hidden states: softcap(hidden @ weight.T + bias), float32."""
    logits = hidden.astype(np.float32) @ weight.astype(np.float32).T
    if bias is not None:
        logits = logits + bias
    return softcap * np.tanh(logits / softcap) if softcap else logits


def decode(data: Mapping[str, np.ndarray], sel: ClmSelection) -> LMTargets:
    """A shard's (or any rows') stored arrays -> LMTargets."""
    return LMTargets(data["input_ids"], data["length"], *decode_support(data, sel, sel.block_size))


def encode_support(ids: np.ndarray, weights: np.ndarray, kept: np.ndarray, sel: Any,
                   group: str = GROUP) -> dict[str, np.ndarray]:
    """The `group`/ arrays of rows: ids [n, T, S], weights [n, T, S] (top-K: float16 log-probs; sampled: counts),
    kept [n, T]; positions outside `kept` are zeroed here, so that their bytes never depend on the teacher."""
    ids = np.where(kept[..., None], ids, 0)
    weights = np.where(kept[..., None], weights, 0)
    out = {f"{group}/kept": np.packbits(kept, axis=-1), f"{group}/ids": pack_ids(ids, sel.id_bits)}
    if sel.support == "topk":
        values, scale = codecs.get(sel.logprob_codec).encode(weights.astype(np.float16))
        out[f"{group}/values"] = values
        if scale is not None:
            out[f"{group}/scale"] = scale
    else:
        out[f"{group}/counts"] = weights.astype(np.uint8)
    return out


def support_specs(spec: Callable[[str, tuple[int, ...], str], ArraySpec], sel: Any, width: int,
                  group: str = GROUP) -> list[ArraySpec]:
    """The `group`/ arrays of a support over `width` positions: kept, ids, then counts or values (and scale);
    a hidden support: kept, then the hidden state's values (and scale)."""
    kept = spec(f"{group}/kept", ((width + 7) // 8,), "uint8")
    if sel.support == HIDDEN:
        declared = codecs.get(sel.hidden_codec).arrays(sel.hidden_size)
        return [kept, *(spec(f"{group}/hidden" + ("" if name == "values" else "_scale"), (width, *shape), dtype)
                        for name, (shape, dtype) in declared.items())]
    specs = [kept, spec(f"{group}/ids", (width, sel.id_bytes), "uint8")]
    if sel.support == "sample":
        return [*specs, spec(f"{group}/counts", (width, sel.slots), "uint8")]
    declared = codecs.get(sel.logprob_codec).arrays(sel.slots)
    specs.append(spec(f"{group}/values", (width, *declared["values"][0]), declared["values"][1]))
    if "scale" in declared:
        specs.append(spec(f"{group}/scale", (width, *declared["scale"][0]), declared["scale"][1]))
    return specs


def array_specs(meta: Mapping[str, Any]) -> list[ArraySpec]:
    """A causal-LM store: the blocks, and per position which are kept and the support (ids, log-probs or counts)."""
    layout, sel = meta["layout"], ClmSelection.from_dict(meta["selection"])
    n, rows, chunk, t = layout["n_rows"], layout["shard_rows"], layout["chunk_rows"], sel.block_size

    def spec(name: str, tail: tuple[int, ...], dtype: str) -> ArraySpec:
        return ArraySpec(name, (n, *tail), dtype, rows, chunk, bitshuffle=np.dtype(dtype).itemsize > 1)

    text = [] if sel.text_bytes is None else [spec(ACTUAL, (t,), "float16"), spec(TOKEN_BYTES, (t,), "uint16"),
                                              spec(TEXT, (sel.text_bytes,), "uint8")]
    return [spec("row", (), "int64"), spec("text_hash", (), "uint64"),
            spec("input_ids", (t,), ids_dtype(sel.vocab_size)), spec("length", (), "int32"),
            *support_specs(spec, sel, t), *text, *layer_specs(spec, sel.layer_states, t)]


# --- the values' domain (hskstore.format.domain): what the readers check of each shard -------------------------
# How far above 1 the decoded top-K probabilities of a position may sum, per log-prob codec: the codec's
# rounding of log-probs near 0 (measured over top-1..128 of softmaxes at temperatures 0.1..10: float16
# 1.0002, int8 1.08, int4 2.2, mxfp4 2.3, nf3 3.3: benchmarks/store/domain_checks.py --slack). A codec not listed
# gets the loosest bound unless it is lossless.
PROBABILITY_SLACK = {"float16": 1.01, "int8": 1.25, "int4": 3.0, "mxfp4": 3.0, "nf3": 4.5}
LOSSY_SLACK = 4.5


def kept_mask(data: Arrays, group: str, width: int) -> np.ndarray:
    return np.unpackbits(data[f"{group}/kept"], axis=-1, count=width).astype(bool)


def kept_on_real_positions(group: str, length: str, width: int, positions: float) -> DomainCheck:
    """`group`/kept marks real positions only (t < length), ceil(positions * length) of them per row (all of
    them at positions 1), as kept_positions chooses them."""
    name = f"{group}/kept"

    def rule(data: Arrays) -> Breach | None:
        kept, lengths = kept_mask(data, group, width), data[length].astype(np.int64)
        real = np.arange(width)[None, :] < lengths[:, None]
        if (kept & ~real).any():
            return Breach(name, f"marks a position at or past its row's {length} (padding)")
        wanted = lengths if positions >= 1 else np.ceil(positions * lengths).astype(np.int64)
        rows = np.flatnonzero(kept.sum(axis=1) != wanted)
        if rows.size:
            return Breach(name, f"row {int(rows[0])} keeps {int(kept[rows[0]].sum())} positions, not "
                          f"ceil({positions:g} x {length} {int(lengths[rows[0]])}) = {int(wanted[rows[0]])}")
        return None

    return DomainCheck((name, length), rule)


def support_ids_below(sel: Any, group: str, width: int) -> DomainCheck:
    """The support's ids at the kept positions are vocabulary ids; positions not kept hold zeros."""
    name = f"{group}/ids"

    def rule(data: Arrays) -> Breach | None:
        ids, kept = unpack_ids(data[name], sel.id_bits, sel.slots), kept_mask(data, group, width)
        if (ids[~kept] != 0).any():
            return Breach(name, "holds ids at a position that keeps no support")
        if ids.size and int(ids.max()) >= sel.vocab_size:
            return Breach(name, f"holds id {int(ids.max())}, outside the vocabulary 0..{sel.vocab_size - 1}")
        return None

    return DomainCheck((name, f"{group}/kept"), rule)


def logprobs_within(sel: Any, group: str, width: int) -> DomainCheck:
    """Top-K: at the kept positions the decoded log-probs are finite and <= 0, their probabilities summing to at
    most 1 (within the codec's rounding: PROBABILITY_SLACK)."""
    codec = codecs.get(sel.logprob_codec)
    scaled = "scale" in codec.arrays(sel.slots)
    needs = (f"{group}/values", f"{group}/kept", *((f"{group}/scale",) if scaled else ()))
    slack = PROBABILITY_SLACK.get(sel.logprob_codec, 1.01 if codec.lossless else LOSSY_SLACK)

    def rule(data: Arrays) -> Breach | None:
        kept = kept_mask(data, group, width)
        logprobs = codec.decode(data[needs[0]], data.get(f"{group}/scale"), sel.slots)  # float32 [n, T, S]
        if (kept & ~np.isfinite(logprobs).all(axis=-1)).any():
            return Breach(needs[0], "holds a NaN or infinite log-prob at a kept position")
        top = np.where(kept, logprobs.max(axis=-1, initial=-np.inf), -np.inf)
        if top.max(initial=-np.inf) > 1e-3:
            return Breach(needs[0], f"holds log-prob {top.max():.4g} > 0 (a probability above 1)")
        mass = np.where(kept, np.exp(logprobs).sum(axis=-1), 0.0)  # float32: its rounding is far below the slack
        if mass.max(initial=0.0) > slack:
            return Breach(needs[0], f"holds a position whose top-{sel.slots} probabilities sum to {mass.max():.4g} "
                          f"> 1 (the {sel.logprob_codec} codec's rounding allows up to {slack:g})")
        return None

    return DomainCheck(needs, rule)


def scales_within(group: str) -> DomainCheck:
    """A scaled codec's scales are finite and non-negative."""
    name = f"{group}/scale"

    def rule(data: Arrays) -> Breach | None:
        scale = data[name]
        if scale.dtype.kind == "f" and not (np.isfinite(scale).all() and (scale >= 0).all()):
            return Breach(name, "holds a NaN, infinite or negative scale")
        return None

    return DomainCheck((name,), rule)


def hidden_within(sel: Any, group: str) -> DomainCheck:
    """The hidden states' codes: int8 codes within -127..127 (int8, int8u: -128 is never written), float16
    values and scales finite (what a head reads as logits)."""
    scaled = "scale" in codecs.get(sel.hidden_codec).arrays(sel.slots)
    needs = (f"{group}/hidden", *((f"{group}/hidden_scale",) if scaled else ()))

    def rule(data: Arrays) -> Breach | None:
        values = data[needs[0]]
        if values.dtype == np.int8 and (values == -128).any():
            return Breach(needs[0], "holds code -128, outside the codec's -127..127")
        for name in needs:
            if data[name].dtype.kind == "f" and not np.isfinite(data[name]).all():
                return Breach(name, "holds a NaN or infinite value")
        return None

    return DomainCheck(needs, rule)


def counts_sum_to_draws(sel: Any, group: str, width: int) -> DomainCheck:
    """Sampled: each kept position's counts sum to the draws; positions not kept hold zero counts."""
    name = f"{group}/counts"

    def rule(data: Arrays) -> Breach | None:
        kept, total = kept_mask(data, group, width), data[name].sum(axis=-1, dtype=np.int64)
        if (total[~kept] != 0).any():
            return Breach(name, "holds counts at a position that keeps no support")
        wrong = total[kept][total[kept] != sel.draws]
        if wrong.size:
            return Breach(name, f"holds a kept position whose counts sum to {int(wrong[0])}, not the {sel.draws} draws")
        return None

    return DomainCheck((name, f"{group}/kept"), rule)


def support_checks(sel: Any, group: str, length: str, width: int) -> list[DomainCheck]:
    """The rules of a support's arrays over `width` positions whose real ones `length` counts (causal-LM and
    seq2seq stores)."""
    if sel.support == HIDDEN:  # no ids or log-probs: the hidden states' codes and scales
        return [kept_on_real_positions(group, length, width, sel.positions), hidden_within(sel, group)]
    checks = [kept_on_real_positions(group, length, width, sel.positions), support_ids_below(sel, group, width)]
    if sel.support == "sample":
        return [*checks, counts_sum_to_draws(sel, group, width)]
    return [*checks, scales_within(group), logprobs_within(sel, group, width)]


def domain_checks(sel: ClmSelection) -> list[DomainCheck]:
    """Every rule of a causal-LM store's arrays, in the order they are checked (a new array adds its own)."""
    text = [] if sel.text_bytes is None else [actual_within(), token_bytes_within(sel.text_bytes)]
    return [ids_below("input_ids", sel.vocab_size), lengths_within("length", 1, sel.block_size),
            *support_checks(sel, GROUP, "length", sel.block_size), *text,
            *layer_checks(sel.layer_states, sel.block_size)]


def actual_within() -> DomainCheck:
    """The actual-token log-probs: finite and <= 0 (a float16 log-prob above 0 is a probability above 1)."""
    name = f"{GROUP}/actual"

    def rule(data: Arrays) -> Breach | None:
        actual = np.asarray(data[name], dtype=np.float32)
        if not np.isfinite(actual).all():
            return Breach(name, "holds a NaN or infinite log-prob")
        if actual.max(initial=0.0) > 1e-3:
            return Breach(name, f"holds log-prob {actual.max():.4g} > 0 (a probability above 1)")
        return None

    return DomainCheck((name,), rule)


def token_bytes_within(text_bytes: int) -> DomainCheck:
    """The tokens' bytes of a block add up to at most the text array's width (`selection.text_bytes`)."""
    name = f"{GROUP}/token_bytes"

    def rule(data: Arrays) -> Breach | None:
        total = np.asarray(data[name], dtype=np.int64).sum(axis=-1)
        if total.max(initial=0) > text_bytes:
            return Breach(name, f"gives a block {int(total.max())} bytes of text, more than text_bytes {text_bytes}")
        return None

    return DomainCheck((name,), rule)


# name -> (axes after rows, description, units): what generic Zarr tools show
_DESCRIBED: dict[str, tuple[tuple[str, ...], str, str | None]] = {
    "row": ((), "block index", None),
    "text_hash": ((), "first 8 bytes (little-endian) of BLAKE2b-512 over the block's ids as int32 little-endian",
                  None),
    "input_ids": (("tokens",), "the block's token ids: documents each followed by EOS, packed; padded with EOS",
                  None),
    "length": ((), "real tokens of the block", "tokens"),
}
# a support's arrays, by their name inside its group (clm/, s2s/)
SUPPORT_DESCRIBED: dict[str, tuple[tuple[str, ...], str, str | None]] = {
    "kept": (("position_bytes",), "which positions carry a support: numpy packbits over {positions}, big-endian "
             "bit order", None),
    "ids": (("tokens", "id_bytes"), "the support's ids of each position, bit-packed at id_bits bits, least "
            "significant bit first", None),
    "values": (("tokens", "slots"), "the top-K ids' normalized log-probs, as the value codec stores them",
               "log-prob (nats)"),
    "scale": (("tokens", "scale_groups"), "the value codec's scale of each position's log-probs", None),
    "counts": (("tokens", "slots"), "how many of the draws gave each stored id; 0 = unused slot", "draws"),
    "hidden": (("tokens", "hidden"), "the teacher's final (post-norm) hidden state, rotated by the selection's "
               "rotation, as the value codec stores it; clm/head gives its logits", None),
    "hidden_scale": (("tokens", "scale_groups"), "the value codec's scale of each position's hidden state", None),
}


def described_support(spec: ArraySpec, sel: Mapping[str, Any], leaf: str, section: str,
                      positions: str = "the block", axis: str = "tokens") -> ArraySpec:
    """A support array's dimension names (its position axis called `axis`) and attributes (its codec, id bits
    and slots where they apply)."""
    dims, text, units = SUPPORT_DESCRIBED[leaf]
    dims = tuple(axis if dim == "tokens" else dim for dim in dims)
    attributes = {"description": text.format(positions=positions), "spec": section, "integrity": INTEGRITY}
    if leaf == "ids":
        attributes.update(codec="bitpack", id_bits=sel["id_bits"], slots=sel["slots"])
    if leaf in ("values", "scale", "hidden", "hidden_scale"):
        attributes["codec"] = sel["hidden_codec" if leaf.startswith("hidden") else "logprob_codec"]
        if leaf in ("values", "hidden") and spec.shape[2] != sel["slots"]:
            dims = (axis, "value_bytes")  # a packed codec: bytes of codes, not one value per slot
        dims = dims[: len(spec.shape) - 1]  # a scale per position (int8) has no group axis
    if units:
        attributes["units"] = units
    return replace(spec, dims=(ROWS, *dims), attributes=attributes)


def describe(spec: ArraySpec, meta: Mapping[str, Any]) -> ArraySpec:
    group, _, leaf = spec.name.rpartition("/")
    if spec.name in LAYER_DESCRIBED:
        layers = meta["selection"]["layer_states"]
        attributes = {"description": LAYER_DESCRIBED[spec.name][1], "spec": LAYERS_SECTION,
                      "integrity": INTEGRITY, "codec": layers["codec"], "layers": list(layers["layers"]),
                      "stride": layers["stride"]}
        return replace(spec, dims=(ROWS, *layer_dims(spec.name, spec.shape, layers["width"])), attributes=attributes)
    if spec.name in TEXT_DESCRIBED:
        dims, text, units = TEXT_DESCRIBED[spec.name]
        attributes = {"description": text, "spec": _SECTION, "integrity": INTEGRITY, **({"units": units} if units
                                                                                         else {})}
        return replace(spec, dims=(ROWS, *dims), attributes=attributes)
    if group == GROUP:
        return described_support(spec, meta["selection"], leaf, _SECTION)
    dims, text, units = _DESCRIBED[spec.name]
    attributes = {"description": text, "spec": _SECTION, "integrity": INTEGRITY}
    if units:
        attributes["units"] = units
    return replace(spec, dims=(ROWS, *dims), attributes=attributes)

# a hidden-state store's head, stored once (not row arrays): name -> (dims, description)
HEAD_DESCRIBED: dict[str, tuple[tuple[str, ...], str]] = {
    HEAD: (("vocab", "hidden"), "the teacher's LM head, rotated as the hidden states are: logits = hidden @ head.T "
                                "(+ head_bias)"),
    HEAD_BIAS: (("vocab",), "the LM head's bias"),
    FIT_MEAN: (("hidden",), "a fitted basis's mean mu of the rotated hidden states; with clm/fit_encoder, what the "
                            "writer encodes more positions with (a reader needs clm/head and clm/head_bias only)"),
    FIT_ENCODER: (("index", "hidden"), "a fitted basis's encoder E: the stored indices are clip(rint((h' - mu) @ "
                                       "E.T), -127, 127)"),
}


def head_attributes(name: str) -> dict[str, str]:
    """The attributes of a head array: its text, the causal-LM section, the integrity line."""
    return {"description": HEAD_DESCRIBED[name][1], "spec": _SECTION, "integrity": INTEGRITY}


# --- what a student with another tokenizer needs (docs/STORE_FORMAT.md, "Block text, offsets and actual-token
# log-probs"): the block's text, where each teacher token ends in it, and the teacher's log-prob of each next token
ACTUAL, TOKEN_BYTES, TEXT = f"{GROUP}/actual", f"{GROUP}/token_bytes", f"{GROUP}/text"
TEXT_ARRAYS = (ACTUAL, TOKEN_BYTES, TEXT)
MAX_TOKEN_BYTES = (1 << 16) - 1  # token_bytes are uint16
TEXT_DESCRIBED: dict[str, tuple[tuple[str, ...], str, str | None]] = {
    ACTUAL: (("tokens",), "position t: the teacher's log-prob (temperature 1, float16) of the block's token t+1, "
             "whatever the support; 0 at the last real position and the padding", "log-prob (nats)"),
    TOKEN_BYTES: (("tokens",), "the UTF-8 bytes of the block's text each token owns: its end offset minus the "
                  "previous token's (delta-coded end offsets); an EOS owns its document's trailing bytes", "bytes"),
    TEXT: (("text_bytes",), "the block's text as UTF-8, its first sum(token_bytes) bytes; zero-padded", None),
}


def char_byte_starts(text: str) -> np.ndarray:
    """int64 [len(text) + 1]: where each character of `text` starts in its UTF-8 bytes, then their length."""
    if text.isascii():
        return np.arange(len(text) + 1, dtype=np.int64)
    points = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    starts = np.zeros(len(text) + 1, dtype=np.int64)
    np.cumsum(1 + (points >= 0x80).astype(np.int64) + (points >= 0x800) + (points >= 0x10000), out=starts[1:])
    return starts


def token_ends(char_offsets: list[tuple[int, int]], text: str) -> np.ndarray:
    """A document's tokens' end offsets in bytes of its UTF-8 text, from a fast tokenizer's character offsets
    (`return_offsets_mapping`), made non-decreasing (tokens of one character share its end)."""
    ends = np.array([end for _, end in char_offsets], dtype=np.int64)
    return np.maximum.accumulate(char_byte_starts(text)[np.clip(ends, 0, len(text))]) if len(ends) else ends


def documents_owned(char_ends: np.ndarray, counts: np.ndarray, texts: Sequence[str]) -> list[np.ndarray]:
    """owned_bytes(token_ends(offsets, text), n_bytes) of each of `texts` (ConfigError as there), in one pass of
    array operations over them all: `char_ends` holds their tokens' character end offsets, concatenated, and
    `counts` how many each has. Clipped to its own document and made non-decreasing, a document's byte ends lie
    between its first byte and the next document's, so one running maximum over all of them is each one's."""
    chars = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    char_base = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(chars, out=char_base[1:])
    starts = char_byte_starts("".join(texts))
    doc = np.repeat(np.arange(len(texts)), counts)
    ends = np.maximum.accumulate(starts[char_base[doc] + np.clip(char_ends, 0, chars[doc])])
    return owned_of_ends(ends, counts, starts[char_base[1:]])


def owned_of_ends(ends: np.ndarray, counts: np.ndarray, doc_ends: np.ndarray) -> list[np.ndarray]:
    """Each document's owned bytes (its tokens' then its EOS's, ConfigError as owned_bytes) from its tokens' byte
    ends in the documents' joined bytes (`ends`, non-decreasing, `counts` per document) and where each document
    ends there (`doc_ends`)."""
    eos = np.cumsum(counts + 1) - 1  # each document's EOS owns the rest of its bytes
    marks = np.empty(len(ends) + len(counts), dtype=np.int64)
    is_eos = np.zeros(len(marks), dtype=bool)
    is_eos[eos] = True
    marks[is_eos] = doc_ends
    marks[~is_eos] = ends
    return np.split(_within_token_bytes(np.diff(marks, prepend=0)), eos[:-1] + 1)


def owned_bytes(ends: np.ndarray, n_bytes: int) -> np.ndarray:
    """int64 [tokens + 1]: the bytes of a document each token owns (token_ends' deltas), its EOS the rest; a
    one-line ConfigError where one token would own more than token_bytes (uint16) holds."""
    return _within_token_bytes(np.diff(np.concatenate([[0], ends, [n_bytes]])).astype(np.int64))


def _within_token_bytes(owned: np.ndarray) -> np.ndarray:
    if len(owned) and int(owned.max()) > MAX_TOKEN_BYTES:
        raise ConfigError(f"a token of the corpus spans {int(owned.max())} bytes (more than {MAX_TOKEN_BYTES}): "
                          "split the documents' whitespace runs")
    return owned


def pack_token_bytes(ends: list[np.ndarray], texts: list[str], block_size: int,
                     max_tokens: int | None = None) -> tuple[np.ndarray, list[bytes]]:
    """(token_bytes [n, block_size] uint16, each block's text) of documents packed as pack_blocks packs their ids
    (each document's tokens then its EOS): token i owns the bytes from the previous token's end to its own, the
    first from the document's start, the EOS the rest of the document, so the blocks' texts concatenated are the
    documents' bytes concatenated (cut where `max_tokens` cuts the tokens). pack_stream gives the same."""
    documents = [(np.zeros(len(e), dtype=np.int64), i, DocumentText(owned_bytes(e, len(t.encode("utf-8"))),
                                                                    t.encode("utf-8")))
                 for i, (e, t) in enumerate(zip(ends, texts, strict=True))]
    parts = list(pack_stream(documents, block_size, 0, 1 << 20, max_tokens))
    if not parts:
        return np.zeros((0, block_size), dtype=np.uint16), []
    return np.concatenate([p.token_bytes for p in parts]), [t for p in parts for t in p.texts]


def text_array(texts: list[bytes], width: int) -> np.ndarray:
    """uint8 [n, width]: each block's text, zero-padded; a one-line ConfigError for a text wider than `width`."""
    out = np.zeros((len(texts), width), dtype=np.uint8)
    for i, data in enumerate(texts):
        if len(data) > width:
            raise ConfigError(f"a block's text spans {len(data)} bytes, more than the store's width of {width} "
                              "(block size x the teacher's longest token): split the documents' whitespace runs")
        out[i, : len(data)] = np.frombuffer(data, dtype=np.uint8)
    return out


def actual_logprobs(logprobs_at_next: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """float16 [n, T]: the teacher's log-prob of token t+1 at position t, zeroed where t+1 is not a real token."""
    t = np.arange(logprobs_at_next.shape[1])[None, :]
    return np.where(t + 1 < lengths[:, None], logprobs_at_next, 0.0).astype(np.float16)


@dataclass(frozen=True)
class BlockText:
    """What a student with another tokenizer reads of a block: its text (UTF-8), the teacher tokens' end
    offsets in it (bytes) and the teacher's log-prob of each position's next token."""

    text: bytes
    ends: np.ndarray  # [T] int64, non-decreasing
    actual: np.ndarray  # [T] float32
    length: int


def block_texts(data: Mapping[str, np.ndarray]) -> list[BlockText]:
    """Rows read with the text arrays -> one BlockText each."""
    ends = np.cumsum(data[TOKEN_BYTES].astype(np.int64), axis=1)
    return [BlockText(data[TEXT][i, : ends[i, -1]].tobytes(), ends[i], data[ACTUAL][i].astype(np.float32),
                      int(data["length"][i])) for i in range(len(ends))]


def require_text(sel: ClmSelection, where: str) -> None:
    """A one-line ConfigError when the store predates the text arrays."""
    if sel.text_bytes is None and sel.support == HIDDEN:
        raise ConfigError(f"{where} keeps the teacher's hidden states without block text, token offsets or "
                          "actual-token log-probs: dump the corpus with --support topk:K or sample:N to train a "
                          "student with another tokenizer")
    if sel.text_bytes is None:
        raise ConfigError(f"{where} keeps no block text, token offsets or actual-token log-probs (written before they "
                          "were stored): re-dump it with `hsk dump --objective clm` to train a student with another "
                          "tokenizer")


KIND = kinds.register(kinds.StoreKind(
    CLM, "a causal LM's next-token distributions on a sparse support (`hsk dump --objective clm`)", array_specs,
    describe, frozenset({*ROW_ARRAYS, GROUP}), "hskstore.io.clm_store:ClmStore", trains=("clm",),
    selection_type=ClmSelection, category="text-generation"))


def hadamard_block(d: int) -> int:
    """The Hadamard block of a width d: its largest power-of-two divisor, at most 256."""
    return min(d & -d, 256)


def rotation(d: int, seed: int) -> np.ndarray:
    """float64 [d, d], orthogonal: the seeded randomized Hadamard transform R of a hidden support (h' = R h).
    Two rounds of random signs, a random permutation and the block-diagonal Walsh-Hadamard transform of blocks
    of `hadamard_block(d)`: one outlier dimension is spread over up to block^2 dimensions (all of them for
    d = 576, block 64). The rounds multiply +-1 integers and the result is divided once by the block size (a
    power of two), so R is exact in float64 and the same seed gives the same R on every machine."""
    b = hadamard_block(d)
    h = np.ones((1, 1))
    while h.shape[0] < b:
        h = np.block([[h, h], [h, -h]])
    blocks = np.kron(np.eye(d // b), h)
    rng = np.random.default_rng(np.random.SeedSequence([seed, d]))
    r = np.eye(d)
    for _ in range(2):
        signs = rng.choice((-1.0, 1.0), size=d)
        r = blocks @ (signs[:, None] * r[rng.permutation(d)])
    return r / b
