"""hsk inside the Hugging Face Trainer: your student, your `TrainingArguments`, targets from a store.

    data = StoreDataset("sst2.zarr", layers="all")        # rows of the store, shuffled shard by shard
    trainer = DistillTrainer(model=student, args=TrainingArguments("runs/hf", max_steps=1000),
                             train_dataset=data, data_collator=StoreCollator(data), hsk_weight=1.0)
    trainer.train()

    lm = LMStoreDataset("corpus.zarr")                    # a causal-LM or seq2seq store
    LMDistillTrainer(model=causal_student, args=args, train_dataset=lm, data_collator=LMStoreCollator()).train()

`StoreDataset` is `hsk train`'s loader (pipelines/train/data/stream.py: the seeded shard-aware shuffle,
every shard's digests checked) yielding one row at a time; `StoreCollator` stacks rows and decodes the
teacher targets with the same `decode_batch`; `DistillTrainer` sums `hsk train`'s own loss terms
(pipelines/train/losses/terms.py) over the layer pairs `hsk train` would use (pairs.py). For causal-LM and
seq2seq stores, `LMStoreDataset` plans the store's method (clm-kd, s2s-kd) as `hsk train` does and its `loss`
builds the batch with the run kind's own feed (pipelines/train/kinds/clm.py, seq2seq.py) and sums the stage's
terms; `LMDistillTrainer` is a Trainer whose compute_loss is that (any Trainer subclass, TRL's included, can
call it). Nothing here decodes or computes a loss of its own. A non-finite loss stops training (NonFiniteLoss)
at the step it appears: the Trainer's own NaN filter would log around it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import Trainer

from hskstore import open_store
from hskstore.format.config import ConfigError
from pipelines import runkinds
from pipelines.registry import Context, get_method
from pipelines.train.data.decode import decode_batch
from pipelines.train.data.sources import open_offline
from pipelines.train.data.stream import TRIMMED, StoreStream
from pipelines.train.kinds.clm import TEXT_READ, check_vocabulary
from pipelines.train.losses.pairs import layer_pairs
from pipelines.train.losses.terms import LOSS_TERMS, TermInputs, weighted_sum
from pipelines.train.run.meter import NonFiniteLoss
from pipelines.train.students.adapter import adapter_for
from pipelines.train.students.build import width_projection

if TYPE_CHECKING:
    from hskstore.io.reader import HSKStore

# The keys of a batch that the student's forward takes; every other key is the store's, prefixed "hsk_".
STUDENT_INPUTS = ("input_ids", "token_type_ids", "attention_mask", "labels")
PREFIX = "hsk_"


def _has_feed(objective: str) -> bool:
    """Whether the store's run kind has a feed LMStoreDataset reads (pipelines.runkinds: causal-LM, seq2seq)."""
    from hskstore.format.kinds import UnknownKindError
    try:
        return runkinds.get(objective).feed is not None
    except (runkinds.UnknownRunKindError, UnknownKindError):
        return False


def check_finite(loss: torch.Tensor, step: int) -> torch.Tensor:
    """Stop at a NaN or infinite loss (the Trainer's logging_nan_inf_filter would average around it and the run
    would end normally): nothing is saved after the step that made it."""
    if not torch.isfinite(loss.detach()).all():
        raise NonFiniteLoss(f"the training loss became NaN or infinite at step {step + 1}: training stopped; lower "
                            "the learning rate, or check the student and the store (`hsk verify STORE`)")
    return loss


@dataclass(frozen=True)
class StoreRow:
    """One example's stored arrays. Not a dict, so that the Trainer's unused-column filter
    (`remove_unused_columns`, on by default) leaves the teacher targets in."""

    arrays: dict[str, np.ndarray]


class _StreamedDataset(torch.utils.data.IterableDataset):
    """What both datasets share: the store's rows through `self.stream`, its order seeded by the Trainer's epoch,
    read ahead on the stream's own threads (so one DataLoader worker)."""

    store: HSKStore
    stream: StoreStream
    _workers_advice = "set it to 0"

    def __len__(self) -> int:
        return len(self.store)

    def set_epoch(self, epoch: int) -> None:
        """Called by the Trainer each epoch: the epoch seeds the order."""
        self.stream.set_epoch(epoch)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            raise ConfigError(f"dataloader_num_workers={info.num_workers}: {self._workers_advice}")
        yield from _rows(self.stream)


class StoreDataset(_StreamedDataset):
    """The rows of a task store, in `hsk train`'s seeded shard-aware order, one `StoreRow` at a time.

    `layers`: the kept layers whose HSK vectors to read ("all", or indices i of the store's layers/<i>);
    none by default (logits only). `read_rows` rows are read and shuffled together, then handed out
    one by one; the DataLoader batches them (`per_device_train_batch_size`). The stream reads ahead on
    its own threads (`workers`), so keep the Trainer's `dataloader_num_workers` at 0.
    """

    _workers_advice = ("each worker would read the whole store; set it to 0 (StoreDataset reads ahead on its own "
                       "threads, `workers`)")

    def __init__(self, store: str, *, layers: Sequence[int] | str = (), seed: int = 0, shuffle: bool = True,
                 buffer_shards: int = 4, workers: int = 2, read_rows: int = 256, task: str | None = None):
        objective = open_store(str(store)).objective
        if _has_feed(objective):
            raise ConfigError(f"{store} is a {objective} store: read it with LMStoreDataset({str(store)!r}), "
                              "LMStoreCollator() and LMDistillTrainer")
        source = open_offline(str(store), task)  # refuses incomplete, masked-LM and other tasks' stores
        self.store = source.store
        self.kept = self._kept(layers)
        reads = ("logits", "layers") if self.kept else ("logits",)
        self.stream = StoreStream(self.store, batch_size=read_rows, seed=seed, shuffle=shuffle,
                                  buffer_shards=buffer_shards, workers=workers,
                                  names=source.stream_names(reads, self.kept))

    def _kept(self, layers: Sequence[int] | str) -> list[int]:
        stored = list(range(len(self.store.layers)))
        if layers == "all":
            return stored
        wanted = [int(i) for i in layers]
        unknown = [i for i in wanted if i not in stored]
        if unknown:
            raise ConfigError(f"layers={unknown}: {self.store.url} keeps layers {stored or 'none'} "
                              "(its layers/<i> arrays); pass some of them, 'all', or () for logits only")
        return wanted


def _rows(stream: StoreStream):
    """The stream's batches one row at a time, token ids cut to the row's length (the collator pads them to its
    batch's longest); arrays of stores without `length` (seq2seq) as they are."""
    for batch in stream:
        lengths = batch.get("length")
        for j in range(len(batch["row"])):
            yield StoreRow({name: arr[j, : lengths[j]] if name in TRIMMED and lengths is not None else arr[j]
                            for name, arr in batch.items()})


def _stack(rows: list[dict[str, np.ndarray]], pad_id: int) -> dict[str, np.ndarray]:
    width = max(1, max(int(r["length"]) for r in rows)) if "length" in rows[0] else 0
    out = {}
    for name in rows[0]:
        if name in TRIMMED and width:
            fill = pad_id if name == "input_ids" else 0
            block = np.full((len(rows), width), fill, dtype=rows[0][name].dtype)
            for k, r in enumerate(rows):
                block[k, : len(r[name])] = r[name]
            out[name] = block
        else:
            out[name] = np.stack([r[name] for r in rows])
    return out


class StoreCollator:
    """StoreRows -> a Trainer batch: the student's inputs (input_ids, token_type_ids, attention_mask;
    labels, -1 or NaN where the row has no gold label) and the teacher's targets, decoded on the CPU as
    `hsk train` decodes them: hsk_logits [B, C], and per streamed layer i hsk_dense_i [B, N^L, d]
    (zero-filled teacher vectors), hsk_positions_i [B, N^L], hsk_valid_i [B, N^L]; hsk_row, the store rows."""

    def __init__(self, dataset: StoreDataset):
        store = dataset.store
        self.layers = [f"layers/{i}" for i in dataset.kept]
        self.hidden_size = store.hidden_size
        self.codec = store.selection.value_dtype
        self.pad_id = store.metadata.tokenizer.pad_id or 0

    def __call__(self, rows: list[StoreRow]) -> dict[str, torch.Tensor]:
        batch = _stack([r.arrays for r in rows], self.pad_id)
        decoded = decode_batch(batch, self.layers, self.hidden_size, "cpu", self.codec)
        out = {(k if k in STUDENT_INPUTS else PREFIX + k): v for k, v in decoded.items()}
        out[PREFIX + "row"] = torch.from_numpy(batch["row"].astype(np.int64))
        return out


class DistillTrainer(Trainer):
    """A `transformers.Trainer` whose loss is knowledge distillation from a store's targets.

    (1 - alpha) * gold loss + alpha * KD loss (classification: cross-entropy to the gold label, rows
    without one left out, and T^2 KL(softmax(t/T) || softmax(s/T)); regression: MSE to the gold and to
    the teacher's score), plus `hsk_weight` * the HSK MSE of `hsk train --method mud`'s first stage:
    the student's hidden states at the stored token positions, through W: Linear(d_S -> d_T) when the
    widths differ, against the zero-filled teacher vectors, summed over the store's layer pairs
    (`hsk train`'s own, for the student's depth). HSK needs `train_dataset=StoreDataset(..., layers=...)`.
    W trains with the student (its own optimizer group) and is not saved with it.
    """

    loss_is_scaled_for_ga = False  # a per-batch mean: the Trainer divides it over accumulation steps

    def __init__(self, *args, temperature: float = 1.0, alpha: float = 0.5, hsk_weight: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.temperature, self.alpha, self.hsk_weight = float(temperature), float(alpha), float(hsk_weight)
        dataset = self.train_dataset
        if isinstance(dataset, StoreDataset):
            self._check_head(dataset)
        self.pairs, self.projection = self._pairs(dataset) if self.hsk_weight else ([], None)

    def _check_head(self, dataset: StoreDataset) -> None:
        stored = dataset.store.specs["logits"].shape[-1]
        found = getattr(self.model.config, "num_labels", stored)
        if found != stored:
            raise ConfigError(f"the student has {found} labels, the store's teacher {stored}: build the student "
                              f"with num_labels={stored}")

    def _pairs(self, dataset) -> tuple[list, torch.nn.Module | None]:
        if not isinstance(dataset, StoreDataset) or not dataset.kept:
            raise ConfigError(f"hsk_weight={self.hsk_weight} needs the HSK vectors: "
                              "train_dataset=StoreDataset(store, layers='all')")
        config, store = self.model.config, dataset.store
        projection = width_projection(config.hidden_size, store.hidden_size)
        pairs = layer_pairs("store", store.selection, config.num_hidden_layers, loss="hsk_mse",
                            projection=projection is not None)
        pairs = [p for p in pairs if p.kept in dataset.kept]
        if not pairs:
            raise ConfigError(f"layers={dataset.kept}: no layer pair of a {config.num_hidden_layers}-layer student "
                              "uses them; pass layers='all'")
        return pairs, None if projection is None else projection.to(self.args.device)

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        if self.projection is not None:
            weight = self.projection.weight
            if not any(p is weight for group in optimizer.param_groups for p in group["params"]):
                optimizer.add_param_group({"params": list(self.projection.parameters()), "weight_decay": 0.0})
        return optimizer

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        batch = {k[len(PREFIX):]: inputs.pop(k) for k in list(inputs) if k.startswith(PREFIX)}
        batch["labels"] = inputs.pop("labels")  # the store's -1 / NaN (no gold label) is not HF's -100
        outputs = model(**inputs, output_hidden_states=bool(self.pairs))
        loss = check_finite(self.distill_loss(TermInputs(outputs, batch, self.pairs, self.projection)),
                            self.state.global_step)
        return (loss, outputs) if return_outputs else loss

    def distill_loss(self, x: TermInputs) -> torch.Tensor:
        """The loss of one batch from the student's outputs and the decoded batch (keys without hsk_)."""
        if x.batch["labels"].is_floating_point():  # regression: one score per row
            gold, kd = LOSS_TERMS["gold_mse"](x), LOSS_TERMS["teacher_mse"](x)
        else:
            gold, kd = LOSS_TERMS["ce"](x), LOSS_TERMS["kl"](x, T=self.temperature)
        loss = (1.0 - self.alpha) * gold + self.alpha * kd
        if self.pairs:
            loss = loss + self.hsk_weight * LOSS_TERMS["hsk_mse"](x)
        return loss


# --------------------------------------------------------------------------------------------------
# Causal-LM and seq2seq stores: the method's own stage, batches and terms


def default_method(objective: str) -> str:
    """The method that distils from a store of this objective (clm: clm-kd, seq2seq: s2s-kd)."""
    return runkinds.get(objective).default_method


class LMStoreDataset(_StreamedDataset):
    """The rows of a causal-LM or seq2seq store in `hsk train`'s seeded shard-aware order, and the loss of
    `method` on them (default: the store's, clm-kd or s2s-kd; `options`: its `--set` options, e.g.
    {"lam": 1.0, "temperature": 2.0}), planned and checked against the store as `hsk train` does (a method that
    re-tokenizes the text for another tokenizer, uld or alm, is hsk train's: refused).
    `loss(model, batch)` is the stage's loss of a collated batch: call it from any Trainer's compute_loss."""

    _workers_advice = "set it to 0 (LMStoreDataset reads ahead on its own threads, `workers`)"

    def __init__(self, store: str, *, method: str | None = None, options: dict | None = None, seed: int = 0,
                 shuffle: bool = True, buffer_shards: int = 4, workers: int = 2, read_rows: int = 64):
        self.store = open_store(str(store))  # refuses incomplete stores; shards are checked as they are read
        if not _has_feed(self.store.objective):
            raise ConfigError(f"{store} is a {self.store.objective} store: read it with StoreDataset and "
                              "StoreCollator (LMStoreDataset reads causal-LM and seq2seq stores)")
        self.method = get_method(method or default_method(self.store.objective))
        self.options = self.method.make_options(options)
        if getattr(self.options, "target", "store") != "store":
            raise ConfigError("options target=live runs the teacher beside the student: the Trainer reads the "
                              "stored support only (drop target, or use `hsk train --set target=live`)")
        stages = self.method.stages(self.options, Context(None, None, self.store.metadata))
        if any(TEXT_READ in stage.reads for stage in stages):  # its feed needs the student's tokenizer
            raise ConfigError(f"method={self.method.name!r} re-tokenizes the store's text for a student with another "
                              "tokenizer, which the Trainer integration does not: train it with `hsk train --store "
                              f"{store} --method {self.method.name} --student DIR`")
        self.stage = stages[0]
        self.feed = runkinds.get(self.store.objective).load("feed")(self.store, self.options)
        self.adapter = adapter_for(self.stage.head)
        self.stream = StoreStream(self.store, batch_size=read_rows, seed=seed, shuffle=shuffle,
                                  buffer_shards=buffer_shards, workers=workers, names=self.feed.names(self.stage, []))
        self._makers: dict[str, object] = {}

    def batch(self, rows: dict[str, np.ndarray], device: torch.device | str) -> dict[str, object]:
        """Collated rows -> the run kind's batch on `device` (inputs, labels, masks, the stored support)."""
        key = str(device)
        if key not in self._makers:
            self._makers[key] = self.feed.maker(self.stage, [], key, None)
        return self._makers[key](rows)

    def loss(self, model: torch.nn.Module, inputs: dict[str, object]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(the stage's weighted sum of terms, each term's value) of a batch from LMStoreCollator."""
        device = next(model.parameters()).device
        batch = self.batch(inputs[PREFIX + "rows"].arrays, device)
        outputs = self.adapter(model, None, batch, self.stage.outputs)
        return weighted_sum(self.stage.terms, TermInputs(outputs, batch, [], None))


class LMStoreCollator:
    """StoreRows of an LM store -> {"input_ids": the token ids (for the Trainer's token counts), "hsk_rows": the
    stacked raw arrays}; the batch itself is built by LMStoreDataset.loss on the model's device."""

    def __init__(self, pad_id: int = 0):
        self.pad_id = pad_id

    def __call__(self, rows: list[StoreRow]) -> dict[str, object]:
        stacked = _stack([r.arrays for r in rows], self.pad_id)
        ids = next((stacked[n] for n in ("input_ids", "source_ids") if n in stacked), stacked["row"])
        return {"input_ids": torch.from_numpy(ids.astype(np.int64)), PREFIX + "rows": StoreRow(stacked)}


class LMDistillTrainer(Trainer):
    """A `transformers.Trainer` whose loss is the store's method (clm-kd, s2s-kd) over the stored support:
    `train_dataset` an LMStoreDataset, `data_collator` an LMStoreCollator. The student must tokenize as the
    store's teacher (checked against `processing_class` when given, else its embeddings' size)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.train_dataset, LMStoreDataset):
            raise ConfigError("LMDistillTrainer reads an LMStoreDataset: train_dataset=LMStoreDataset(store)")
        self._check_vocabulary(self.train_dataset.store.metadata)

    def _check_vocabulary(self, meta: Any) -> None:
        if self.processing_class is not None:
            check_vocabulary(self.model, self.processing_class, meta, lambda _: None)
        elif self.model.config.vocab_size < meta.tokenizer.vocab_size:
            raise ConfigError(f"the student's embeddings have {self.model.config.vocab_size} rows but the store's "
                              f"tokenizer has {meta.tokenizer.vocab_size} tokens: the student needs the teacher's "
                              "vocabulary")

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, _ = self.train_dataset.loss(model, inputs)
        check_finite(loss, self.state.global_step)
        return (loss, None) if return_outputs else loss
