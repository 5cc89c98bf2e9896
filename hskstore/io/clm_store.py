"""The reader of causal-LM stores (hskstore.format.clm): decoded targets, `hsk info`, derive.

`store.targets(shard)` gives a shard's teacher distributions decoded (LMTargets); `hsk info` counts bytes per
token of the knowledge (the clm/ arrays) beside today's offline-logit formats.
"""

from __future__ import annotations

import numpy as np

from ..errors import CorruptStoreError
from ..format.clm import (
    ACTUAL,
    CLM,
    GROUP,
    HEAD,
    HEAD_BIAS,
    HEAD_DESCRIBED,
    HIDDEN,
    TEXT_ARRAYS,
    BlockText,
    ClmSelection,
    HiddenTargets,
    LMTargets,
    block_texts,
    decode,
    decode_hidden,
    domain_checks,
    head_attributes,
    head_digest,
)
from ..format.clm_layers import LAYER_ARRAYS
from ..format.config import ConfigError
from ..format.domain import DomainCheck
from ..format.hidden_fit import FIT_ENCODER, FIT_MEAN, Fit, FitEncoder
from ..format.schema import META_KEY, ArraySpec
from . import info
from .location import zarr_location
from .reader import HSKStore

HEAD_CHUNK_ROWS = 4096


def head_specs(vocab_size: int, hidden_size: int, bias: bool) -> list[ArraySpec]:
    """A hidden-state store's head, stored once: clm/head [V, d] float32 (and clm/head_bias [V]), one shard of
    chunks of HEAD_CHUNK_ROWS rows; its bytes are covered by the selection's head_sha256, its zarr.json by the
    manifest."""
    chunk = min(HEAD_CHUNK_ROWS, vocab_size)
    rows = -(-vocab_size // chunk) * chunk
    shapes = {HEAD: (vocab_size, hidden_size), HEAD_BIAS: (vocab_size,)}
    return [ArraySpec(name, shapes[name], "float32", rows, chunk, dims=HEAD_DESCRIBED[name][0],
                      attributes=head_attributes(name))
            for name in ((HEAD, HEAD_BIAS) if bias else (HEAD,))]


def write_head(group, weight: np.ndarray, bias: np.ndarray | None) -> None:
    """Write a hidden-state store's head arrays into its zarr group (before its shards; rewritten on resume)."""
    for spec, data in zip(head_specs(*weight.shape, bias is not None), (weight, bias)):
        _create(spec, group)
        group[spec.name][...] = np.asarray(data, dtype=np.float32)


def write_fit(group, encoder: FitEncoder) -> None:
    """Write a fitted store's encoder (float64, one chunk each; covered by hidden_fit.encoder_sha256) into its zarr
    group, beside its head: what a resumed dump encodes the rest of the corpus with."""
    d = encoder.mean.shape[0]
    for name, data in ((FIT_MEAN, encoder.mean), (FIT_ENCODER, encoder.matrix)):
        spec = ArraySpec(name, data.shape, "float64", d, d, dims=HEAD_DESCRIBED[name][0],
                         attributes=head_attributes(name))
        _create(spec, group)
        group[name][...] = np.asarray(data, dtype=np.float64)


def stored_fit(url: str, kl: float) -> Fit | None:
    """The fit that the (complete or not) causal-LM store at `url` keeps for a target KL of `kl`, its head and
    encoder matching their digests: what a resumed dump encodes the rest of the corpus with. None when there is no
    such store or fit (the dump then fits, and the writer refuses a store made with other options)."""
    import zarr

    try:
        group = zarr.open_group(zarr_location(url), mode="r", zarr_format=3)
        sel = ClmSelection.from_dict(group.attrs.asdict()[META_KEY]["selection"])
        fit = sel.hidden_fit
        if fit is None or fit.kl != kl:
            return None
        weight, bias = group[HEAD][...], group[HEAD_BIAS][...]
        encoder = FitEncoder(group[FIT_MEAN][...], group[FIT_ENCODER][...])
    except Exception:  # no store there, another kind, or one stopped before its head was written
        return None
    if head_digest(weight, bias) != sel.head_sha256 or encoder.digest() != fit.encoder_sha256:
        return None
    return Fit(fit, weight, bias, encoder)


def _create(spec: ArraySpec, group) -> None:
    if spec.name in group:
        del group[spec.name]
    spec.create(group)

# What other tools store per token (bytes, before their own compression where they say so).
OTHERS = (("Megatron-LM top-128 fp16 + 17-bit ids", 528), ("DistillKit top-128, polynomial tail", 300),
          ("RS-KD 12 sampled ids of 50, 7-bit counts", 37))


class ClmStore(HSKStore):
    """A causal-LM store: packed blocks and, per kept position, the teacher's distribution on a sparse support."""

    objective = CLM
    reads = frozenset({"clm"})

    @property
    def clm(self) -> ClmSelection:
        return self.selection_record

    def domain_checks(self) -> list[DomainCheck]:
        return domain_checks(self.clm)

    def support(self) -> tuple[ClmSelection, str, int]:
        """(selection, group, positions per row) of the stored support, for derive."""
        return self.clm, GROUP, self.clm.block_size

    def targets(self, data: dict[str, np.ndarray]) -> LMTargets | HiddenTargets:
        """Rows read with read_shard / read (every array) -> their decoded teacher distributions (a hidden-state
        store: the decoded hidden states; `head()` turns them into logits)."""
        return decode_hidden(data, self.clm) if self.clm.support == HIDDEN else decode(data, self.clm)

    def head(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(weight [V, d], bias [V] or None) float32 of a hidden-state store, checked against head_sha256."""
        sel = self.clm
        if sel.support != HIDDEN:
            raise ConfigError(f"{self.url} keeps support {sel.described}, not the hidden state: it has no head")
        try:
            weight = self.group[HEAD][...]
            bias = self.group[HEAD_BIAS][...] if sel.head_bias else None
        except Exception as exc:
            raise CorruptStoreError(f"{self.url}: its head ({HEAD}) cannot be read ({exc.__class__.__name__}): "
                                    "the store is damaged; re-copy it or dump again") from None
        if head_digest(weight, bias) != sel.head_sha256:
            raise CorruptStoreError(f"{self.url}: its head ({HEAD}) does not match head_sha256 in its selection: "
                                    "the store is damaged; re-copy it or dump again")
        return weight, bias

    def fit_encoder(self) -> FitEncoder:
        """The encoder of a store with a fitted basis, checked against hidden_fit.encoder_sha256."""
        fit = self.clm.hidden_fit
        if fit is None:
            raise ConfigError(f"{self.url} keeps support {self.clm.described}: it has no fitted basis")
        try:
            encoder = FitEncoder(self.group[FIT_MEAN][...], self.group[FIT_ENCODER][...])
        except Exception as exc:
            raise CorruptStoreError(f"{self.url}: its fitted basis ({FIT_ENCODER}) cannot be read "
                                    f"({exc.__class__.__name__}): the store is damaged; re-copy it or dump again"
                                    ) from None
        if encoder.digest() != fit.encoder_sha256:
            raise CorruptStoreError(f"{self.url}: its fitted basis ({FIT_MEAN}, {FIT_ENCODER}) does not match "
                                    "hidden_fit.encoder_sha256 in its selection: the store is damaged; re-copy it "
                                    "or dump again")
        return encoder

    def verify(self, progress=None) -> list[str]:
        problems = super().verify(progress)
        checks = (self.head, *((self.fit_encoder,) if self.clm.hidden_fit is not None else ()))
        for check in checks if self.clm.support == HIDDEN else ():
            try:
                check()
            except CorruptStoreError as exc:
                problems.append(str(exc))
        return problems

    def texts(self, data: dict[str, np.ndarray]) -> list[BlockText]:
        """Rows read with the text arrays -> each block's text, teacher token ends and actual-token log-probs."""
        return block_texts(data)

    def tokens(self) -> tuple[int, int]:
        """(real tokens, kept positions) over the whole store."""
        real = kept = 0
        for shard in range(self.n_shards):
            data = self.read(slice(*self.shard_bounds(shard)), ["length", "clm/kept"])
            real += int(data["length"].sum())
            kept += int(np.unpackbits(data["clm/kept"], axis=-1).sum())
        return real, kept

    def storage_report(self) -> dict:
        arrays = info.array_bytes(self)
        real, kept = self.tokens()
        # the block text and its offsets are the corpus, not the teacher's knowledge; the actual-token log-probs are
        knowledge = sum(a["stored"] for name, a in arrays.items()
                        if name.startswith("clm/") and (name == ACTUAL or name not in TEXT_ARRAYS))
        total = sum(a["stored"] for a in arrays.values())
        return {"rows": len(self), "arrays": arrays, "total_bytes": total,
                "bytes_per_example": total / max(len(self), 1), "tokens": real, "kept_positions": kept,
                "knowledge_bytes": knowledge, "bytes_per_token": knowledge / max(real, 1),
                "bytes_per_kept_position": knowledge / max(kept, 1), "total_bytes_per_token": total / max(real, 1),
                "support": str(self.clm.described), "vocab_size": self.clm.vocab_size,
                **self._hidden_report(arrays), **self._layers_report(arrays, real)}

    def _layers_report(self, arrays: dict, real: int) -> dict:
        """The intermediate layers' part of the bytes per token (in bytes_per_token already), when the store has
        them."""
        if self.clm.layer_states is None:
            return {}
        stored = sum(a["stored"] for name, a in arrays.items() if name in LAYER_ARRAYS)
        return {"layers": self.clm.layer_states.described(), "layer_bytes_per_token": stored / max(real, 1)}

    def _hidden_report(self, arrays: dict) -> dict:
        sel = self.clm
        if sel.support != HIDDEN:
            return {}
        once = (HEAD, HEAD_BIAS)[: 1 + sel.head_bias] + ((FIT_MEAN, FIT_ENCODER) if sel.hidden_fit else ())
        head = sum(int(self.group[name].nbytes_stored()) for name in once)  # a fitted basis's encoder with it
        return {"head_bytes": head, "reconstruction_kl": sel.reconstruction_kl,
                "reconstruction_top1": sel.reconstruction_top1, "reconstruction_tokens": sel.reconstruction_tokens,
                "reconstruction_reference": sel.reconstruction_reference}

    def size_summary(self, report: dict) -> str:
        """One line: the support and what it costs per token."""
        return f"support {report['support']}: {report['bytes_per_token']:.2f} B/token"

    def format_report(self, report: dict) -> str:
        meta, sel = self.metadata, self.clm
        what = self._what(sel)
        lines = [f"store      {self.url}", info.status_line(meta, "   objective clm"), *info.upgrade_lines(self.meta),
                 f"corpus     {report['rows']} blocks of {sel.block_size} tokens ({report['tokens']} real)   source "
                 f"{meta.dataset.source}",
                 f"teacher    {meta.teacher.name} ({meta.teacher.architecture}, {meta.teacher.num_layers} layers)   "
                 f"weights {(meta.teacher.weights_hash or '?')[:19]}",
                 info.tokenizer_line(meta),
                 f"support    {what}; {'' if sel.support == HIDDEN else f'ids at {sel.id_bits} bits; '}positions kept "
                 f"{sel.positions:g} "
                 f"({report['kept_positions']})",
                 "", *info.array_lines(report["arrays"]), "",
                 f"total          {info.human_bytes(report['total_bytes'])}  "
                 f"({report['total_bytes_per_token']:.1f} B/token with the inputs)",
                 f"per token      {report['bytes_per_token']:.2f} B stored (clm/ arrays; "
                 f"{report['bytes_per_kept_position']:.2f} B per kept position); the full distribution in fp16: "
                 f"{2 * sel.vocab_size:,} B"]
        lines += self._hidden_lines(report)
        if "layers" in report:
            lines.append(f"layers         {report['layers']}: {report['layer_bytes_per_token']:.2f} B/token of "
                         "the above")
        lines += ["for scale, what other tools store per token:"]
        lines += [f"  {name}: ~{size} B ({size / max(report['bytes_per_token'], 1e-9):.1f}x this store)"
                  for name, size in OTHERS]
        return info.join_report(lines)

    @staticmethod
    def _what(sel: ClmSelection) -> str:
        if sel.support == HIDDEN:
            rotated = "not rotated" if sel.rotation_seed is None else f"Hadamard-rotated, seed {sel.rotation_seed}"
            if sel.hidden_fit is not None:
                rotated += f", indices in a {sel.hidden_fit.described()}"
            return (f"the final hidden state (d {sel.hidden_size}, {sel.hidden_codec}, {rotated}) + the LM head "
                    "once per store: the full distribution")
        if sel.support == "topk":
            return f"top-{sel.k} ids + log-probs ({sel.logprob_codec}); tail = 1 - sum"
        return f"{sel.draws} draws from the teacher (seed {sel.sample_seed}): distinct ids + counts"

    @staticmethod
    def _hidden_lines(report: dict) -> list[str]:
        if "head_bytes" not in report:
            return []
        kl = report["reconstruction_kl"]
        measured = ("not measured" if kl is None else
                    f"mean KL({report['reconstruction_reference']} || stored) {kl:.5f} nats/token, top-1 "
                    f"{100 * report['reconstruction_top1']:.1f}% over {report['reconstruction_tokens']} tokens")
        return [f"head           {info.human_bytes(report['head_bytes'])} once per store (not in B/token)",
                f"reconstruction {measured}"]

    def refuse_derive(self) -> None:
        raise ConfigError(f"{self.url} is a causal-LM store: derive it with --support topk:K or sample:N "
                          "(and --logprobs), not a config")

    def refuse_task_training(self) -> None:
        raise ConfigError(f"{self.url} is a causal-LM store: train from it with --method clm-kd")

    derives_by_support = True  # hskstore.share.support_derive, called by `hsk derive --support`
