"""Smaller causal-LM and seq2seq stores from a larger one, without the teacher (`hsk derive SRC --support ...`).

- Top-K -> top-K' (K' <= K), and another log-prob codec: the first K' ids and log-probs of each position,
  encoded as the dump encodes them. From a float16 source (or a source in the target codec's `via` chain at
  the same K) the bytes are those of a direct dump at K'; a lossy source at another K is refused, since its
  per-position scale saw K values.
- Sampled N draws -> N' < N: each position's N draws thinned to a uniformly random N' of them (a multivariate
  hypergeometric draw from its counts, generator seeded (sample_seed, row, N')). N' draws chosen at random
  from N i.i.d. draws are N' i.i.d. draws from the teacher: exact in distribution (unbiased as a direct
  dump's), not the same bytes as a dump at N', whose draws are other ones.
Kept positions stay as they are (choosing fewer needs the teacher's entropy, which the store does not keep), and
so do the intermediate layers (`--hidden-layers`) of a store that has them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

import numpy as np

from .. import __version__, codecs
from ..errors import StoreExistsError
from ..format.clm import (
    HIDDEN,
    TEXT_ARRAYS,
    ClmSelection,
    Support,
    decode_hidden,
    decode_support,
    encode_hidden,
    encode_support,
    head_digest,
    head_logits,
)
from ..format.clm_layers import LAYER_ARRAYS
from ..format.config import ConfigError
from ..format.hidden_fit import Fit, FitEncoder, check_fit_request, fit_head
from ..format.meta import StoreMeta
from ..io.clm_store import write_fit, write_head
from ..io.writer import writing
from .derive import _check_source_checksums, _same_location

# what the writer records itself; data_origin is inherited (where the data came from does not change)
_SOURCE_ONLY = ("format_version", "complete", "identity", "created", "software_version", "inputs_hash", "checksums",
                "stored_bytes", "manifest", "derived_from", "upgraded")


def _check_codec(src: ClmSelection, new: ClmSelection) -> None:
    if src.support != "topk" or src.logprob_codec == codecs.FULL:
        return
    same_k = new.k == src.k
    if not (same_k and src.logprob_codec in codecs.get(new.logprob_codec).chain()):
        raise ConfigError(f"--support {new.described} --logprobs {new.logprob_codec}: a source whose log-probs are "
                          f"{src.logprob_codec} gives only its own K with a codec derived from it; derive from a "
                          "float16 store (`hsk dump --logprobs float16`)")


def thin_counts(counts: np.ndarray, draws: int, seed: int, row: int) -> np.ndarray:
    """counts [T, S] of N draws per position -> counts of a uniformly random `draws` of them (positions with no
    draws stay empty); the generator is seeded (seed, row, draws)."""
    rng = np.random.default_rng([seed, row, draws])
    out = np.zeros_like(counts)
    for t in np.flatnonzero(counts.sum(-1)):
        out[t] = rng.multivariate_hypergeometric(counts[t].astype(np.int64), draws)
    return out


def _compact(ids: np.ndarray, counts: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep each position's ids with a count, in increasing id order, in the first `slots` slots."""
    order = np.argsort(np.where(counts > 0, ids, np.iinfo(np.int64).max), axis=-1, kind="stable")[..., :slots]
    kept_ids, kept_counts = np.take_along_axis(ids, order, -1), np.take_along_axis(counts, order, -1)
    return np.where(kept_counts > 0, kept_ids, 0), kept_counts


def derive_shard(data: dict[str, np.ndarray], src: ClmSelection, new: ClmSelection, rows: np.ndarray, group: str,
                 width: int, encoder: FitEncoder | None = None) -> dict:
    """A shard's arrays with the support of `group` (over `width` positions) made smaller; the rest as it is (a
    fitted basis's `encoder` encodes a float16 source's states as the dump does)."""
    if new.support == HIDDEN:  # the same states through a smaller codec, as the dump's `via` chain encodes them
        decoded = decode_hidden(data, src)
        if encoder is not None:
            arrays = encode_hidden(decoded.hidden, decoded.kept, new, encoder)
        else:
            values, scale = codecs.get(new.hidden_codec).requantize(src.hidden_codec, decoded.hidden)
            arrays = {f"{group}/kept": data[f"{group}/kept"], f"{group}/hidden": values,
                      **({f"{group}/hidden_scale": scale} if scale is not None else {})}
        arrays.update({name: array for name, array in data.items()
                       if not name.startswith(f"{group}/") or name in LAYER_ARRAYS})
        return arrays
    kept, ids, _, _ = decode_support(data, src, width, group)
    if new.support == "topk":
        logprobs = codecs.get(src.logprob_codec).decode(data[f"{group}/values"], data.get(f"{group}/scale"), src.slots)
        weights = logprobs[..., : new.k].astype(np.float16)
        arrays = encode_support(ids[..., : new.k], weights, kept, new, group)
    else:
        counts = np.stack([thin_counts(data[f"{group}/counts"][i], new.draws, src.sample_seed, int(row))
                           for i, row in enumerate(rows)])
        ids, counts = _compact(ids, counts, new.slots)
        arrays = encode_support(ids, counts, kept, new, group)
    # the text arrays (clm/actual, token_bytes, text) and the intermediate layers are not the support: kept as they are
    arrays.update({name: array for name, array in data.items()
                   if not name.startswith(f"{group}/") or name in TEXT_ARRAYS or name in LAYER_ARRAYS})
    return arrays


MEASURED_POSITIONS = 1024  # the positions of the first shard a derived codec's reconstruction is measured on


def _measured(source, src: ClmSelection, new: ClmSelection, head: tuple, fit: Fit | None) -> ClmSelection:
    """The derived selection with its reconstruction measured against the source store's (the teacher does not
    run): mean KL(source || derived) and top-1 agreement over the first shard's first kept positions."""
    data = source.read_shard(0, verify=True)
    rows = derive_shard(data, src, new, np.arange(*source.shard_bounds(0)), "clm", src.block_size,
                        None if fit is None else fit.encoder)
    before, after = decode_hidden(data, src), decode_hidden(rows, new)
    kept = before.kept
    a = head_logits(before.hidden[kept][:MEASURED_POSITIONS], *head, src.logit_softcap)
    b = head_logits(after.hidden[kept][:MEASURED_POSITIONS], *(head if fit is None else (fit.weight, fit.bias)),
                    src.logit_softcap)
    p, q = _log_softmax(a), _log_softmax(b)
    kl = float((np.exp(p) * (p - q)).sum(-1).clip(min=0).mean()) if len(p) else 0.0
    top1 = float((p.argmax(-1) == q.argmax(-1)).mean()) if len(p) else 1.0
    return new.measured(kl, top1, len(p), "source store")


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def fit_positions(source, src: ClmSelection, tokens: int) -> np.ndarray:
    """float16 [N, d]: the first `tokens` kept positions' states of a float16 hidden-state store (all it has when
    fewer), in row order: what the dump fitted its basis to."""
    found, count = [], 0
    for shard in range(source.n_shards):
        targets = decode_hidden(source.read_shard(shard, verify=True), src)
        found.append(targets.hidden[targets.kept].astype(np.float16))
        count += len(found[-1])
        if count >= tokens:
            break
    return np.concatenate(found)[:tokens] if found else np.zeros((0, src.hidden_size), dtype=np.float16)


def _fitted(source, src: ClmSelection, new: ClmSelection, head: tuple, kl: float, tokens: int
            ) -> tuple[ClmSelection, Fit]:
    """A fitted basis's selection and fit, from the float16 source's first kept positions and its head."""
    check_fit_request(kl, tokens)
    fit = fit_head(fit_positions(source, src, tokens), *head, src.logit_softcap, kl, tokens)
    return new.fitted(fit.record, head_digest(fit.weight, fit.bias)), fit


def derive_support(source, out: str, *, support: str, logprob_codec: str | None = None, overwrite: bool = False,
                   progress: Callable[[Iterable[int]], Iterable[int]] | None = None,
                   log: Callable[[str], object] | None = None, hidden_kl: float = 0.01,
                   hidden_fit_tokens: int = 8192) -> dict:
    """Write at `out` the store of `support` derived from `source`, an opened store with a sparse support
    (ClmStore, Seq2seqStore: `source.support()` gives its selection, group and positions); `hidden_kl` and
    `hidden_fit_tokens` are a fitted basis's (`--support hidden:fit`), as the dump's."""
    if _same_location(str(source.url), str(out)):
        raise StoreExistsError(f"--out {out} is the source store itself: choose another output")
    src, group, width = source.support()
    wanted = Support.parse(support)
    new = src.derived(wanted, logprob_codec)
    _check_codec(src, new)
    _check_source_checksums(source)
    head = source.head() if new.support == HIDDEN else None
    fit = None
    if wanted.basis is not None:
        new, fit = _fitted(source, src, new, head, hidden_kl, hidden_fit_tokens)
    if head is not None:
        new = _measured(source, src, new, head, fit)
    recorded = source.metadata
    meta = {k: v for k, v in source.meta.items() if k not in _SOURCE_ONLY}
    meta["selection"] = new.to_dict()
    meta["layout"] = replace(recorded.layout, n_width=new.slots).to_dict()
    meta["derived_from"] = {"url": source.url, "identity": recorded.identity,
                            "config": str(src.described), "logprob_codec": src.logprob_codec,
                            "created": recorded.created, "checksums": dict(recorded.checksums),
                            "content_address": source.content_address,
                            "options": {"support": support, "logprob_codec": logprob_codec,
                                        **({} if fit is None else {"hidden_kl": hidden_kl,
                                                                   "hidden_fit_tokens": hidden_fit_tokens})}}
    if recorded.derived_from:
        meta["derived_from"]["derived_from"] = recorded.derived_from  # the chain back to the dump
    with writing(out, StoreMeta.parse(meta), overwrite=overwrite, software_version=__version__, log=log) as writer:
        if writer.complete:
            if log is not None:
                log(f"{out} is already complete, nothing to do")
            return writer.meta
        if head is not None:
            write_head(writer.group, *(head if fit is None else (fit.weight, fit.bias)))
        if fit is not None:
            write_fit(writer.group, fit.encoder)
        encoder = None if fit is None else fit.encoder
        pending = writer.pending_shards()
        for shard in progress(pending) if progress is not None else pending:
            data = source.read_shard(shard, verify=True)
            rows = np.arange(*source.shard_bounds(shard), dtype=np.int64)
            writer.write_shard(shard, derive_shard(data, src, new, rows, group, width, encoder))
        return writer.finalize().to_dict()
