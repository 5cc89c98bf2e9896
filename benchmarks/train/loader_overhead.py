"""Training-step time when the teacher targets stream from a store, relative to having them in memory.

    python benchmarks/train/loader_overhead.py                       # synthetic store, CPU, about a minute
    python benchmarks/train/loader_overhead.py --store /tmp/s.zarr   # reuse (or build and keep) a store

The store is synthetic, shaped like the paper's smallest config (1,9,0.1) on BERT-base:
d=768, max length 128, 1024 rows per shard, fp16 values, magnitude masks. The "training step" is
a fixed torch workload (a stack of d x d matmuls, forward and backward, calibrated to --step-ms)
whose loss reads the decoded targets, so both arms do exactly the same compute:
  in-memory: batches decoded beforehand and held as tensors (the best a loader could do);
  offline:   StoreStream (background shard reads + digest checks + shuffle buffer) + decode_batch
             inside the timed loop.
Rounds alternate the two arms so machine noise hits both; the median ratio is reported. Each
offline round times two whole buffer fills' worth of steps, so it pays the shard reads of a steady
epoch; its first batch (the buffer's initial fill) is timed separately as startup latency.
Wall time is what the goal is about (offline step <= 1.05x in-memory step), but on a shared machine
other jobs swamp it; the ratio of process CPU time per step (loader threads included) is reported
beside it: it is what the wall ratio becomes when the step keeps every core busy. Use --threads 1
for it on a loaded machine (idle OpenMP threads spin, and that spin counts as CPU time).
On a CPU-only machine every loader cycle (zarr reads, digest checks, decoding: ~1.6 ms of CPU per
batch of 32 here) is taken from the step; with a GPU doing the step they run on idle cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from hskstore import open_store
from hskstore.format import codec
from hskstore.format.config import HSKConfig, Selection
from hskstore.format.schema import array_specs, make_layout
from hskstore.io.writer import StoreWriter
from pipelines.train.data.decode import decode_batch
from pipelines.train.data.stream import StoreStream

D, T, VOCAB = 768, 128, 30522


def store_meta(n_rows: int, shard_rows: int, config: str, value_dtype: str = "float16") -> dict:
    cfg = HSKConfig.parse(config)
    layers = tuple(range(12 - cfg.n_layers + 1, 13))  # any kept layers do: the loader never looks
    sel = Selection(cfg, D, 12, layers, None, layers, ref_student_layers=None, value_dtype=value_dtype)
    return {
        "task": {"name": "sst2", "split": "train", "labels": ["negative", "positive"], "regression": False},
        "dataset": {"source": "synthetic", "fingerprint": "bench", "n_rows": n_rows},
        "teacher": {"name": "synthetic", "weights_hash": "-", "num_layers": 12, "hidden_size": D,
                    "num_labels": 2},
        "tokenizer": {"name": "synthetic", "vocab_hash": "-", "vocab_size": VOCAB, "sep_id": 102},
        "max_length": T,
        "selection": sel.to_dict(),
        "layout": make_layout(n_rows, sel.n_width, shard_rows),
    }


def synthetic_shard(meta: dict, start: int, stop: int) -> dict[str, np.ndarray]:
    """Rows shaped like a real dump: lengths 16..128, top-|v| masks, tokens ranked among real positions."""
    rng = np.random.default_rng(start)
    n, n_width = stop - start, meta["layout"]["n_width"]
    n_tokens = HSKConfig.parse(meta["selection"]["config"]).n_tokens
    length = rng.integers(16, T + 1, n)
    out = {
        "row": np.arange(start, stop), "text_hash": rng.integers(0, 2**63, n).astype(np.uint64),
        "label": rng.integers(0, 2, n), "logits": rng.normal(size=(n, 2)), "length": length,
        "input_ids": np.where(np.arange(T) < length[:, None], rng.integers(1000, VOCAB, (n, T)), 0),
        "token_type_ids": np.zeros((n, T)),
    }
    for spec in array_specs(meta):
        if not spec.name.endswith("/positions"):
            continue
        layer = spec.name.rsplit("/", 1)[0]
        out[f"{layer}/positions"] = np.argsort(rng.random((n, T)) * (np.arange(T) < length[:, None]), axis=1)[
            :, ::-1][:, :n_tokens]
        out[f"{layer}/scores"] = np.sort(rng.random((n, n_tokens)), axis=1)[:, ::-1]
        vectors = rng.normal(size=(n, n_tokens, D)).astype(np.float32)
        top = np.argpartition(-np.abs(vectors), n_width - 1, axis=-1)[..., :n_width]
        mask = np.zeros(vectors.shape, dtype=bool)
        np.put_along_axis(mask, top, True, axis=-1)
        values, scale = codec.encode_values(vectors, mask, n_width, meta["selection"]["value_dtype"])
        out[f"{layer}/values"], out[f"{layer}/masks"] = values, codec.pack_mask(mask)
        if scale is not None:  # int8 / int4 / mxfp4 values
            out[f"{layer}/scale"] = scale
    return out


def build_store(url: str, n_rows: int, shard_rows: int, config: str, value_dtype: str = "float16") -> None:
    meta = store_meta(n_rows, shard_rows, config, value_dtype)
    with StoreWriter.open(url, meta) as writer:
        for shard in writer.pending_shards():
            writer.write_shard(shard, synthetic_shard(meta, *writer.shard_bounds(shard)))
        writer.finalize()


class FakeStep:
    """A fixed compute workload standing in for a student step; its loss reads every decoded target."""

    def __init__(self, n_layers: int, batch_size: int, n_tokens: int):
        torch.manual_seed(0)
        self.weights = [(torch.randn(D, D) / D**0.5).requires_grad_() for _ in range(n_layers)]
        self.embed = torch.randn(VOCAB, D)  # frozen: a dense 30k x d gradient would swamp the step
        self.head = torch.randn(D, 2, requires_grad=True)
        self.x = torch.randn(batch_size * n_tokens, D)
        self.shape = (batch_size, n_tokens)

    def __call__(self, t: dict[str, torch.Tensor]) -> float:
        h = self.x
        for w in self.weights:
            h = torch.tanh(h @ w)
        b = t["input_ids"].shape[0]
        emb = (self.embed[t["input_ids"]] * t["attention_mask"][..., None]).mean(1)  # [B, d]
        n_tokens = self.shape[1]
        student = h[: b * n_tokens].view(b, n_tokens, D) + emb[:, None, :]
        loss = torch.nn.functional.cross_entropy(emb @ self.head, t["logits"].softmax(-1))
        for key in t:
            if key.startswith("dense_"):
                i = key.split("_", 1)[1]
                valid = t[f"valid_{i}"][..., None]
                loss = loss + ((student - t[key]) ** 2 * valid).mean()
        loss.backward()
        with torch.no_grad():
            for p in (*self.weights, self.head):
                p.grad = None
        return float(loss.detach())


def calibrate(step_ms: float, batch_size: int, n_tokens: int, sample: dict[str, torch.Tensor]) -> FakeStep:
    """Number of d x d layers that makes one step take about step_ms on this machine."""
    probe = FakeStep(4, batch_size, n_tokens)
    for _ in range(3):
        probe(sample)
    start = time.perf_counter()
    for _ in range(10):
        probe(sample)
    per_layer = (time.perf_counter() - start) / 10 / 4
    return FakeStep(max(1, round(step_ms / 1000 / per_layer)), batch_size, n_tokens)


def run_in_memory(step: FakeStep, batches: list[dict[str, torch.Tensor]], steps: int) -> dict[str, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(steps):
        step(batches[i % len(batches)])
    return {"step_s": (time.perf_counter() - wall) / steps, "cpu_s": (time.process_time() - cpu) / steps}


def run_offline(step: FakeStep, stream: StoreStream, layers, steps: int, epoch: int) -> dict[str, float]:
    """Per-step seconds after the first batch, and the first batch's latency (the buffer fill).

    cpu_s is the process's CPU time per step, loader threads included.
    """
    stream.set_epoch(epoch)
    t0 = time.perf_counter()
    it = iter(stream)
    first = decode_batch(next(it), layers, D, "cpu", stream.store.selection.value_dtype)
    startup = time.perf_counter() - t0
    step(first)
    wait = decode = 0.0
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        a = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:  # the epoch ran out: go on with the next one, as training would
            stream.set_epoch(stream.epoch)
            it = iter(stream)
            batch = next(it)
        b = time.perf_counter()
        targets = decode_batch(batch, layers, D, "cpu", stream.store.selection.value_dtype)
        c = time.perf_counter()
        step(targets)
        wait, decode = wait + b - a, decode + c - b
    result = {"step_s": (time.perf_counter() - wall) / steps, "cpu_s": (time.process_time() - cpu) / steps,
              "startup_s": startup, "wait_s": wait / steps, "decode_s": decode / steps}
    it.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", help="store to read; built there (and kept) when missing")
    ap.add_argument("--examples", type=int, default=16384)
    ap.add_argument("--config", default="1,9,0.1")
    ap.add_argument("--shard-rows", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=0,
                    help="timed steps per arm and round (0: two buffer fills' worth, the steady state)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--step-ms", type=float, default=30.0, help="target time of the fake training step")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--buffer-shards", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", default="benchmarks/train/results/loader_overhead.json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    work = Path(tempfile.mkdtemp(prefix="hsk-loader-bench-"))
    try:
        url = args.store or str(work / "store.zarr")
        built = 0.0
        if not Path(url).exists():
            t0 = time.perf_counter()
            build_store(url, args.examples, args.shard_rows, args.config)
            built = time.perf_counter() - t0
            print(f"built {url}: {args.examples} rows, config {args.config} in {built:.1f}s")
        store = open_store(url)
        # what training reads: no token scores or text hashes
        names = [n for n in store.specs if not n.endswith("/scores") and n != "text_hash"]
        stream = StoreStream(store, batch_size=args.batch_size, buffer_shards=args.buffer_shards,
                             workers=args.workers, names=names)
        # in-memory arm: the first 64 batches of an epoch, already decoded (cycled)
        warm = StoreStream(store, batch_size=args.batch_size, buffer_shards=args.buffer_shards, names=names)
        memory = []
        for batch in warm:
            memory.append(decode_batch(batch, store.layers, D, "cpu", store.selection.value_dtype))
            if len(memory) == 64:
                break
        step = calibrate(args.step_ms, args.batch_size, store.config.n_tokens, memory[0])
        run_in_memory(step, memory, 10)  # warm-up
        # whole buffer fills, so that the timed steps include the reads of a steady-state epoch
        steps = args.steps or 2 * -(-args.buffer_shards * store.meta["layout"]["shard_rows"] // args.batch_size)
        rows = []
        for r in range(args.rounds):
            mem = run_in_memory(step, memory, steps)
            off = run_offline(step, stream, store.layers, steps, epoch=r)
            rows.append({"round": r, **{f"in_memory_{k}": v for k, v in mem.items()},
                         **{f"offline_{k}": v for k, v in off.items()},
                         "ratio": off["step_s"] / mem["step_s"], "cpu_ratio": off["cpu_s"] / mem["cpu_s"]})
            print(f"round {r}: step in memory {mem['step_s'] * 1e3:.1f} ms, offline {off['step_s'] * 1e3:.1f} ms "
                  f"(waiting {off['wait_s'] * 1e3:.2f} ms, decoding {off['decode_s'] * 1e3:.2f} ms): "
                  f"ratio {rows[-1]['ratio']:.3f}; CPU per step {mem['cpu_s'] * 1e3:.1f} / "
                  f"{off['cpu_s'] * 1e3:.1f} ms: ratio {rows[-1]['cpu_ratio']:.3f}; "
                  f"first batch after {off['startup_s'] * 1e3:.0f} ms")
        result = {
            "examples": len(store), "config": str(store.config), "hidden_size": D, "max_length": T,
            "shard_rows": store.meta["layout"]["shard_rows"], "batch_size": args.batch_size,
            "steps": steps, "workers": args.workers, "buffer_shards": args.buffer_shards,
            "fake_step_layers": len(step.weights), "torch_threads": torch.get_num_threads(),
            "cpus": os.cpu_count(), "load_average": os.getloadavg(), "store_build_s": built, "rounds": rows,
            "median_ratio": statistics.median(r["ratio"] for r in rows),
            "median_cpu_ratio": statistics.median(r["cpu_ratio"] for r in rows),
            "note": "ratio: offline / in-memory wall time per step, steady state (the first batch, the buffer's "
                    "first fill, is reported as startup); both arms run the same fake step, interleaved. "
                    "cpu_ratio: the same for process CPU time (loader threads included), which other jobs on "
                    "the machine barely disturb: the wall ratio to expect when the step keeps every core busy",
        }
        print(f"median offline / in-memory step: wall {result['median_ratio']:.3f}, "
              f"CPU {result['median_cpu_ratio']:.3f} (goal <= 1.05; load average {os.getloadavg()[0]:.1f} "
              f"on {os.cpu_count()} CPUs)")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
