"""Training step time reading a store from S3 (SeaweedFS on loopback) against the same store in a local folder.

    python benchmarks/train/s3_training.py --data-dir ../shared/data/glue

A MiniLM-L6-H384-sized teacher with random weights is dumped once over SST-2 rows at 3,8,0.2
to a local folder, and the folder is copied to a SeaweedFS S3 server started on loopback (the
tests' server, tests/s3_server.py). A `bert4` student (the teacher's first 4 layers, as the
store's 4-layer reference map expects) then runs
stage-1 (HSK) steps from each copy; rounds alternate the two. The time per step is the loop's own
clock (reading, decoding, forward, backward and optimizer step; not model loading or evaluation).
Loopback S3 has no network latency: this measures the object-store protocol's cost (HTTP
requests, signing, no page cache), not a WAN. With --latency-ms L, further arms read through a TCP
proxy on 127.0.0.1 that delays every chunk by L/2 each way (benchmarks/train/latency_proxy.py; L per
round trip, stopped with the benchmark), once per --read-ahead depth (shards read ahead, the knob
that hides the latency).

    python benchmarks/train/s3_training.py --data-dir ../shared/data/glue --latency-ms 50 --read-ahead 2,8
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from latency_proxy import LatencyProxy  # this folder is on sys.path when run as a script

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dump"))
from dump_throughput import make_teacher  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from s3_server import BUCKET, start_s3_server  # noqa: E402

from hskstore.format.config import HSKConfig  # noqa: E402
from pipelines.dump.stage import DumpOptions, dump  # noqa: E402
from pipelines.train.run.driver import TrainOptions, train  # noqa: E402


def step_seconds(store: str, args, out: Path, read_ahead: int = 0, endpoint: str | None = None) -> float:
    shutil.rmtree(out, ignore_errors=True)
    options = TrainOptions(method_options=dict(stages=("hsk",), epochs_hsk=1), max_steps=args.steps,
                           batch_size=args.batch_size, eval_limit=32, progress=False, device="cpu",
                           checkpoint_every=10**6, log_every=10**6, data_dir=args.data_dir, resume=False,
                           read_ahead=read_ahead)
    if endpoint is not None:
        import s3fs

        os.environ["AWS_ENDPOINT_URL"] = endpoint
        s3fs.S3FileSystem.clear_instance_cache()  # a cached client would keep the previous endpoint
    # bert4 starts from the first 4 layers of the teacher the store records (its local folder)
    summary = train(options, student="bert4", out_dir=str(out), store=store, data_dir=args.data_dir,
                    log=lambda *_: None)
    return summary["train_seconds"] / summary["steps"]


def run_arms(args, local: str, remote: str, endpoint: str, proxied: str, work: Path) -> dict:
    """Rounds of every arm, alternating; the per-arm medians and their ratios to the local folder."""
    arms = {"local": (local, 0, endpoint), "s3": (remote, 0, endpoint)}
    if args.latency_ms:
        for depth in (int(d) for d in args.read_ahead.split(",")):
            arms[f"s3_{args.latency_ms:g}ms_read_ahead_{depth}"] = (remote, depth, proxied)
    step_seconds(local, args, work / "warm")  # warm-up: imports, page cache
    rounds = []
    for r in range(args.rounds):
        order = list(arms) if r % 2 == 0 else list(arms)[::-1]
        row = {}
        for arm in order:
            store, depth, url = arms[arm]
            row[arm] = step_seconds(store, args, work / f"run-{r}", depth, url)
        rounds.append(row)
        print(f"round {r} (load {os.getloadavg()[0]:.1f}): "
              + ", ".join(f"{k} {v:.3f} s/step" for k, v in row.items()), flush=True)
    median = {arm: statistics.median(r[arm] for r in rounds) for arm in arms}
    print("median: " + ", ".join(f"{k} {v:.3f} s/step ({median['local'] / v:.2f}x local throughput)"
                                 for k, v in median.items()))
    return {"rows": args.rows, "shard_rows": args.shard_rows, "steps": args.steps, "batch_size": args.batch_size,
            "config": "3,8,0.2", "teacher": "MiniLM-L6-H384-sized, random", "student": "bert4",
            "latency_ms": args.latency_ms, "rounds": rounds, "median_s_per_step": median,
            "throughput_over_local": {k: median["local"] / v for k, v in median.items()},
            "s3_over_local": median["s3"] / median["local"], "load_average": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--shard-rows", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=0.0, help="injected round-trip latency (0: no proxy)")
    ap.add_argument("--read-ahead", default="0", help="comma-separated read-ahead depths of the latency arms")
    ap.add_argument("--out", default="benchmarks/train/results/s3_training.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hsk-bench-"))
    server = start_s3_server()
    os.environ.update(server.env)  # the client side reads the standard AWS variables only
    try:
        teacher = make_teacher("minilm", 2, work / "teacher")
        local = work / "sst2.zarr"
        dump("sst2", DumpOptions(config=HSKConfig.parse("3,8,0.2"), shard_rows=args.shard_rows, progress=False),
             teacher=teacher, out=str(local), data_dir=args.data_dir, limit=args.rows, log=lambda *_: None)
        remote = f"s3://{BUCKET}/bench/sst2.zarr"
        server.filesystem().put(str(local), remote.removeprefix("s3://"), recursive=True)
        with LatencyProxy(*server.endpoint.removeprefix("http://").split(":"), args.latency_ms / 2000) as proxy:
            result = run_arms(args, str(local), remote, server.endpoint, proxy.url, work)
            result["proxied_chunks"] = proxy.chunks  # > 0: the latency arms did go through the proxy
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
