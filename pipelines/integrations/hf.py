"""hsk inside the Hugging Face Trainer: your student, your `TrainingArguments`, targets from a store.

    data = StoreDataset("sst2.zarr", layers="all")        # rows of the store, shuffled shard by shard
    trainer = DistillTrainer(model=student, args=TrainingArguments("runs/hf", max_steps=1000),
                             train_dataset=data, data_collator=StoreCollator(data), hsk_weight=1.0)
    trainer.train()

`StoreDataset` is `hsk train`'s loader (pipelines/train/data/stream.py: the seeded shard-aware shuffle,
every shard's digests checked) yielding one row at a time; `StoreCollator` stacks rows and decodes the
teacher targets with the same `decode_batch`; `DistillTrainer` sums `hsk train`'s own loss terms
(pipelines/train/losses/terms.py) over the layer pairs `hsk train` would use (pairs.py). Nothing here
decodes or computes a loss of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import Trainer

from hskstore.format.config import ConfigError
from pipelines.train.data.decode import decode_batch
from pipelines.train.data.sources import open_offline
from pipelines.train.data.stream import TRIMMED, StoreStream
from pipelines.train.losses.pairs import layer_pairs
from pipelines.train.losses.terms import LOSS_TERMS, TermInputs
from pipelines.train.students.build import width_projection

# The keys of a batch that the student's forward takes; every other key is the store's, prefixed "hsk_".
STUDENT_INPUTS = ("input_ids", "token_type_ids", "attention_mask", "labels")
PREFIX = "hsk_"


@dataclass(frozen=True)
class StoreRow:
    """One example's stored arrays. Not a dict, so that the Trainer's unused-column filter
    (`remove_unused_columns`, on by default) leaves the teacher targets in."""

    arrays: dict[str, np.ndarray]


class StoreDataset(torch.utils.data.IterableDataset):
    """The rows of a task store, in `hsk train`'s seeded shard-aware order, one `StoreRow` at a time.

    `layers`: the kept layers whose HSK vectors to read ("all", or indices i of the store's layers/<i>);
    none by default (logits only). `read_rows` rows are read and shuffled together, then handed out
    one by one; the DataLoader batches them (`per_device_train_batch_size`). The stream reads ahead on
    its own threads (`workers`), so keep the Trainer's `dataloader_num_workers` at 0.
    """

    def __init__(self, store: str, *, layers: Sequence[int] | str = (), seed: int = 0, shuffle: bool = True,
                 buffer_shards: int = 4, workers: int = 2, read_rows: int = 256, task: str | None = None):
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

    def __len__(self) -> int:
        return len(self.store)

    def set_epoch(self, epoch: int) -> None:
        """Called by the Trainer each epoch: the epoch seeds the order."""
        self.stream.set_epoch(epoch)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            raise ConfigError(f"dataloader_num_workers={info.num_workers}: each worker would read the whole "
                              "store; set it to 0 (StoreDataset reads ahead on its own threads, `workers`)")
        for batch in self.stream:
            lengths = batch["length"]
            for j in range(len(lengths)):
                # token ids cut to the text: the collator pads to its batch's longest
                yield StoreRow({name: arr[j, : lengths[j]] if name in TRIMMED else arr[j]
                                for name, arr in batch.items()})


def _stack(rows: list[dict[str, np.ndarray]], pad_id: int) -> dict[str, np.ndarray]:
    width = max(1, max(int(r["length"]) for r in rows))
    out = {}
    for name in rows[0]:
        if name in TRIMMED:
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
        loss = self.distill_loss(TermInputs(outputs, batch, self.pairs, self.projection))
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
