"""The masked-LM dump: run a masked-LM teacher once over raw text and write an MLM store (LightPAFF).

Masking is BERT's: per row, 15% of its maskable tokens rounded half up (not [CLS], [SEP], padding;
at least one), chosen uniformly; of those, 80% become [MASK], 10% a random vocabulary id, 10% stay. Each
row's draws come from its own generator, seeded by (seed, row index), so a row is masked the same
way whatever the shard layout, batch or resume. Per masked position the store keeps the teacher's
top-k vocabulary ids and logits and the log-sum-exp over the whole vocabulary, so that
p(id) = exp(logit - lse) for a kept id and the mass outside the top-k is 1 - sum of those.

Same guarantees as a task store (hskstore.io.writer): whole shards, digests, resumable bit-identically,
provenance in the metadata; the arrays are `hskstore.format.mlm.array_specs`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm.auto import tqdm

from hskstore import __version__
from hskstore.format.config import ConfigError
from hskstore.format.meta import (
    DataRef,
    Layout,
    StoreMeta,
    TaskRef,
    TeacherRef,
    TokenizerRef,
)
from hskstore.format.mlm import MLM, MLM_TEACHER_KEYS, MLM_TOKENIZER_KEYS, MaskedLMSelection
from hskstore.io.writer import StoreWriter, writing
from pipelines.core.batching import batch_inputs, length_bucketed_batches
from pipelines.core.data import DataError, Examples, _read_table
from pipelines.core.models import (
    ModelLoadError,
    load_tokenizer,
    model_revision,
    resolve_model,
    vocab_hash,
    weights_hash,
)
from pipelines.core.tokenize import encode

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MASK, RANDOM, KEPT = 1, 2, 3  # mlm/kind values; 0 = unused slot


@dataclass(frozen=True)
class Masking:
    """BERT's masking: `mask_rate` of the tokens; of those, `mask_token_rate` [MASK], `random_token_rate`
    a random id, the rest kept."""

    mask_rate: float = 0.15
    mask_token_rate: float = 0.8
    random_token_rate: float = 0.1
    mask_seed: int = 0

    @property
    def keep_rate(self) -> float:
        return round(1.0 - self.mask_token_rate - self.random_token_rate, 10)

    def check(self) -> None:
        if not 0 < self.mask_rate < 1:
            raise ValueError(f"mask rate {self.mask_rate} must be in (0, 1)")
        if self.mask_token_rate < 0 or self.random_token_rate < 0 or self.keep_rate < 0:
            raise ValueError("the [MASK] and random-token shares must be >= 0 and sum to at most 1")

    def max_masked(self, max_length: int) -> int:
        """Masked slots per row (M): enough for the longest row ([CLS] and one [SEP] never masked)."""
        return _n_masked(self.mask_rate, max(max_length - 2, 1))

    def to_meta(self, max_length: int, top_k: int) -> dict:
        return MaskedLMSelection(self.mask_rate, self.mask_token_rate, self.random_token_rate, self.keep_rate,
                                 self.mask_seed, self.max_masked(max_length), top_k).to_dict()


def _n_masked(rate: float, candidates: int) -> int:
    """floor(rate x candidates + 0.5), at least 1: half up (0.15 x 30 = 4.5 -> 5), as docs/STORE_FORMAT.md says.

    The stores' `selection.unit` text says "round": it means this rule, not half to even."""
    return max(1, math.floor(rate * candidates + 0.5)) if candidates else 0


def mask_row(
    ids: np.ndarray, length: int, row: int, masking: Masking, special_ids: set[int], mask_id: int, vocab_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(masked ids [T], positions, original ids, kinds) of one row; deterministic in (seed, row)."""
    rng = np.random.default_rng([masking.mask_seed, row])
    candidates = np.array([p for p in range(length) if int(ids[p]) not in special_ids], dtype=np.int64)
    n = _n_masked(masking.mask_rate, len(candidates))
    positions = np.sort(rng.choice(candidates, size=n, replace=False)) if n else candidates[:0]
    draw = rng.random(n)
    random_ids = rng.integers(0, vocab_size, size=n)
    kinds = np.where(draw < masking.mask_token_rate, MASK,
                     np.where(draw < masking.mask_token_rate + masking.random_token_rate, RANDOM, KEPT))
    masked = ids.copy()
    originals = ids[positions].copy()
    masked[positions] = np.where(kinds == MASK, mask_id, np.where(kinds == RANDOM, random_ids, originals))
    return masked, positions, originals, kinds.astype(np.uint8)


def mask_rows(enc: dict[str, np.ndarray], rows: np.ndarray, masking: Masking,
              tokenizer: PreTrainedTokenizerBase) -> dict[str, np.ndarray]:
    """Mask a tokenized block: the masked input_ids and the mlm/positions, mlm/labels, mlm/kind arrays."""
    n, t = enc["input_ids"].shape
    m = masking.max_masked(t)
    special = {tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id}
    out = {
        "input_ids": enc["input_ids"].copy(),
        "mlm/positions": np.full((n, m), -1, dtype=np.int16),
        "mlm/labels": np.zeros((n, m), dtype=np.int64),
        "mlm/kind": np.zeros((n, m), dtype=np.uint8),
    }
    for i in range(n):
        masked, pos, orig, kind = mask_row(
            enc["input_ids"][i], int(enc["length"][i]), int(rows[i]), masking, special, tokenizer.mask_token_id,
            len(tokenizer),
        )
        out["input_ids"][i] = masked
        out["mlm/positions"][i, : len(pos)] = pos
        out["mlm/labels"][i, : len(pos)] = orig
        out["mlm/kind"][i, : len(pos)] = kind
    return out


@torch.no_grad()
def teacher_topk(model: PreTrainedModel, inputs: dict, positions: np.ndarray, top_k: int) -> dict[str, np.ndarray]:
    """Top-k ids and logits and the full log-sum-exp at each masked position ([b, M]; -1 = unused)."""
    hidden = model.bert(**inputs).last_hidden_state  # [b, t, d]
    pos = torch.as_tensor(np.maximum(positions, 0).astype(np.int64), device=hidden.device)
    gathered = hidden.gather(1, pos[..., None].expand(-1, -1, hidden.shape[-1]))  # [b, M, d]
    logits = model.cls(gathered).float()  # [b, M, V]: the teacher's MLM head on the masked positions only
    values, ids = logits.topk(top_k, dim=-1)
    lse = logits.logsumexp(-1)
    used = torch.as_tensor(positions >= 0, device=hidden.device)
    return {
        "mlm/topk_ids": (ids * used[..., None]).cpu().numpy(),
        "mlm/topk_logits": (values * used[..., None]).cpu().numpy(),
        "mlm/lse": (lse * used).cpu().numpy(),
    }


def load_corpus(
    text_file: str | None = None, data_file: str | None = None, text_column: str | None = None,
    limit: int | None = None,
) -> Examples:
    """Raw text, one example per non-empty line of `text_file`, or the `text_column` of a table file."""
    if bool(text_file) == bool(data_file):
        raise ConfigError("an LM dump (--objective mlm or clm) reads raw text: pass --text-file (one text per line) "
                          "or --data-file")
    path = Path(text_file or data_file)
    if not path.is_file():
        raise DataError(f"no such file: {path}")
    if text_file:
        texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        columns = _read_table(path)
        name = text_column or next(iter(columns), None)
        if name not in columns:
            raise DataError(f"{path} has no column {name!r}; its columns: {', '.join(columns)}: pass --text-columns")
        texts = [str(v) for v in columns[name] if v is not None and str(v).strip()]
    texts = texts[:limit] if limit else texts
    if not texts:
        raise DataError(f"{path} holds no text")
    return Examples(texts=(texts,), labels=np.full(len(texts), -1), rows=np.arange(len(texts)),
                    source=f"{'text' if text_file else 'table'}:{path}")


def load_mlm_teacher(teacher: str, device: str) -> Any:
    from transformers import AutoModelForMaskedLM

    try:
        model = AutoModelForMaskedLM.from_pretrained(resolve_model(teacher), dtype=torch.float32)
    except Exception as exc:
        raise ModelLoadError(
            f"cannot load a masked-LM teacher from {teacher} ({str(exc).splitlines()[0][:200]}): pass a "
            "BertForMaskedLM checkpoint, e.g. one made by `hsk teacher --objective mlm`"
        ) from None
    if not hasattr(model, "bert") or not hasattr(model, "cls"):
        raise ModelLoadError(f"{teacher} is a {type(model).__name__}; the MLM dump needs a BertForMaskedLM")
    return model.to(device).eval()


def mlm_metadata(corpus: Examples, teacher: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 masking: Masking, max_length: int, top_k: int, shard_rows: int) -> dict:
    cfg = model.config
    return StoreMeta(
        objective=MLM,
        task=TaskRef(MLM, "train"),
        dataset=DataRef(corpus.source, corpus.fingerprint, len(corpus)),
        teacher=TeacherRef(
            teacher, revision=model_revision(teacher), weights_hash=weights_hash(model),
            architecture=type(model).__name__, num_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size,
            vocab_size=cfg.vocab_size, written=MLM_TEACHER_KEYS,
        ),
        tokenizer=TokenizerRef(
            teacher, vocab_hash=vocab_hash(tokenizer), vocab_size=len(tokenizer), cls_id=tokenizer.cls_token_id,
            sep_id=tokenizer.sep_token_id, pad_id=tokenizer.pad_token_id, mask_id=tokenizer.mask_token_id,
            written=MLM_TOKENIZER_KEYS,
        ),
        max_length=max_length,
        selection=masking.to_meta(max_length, top_k),
        layout=Layout.of(len(corpus), top_k, shard_rows),
    ).to_dict()


def compute_mlm_shard(model: PreTrainedModel, enc: dict, rows: np.ndarray, masking: Masking,
                      tokenizer: PreTrainedTokenizerBase, top_k: int, batch_size: int,
                      device: str) -> dict[str, np.ndarray]:
    """Mask one shard's rows and run the teacher on them (length-bucketed), back in row order."""
    arrays = mask_rows(enc, rows, masking, tokenizer)
    n, m = arrays["mlm/positions"].shape
    arrays["mlm/topk_ids"] = np.zeros((n, m, top_k), dtype=np.int64)
    arrays["mlm/topk_logits"] = np.zeros((n, m, top_k), dtype=np.float32)
    arrays["mlm/lse"] = np.zeros((n, m), dtype=np.float32)
    masked = {**enc, "input_ids": arrays["input_ids"]}
    for batch in length_bucketed_batches(enc["length"], batch_size):
        out = teacher_topk(model, batch_inputs(masked, batch, device), arrays["mlm/positions"][batch], top_k)
        for name, value in out.items():
            arrays[name][batch] = value
    return arrays


def dump_mlm(
    teacher: str,
    out: str,
    corpus: Examples,
    *,
    top_k: int = 64,
    masking: Masking = Masking(),
    max_length: int = 128,
    batch_size: int = 32,
    shard_rows: int = 1024,
    device: str = "cpu",
    overwrite: bool = False,
    progress: bool = True,
    log=print,
    extra_meta: dict | None = None,
) -> dict:
    """Write (or finish) the MLM store at `out`; returns its metadata. `extra_meta`: more hsk metadata
    (e.g. `sharing`: licence and creators)."""
    masking.check()
    tokenizer = load_tokenizer(teacher)
    if tokenizer.mask_token_id is None:
        raise ModelLoadError(f"the tokenizer of {teacher} has no [MASK] token: pass a masked-LM teacher")
    model = load_mlm_teacher(teacher, device)
    if not 1 <= top_k <= model.config.vocab_size:
        raise ConfigError(f"--top-k {top_k} must be in 1..{model.config.vocab_size} (the teacher's vocabulary)")
    meta = StoreMeta.parse({**mlm_metadata(corpus, teacher, model, tokenizer, masking, max_length, top_k, shard_rows),
                            **(extra_meta or {})})
    # The same output rule, writer lease and staged --overwrite as every store (hskstore/io/writer.py).
    with writing(out, meta, overwrite=overwrite, software_version=__version__, log=log) as writer:
        if writer.complete:
            log(f"{out} is already complete, nothing to do")
            return writer.meta
        return _write_mlm_shards(writer, out, corpus, model, tokenizer, masking, max_length, top_k, batch_size,
                                 device, progress, log)


def _write_mlm_shards(writer: StoreWriter, out: str, corpus: Examples, model, tokenizer, masking: Masking,
                      max_length: int, top_k: int, batch_size: int, device: str, progress: bool, log) -> dict:
    pending = writer.pending_shards()
    if len(pending) < writer.n_shards:
        log(f"resuming {out}: {writer.n_shards - len(pending)}/{writer.n_shards} shards already written")
    hashes = corpus.text_hashes()
    started = time.perf_counter()
    for shard in tqdm(pending, unit="shard", desc="dump mlm", disable=not progress or None):
        start, stop = writer.shard_bounds(shard)
        enc = encode(tokenizer, (corpus.texts[0][start:stop],), max_length)
        arrays = compute_mlm_shard(model, enc, corpus.rows[start:stop], masking, tokenizer, top_k, batch_size, device)
        arrays.update(row=corpus.rows[start:stop], text_hash=hashes[start:stop], token_type_ids=enc["token_type_ids"],
                      length=enc["length"])
        writer.write_shard(shard, arrays)
    meta = writer.finalize().to_dict()
    log(f"wrote {len(pending)} shards in {time.perf_counter() - started:.1f}s to {out}")
    return meta
