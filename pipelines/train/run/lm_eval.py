"""Held-out perplexity and calibration of a causal LM (`hsk eval MODEL --text-file F`).

The text is packed into blocks exactly as a causal-LM store packs its corpus (documents each followed by
EOS, hskstore.format.clm.pack_blocks) and scored block by block, without overlap: position t predicts token
t + 1 of its block. Token perplexity is exp(mean NLL) over those predictions; word perplexity is
exp(total NLL / words), words counted by whitespace in the text scored, and bits per byte is total NLL / ln 2 /
bytes, the bytes of the text's UTF-8 with one per document's end (its newline): both are comparable across
tokenizers, their denominators the text's. (The first token of each block is predicted from nothing and left
out, as in the token perplexity: a tokenizer with more blocks leaves out a little more text.)
ECE: |accuracy - confidence| of the argmax next token, averaged over 15 equal-width confidence bins weighted
by their counts (Guo et al., 2017).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from hskstore.format.clm import pack_blocks
from pipelines.core.data import DataError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ECE_BINS = 15


def read_documents(text_file: str, limit: int | None = None) -> list[str]:
    path = Path(text_file)
    if path.is_dir():
        raise DataError(f"--text-file {text_file} is a folder: pass a text file, one document per line")
    if not path.is_file():
        raise DataError(f"--text-file {text_file}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"--text-file {text_file} is not UTF-8 text (byte {exc.start}: 0x{exc.object[exc.start]:02x}):"
                        " pass a text file, one document per line") from None
    docs = [line.strip() for line in text.splitlines() if line.strip()]
    docs = docs[:limit] if limit else docs
    if not docs:
        raise DataError(f"--text-file {text_file} holds no text")
    return docs


def ece(confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> float:
    """Expected calibration error of predictions with these confidences and outcomes."""
    which = np.minimum((confidence * bins).astype(np.int64), bins - 1)
    total = 0.0
    for b in range(bins):
        inside = which == b
        if inside.any():
            total += inside.sum() * abs(correct[inside].mean() - confidence[inside].mean())
    return float(total / max(len(confidence), 1))


@torch.no_grad()
def _score(model: PreTrainedModel, blocks: np.ndarray, lengths: np.ndarray, batch_size: int, device: str) -> dict:
    nll, confidence, correct = [], [], []
    for start in range(0, len(blocks), batch_size):
        ids = torch.as_tensor(blocks[start:start + batch_size], device=device)
        length = torch.as_tensor(lengths[start:start + batch_size], device=device)
        logprobs = torch.log_softmax(model(input_ids=ids).logits.float(), -1)[:, :-1]
        labels = ids[:, 1:]
        valid = torch.arange(1, ids.shape[1], device=device)[None, :] < length[:, None]
        picked = logprobs.gather(-1, labels[..., None])[..., 0]
        best, guess = logprobs.max(-1)
        nll.append(-picked[valid].double().cpu())
        confidence.append(best[valid].exp().double().cpu())
        correct.append((guess == labels)[valid].cpu())
    return {"nll": torch.cat(nll).numpy(), "confidence": torch.cat(confidence).numpy(),
            "correct": torch.cat(correct).numpy().astype(np.float64)}


def evaluate_lm(model_dir: str, text_file: str, *, block_size: int = 256, batch_size: int = 8, device: str = "cpu",
                limit: int | None = None) -> dict:
    """Perplexity (token and word level), ECE and counts of `model_dir` on `text_file`."""
    from transformers import AutoModelForCausalLM

    from pipelines.core.models import ModelLoadError, load_tokenizer, resolve_model
    from pipelines.dump.clm import eos_of

    try:
        model = AutoModelForCausalLM.from_pretrained(resolve_model(model_dir), dtype=torch.float32).to(device).eval()
    except Exception as exc:  # transformers raises many kinds; say what to pass instead
        raise ModelLoadError(f"cannot load {model_dir} as a causal LM ({str(exc).splitlines()[0][:200]}): pass a "
                             "folder such as OUT/best of `hsk train --method clm-kd`") from None
    tokenizer = load_tokenizer(model_dir)
    docs = read_documents(text_file, limit)
    encoded = tokenizer(docs, add_special_tokens=False)["input_ids"]
    blocks, lengths = pack_blocks(encoded, block_size, eos_of(tokenizer, model_dir))
    scored = _score(model, blocks, lengths, batch_size, device)
    words = sum(len(doc.split()) for doc in docs)
    size = sum(len(doc.encode("utf-8")) + 1 for doc in docs)
    total, n = float(scored["nll"].sum()), max(len(scored["nll"]), 1)
    return {"model": str(model_dir), "text_file": str(text_file), "block_size": block_size,
            "tokens": int(len(scored["nll"])), "words": words, "nll": total / n, "perplexity": math.exp(total / n),
            "word_perplexity": math.exp(total / max(words, 1)), "bytes": size,
            "bits_per_byte": total / math.log(2) / max(size, 1), "ece": ece(scored["confidence"], scored["correct"]),
            "accuracy": float(scored["correct"].mean())}
