"""The sequence-to-sequence store kind (`objective: seq2seq`): source/target pairs, the teacher's own output
(sequence-level KD) and, per target token, its distribution under teacher forcing on a sparse support
(word-level KD). docs/STORE_FORMAT.md, "Sequence-to-sequence stores".

A row is one pair. `source_ids` is what the teacher's encoder read (an encoder-decoder) or the prompt it was
given (a decoder-only teacher: the `prompt` template around the source); `reference_ids` is the pair's target
tokenized as the teacher's tokenizer tokenizes targets (ending with EOS). With `decoding`, `teacher_ids` holds
the teacher's own output for the source (greedy or beam search, the options recorded). The support (if any)
sits on one of the two targets, `supports_on`: position t holds the teacher's distribution over that target's
token t, given the source and the target's tokens before t (teacher forcing), on the same supports as
causal-LM stores (hskstore.format.clm: top-K log-probs with the tail recoverable, or RS-KD draws). Pure numpy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

import numpy as np

from .. import codecs
from . import kinds
from .clm import (
    LMTargets,
    Support,
    check_positions,
    decode_support,
    described_support,
    fraction_problem,
    id_bits,
    positive_problem,
    support_checks,
    support_problem,
    support_specs,
    vocabulary_problem,
)
from .config import ConfigError
from .domain import MAX_WIDTH, DomainCheck, first_problem, ids_below, int_within, lengths_within
from .schema import INTEGRITY, ROWS, SPEC_DOC, ArraySpec, ids_dtype

SEQ2SEQ = "seq2seq"
GROUP = "s2s"
ROW_ARRAYS = ("row", "text_hash", "source_ids", "source_length", "reference_ids", "reference_length",
              "teacher_ids", "teacher_length")
TARGETS = ("reference", "teacher")
ARCHITECTURES = ("encoder-decoder", "decoder-only")
STRATEGIES = ("greedy", "beam")
_SECTION = SPEC_DOC + "#sequence-to-sequence-stores-objective-seq2seq"
_UNIT = ("per target position t: the teacher's distribution over the target's token t given the source and the "
         "target's tokens before t, at temperature 1, on the support; positions outside s2s/kept hold zeros")


@dataclass(frozen=True)
class Decoding:
    """How the teacher's own output was decoded: greedy, or beam search with `beams` beams (no sampling)."""

    strategy: str  # "greedy" | "beam"
    beams: int
    max_new_tokens: int

    @classmethod
    def parse(cls, text: str, max_new_tokens: int) -> Decoding | None:
        """`none`, `greedy` or `beam:N` (a one-line ConfigError naming the value otherwise)."""
        strategy, _, number = str(text).strip().partition(":")
        if strategy == "none" and not number:
            return None
        if strategy == "greedy" and not number:
            return cls("greedy", 1, max_new_tokens)
        if strategy == "beam" and number.isascii() and number.isdigit() and 2 <= int(number) <= 64:
            return cls("beam", int(number), max_new_tokens)
        raise ConfigError(f"--decode {text!r}: pass none, greedy or beam:N (2 <= N <= 64 beams)")


@dataclass(frozen=True)
class Seq2seqSelection:
    """A sequence-to-sequence store's `selection`: the pairs' lengths, the teacher's decoding and the support."""

    architecture: str  # "encoder-decoder" | "decoder-only": how the teacher (and a first<k> student) reads a pair
    max_source: int  # source (or prompt) tokens kept per pair
    max_target: int  # target tokens kept per pair (reference and teacher output)
    vocab_size: int
    id_bits: int  # bits per stored id: ceil(log2 vocab)
    eos_id: int
    pad_id: int  # what pads the id arrays past each length
    decoder_start_id: int | None  # encoder-decoder: the decoder's first input
    prompt: str | None  # decoder-only: the template the source was put in ("{source}" marks it)
    decoding: dict | None  # Decoding as a dict; None: no teacher output stored
    supports_on: str | None  # "reference" | "teacher": the target the support sits on; None: no support
    support: str | None  # "topk" | "sample" | None
    k: int | None
    draws: int | None
    slots: int  # ids stored per position (0 without a support)
    logprob_codec: str | None
    positions: float = 1.0
    positions_by: str = "entropy"
    sample_seed: int | None = None
    temperature: float = 1.0
    unit: str = _UNIT

    @classmethod
    def make(cls, support: Support | None, decoding: Decoding | None, *, architecture: str, vocab_size: int,
             max_source: int, max_target: int, eos_id: int, pad_id: int, decoder_start_id: int | None,
             prompt: str | None, supports_on: str | None = None, logprob_codec: str = "float16",
             positions: float = 1.0, sample_seed: int = 0) -> Seq2seqSelection:
        check_positions(positions)
        on = _supports_on(support, decoding, supports_on)
        return cls(architecture, max_source, max_target, vocab_size, id_bits(vocab_size), eos_id, pad_id,
                   decoder_start_id, prompt, None if decoding is None else asdict(decoding), on,
                   **_support_fields(support, vocab_size, logprob_codec, sample_seed), positions=float(positions))

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Seq2seqSelection:
        sel = cls(**{key: d[key] for key in cls.__dataclass_fields__ if key in d})
        problem = sel._problem()
        if problem:
            raise ValueError(problem)
        return sel

    def _problem(self) -> str | None:
        """What makes a read selection unusable, out of its domain or contradicting itself (None: nothing)."""
        if self.architecture not in ARCHITECTURES:
            return f"architecture {self.architecture!r} is not one of {', '.join(ARCHITECTURES)}"
        last = self.vocab_size - 1 if isinstance(self.vocab_size, int) else 0
        return first_problem((
            vocabulary_problem(self.vocab_size, self.id_bits), int_within("max_source", self.max_source, 1, MAX_WIDTH),
            int_within("max_target", self.max_target, 1, MAX_WIDTH), int_within("eos_id", self.eos_id, 0, last),
            int_within("pad_id", self.pad_id, 0, last),
            None if self.decoder_start_id is None else int_within("decoder_start_id", self.decoder_start_id, 0, last),
            self._support_problem(), self._decoding_problem(), fraction_problem("positions", self.positions),
            positive_problem("temperature", self.temperature)))

    def _support_problem(self) -> str | None:
        if self.support is None:
            return None if self.slots == 0 else f"slots {self.slots!r} without a support"
        if self.supports_on not in TARGETS or self.supports_on == "teacher" and self.decoding is None:
            return f"supports_on {self.supports_on!r} is not a stored target"
        return support_problem(self)

    def _decoding_problem(self) -> str | None:
        if self.decoding is None:
            return None
        d = self.decoding
        if not isinstance(d, dict) or d.get("strategy") not in STRATEGIES:
            return f"decoding {d!r} is not greedy or beam search"
        return first_problem((int_within("decoding.beams", d.get("beams"), 1, 64),
                              int_within("decoding.max_new_tokens", d.get("max_new_tokens"), 1, MAX_WIDTH)))

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def described(self) -> Support | None:
        if self.support is None:
            return None
        return Support(self.support, self.k if self.support == "topk" else self.draws)

    def label(self) -> tuple[str | None, str | None]:
        """(config, codec): how a catalog and the card's title name this selection: the decoding and the support."""
        parts = [p for p in ((self.decoding or {}).get("strategy"), self.described and str(self.described)) if p]
        return "+".join(parts) or None, self.logprob_codec

    def kept(self) -> str:
        """What the store keeps, in one clause (the card, croissant's rai:dataPreprocessingProtocol)."""
        parts = []
        if self.decoding:
            parts.append(f"the teacher's {self.decoding.get('strategy')} output per source")
        if self.support == "topk":
            parts.append(f"top-{self.k} ids and log-probs ({self.logprob_codec}) per {self.supports_on} target token")
        elif self.support == "sample":
            parts.append(f"{self.draws} sampled ids per {self.supports_on} target token (RS-KD)")
        return "; ".join(parts) or "the pairs"

    @property
    def id_bytes(self) -> int:
        return -(-self.slots * self.id_bits // 8)

    @property
    def decoded(self) -> Decoding | None:
        return None if self.decoding is None else Decoding(**self.decoding)

    def derived(self, support: Support, logprob_codec: str | None) -> Seq2seqSelection:
        """The selection of a store derived from this one (a smaller K, fewer draws, another codec)."""
        if self.support is None:
            raise ConfigError("this seq2seq store keeps no word-level support to derive from (it was dumped "
                              "without --support)")
        if support.kind != self.support or support.size > self.slots:
            raise ConfigError(f"--support {support}: a store of support {self.described} gives {self.support}:N "
                              f"with N <= {self.slots} only (derive keeps a subset; the teacher is not run)")
        if support.kind == "topk":
            return replace(self, k=support.size, slots=support.size, logprob_codec=logprob_codec or self.logprob_codec)
        if logprob_codec:
            raise ConfigError("--logprobs: a sampled store holds counts, not log-probs")
        return replace(self, draws=support.size, slots=support.size)

    def target_arrays(self, on: str) -> tuple[str, str]:
        """(ids, length) array names of a target: the reference or the teacher's output."""
        if on == "teacher" and self.decoding is None:
            raise ConfigError("this seq2seq store holds no teacher output (it was dumped without --decode)")
        return f"{on}_ids", f"{on}_length"


def _supports_on(support: Support | None, decoding: Decoding | None, asked: str | None) -> str | None:
    """The target the support sits on (None: no support): as asked, else the teacher's output if decoded."""
    if support is None and decoding is None:
        raise ConfigError("a seq2seq store keeps word-level supports (--support), the teacher's output "
                          "(--decode greedy or beam:N) or both: pass at least one")
    if support is None:
        return None
    on = asked or ("teacher" if decoding else "reference")
    if on not in TARGETS:
        raise ConfigError(f"--supports-on {on!r}: pass reference or teacher")
    if on == "teacher" and decoding is None:
        raise ConfigError("--supports-on teacher: the teacher's output is stored only with --decode greedy or beam:N")
    return on


def _support_fields(support: Support | None, vocab_size: int, logprob_codec: str, sample_seed: int) -> dict:
    """The selection's support fields: none, top-K (its codec checked) or sampled."""
    if support is None:
        return {"support": None, "k": None, "draws": None, "slots": 0, "logprob_codec": None}
    if support.kind == "hidden":
        raise ConfigError(f"--support {support}: a seq2seq store keeps topk:K or sample:N (the final hidden state is "
                          "a causal-LM support: --objective clm)")
    if support.kind == "sample":
        return {"support": "sample", "k": None, "draws": support.size, "slots": support.slots, "logprob_codec": None,
                "sample_seed": sample_seed}
    if not 1 <= support.size <= vocab_size:
        raise ConfigError(f"--support {support}: K must be in 1..{vocab_size} (the teacher's vocabulary)")
    codecs.chosen(logprob_codec, "--logprobs")  # an unknown codec is refused before anything runs
    return {"support": "topk", "k": support.size, "draws": None, "slots": support.slots,
            "logprob_codec": logprob_codec}


def pair_hashes(source_ids: np.ndarray, reference_ids: np.ndarray) -> np.ndarray:
    """uint64 per row: the first 8 bytes (little-endian) of BLAKE2b-512 over the row's source ids then its
    reference ids (each array whole, padding included) as int32 little-endian."""
    both = np.concatenate([source_ids.astype("<i4"), reference_ids.astype("<i4")], axis=1)
    digests = b"".join(hashlib.blake2b(row.tobytes()).digest()[:8] for row in np.ascontiguousarray(both))
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


def pad_rows(sequences: list[list[int]], width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids [n, width] int64, lengths [n] int32): each sequence cut to `width` tokens, then padded."""
    ids = np.full((len(sequences), width), pad_id, dtype=np.int64)
    lengths = np.zeros(len(sequences), dtype=np.int32)
    for i, seq in enumerate(sequences):
        cut = seq[:width]
        ids[i, : len(cut)] = cut
        lengths[i] = len(cut)
    return ids, lengths


def decode(data: Mapping[str, np.ndarray], sel: Seq2seqSelection) -> LMTargets:
    """Rows' stored arrays -> LMTargets over the target the support sits on (its ids and lengths as
    input_ids/length; position t holds the distribution over input_ids[t])."""
    ids_name, length_name = sel.target_arrays(sel.supports_on)
    return LMTargets(data[ids_name], data[length_name], *decode_support(data, sel, sel.max_target, GROUP))


def array_specs(meta: Mapping[str, object]) -> list[ArraySpec]:
    """The pairs, the teacher's output (with `decoding`) and the support over the target (with `support`)."""
    layout, sel = meta["layout"], Seq2seqSelection.from_dict(meta["selection"])
    n, rows, chunk = layout["n_rows"], layout["shard_rows"], layout["chunk_rows"]

    def spec(name: str, tail: tuple[int, ...], dtype: str) -> ArraySpec:
        return ArraySpec(name, (n, *tail), dtype, rows, chunk, bitshuffle=np.dtype(dtype).itemsize > 1)

    ids = ids_dtype(sel.vocab_size)
    specs = [spec("row", (), "int64"), spec("text_hash", (), "uint64"),
             spec("source_ids", (sel.max_source,), ids), spec("source_length", (), "int32"),
             spec("reference_ids", (sel.max_target,), ids), spec("reference_length", (), "int32")]
    if sel.decoding is not None:
        specs += [spec("teacher_ids", (sel.max_target,), ids), spec("teacher_length", (), "int32")]
    if sel.support is not None:
        specs += support_specs(spec, sel, sel.max_target, GROUP)
    return specs


def domain_checks(sel: Seq2seqSelection) -> list[DomainCheck]:
    """Every rule of a seq2seq store's arrays (hskstore.format.domain), in the order they are checked: the ids of
    each sequence below the vocabulary, its length within its array, then the support over its target."""
    widths = {"source": sel.max_source, "reference": sel.max_target, "teacher": sel.max_target}
    checks = []
    for target, width in widths.items():
        if target != "teacher" or sel.decoding is not None:
            checks += [ids_below(f"{target}_ids", sel.vocab_size), lengths_within(f"{target}_length", 0, width)]
    if sel.support is not None:
        checks += support_checks(sel, GROUP, f"{sel.supports_on}_length", sel.max_target)
    return checks


_DESCRIBED: dict[str, tuple[tuple[str, ...], str, str | None]] = {
    "row": ((), "pair index", None),
    "text_hash": ((), "first 8 bytes (little-endian) of BLAKE2b-512 over source_ids then reference_ids (whole rows) "
                  "as int32 little-endian", None),
    "source_ids": (("source_tokens",), "the source as the teacher read it (in the prompt template for a "
                   "decoder-only teacher); padded with pad_id", None),
    "source_length": ((), "real tokens of source_ids", "tokens"),
    "reference_ids": (("target_tokens",), "the pair's target, tokenized as the teacher's targets (ending with "
                      "EOS unless cut at max_target); padded with pad_id", None),
    "reference_length": ((), "real tokens of reference_ids", "tokens"),
    "teacher_ids": (("target_tokens",), "the teacher's own output for the source (selection.decoding), up to and "
                    "including its EOS; padded with pad_id", None),
    "teacher_length": ((), "real tokens of teacher_ids", "tokens"),
}


def describe(spec: ArraySpec, meta: Mapping[str, object]) -> ArraySpec:
    group, _, leaf = spec.name.rpartition("/")
    if group == GROUP:
        sel = meta["selection"]
        return described_support(spec, sel, leaf, _SECTION, f"the {sel['supports_on']} target's positions",
                                 "target_tokens")
    dims, text, units = _DESCRIBED[spec.name]
    attributes = {"description": text, "spec": _SECTION, "integrity": INTEGRITY}
    if units:
        attributes["units"] = units
    return replace(spec, dims=(ROWS, *dims), attributes=attributes)


KIND = kinds.register(kinds.StoreKind(
    SEQ2SEQ, "source/target pairs with the teacher's output and per-target-token distributions on a sparse "
    "support (`hsk dump --objective seq2seq`)", array_specs, describe, frozenset({*ROW_ARRAYS, GROUP}),
    "hskstore.io.seq2seq_store:Seq2seqStore", trains=("seq2seq",), inputs=("source_ids", "reference_ids"),
    selection_type=Seq2seqSelection, category="text2text-generation"))
