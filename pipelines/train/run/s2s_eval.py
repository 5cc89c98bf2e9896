"""BLEU, chrF and target perplexity of a seq2seq model on held-out pairs (`hsk eval MODEL --pairs-file F`).

The model decodes each source greedily (up to --max-target tokens, as a store's teacher decodes; a
decoder-only model after the same prompt template as its store) and its outputs are scored against the
references with sacrebleu's corpus BLEU and chrF on the detokenized text (its default tokenizer 13a; no
download). Perplexity is exp(mean NLL) of the reference's tokens under teacher forcing, EOS included.
"""

from __future__ import annotations

import importlib.util
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hskstore.format.seq2seq import Decoding, Seq2seqSelection
from pipelines.core.data import DataError
from pipelines.core.pair_models import PairModel, architecture_of, pair_model

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _sacrebleu() -> Any:
    if importlib.util.find_spec("sacrebleu") is None:
        raise DataError("BLEU and chrF need sacrebleu: pip install -e \".[seq2seq]\" (or pip install sacrebleu)")
    import sacrebleu

    return sacrebleu


@torch.no_grad()
def _nll(model: PreTrainedModel, arch: PairModel, arrays: dict[str, np.ndarray], sel: Seq2seqSelection, batch_size: int,
         device: str) -> np.ndarray:
    """The reference tokens' negative log-likelihoods, one per real token."""
    out = []
    for s in range(0, len(arrays["source_ids"]), batch_size):
        part = {name: values[s:s + batch_size] for name, values in arrays.items()}
        inputs = arch.inputs(part["source_ids"], part["source_length"].astype(np.int64), part["reference_ids"],
                             part["reference_length"].astype(np.int64), sel, device)
        logprobs = torch.log_softmax(inputs.target_logits(model(**inputs.kwargs).logits).float(), -1)
        target = torch.as_tensor(part["reference_ids"].astype(np.int64), device=device)
        real = torch.arange(target.shape[1], device=device)[None, :] < torch.as_tensor(part["reference_length"],
                                                                                      device=device)[:, None]
        out.append(-logprobs.gather(-1, target[..., None])[..., 0][real].double().cpu().numpy())
    return np.concatenate(out)


def evaluate_pairs(model_dir: str, pairs: Any, *, prompt: str | None = None, max_source: int = 128,
                   max_target: int = 64, batch_size: int = 16, device: str = "cpu") -> dict:
    """BLEU, chrF, perplexity and a few outputs of `model_dir` on `pairs` (Examples of source and target)."""
    from pipelines.core.models import load_tokenizer
    from pipelines.dump.seq2seq import DEFAULT_PROMPT, tokenize_pairs

    sacrebleu = _sacrebleu()
    architecture = architecture_of(model_dir)
    arch = pair_model(architecture)
    model = arch.load(model_dir, device)
    tokenizer = load_tokenizer(model_dir)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    start = getattr(model.config, "decoder_start_token_id", None)
    sel = Seq2seqSelection.make(
        None, Decoding("greedy", 1, max_target), architecture=architecture, vocab_size=model.config.vocab_size,
        max_source=max_source, max_target=max_target, eos_id=eos, pad_id=pad,
        decoder_start_id=start if architecture == "encoder-decoder" else None,
        prompt=(prompt or DEFAULT_PROMPT) if architecture == "decoder-only" else None)
    arrays = tokenize_pairs(tokenizer, pairs, sel)
    outputs = []
    for s in range(0, len(pairs), batch_size):
        part = slice(s, s + batch_size)
        outputs += arch.generate(model, arrays["source_ids"][part], arrays["source_length"][part], sel.decoded, sel)
    hypotheses = [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in outputs]
    references = [target.strip() for target in pairs.texts[1]]
    nll = _nll(model, arch, arrays, sel, batch_size, device)
    return {"model": str(model_dir), "pairs": len(pairs), "source": pairs.source, "architecture": architecture,
            "prompt": sel.prompt, "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
            "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score, "nll": float(nll.mean()),
            "perplexity": math.exp(float(nll.mean())), "reference_tokens": int(len(nll)),
            "output_tokens": int(sum(len(o) for o in outputs)),
            "examples": [{"source": src, "reference": ref, "output": hyp}
                         for src, ref, hyp in list(zip(pairs.texts[0], references, hypotheses))[:3]]}


def stored_prompt(model_dir: str) -> tuple[str | None, str | None]:
    """(the prompt template of the store a student was trained from, the line that says so): what `hsk eval
    --pairs-file` uses without --prompt, read through best/hsk_student.json's source store. (None, None) for a
    model that no hsk run saved, or whose store is not there now; the teacher's default then applies."""
    import json
    from pathlib import Path

    from hskstore import open_store

    try:
        source = json.loads((Path(model_dir) / "hsk_student.json").read_text(encoding="utf-8")).get("source")
        store = open_store(str(source))
        prompt = store.metadata.selection.get("prompt")
    except Exception:  # no card, no store, not a seq2seq store: nothing recorded to use
        return None, None
    if not prompt:
        return None, None
    return prompt, f"prompt: {prompt!r}, the one {source} was dumped with (--prompt to give another)"
