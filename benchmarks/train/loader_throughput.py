"""Loader throughput alone: decoded examples per second per core, digest checks on, d 768.

    OMP_NUM_THREADS=1 python benchmarks/train/loader_throughput.py              # 3,8,0.2 and 3,8,1, 3 rounds

The issue's goal: at least 25,000 decoded examples per second per core. The store is synthetic
(benchmarks/train/loader_overhead.py's writer: BERT-base-like, 12 teacher layers, d 768, max length 128,
random values, top-|v| masks, fp16 values), written with hskstore's StoreWriter. The loader is
StoreStream (shard reads + blake2 digest checks + shuffle) and decode_batch to CPU tensors, with
one torch thread and, by default, workers=0: every cycle runs in the timed thread, so examples per
CPU-second of the process is examples per second per core, whatever else the machine runs. Wall
throughput is reported beside it (it drops when other jobs take the core). Rounds alternate the
configs; each round is one epoch (every shard read and checked once) after a warm-up epoch, then a
breakdown in CPU microseconds per example (reads with digest checks alone; the stream, reads
included; decode_batch alone). decode_batch is meant for the training GPU: `stream_only` is the
per-core rate when it runs there. On CPU tensors decode_batch scatters through numpy's flatnonzero
(pipelines/train/data/stream.py dense_by_scatter); on a GPU it gathers (dense_by_gather), the same bits.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from hskstore import open_store
from hskstore.format.schema import make_layout
from hskstore.io.writer import StoreWriter
from pipelines.train.data.decode import decode_batch
from pipelines.train.data.stream import StoreStream


def build(url: str, rows: int, shard_rows: int, config: str, chunk_rows: int | None) -> None:
    from loader_overhead import store_meta, synthetic_shard  # benchmarks/train/ is on sys.path when run as a script

    meta = store_meta(rows, shard_rows, config)
    meta["layout"] = make_layout(rows, meta["layout"]["n_width"], shard_rows, chunk_rows)
    with StoreWriter.open(url, meta) as writer:
        for shard in writer.pending_shards():
            writer.write_shard(shard, synthetic_shard(meta, *writer.shard_bounds(shard)))
        writer.finalize()


def breakdown(store, batch_size: int) -> dict[str, float]:
    """CPU microseconds per example: shard reads with digest checks, the stream (reads, shuffle, batches),
    and decode_batch on CPU."""
    n = len(store)
    cpu = time.process_time()
    for shard in range(store.n_shards):
        store.read_shard(shard, verify=True)
    read = time.process_time() - cpu
    cpu = time.process_time()
    batches = list(StoreStream(store, batch_size=batch_size, seed=0, buffer_shards=4, workers=0))
    stream = time.process_time() - cpu
    cpu = time.process_time()
    for batch in batches:
        decode_batch(batch, store.layers, store.hidden_size, "cpu", store.selection.value_dtype)
    decode = time.process_time() - cpu
    return {"read_verify_us": round(read / n * 1e6, 1), "stream_us": round(stream / n * 1e6, 1),
            "decode_us": round(decode / n * 1e6, 1)}


def one_epoch(store, batch_size: int, workers: int, epoch: int) -> dict[str, float]:
    stream = StoreStream(store, batch_size=batch_size, seed=0, buffer_shards=4, workers=workers)
    stream.set_epoch(epoch)
    wall, cpu, n = time.perf_counter(), time.process_time(), 0
    for batch in stream:
        out = decode_batch(batch, store.layers, store.hidden_size, "cpu", store.selection.value_dtype)
        n += int(out["input_ids"].shape[0])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"examples": n, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "examples_per_s_wall": round(n / wall), "examples_per_cpu_s": round(n / cpu),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="3,8,0.2;3,8,1", help="';'-separated HSK configs")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--shard-rows", type=int, default=1024)
    ap.add_argument("--chunk-rows", type=int, default=None, help="inner chunk rows (default: the dump's, shard/4)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=0, help="0: reads in the timed thread (per-core figure)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to build (or reuse) the stores; default a temp dir")
    ap.add_argument("--out", default="benchmarks/train/results/loader_throughput.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = Path(args.dir or tempfile.mkdtemp(prefix="hsk-loader-"))
    configs = args.configs.split(";")
    stores = {}
    for config in configs:
        url = str(root / f"{config.replace(',', '_')}_{args.rows}_{args.shard_rows}_{args.chunk_rows}.zarr")
        if not Path(url).exists():
            build(url, args.rows, args.shard_rows, config, args.chunk_rows)
        stores[config] = open_store(url)
        one_epoch(stores[config], args.batch_size, args.workers, 0)  # warm-up: imports, page cache
    rounds = {c: [] for c in configs}
    for r in range(args.rounds):
        for config in configs if r % 2 == 0 else configs[::-1]:  # alternate the order of the arms
            rounds[config].append(one_epoch(stores[config], args.batch_size, args.workers, r + 1))
            rounds[config][-1]["cpu_us_per_example"] = breakdown(stores[config], args.batch_size)
            print(config, json.dumps(rounds[config][-1]), flush=True)
    summary = {c: {"median_examples_per_cpu_s": statistics.median(x["examples_per_cpu_s"] for x in v),
                   "median_examples_per_s_wall": statistics.median(x["examples_per_s_wall"] for x in v),
                   # decode_batch belongs on the training GPU: what one core does when only the stream is its
                   "median_examples_per_cpu_s_stream_only": round(statistics.median(
                       1e6 / x["cpu_us_per_example"]["stream_us"] for x in v))}
               for c, v in rounds.items()}
    print(json.dumps(summary))
    result = {"rows": args.rows, "shard_rows": args.shard_rows, "batch_size": args.batch_size,
              "workers": args.workers, "torch_threads": torch.get_num_threads(),
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "d": 768, "teacher_layers": 12,
              "chunk_rows": stores[configs[0]].metadata.layout.chunk_rows,
              "summary": summary, "rounds": rounds, "goal_examples_per_s_per_core": 25000}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
