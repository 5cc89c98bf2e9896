"""Where the loader's time per training batch goes, in CPU seconds (robust to a loaded machine).

    OMP_NUM_THREADS=1 python benchmarks/train/step_breakdown.py              # d 768, 1024-row shards, batch 16

On a synthetic d 768 store shaped like a BERT-base dump (benchmarks/train/loader_overhead.py's builder;
fp16 values, or --value-dtype int4), per batch of --batch-size rows: the zarr read of the shard
(chunk fetch + blosc/zstd decompression, as one call: zarr does both), the blake2b digest checks,
the shuffle buffer's copies (fill + batch gather: `StoreStream` with names, no reads), the decoding
of the targets into dense tensors (`decode_batch` on CPU) and the host-to-tensor conversion. Read
and digest costs are per shard, divided by the shard's batches. Phases alternate within each round;
medians over rounds; the machine's load average is recorded. The reads and digests run on the
stream's read-ahead threads (they release the GIL), the rest on the training thread.
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
from loader_overhead import D, build_store  # benchmarks/train/ is on sys.path when run as a script

from hskstore import open_store
from hskstore.format.digest import shard_digest
from pipelines.train.data.decode import decode_batch
from pipelines.train.data.stream import StoreStream


def cpu(fn, repeat: int = 1) -> float:
    t = time.process_time()  # zarr reads on its own event-loop thread: count the process
    for _ in range(repeat):
        fn()
    return (time.process_time() - t) / repeat


def measure(store, names: list[str], batch_size: int) -> dict[str, float]:
    shard_rows = store.meta["layout"]["shard_rows"]
    per_shard = shard_rows / batch_size
    data = store.read_shard(0, verify=False, names=names)
    stream = StoreStream(store, batch_size=batch_size, buffer_shards=1, workers=0, names=names)
    pool = {n: a.copy() for n, a in data.items()}
    slots = np.random.default_rng(0).permutation(shard_rows)[:batch_size]
    batch = stream._batch(pool, slots)
    decode = cpu(lambda: decode_batch(batch, store.layers, D, "cpu", store.selection.value_dtype), 50)
    return {
        "read_decompress_ms": cpu(lambda: store.read_shard(1, verify=False, names=names), 3) / per_shard * 1e3,
        "digest_ms": cpu(lambda: [shard_digest(data[n]) for n in names], 3) / per_shard * 1e3,
        "buffer_fill_ms": cpu(lambda: {n: np.concatenate([a]) for n, a in data.items()}, 3) / per_shard * 1e3,
        "batch_gather_ms": cpu(lambda: stream._batch(pool, slots), 200) * 1e3,
        "decode_ms": decode * 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="1,9,0.1;3,8,0.2")
    ap.add_argument("--shard-rows", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--value-dtype", default="float16", help="float16, int8, int4, mxfp4")
    ap.add_argument("--out", default="benchmarks/train/results/step_breakdown.json")
    args = ap.parse_args()
    torch.set_num_threads(1)  # CPU seconds of one thread: what the loader takes from the step's cores
    work = Path(tempfile.mkdtemp(prefix="hsk-breakdown-"))
    results = []
    try:
        for config in args.configs.split(";"):
            url = str(work / f"{config}.zarr")
            build_store(url, 2 * args.shard_rows, args.shard_rows, config, args.value_dtype)
            store = open_store(url)
            names = [n for n in store.specs if not n.endswith("/scores") and n != "text_hash"]
            rounds = []
            for r in range(args.rounds):
                rounds.append(measure(store, names, args.batch_size))
                print(f"{config} round {r} (load {os.getloadavg()[0]:.1f}): "
                      + ", ".join(f"{k} {v:.2f}" for k, v in rounds[-1].items()), flush=True)
            med = {k: statistics.median(x[k] for x in rounds) for k in rounds[0]}
            med["total_ms"] = sum(med.values())
            results.append({"config": config, "value_dtype": args.value_dtype, "median": med, "rounds": rounds})
            print(f"{config}: loader CPU per batch of {args.batch_size}: {med['total_ms']:.2f} ms")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {"hidden_size": D, "shard_rows": args.shard_rows, "batch_size": args.batch_size, "torch_threads": 1,
           "load_average": os.getloadavg(), "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
