"""ROSITA students: prune a fine-tuned BERT teacher into a small student, then distil it from a store.

ROSITA (Liu et al., 2021; the student of the Marginal-Utility paper, METHOD.md section 6) compresses
a fine-tuned teacher along four dimensions, directly on its parameters:

- depth: keep the bottom `layers` layers (their pooler and classifier stay);
- attention heads: keep, per layer, the `heads` heads of highest importance;
- FFN: keep, per layer, the `ffn` intermediate neurons of highest importance;
- word embedding: factorise E [V, d] by truncated SVD, E ~ (U_r diag(s_r)) V_r^T, stored as a
  [V, r] table and a Linear(r -> d) holding V_r.

Importance of a weight w is |w| * G(w), G = sum over the batches of one epoch of |dL/dw|, where L is
the teacher's own task loss (cross-entropy to the gold labels; MSE for a regression task), averaged
over the batch. The teacher is frozen: no parameter is updated, and it runs in eval mode (no
dropout), so the scores are deterministic. A head's score sums its query, key and value rows
(weights and biases) and its columns of the attention output projection; a neuron's score sums its
row of the intermediate projection (weight and bias) and its column of the output projection.
Importance is computed on the whole teacher, whose classifier reads its top layer; the bottom
layers' scores are then used.

Pure functions: `importance_from_grads`, `top_indices`, `factorise_embedding`, `prune_teacher`,
`merge_export`, `parameter_count`; the gradient pass is `accumulate_abs_grads`; `build_rosita`
runs the whole build and `save_rosita` writes the folder (see `MODEL_CARD`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, BertForSequenceClassification

from hskstore.format.config import ConfigError
from hskstore.io.outputs import mark_output, staged_replace
from pipelines.core.batching import batch_inputs, length_bucketed_batches
from pipelines.core.data import DataError, load_examples
from pipelines.core.models import (
    ModelLoadError,
    is_classifier,
    load_classifier,
    load_config,
    load_tokenizer,
    resolve_model,
    vocab_hash,
    weights_hash,
)
from pipelines.core.output_kinds import STUDENT
from pipelines.core.pruned_bert import HskBertConfig, HskBertForSequenceClassification
from pipelines.core.tasks import get_task
from pipelines.core.tokenize import encode

if TYPE_CHECKING:
    from transformers import PreTrainedConfig, PreTrainedTokenizerBase

PLAIN_DIR = "plain"  # inside the build folder: the export plain transformers loads
SUMMARY_FILE = "hsk_rosita.json"
OUTPUT_KIND = STUDENT.name  # what `hsk student build --out` holds (pipelines.core.output_kinds)
_LAYER = "bert.encoder.layer.{}."


@dataclass(frozen=True)
class RositaShape:
    """What to keep: bottom `layers` layers, `heads` heads and `ffn` neurons per layer, embedding rank."""

    layers: int
    heads: int
    ffn: int
    emb_rank: int  # 0 keeps the full embedding table

    def check(self, config: PreTrainedConfig) -> None:
        """ConfigError (one line, says what to pass) unless the teacher can be cut to this shape."""
        limits = {
            "--student-layers": (self.layers, 1, config.num_hidden_layers),
            "--heads": (self.heads, 1, config.num_attention_heads),
            "--ffn": (self.ffn, 1, config.intermediate_size),
            "--emb-rank": (self.emb_rank, 0, min(config.vocab_size, config.hidden_size)),
        }
        for flag, (value, low, high) in limits.items():
            if not low <= value <= high:
                raise ConfigError(f"{flag} {value} is out of range for this teacher: pass {low}..{high}")


# --------------------------------------------------------------------------------------------------
# Importance


def _tracked(layers: int) -> list[str]:
    names = []
    for i in range(layers):
        p = _LAYER.format(i)
        for part in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "intermediate.dense"):
            names += [f"{p}{part}.weight", f"{p}{part}.bias"]
        names += [f"{p}attention.output.dense.weight", f"{p}output.dense.weight"]
    return names


def accumulate_abs_grads(
    model: BertForSequenceClassification,
    batches: Iterable[tuple[dict, torch.Tensor]],
    layers: int,
    *,
    regression: bool = False,
) -> dict[str, torch.Tensor]:
    """G(w) = sum over `batches` of |dL/dw| for the attention and FFN weights of the bottom `layers` layers.

    L is the model's task loss on each batch (mean cross-entropy to the gold labels, or mean squared
    error for regression). The model is frozen: eval mode, no parameter changes.
    """
    model.eval()
    params = dict(model.named_parameters())
    names = _tracked(layers)
    sums = {n: torch.zeros_like(params[n], dtype=torch.float64) for n in names}
    for inputs, target in batches:
        logits = model(**inputs).logits.float()
        loss = F.mse_loss(logits.squeeze(-1), target.float()) if regression else F.cross_entropy(logits, target)
        grads = torch.autograd.grad(loss, [params[n] for n in names])
        for n, g in zip(names, grads):
            sums[n] += g.detach().abs().double()
    return sums


@dataclass
class Importance:
    heads: np.ndarray  # [layers, H]
    neurons: np.ndarray  # [layers, F]


def importance_from_grads(
    model: BertForSequenceClassification, grad_sums: dict[str, torch.Tensor], layers: int
) -> Importance:
    """Per-head and per-neuron importance: sums of |w| * G(w) over each structure's weights (module doc)."""
    params = dict(model.named_parameters())
    n_heads = model.config.num_attention_heads

    def score(name: str) -> torch.Tensor:
        return params[name].detach().double().abs() * grad_sums[name]

    heads, neurons = [], []
    for i in range(layers):
        p = _LAYER.format(i)
        head = torch.zeros(n_heads, dtype=torch.float64)
        for part in ("query", "key", "value"):
            head += score(f"{p}attention.self.{part}.weight").reshape(n_heads, -1).sum(1)
            head += score(f"{p}attention.self.{part}.bias").reshape(n_heads, -1).sum(1)
        out = score(f"{p}attention.output.dense.weight")  # [d, H * head_size]
        head += out.reshape(out.shape[0], n_heads, -1).sum((0, 2))
        neuron = score(f"{p}intermediate.dense.weight").sum(1) + score(f"{p}intermediate.dense.bias")
        neuron += score(f"{p}output.dense.weight").sum(0)
        heads.append(head.numpy())
        neurons.append(neuron.numpy())
    return Importance(heads=np.stack(heads), neurons=np.stack(neurons))


def top_indices(scores: np.ndarray, k: int) -> list[int]:
    """The k highest-scoring indices (ties: the lower index), in increasing index order."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    return sorted(int(i) for i in order[:k])


# --------------------------------------------------------------------------------------------------
# Pruning, factorisation, export


def factorise_embedding(table: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated SVD of a [V, d] table: (factors [V, r] = U_r diag(s_r), projection weight [d, r] = V_r).

    factors @ projection.T is the best rank-r approximation of the table; computed in float64.
    """
    u, s, vh = torch.linalg.svd(table.detach().double(), full_matrices=False)
    factors = u[:, :rank] * s[:rank]
    return factors.to(table.dtype).contiguous(), vh[:rank].T.to(table.dtype).contiguous()


def _rows(heads: list[int], head_size: int) -> torch.Tensor:
    return torch.tensor([h * head_size + j for h in heads for j in range(head_size)], dtype=torch.long)


def _student_config(teacher_config: BertConfig, shape: RositaShape, kept_heads: list[list[int]]) -> HskBertConfig:
    fields = teacher_config.to_dict()
    for key in ("model_type", "architectures", "transformers_version", "pruned_heads", "embedding_rank"):
        fields.pop(key, None)
    n_heads = teacher_config.num_attention_heads
    pruned = {i: [h for h in range(n_heads) if h not in kept] for i, kept in enumerate(kept_heads)}
    fields.update(
        num_hidden_layers=shape.layers,
        intermediate_size=shape.ffn,
        pruned_heads={i: heads for i, heads in pruned.items() if heads},
        embedding_rank=shape.emb_rank,
        architectures=["HskBertForSequenceClassification"],
    )
    return HskBertConfig(**fields)


def _layer_state(
    teacher: dict[str, torch.Tensor], i: int, heads: list[int], neurons: list[int], head_size: int
) -> dict[str, torch.Tensor]:
    p, rows, cols = _LAYER.format(i), _rows(heads, head_size), torch.tensor(neurons, dtype=torch.long)
    state = {}
    for part in ("query", "key", "value"):
        for kind in ("weight", "bias"):
            name = f"{p}attention.self.{part}.{kind}"
            state[name] = teacher[name].index_select(0, rows)
    state[f"{p}attention.output.dense.weight"] = teacher[f"{p}attention.output.dense.weight"].index_select(1, rows)
    state[f"{p}intermediate.dense.weight"] = teacher[f"{p}intermediate.dense.weight"].index_select(0, cols)
    state[f"{p}intermediate.dense.bias"] = teacher[f"{p}intermediate.dense.bias"].index_select(0, cols)
    state[f"{p}output.dense.weight"] = teacher[f"{p}output.dense.weight"].index_select(1, cols)
    for name in ("attention.output.dense.bias", "attention.output.LayerNorm.weight",
                 "attention.output.LayerNorm.bias", "output.dense.bias", "output.LayerNorm.weight",
                 "output.LayerNorm.bias"):
        state[p + name] = teacher[p + name]
    return state


def prune_teacher(
    teacher: BertForSequenceClassification,
    shape: RositaShape,
    kept_heads: list[list[int]],
    kept_neurons: list[list[int]],
) -> HskBertForSequenceClassification:
    """The ROSITA student: the teacher's bottom layers with exactly `kept_heads` / `kept_neurons` per
    layer (sorted teacher indices) and, when `shape.emb_rank` > 0, the SVD-factorised word embedding."""
    config = _student_config(teacher.config, shape, kept_heads)
    head_size = teacher.config.hidden_size // teacher.config.num_attention_heads
    source = {k: v.detach() for k, v in teacher.state_dict().items()}
    state = {
        k: v for k, v in source.items()
        if not k.startswith("bert.encoder.layer.") and k != "bert.embeddings.word_embeddings.weight"
    }
    table = source["bert.embeddings.word_embeddings.weight"]
    if shape.emb_rank:
        factors, project = factorise_embedding(table, shape.emb_rank)
        state["bert.embeddings.word_embeddings.factors.weight"] = factors
        state["bert.embeddings.word_embeddings.project.weight"] = project
    else:
        state["bert.embeddings.word_embeddings.weight"] = table
    for i in range(shape.layers):
        state.update(_layer_state(source, i, kept_heads[i], kept_neurons[i], head_size))
    student = HskBertForSequenceClassification(config)
    student.load_state_dict(state, strict=True)
    return student.eval()


def merge_export(student: HskBertForSequenceClassification) -> BertForSequenceClassification:
    """The same function as a plain BertForSequenceClassification (transformers' own class).

    The embedding factors are multiplied back into one table. transformers 5 has no pruned heads, so
    each layer keeps the teacher's head grid with the removed heads' query, key and value rows and
    output-projection columns set to zero: a zero value projection makes a head contribute exactly
    nothing, so the logits are those of the pruned model (up to float rounding of the embedding).
    """
    config = student.config
    fields = config.to_dict()
    for key in ("model_type", "architectures", "transformers_version", "pruned_heads", "embedding_rank"):
        fields.pop(key, None)
    plain = BertForSequenceClassification(BertConfig(**fields, architectures=["BertForSequenceClassification"]))
    n_heads, d = config.num_attention_heads, config.hidden_size
    head_size = d // n_heads
    state = {k: v.detach().clone() for k, v in student.state_dict().items()}
    embedding = student.bert.embeddings.word_embeddings
    if config.embedding_rank:
        for part in ("factors", "project"):
            del state[f"bert.embeddings.word_embeddings.{part}.weight"]
        state["bert.embeddings.word_embeddings.weight"] = embedding.merged().detach()
    for i in range(config.num_hidden_layers):
        removed = config.removed_heads(i)
        if not removed:
            continue
        rows = _rows([h for h in range(n_heads) if h not in removed], head_size)
        p = _LAYER.format(i)
        for part in ("query", "key", "value"):
            for kind, shape in (("weight", (n_heads * head_size, d)), ("bias", (n_heads * head_size,))):
                name = f"{p}attention.self.{part}.{kind}"
                state[name] = torch.zeros(shape, dtype=state[name].dtype).index_copy_(0, rows, state[name])
        name = f"{p}attention.output.dense.weight"
        state[name] = torch.zeros((d, n_heads * head_size), dtype=state[name].dtype).index_copy_(1, rows, state[name])
    plain.load_state_dict(state, strict=True)
    return plain.eval()


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------------
# The build: data, gradient pass, pruning, saving

MODEL_CARD = """# ROSITA student of {teacher}

Built by `hsk student build rosita` from the fine-tuned teacher `{teacher}` (task {task}).

| | teacher | this student |
|---|---:|---:|
| layers | {t_layers} | {layers} (the bottom ones) |
| attention heads per layer | {t_heads} | {heads} (head size {head_size}) |
| FFN neurons per layer | {t_ffn} | {ffn} |
| word embedding | {vocab} x {hidden} | {embedding} |
| parameters | {t_params:,} | {params:,} |

Heads and FFN neurons were chosen per layer by importance |w| * sum|dL/dw|, summed over each
structure's weights, the gradients accumulated over one epoch ({rows:,} examples) of the frozen
teacher's own task loss ({loss}). `hsk_rosita.json` lists the kept heads and neurons.

## Which folder is which

- **this folder**: the student as built, with the factorised embedding and truly pruned heads
  (model type `hsk_bert`, hsk's own config and model class). This is what `hsk train --student
  <this folder>` distils. hsk registers the class with the transformers Auto classes when
  `pipelines` is imported: `import pipelines.core.pruned_bert` then
  `AutoModelForSequenceClassification.from_pretrained(<this folder>)`; no remote code.
- **`{plain}/`**: the same function as a standard `BertForSequenceClassification` that plain
  transformers loads with `AutoModelForSequenceClassification.from_pretrained` (no hsk needed):
  the embedding factors multiplied back into one {vocab} x {hidden} table, the reduced FFN as
  `intermediate_size` {ffn}, and the removed heads kept as zero weights, since transformers 5 no
  longer supports pruned heads ({plain_params:,} parameters, same logits).
"""


def _train_batches(enc: dict, labels: np.ndarray, batch_size: int, device: str, regression: bool):
    target = torch.from_numpy(labels.astype(np.float32 if regression else np.int64))
    for batch in length_bucketed_batches(enc["length"], batch_size):
        yield batch_inputs(enc, batch, device), target[batch].to(device)


def _check_teacher(teacher: str, shape: RositaShape) -> None:
    """Refuse, before any weights load, a teacher that is not a fine-tuned BERT or too small for `shape`."""
    config = load_config(teacher)
    if config.model_type != "bert" or not is_classifier(config):
        raise ModelLoadError(
            f"ROSITA prunes a fine-tuned BERT classifier; {teacher} is a {config.model_type} "
            f"{'/'.join(config.architectures or ['model'])}: pass a fine-tuned BERT checkpoint (e.g. of hsk teacher)"
        )
    shape.check(config)


def build_rosita(
    teacher: str,
    task: str,
    shape: RositaShape,
    out: str | Path,
    *,
    data_dir: str | None = None,
    data_file: str | None = None,
    train_limit: int | None = None,
    batch_size: int = 32,
    max_length: int | None = None,
    device: str = "cpu",
    overwrite: bool = False,
    log: Callable[[str], object] = print,
) -> dict:
    """Build a ROSITA student from `teacher` on `task`'s training data and save it to `out`; returns the summary."""
    started = time.perf_counter()
    task_ = get_task(task)
    out = Path(out)
    STUDENT.claim(str(out), overwrite=overwrite)
    _check_teacher(teacher, shape)
    model = load_classifier(teacher, num_labels=task_.num_labels, device=device)
    train = load_examples(task_, "train", data_dir=data_dir, data_file=data_file, limit=train_limit)
    train = train.select(train.has_label)
    if len(train) == 0:
        raise DataError(
            f"no labelled training examples for {task_.name} in {train.source}: importance needs gold labels"
        )
    tokenizer = load_tokenizer(teacher)
    enc = encode(tokenizer, train.texts, max_length or task_.max_length)
    log(f"importance: one frozen epoch over {len(train)} {task_.name} examples from {train.source}")
    sums = accumulate_abs_grads(
        model, _train_batches(enc, train.labels, batch_size, device, task_.is_regression), shape.layers,
        regression=task_.is_regression,
    )
    scores = importance_from_grads(model, sums, shape.layers)
    kept_heads = [top_indices(s, shape.heads) for s in scores.heads]
    kept_neurons = [top_indices(s, shape.ffn) for s in scores.neurons]
    model = model.cpu()
    student = prune_teacher(model, shape, kept_heads, kept_neurons)
    summary = {
        "format": "hsk-rosita/1",
        "teacher": teacher,
        "teacher_resolved": resolve_model(teacher),
        "teacher_weights_hash": weights_hash(model),
        "vocab_hash": vocab_hash(tokenizer),
        "task": task_.name,
        "teacher_shape": {
            "layers": model.config.num_hidden_layers,
            "heads": model.config.num_attention_heads,
            "ffn": model.config.intermediate_size,
        },
        "shape": {"layers": shape.layers, "heads": shape.heads, "ffn": shape.ffn, "emb_rank": shape.emb_rank},
        "importance_loss": "mse to the gold score" if task_.is_regression else "cross-entropy to the gold labels",
        "importance_examples": len(train),
        "importance_source": train.source,
        "importance_fingerprint": train.fingerprint,
        "kept_heads": kept_heads,
        "kept_neurons": kept_neurons,
        "head_scores": [[float(f"{v:.6g}") for v in s] for s in scores.heads],
        "parameters": {"teacher": parameter_count(model), "student": parameter_count(student)},
    }
    plain = merge_export(student)
    summary["parameters"]["plain_export"] = parameter_count(plain)
    summary["build_seconds"] = round(time.perf_counter() - started, 2)
    save_rosita(student, plain, tokenizer, out, summary)
    return summary


def save_rosita(
    student: HskBertForSequenceClassification,
    plain: BertForSequenceClassification,
    tokenizer: PreTrainedTokenizerBase,
    out: str | Path,
    summary: dict,
) -> None:
    """Write the build folder (factorised student at the root, `plain/` export, model card, summary)
    in a staged sibling of `out`, then swap it in: a reader never sees half a folder."""
    with staged_replace(str(out)) as staged:
        mark_output(staged, OUTPUT_KIND, builder="rosita")
        folder = Path(staged)
        student.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        plain.save_pretrained(folder / PLAIN_DIR)
        tokenizer.save_pretrained(folder / PLAIN_DIR)
        (folder / "README.md").write_text(_card(student.config, summary))
        (folder / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")


def _card(config: HskBertConfig, summary: dict) -> str:
    shape, params, t = summary["shape"], summary["parameters"], summary["teacher_shape"]
    rank = shape["emb_rank"]
    return MODEL_CARD.format(
        teacher=summary["teacher"],
        task=summary["task"],
        t_layers=t["layers"],
        layers=shape["layers"],
        t_heads=config.num_attention_heads,
        heads=shape["heads"],
        head_size=config.hidden_size // config.num_attention_heads,
        t_ffn=t["ffn"],
        ffn=shape["ffn"],
        vocab=config.vocab_size,
        hidden=config.hidden_size,
        embedding=f"{config.vocab_size} x {rank} then Linear({rank} -> {config.hidden_size})" if rank else "unchanged",
        t_params=params["teacher"],
        params=params["student"],
        plain_params=params["plain_export"],
        rows=summary["importance_examples"],
        loss=summary["importance_loss"],
        plain=PLAIN_DIR,
    )




def describe_counts(summary: dict) -> str:
    """One line: parameters before and after (and of the plain export)."""
    p = summary["parameters"]
    return (
        f"parameters: teacher {p['teacher']:,} -> student {p['student']:,} "
        f"({p['student'] / p['teacher']:.1%}); plain export {p['plain_export']:,}"
    )
