"""The compute of the token-classification kind (torch): its dump, its `hsk train` run plan (feed, student, loss)
and its evaluation. hsk imports this module through the entry points hsk_tokcls.run_kind names, when used."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from hskstore import __version__, open_store
from hskstore.errors import UserError
from hskstore.format.meta import DataRef, Layout, StoreMeta, TaskRef, TeacherRef, TokenizerRef
from hskstore.io.writer import StoreWriter, writing
from pipelines.core.batching import batch_inputs, length_bucketed_batches
from pipelines.core.data import Examples
from pipelines.core.models import (
    ModelLoadError,
    load_tokenizer,
    model_revision,
    resolve_model,
    vocab_hash,
    weights_hash,
)
from pipelines.core.tokenize import encode
from pipelines.registry import Stage
from pipelines.train.kinds.store_run import plan_store_run
from pipelines.train.losses.terms import Counter, TermInputs, local_count, loss_term
from pipelines.train.run.driver import RunRequest
from pipelines.train.run.loop import RunParts
from pipelines.train.students.adapter import StudentOutputs, student_adapter

from .method import HEAD, LOSS
from .reader import TokClsStore
from .store_kind import GROUP, NAME, TokClsSelection

TEACHER_KEYS = ("name", "revision", "weights_hash", "architecture", "num_layers", "hidden_size", "vocab_size",
                "num_labels")
TOKENIZER_KEYS = ("name", "vocab_hash", "vocab_size", "cls_id", "sep_id", "pad_id")
Log = Callable[[str], object]


# --------------------------------------------------------------------------------------------------
# The loss: pure torch


def token_kl(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor, ids: torch.Tensor | None,
             mask: torch.Tensor, count: Counter = local_count) -> torch.Tensor:
    """KL(teacher || student) per real token, averaged over them. student_logits [B, T, C]; teacher_logprobs
    [B, T, K]: every label's in label order (ids None, K = C), or the top-k labels' with their `ids` [B, T, K], the
    other labels then one bucket on both sides (1 - the sum); mask [B, T] bool: the real tokens."""
    log_q = F.log_softmax(student_logits.float(), dim=-1)
    log_p = teacher_logprobs.float()
    p = log_p.exp()
    if ids is None:
        kl = (p * (log_p - log_q)).sum(-1)
    else:
        log_qk = log_q.gather(-1, ids.long())
        p_tail = (1.0 - p.sum(-1)).clamp(min=0.0)
        q_tail = (1.0 - log_qk.exp().sum(-1)).clamp(min=1e-12)
        kl = (p * (log_p - log_qk)).sum(-1) + torch.xlogy(p_tail, p_tail) - p_tail * q_tail.log()
    weight = mask.to(kl.dtype)
    return (kl * weight).sum() / count(weight.sum())


@loss_term(LOSS)
def term_tokcls_kl(x: TermInputs) -> torch.Tensor:
    return token_kl(x.outputs.logits, x.batch["tokcls_logprobs"], x.batch.get("tokcls_ids"), x.batch["token_mask"],
                    x.count)


# --------------------------------------------------------------------------------------------------
# The dump: the teacher once over raw text


def read_texts(text_file: str | None, limit: int | None) -> Examples:
    if not text_file:
        raise UserError("a token-classification dump reads raw text: pass --set text_file=FILE (one text a line)")
    path = Path(text_file)
    if not path.is_file():
        raise UserError(f"--set text_file={text_file}: no such file")
    texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()][:limit]
    if not texts:
        raise UserError(f"{text_file} holds no text")
    return Examples(texts=(texts,), labels=np.full(len(texts), -1), rows=np.arange(len(texts)), source=f"text:{path}")


def load_token_classifier(name: str, device: str = "cpu") -> Any:
    from transformers import AutoModelForTokenClassification

    try:
        model = AutoModelForTokenClassification.from_pretrained(resolve_model(name), dtype=torch.float32)
    except Exception as exc:  # transformers raises many kinds: say what to pass
        raise ModelLoadError(f"cannot load a token classifier from {name} ({str(exc).splitlines()[0][:160]}): pass "
                             "an AutoModelForTokenClassification checkpoint") from None
    return model.to(device).eval()


def parse_support(text: str, labels: int) -> TokClsSelection | None:
    """`topk:K` or `full` as the selection it keeps (None: not one of them)."""
    match = re.fullmatch(r"topk:(\d+)|full", text.strip())
    if match is None:
        return None
    k = int(match.group(1)) if match.group(1) else labels
    return TokClsSelection("topk" if match.group(1) else "full", k, tuple(str(i) for i in range(labels)))


def tokcls_metadata(corpus: Examples, teacher: str, model: Any, tokenizer: Any, selection: TokClsSelection,
                    max_length: int, shard_rows: int) -> dict:
    cfg = model.config
    return StoreMeta(
        objective=NAME, task=TaskRef(NAME, "train"), dataset=DataRef(corpus.source, corpus.fingerprint, len(corpus)),
        teacher=TeacherRef(teacher, revision=model_revision(teacher), weights_hash=weights_hash(model),
                           architecture=type(model).__name__, num_layers=cfg.num_hidden_layers,
                           hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size, num_labels=cfg.num_labels,
                           written=TEACHER_KEYS),
        tokenizer=TokenizerRef(teacher, vocab_hash=vocab_hash(tokenizer), vocab_size=len(tokenizer),
                               cls_id=tokenizer.cls_token_id, sep_id=tokenizer.sep_token_id,
                               pad_id=tokenizer.pad_token_id, written=TOKENIZER_KEYS),
        max_length=max_length, selection=selection.to_dict(),
        layout=Layout.of(len(corpus), selection.top_k, shard_rows),
    ).to_dict()


@torch.no_grad()
def teacher_labels(model: Any, enc: dict[str, np.ndarray], selection: TokClsSelection, batch_size: int,
                   device: str) -> dict[str, np.ndarray]:
    """Per real token, the teacher's log-probs (top-k with their ids, or all), zeros past each row's length."""
    n, t = enc["input_ids"].shape
    out = {f"{GROUP}/logprobs": np.zeros((n, t, selection.top_k), dtype=np.float32)}
    if selection.support == "topk":
        out[f"{GROUP}/ids"] = np.zeros((n, t, selection.top_k), dtype=np.uint8)
    for batch in length_bucketed_batches(enc["length"], batch_size):
        inputs = batch_inputs(enc, batch, device)
        logprobs = F.log_softmax(model(**inputs).logits.float(), dim=-1)
        real = inputs["attention_mask"].bool()[..., None]
        width = logprobs.shape[1]
        if selection.support == "topk":
            logprobs, ids = logprobs.topk(selection.top_k, dim=-1)
            out[f"{GROUP}/ids"][batch, :width] = (ids * real).cpu().numpy()
        out[f"{GROUP}/logprobs"][batch, :width] = (logprobs * real).cpu().numpy()
    return out


def dump_tokcls(teacher: str, out: str, corpus: Examples, support: str, *, max_length: int, batch_size: int,
                shard_rows: int, device: str, overwrite: bool, progress: bool, log: Log, extra_meta: dict) -> dict:
    tokenizer = load_tokenizer(teacher)
    model = load_token_classifier(teacher, device)
    selection = parse_support(support, model.config.num_labels)
    if selection is None or not 1 <= selection.top_k <= model.config.num_labels:
        raise UserError(f"--set support={support}: pass topk:K (K in 1..{model.config.num_labels}, the teacher's "
                        "labels) or full")
    labels = tuple(str(model.config.id2label[i]) for i in range(model.config.num_labels))
    selection = TokClsSelection(selection.support, selection.top_k, labels)
    meta = StoreMeta.parse({**tokcls_metadata(corpus, teacher, model, tokenizer, selection, max_length, shard_rows),
                            **extra_meta})
    with writing(out, meta, overwrite=overwrite, software_version=__version__, log=log) as writer:
        if writer.complete:
            log(f"{out} is already complete, nothing to do")
            return writer.meta
        return _write_shards(writer, out, corpus, model, tokenizer, selection, max_length, batch_size, device,
                             progress, log)


def _write_shards(writer: StoreWriter, out: str, corpus: Examples, model: Any, tokenizer: Any,
                  selection: TokClsSelection, max_length: int, batch_size: int, device: str, progress: bool,
                  log: Log) -> dict:
    pending, hashes, started = writer.pending_shards(), corpus.text_hashes(), time.perf_counter()
    for shard in tqdm(pending, unit="shard", desc="dump tokcls", disable=not progress or None):
        start, stop = writer.shard_bounds(shard)
        enc = encode(tokenizer, (corpus.texts[0][start:stop],), max_length)
        arrays = teacher_labels(model, enc, selection, batch_size, device)
        arrays.update(row=corpus.rows[start:stop], text_hash=hashes[start:stop], input_ids=enc["input_ids"],
                      token_type_ids=enc["token_type_ids"], length=enc["length"])
        writer.write_shard(shard, arrays)
    meta = writer.finalize().to_dict()
    log(f"wrote {len(pending)} shards in {time.perf_counter() - started:.1f}s to {out}")
    return meta


# --------------------------------------------------------------------------------------------------
# `hsk train`: the feed, the student, the run plan


def token_batch(raw: dict[str, np.ndarray], device: str) -> dict[str, torch.Tensor]:
    """A stream batch as the student's inputs and the stored targets, trimmed to its longest row."""
    length = raw["length"].astype(np.int64)
    t = max(int(length.max()), 1)
    mask = np.arange(t)[None, :] < length[:, None]
    batch = {"input_ids": torch.as_tensor(raw["input_ids"][:, :t].astype(np.int64), device=device),
             "token_type_ids": torch.as_tensor(raw["token_type_ids"][:, :t].astype(np.int64), device=device),
             "attention_mask": torch.as_tensor(mask.astype(np.int64), device=device),
             "token_mask": torch.as_tensor(mask, device=device),
             "tokcls_logprobs": torch.as_tensor(raw[f"{GROUP}/logprobs"][:, :t], device=device)}
    if f"{GROUP}/ids" in raw:
        batch["tokcls_ids"] = torch.as_tensor(raw[f"{GROUP}/ids"][:, :t].astype(np.int64), device=device)
    return batch


class _Maker:
    def __init__(self, device: str):
        self.device = device

    def __call__(self, raw: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return token_batch(raw, self.device)

    def close(self) -> None:
        pass


@dataclass
class TokenFeed:
    """A stage reading "tokcls" streams the word-pieces and the stored label distributions."""

    store: TokClsStore

    def names(self, stage: Stage, kept: list[int]) -> list[str]:
        return [n for n in ("input_ids", "token_type_ids", "length", f"{GROUP}/logprobs", f"{GROUP}/ids")
                if n in self.store.specs]

    def maker(self, stage: Stage, kept: list[int], device: str, stream: Any) -> _Maker:
        return _Maker(device)


def token_student(student: str, teacher: Callable[[], str]) -> tuple[Any, str, str]:
    """(model, where its tokenizer is, init): bert<k> = the teacher's first k layers and its classifier; else a
    saved token classifier."""
    match = re.fullmatch(r"bert(\d+)", student.strip().lower())
    if match is None:
        return load_token_classifier(student).train(), resolve_model(student), f"token classifier {student}"
    from transformers import AutoModelForTokenClassification

    source = resolve_model(teacher())
    model = AutoModelForTokenClassification.from_pretrained(source, num_hidden_layers=int(match.group(1)))
    return model.train(), source, f"first {match.group(1)} layers + classifier of {source}"


@student_adapter(HEAD)
def token_outputs(model: torch.nn.Module, runner: torch.nn.Module | None, batch: dict,
                  outputs: tuple[str, ...]) -> StudentOutputs:
    """A token classifier's student forward: its logits at every word-piece, [B, T, labels] (the loss keeps the
    real ones); no segments, whatever the model's type vocabulary."""
    out = (runner or model)(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return StudentOutputs(out.logits)


def prepare(request: RunRequest) -> RunParts:
    """The plan, student and feed of a run from a token-classification store, every check done first."""
    options, student, device, log = request.options, request.student, request.device, request.log
    plan = plan_store_run(request, "a token-classification store (`hsk dump --objective tokcls`)")
    labels = plan.store.labelling.labels
    teacher = lambda: plan.source.teacher_path(options.teacher, load=load_token_classifier)  # noqa: E731
    model, tokenizer_source, init = token_student(student, teacher)
    if model.config.num_labels != len(labels):
        raise UserError(f"--student {student} has {model.config.num_labels} labels, the store's teacher "
                        f"{len(labels)} ({', '.join(labels)}): pass a token classifier with the teacher's labels")
    tokenizer = load_tokenizer(tokenizer_source)
    if vocab_hash(tokenizer) != plan.source.metadata.tokenizer.vocab_hash:
        raise UserError(f"--student {student}: its tokenizer is not the store's; per-token KD needs the same "
                        "word-pieces (use the teacher's tokenizer)")
    log(f"tokcls-kd: {init}; {len(plan.store)} rows")
    info = plan.student_info(student, "hf", init, student, model, tokenizer)
    return plan.parts(student, info, model, HEAD, TokenFeed(plan.store), device, 16,
                      f"evaluate it: hsk eval OUT/best --objective {NAME} --set store=HELD_OUT.zarr")


# --------------------------------------------------------------------------------------------------
# `hsk eval MODEL --objective tokcls --set store=S`: agreement with the teacher on a held-out store


@torch.no_grad()
def evaluate_on_store(model_name: str, store_url: str, *, batch_size: int, device: str,
                      limit: int | None) -> dict[str, float]:
    """Token agreement (the student's top label is the teacher's) and the per-token KL, over the store's rows."""
    store = open_store(store_url)
    if not isinstance(store, TokClsStore):
        raise UserError(f"--set store={store_url} is a {store.objective} store: pass a token-classification store "
                        "(`hsk dump --objective tokcls`)")
    model = load_token_classifier(model_name, device)
    if vocab_hash(load_tokenizer(resolve_model(model_name))) != store.metadata.tokenizer.vocab_hash:
        raise UserError(f"{model_name}: its tokenizer is not the one {store_url} was tokenized with")
    rows = min(len(store), limit or len(store))
    agree = tokens = 0
    kl_sum = 0.0
    for start in range(0, rows, batch_size):
        batch = token_batch(store.read(slice(start, min(start + batch_size, rows))), device)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       token_type_ids=batch["token_type_ids"]).logits
        ids = batch.get("tokcls_ids")
        teacher_top = ids[..., 0] if ids is not None else batch["tokcls_logprobs"].argmax(-1)
        mask = batch["token_mask"]
        n = int(mask.sum())
        agree += int(((logits.argmax(-1) == teacher_top) & mask).sum())
        kl_sum += float(token_kl(logits, batch["tokcls_logprobs"], ids, mask)) * n
        tokens += n
    return {"agreement": agree / max(tokens, 1), "kl": kl_sum / max(tokens, 1), "tokens": tokens, "rows": rows}


def evaluate(model: str, store: str | None, common: Any, device: str, log: Log) -> None:
    if not store:
        raise UserError(f"hsk eval --objective {NAME} needs --set store=STORE (a token-classification store of "
                        "held-out text)")
    result = evaluate_on_store(model, store, batch_size=common.batch_size, device=device, limit=common.limit)
    if common.as_json:
        log(json.dumps(result, indent=2))
        return
    log(f"{store}: token agreement with the teacher {result['agreement']:.4f} ({result['tokens']} word-pieces, "
        f"{result['rows']} rows), per-token KL {result['kl']:.4f}")
