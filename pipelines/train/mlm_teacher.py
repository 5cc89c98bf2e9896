"""An MLM teacher that can be had offline: train a masked-LM head on a base encoder (LightPAFF's teacher).

The MiniLM package ships an encoder without its MLM head. This puts BERT's head on it (dense +
GELU + LayerNorm, then a decoder tied to the word embeddings, as BERT does, plus a bias) and trains
the head, and optionally the top `train_layers` encoder layers, with BERT's masking on in-domain
raw text; everything else stays frozen. Masking is drawn anew each epoch (seeded). The result is
a plain `BertForMaskedLM` checkpoint, which `hsk dump --objective mlm` reads.

The output rule is `hsk teacher`'s (pipelines/train/teacher.py): `--out` must be new, or a teacher
folder with `--overwrite`; training runs in the hidden sibling `.OUT.hsk-train`, checkpointed every
`checkpoint_every` steps and at each epoch's end, so a rerun of the same command resumes (RNG state
included: the resumed run takes the same steps as an uninterrupted one); the teacher folder is
built in a staged sibling and swapped in whole.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from hskstore.config import ConfigError
from pipelines.core.batching import batch_inputs, length_bucketed_batches
from pipelines.core.data import Examples
from pipelines.core.models import ModelLoadError, load_tokenizer, resolve_model, vocab_hash, weights_hash
from pipelines.core.output_kinds import TEACHER
from pipelines.core.run_state import atomic_save, rng_state, set_rng_state
from pipelines.core.tokenize import encode
from pipelines.dump.mlm import Masking, mask_rows
from pipelines.train.teacher import check_numbers, publish_teacher, work_dir

STATE_FILE = "mlm-state.pt"


def _trainable(model: Any, train_layers: int) -> list[torch.nn.Parameter]:
    """The MLM head (transform and bias; the decoder is the tied word embedding, frozen) and the top layers."""
    for p in model.parameters():
        p.requires_grad_(False)
    modules = [model.cls.predictions.transform]
    if train_layers:
        modules += list(model.bert.encoder.layer[-train_layers:])
    params = [p for m in modules for p in m.parameters()] + [model.cls.predictions.bias]
    for p in params:
        p.requires_grad_(True)
    return params


def _mlm_loss(model: Any, inputs: dict, arrays: dict, batch: np.ndarray, device: str) -> tuple[torch.Tensor, int, int]:
    """Mean cross-entropy over the batch's masked positions; (loss, correct, count)."""
    hidden = model.bert(**inputs).last_hidden_state
    pos = torch.as_tensor(arrays["mlm/positions"][batch].astype(np.int64), device=device)
    used = pos >= 0
    gathered = hidden.gather(1, pos.clamp(min=0)[..., None].expand(-1, -1, hidden.shape[-1]))
    logits = model.cls(gathered[used])
    target = torch.as_tensor(arrays["mlm/labels"][batch].astype(np.int64), device=device)[used]
    correct = int((logits.argmax(-1) == target).sum())
    return F.cross_entropy(logits.float(), target), correct, int(used.sum())


def _epoch_arrays(enc: dict, rows: np.ndarray, seed: int, epoch: int, tokenizer: Any) -> dict:
    masking = Masking(mask_seed=int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0]))
    return mask_rows(enc, rows, masking, tokenizer)


def _evaluate(model: Any, enc: dict, arrays: dict, batch_size: int, device: str) -> dict:
    model.eval()
    total, correct, count = 0.0, 0, 0
    masked = {**enc, "input_ids": arrays["input_ids"]}
    with torch.no_grad():
        for batch in length_bucketed_batches(enc["length"], batch_size):
            loss, c, n = _mlm_loss(model, batch_inputs(masked, batch, device), arrays, batch, device)
            total, correct, count = total + float(loss) * n, correct + c, count + n
    return {"loss": _finite(total / max(count, 1)), "accuracy": round(correct / max(count, 1), 6), "tokens": count}


def _finite(x: float) -> float | None:
    """Rounded for the summary; None for a diverged (nan/inf) loss, which JSON cannot hold."""
    return round(float(x), 6) if math.isfinite(x) else None


@dataclass
class _Progress:
    """Where training stands: epochs finished, optimizer steps taken, this epoch's losses so far."""

    epoch: int = 0
    step: int = 0
    losses: list[float] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)


@dataclass
class _Data:
    train: dict
    rows: np.ndarray
    dev: dict
    dev_arrays: dict | None


def _load_model(base: str, train_layers: int, device: str) -> Any:
    from transformers import BertForMaskedLM

    try:
        model = BertForMaskedLM.from_pretrained(resolve_model(base), dtype=torch.float32).to(device)
    except Exception as exc:
        reason = str(exc).splitlines()[0][:200]
        raise ModelLoadError(f"cannot put an MLM head on {base} ({reason}): pass a BERT encoder") from None
    if not 0 <= train_layers <= model.config.num_hidden_layers:
        raise ConfigError(f"--train-layers {train_layers} must be in 0..{model.config.num_hidden_layers}")
    return model


def _split(corpus: Examples, tokenizer: Any, max_length: int, seed: int) -> _Data:
    """The last tenth of the corpus (at most 500 rows) is held out, masked once with the seed."""
    held_out = min(max(len(corpus) // 10, 1), 500) if len(corpus) > 1 else 0
    enc = encode(tokenizer, corpus.texts, max_length)
    split = len(corpus) - held_out
    dev = {k: v[split:] for k, v in enc.items()}
    dev_arrays = mask_rows(dev, corpus.rows[split:], Masking(mask_seed=seed), tokenizer) if held_out else None
    return _Data({k: v[:split] for k, v in enc.items()}, corpus.rows[:split], dev, dev_arrays)


def _restore(path: Path, identity: dict, model: Any, optimizer: Any, log: Callable[[str], Any]) -> _Progress:
    """The progress of an interrupted run of this very command (another run's state is ignored)."""
    if not path.exists():
        return _Progress()
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("identity") != identity:
        log(f"{path} is another run's checkpoint: starting over")
        return _Progress()
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"])
    progress = _Progress(**state["progress"])
    log(f"resuming the MLM head's training from {path} (step {progress.step})")
    return progress


def _save(path: Path, identity: dict, model: Any, optimizer: Any, progress: _Progress) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_save({"identity": identity, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "rng": rng_state(), "progress": asdict(progress)}, path)


def train_mlm_teacher(
    base: str,
    corpus: Examples,
    out: str | Path,
    *,
    train_layers: int = 0,
    epochs: float = 1.0,
    lr: float = 1e-4,
    batch_size: int = 32,
    max_length: int = 128,
    seed: int = 0,
    device: str = "cpu",
    overwrite: bool = False,
    checkpoint_every: int = 100,
    progress: bool = True,
    log: Callable[[str], Any] = print,
    on_step: Callable[[int], Any] | None = None,
) -> dict:
    """Train an MLM head (and the top `train_layers` layers) of `base` on `corpus`; save a BertForMaskedLM.

    `out` follows hsk teacher's output rule; a rerun after an interruption resumes (module docstring).
    `on_step(step)` is called after every optimizer step.
    """
    out = Path(out)
    check_numbers(epochs=epochs, lr=lr, batch_size=batch_size, max_length=max_length)
    TEACHER.claim(str(out), overwrite=overwrite)
    started = time.perf_counter()
    tokenizer = load_tokenizer(base)
    torch.manual_seed(seed)  # the fresh head is drawn from this
    model = _load_model(base, train_layers, device)
    data = _split(corpus, tokenizer, max_length, seed)
    optimizer = torch.optim.AdamW(_trainable(model, train_layers), lr=lr, weight_decay=0.01)
    total_steps = max(1, math.ceil(epochs * math.ceil(len(data.rows) / batch_size)))
    identity = {"objective": "mlm", "base": base, "corpus": corpus.fingerprint, "train_layers": train_layers,
                "epochs": epochs, "lr": lr, "batch_size": batch_size, "max_length": max_length, "seed": seed}
    state_path = work_dir(out) / STATE_FILE
    done = _restore(state_path, identity, model, optimizer, log)
    while done.step < total_steps or done.losses:  # losses left: the last epoch's end was not recorded yet
        _train_epoch(model, optimizer, data, done, tokenizer, total_steps, batch_size, seed, device, progress,
                     lambda: _save(state_path, identity, model, optimizer, done), checkpoint_every, on_step)
        dev = _evaluate(model, data.dev, data.dev_arrays, batch_size, device) if data.dev_arrays else {}
        done.history.append({"epoch": done.epoch + 1, "step": done.step,
                             "train_loss": _finite(np.mean(done.losses)), "dev": dev})
        log(f"epoch {done.epoch + 1}: train loss {done.history[-1]['train_loss']}; held-out masked tokens {dev}")
        done.epoch, done.losses = done.epoch + 1, []
        _save(state_path, identity, model, optimizer, done)
    summary = {
        "format": "hsk-teacher/1", "objective": "mlm", "base": base, "base_resolved": resolve_model(base),
        "train_layers": train_layers, "epochs": epochs, "lr": lr, "batch_size": batch_size, "seed": seed,
        "max_length": max_length, "train_rows": len(data.rows), "held_out_rows": len(corpus) - len(data.rows),
        "corpus": corpus.source, "corpus_fingerprint": corpus.fingerprint, "history": done.history,
        "dev_metrics": done.history[-1]["dev"], "steps": done.step, "weights_hash": weights_hash(model),
        "vocab_hash": vocab_hash(tokenizer), "train_seconds": round(time.perf_counter() - started, 2),
    }

    def fill(folder: Path) -> None:
        model.eval().save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    publish_teacher(out, fill, summary, objective="mlm")
    shutil.rmtree(work_dir(out), ignore_errors=True)
    return summary


def _train_epoch(model: Any, optimizer: Any, data: _Data, done: _Progress, tokenizer: Any, total_steps: int,
                 batch_size: int, seed: int, device: str, progress: bool, save: Callable[[], None],
                 checkpoint_every: int, on_step: Callable[[int], Any] | None) -> None:
    """Run the rest of epoch `done.epoch` (masking and order are functions of the seed and the epoch,
    so the batches already taken are skipped, not redrawn)."""
    arrays = _epoch_arrays(data.train, data.rows, seed, done.epoch, tokenizer)
    masked = {**data.train, "input_ids": arrays["input_ids"]}
    batches = length_bucketed_batches(data.train["length"], batch_size, shuffle_seed=seed * 1000 + done.epoch)
    first, stop = len(done.losses), total_steps - (done.step - len(done.losses))
    model.train()
    for batch in tqdm(batches[first:stop], desc=f"mlm epoch {done.epoch + 1}", disable=not progress or None,
                      initial=first, total=min(stop, len(batches))):
        loss, _, _ = _mlm_loss(model, batch_inputs(masked, batch, device), arrays, batch, device)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        done.losses.append(float(loss.detach()))
        done.step += 1
        if done.step % checkpoint_every == 0:
            save()
        if on_step is not None:
            on_step(done.step)
