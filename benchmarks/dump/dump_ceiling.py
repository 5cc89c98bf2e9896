"""The dump's ceiling: the whole `hsk dump` pipeline with the teacher's forward replaced by stored outputs.

    python benchmarks/dump/dump_ceiling.py --rows 4096 --json benchmarks/dump/results/dump_ceiling.json

A real forward of a random-weight teacher (MiniLM-L6-sized: d 384, 6 layers; BERT-base-sized: d 768,
12 layers) over QNLI dev pairs at max length 128 is run once and its probe outputs (logits, every
hidden state, every layer's [CLS] score rows) are kept; the dump then replays them, sliced to each
batch's shape, instead of calling the teacher. Everything else is the real dump: tokenizing (its own
thread), selection and encoding (the engine under test), copies, compression and writing the store.
On a GPU the forward runs on the device, so this is the rate the host can feed it at.

Both selection engines run alternately in every round (the order flips each round) at each config.
Reported per run: examples/s, host CPU milliseconds per example (the process's CPU time, every thread,
less two things clocked apart: the replayed forward, which hands the selection contiguous tensors as a real
forward does and is a device's work on a GPU, and the store's finalize, checksums, manifest and card once
per store, reported in seconds), and each stage's CPU per example and share, timed on the threads that run
it (thread CPU time): tokenizing, selection (with encoding and placing rows in the shard's arrays),
compression (Blosc, per inner chunk) and the shard digests; `rest` is the host CPU less those (zarr's
object writes on its I/O threads, the store's progress records, thread hand-offs). `main thread` is the
CPU of the thread that drives the dump (with the torch engine on this CPU "device" it runs the selection
too; on a GPU that part is kernel launches): the serial part no worker takes over. Until 1a01b22 the
per-example figure also held the finalize (about 0.02-0.04 ms per example at 4,096 rows) and the
selection took the slower path for non-contiguous hidden states that only the replay produced.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hskstore.format.config import HSKConfig
from hskstore.format.shard_codec import ShardLayout
from hskstore.io import writer as store_writer
from pipelines.core.tasks import get_task
from pipelines.dump import pipeline, stage
from pipelines.dump.probe import ProbeOutput, TeacherProbe

SIZES = {
    "minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}


def make_teacher(size: str, num_labels: int, folder: Path) -> str:
    """A random-weight BERT of the given size with MiniLM's (bert-base-uncased) vocabulary."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    from pipelines.core.models import resolve_model

    tok = BertTokenizerFast.from_pretrained(resolve_model("minilm"))
    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig(vocab_size=tok.vocab_size, num_labels=num_labels, **SIZES[size])
                                  ).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


class ReplayProbe:
    """Stands in for TeacherProbe: returns stored outputs of a real forward, sliced to the batch's shape."""

    def __init__(self, outputs: list[ProbeOutput]):
        self.outputs = outputs
        self.turn = 0

    def __call__(self, input_ids, token_type_ids, attention_mask, hidden_layers) -> ProbeOutput:
        # Contiguous, as a real forward's outputs are (a slice of the padded recording is not, and would send the
        # selection down a slower path than a dump takes); the copy is the forward's work, clocked as "forward".
        b, t = input_ids.shape
        out = self.outputs[self.turn % len(self.outputs)]
        self.turn += 1
        return ProbeOutput(out.logits[:b].clone(), {j: out.hidden[j][:b, :t].contiguous() for j in hidden_layers},
                           {layer: s[:b, :, :t].contiguous() for layer, s in out.cls_scores.items()})

    def close(self) -> None:
        return None


def record_outputs(teacher: str, texts, max_length: int, batch_size: int, n_batches: int) -> list[ProbeOutput]:
    """A real forward over the first batches of rows, every layer kept, padded to max_length."""
    from pipelines.core.models import load_classifier, load_tokenizer
    from pipelines.core.tokenize import encode

    model, tok = load_classifier(teacher), load_tokenizer(teacher)
    n_layers = model.config.num_hidden_layers
    probe = TeacherProbe(model, list(range(1, n_layers + 1)))
    enc = encode(tok, tuple(col[: batch_size * n_batches] for col in texts), max_length)
    outputs = []
    for start in range(0, len(enc["length"]), batch_size):
        rows = slice(start, start + batch_size)
        mask = np.arange(max_length)[None, :] < enc["length"][rows][:, None]
        outputs.append(probe(torch.from_numpy(enc["input_ids"][rows].astype(np.int64)),
                             torch.from_numpy(enc["token_type_ids"][rows].astype(np.int64)),
                             torch.from_numpy(mask.astype(np.int64)), hidden_layers=list(range(n_layers + 1))))
    probe.close()
    return outputs


STAGES = ("tokenize", "select", "compress", "digest")
# Clocked, not host work per example: the replayed forward (a device's work on a GPU) and the store's finalize
# (checksums, manifest, card: once per store, whatever its rows).
APART = ("forward", "finalize")


@dataclass
class StageClock:
    """Thread CPU seconds spent in each stage (STAGES), summed over the threads that run it."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES + APART, 0.0))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                with self.lock:
                    self.seconds[name] += time.thread_time() - start
        return timed


def one_dump(engine: str, config: str, teacher: str, replay: ReplayProbe, args, out: str) -> dict:
    clock = StageClock()
    saved = pipeline.encode, stage.compute_shard, stage.TeacherProbe, stage._write_pending
    saved_write = ShardLayout.encode, store_writer.shard_digest, store_writer.StoreWriter.finalize
    pipeline.encode = clock.wrap("tokenize", pipeline.encode)
    stage.compute_shard = clock.wrap("select", stage.compute_shard)
    ShardLayout.encode = clock.wrap("compress", ShardLayout.encode)
    store_writer.shard_digest = clock.wrap("digest", store_writer.shard_digest)
    store_writer.StoreWriter.finalize = clock.wrap("finalize", saved_write[2])
    forward = clock.wrap("forward", replay)
    stage.TeacherProbe = lambda *a, **k: _Probe(forward, replay.close)
    written = {"process_cpu_s": 0.0}
    saved_close = pipeline.ShardWrites.close

    def close(writes) -> None:  # what the write processes clocked, read as the dump closes its writes
        written["process_cpu_s"] = writes.process_cpu_s
        saved_close(writes)

    pipeline.ShardWrites.close = close
    cpu = {"seconds": 0.0, "main": 0.0, "children": 0.0}

    def write_pending(*a, **k):  # the timed part of a dump: teacher and data loading excluded
        start, main, children = time.process_time(), time.thread_time(), _children_cpu()
        try:
            return saved[3](*a, **k)
        finally:  # write processes have ended (and been waited for) when _write_pending returns
            cpu["seconds"], cpu["main"] = time.process_time() - start, time.thread_time() - main
            cpu["children"] = _children_cpu() - children

    stage._write_pending = write_pending
    options = stage.DumpOptions(config=HSKConfig.parse(config), max_length=args.max_length, batch_size=args.batch_size,
                                shard_rows=args.shard_rows, device="cpu", selection_engine=engine, progress=False,
                                overwrite=True, write_depth=args.write_depth,
                                tokenize_threads=args.tokenize_threads, host_overlap=True,  # a GPU's schedule
                                write_processes=args.write_processes)
    try:
        result = stage.dump("qnli", options, teacher=teacher, out=out, split="dev", data_dir=args.data_dir,
                            limit=args.rows, log=lambda *_: None)
    finally:
        pipeline.encode, stage.compute_shard, stage.TeacherProbe, stage._write_pending = saved
        ShardLayout.encode, store_writer.shard_digest, store_writer.StoreWriter.finalize = saved_write
        pipeline.ShardWrites.close = saved_close
    n = result.examples_written
    apart = {name: clock.seconds.pop(name) for name in APART}
    # the forward runs inside the selection's clock (compute_shard): taken out of it, as out of the process total
    clock.seconds["select"] -= apart["forward"]
    # the write processes' compression, digests and writes, as each process clocked its shards' writes; their
    # start-up (spawn re-imports this script, torch and all) and exit are the rest of their CPU, kept apart
    clock.seconds["write processes"] = written["process_cpu_s"]
    apart["write processes' start and exit"] = cpu["children"] - written["process_cpu_s"]
    host = cpu["seconds"] + cpu["children"] - sum(apart.values())  # neither the forward nor the finalize
    stage_ms = {name: 1e3 * s / n for name, s in clock.seconds.items()}
    stage_ms["rest"] = 1e3 * host / n - sum(stage_ms.values())
    shares = {name: ms / (1e3 * host / n) for name, ms in stage_ms.items()}
    return {"engine": engine, "config": config, "ex_per_s": n / result.seconds, "seconds": result.seconds,
            "cpu_ms_per_example": 1e3 * host / n, "stage_ms_per_example": stage_ms, "cpu_share": shares,
            "main_thread_ms_per_example": 1e3 * (cpu["main"] - apart["forward"]) / n,
            "replayed_forward_ms_per_example": 1e3 * apart["forward"] / n, "finalize_s": apart["finalize"],
            "write_processes_start_exit_s": apart["write processes' start and exit"]}


def _children_cpu() -> float:
    """CPU seconds of this process's ended, waited-for children (the dump's write processes)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class _Probe:
    """The replay behind the probe's interface, clocked."""

    call: object
    close: object

    def __call__(self, *args, **kwargs) -> ProbeOutput:
        return self.call(*args, **kwargs)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_size(size: str, args, work: Path) -> list[dict]:
    from pipelines.core.data import load_examples

    task = get_task("qnli")
    teacher = make_teacher(size, task.num_labels, work / f"teacher-{size}")
    texts = load_examples(task, "dev", data_dir=args.data_dir, limit=args.rows).texts
    replay = ReplayProbe(record_outputs(teacher, texts, args.max_length, args.batch_size, args.probe_batches))
    runs = []
    for config in args.configs:
        for r in range(args.rounds):
            for engine in (("torch", "numpy") if r % 2 == 0 else ("numpy", "torch")):
                run = one_dump(engine, config, teacher, replay, args, str(work / "store.zarr"))
                run.update(size=size, round=r, load_average=load_average())
                runs.append(run)
                print(f"{size} {config} round {r} {engine:5s}: {run['ex_per_s']:8.0f} ex/s, "
                      f"{run['cpu_ms_per_example']:.3f} ms CPU/ex: "
                      + ", ".join(f"{k} {v:.3f}" for k, v in run["stage_ms_per_example"].items())
                      + f"; main thread {run['main_thread_ms_per_example']:.3f}; apart: finalize "
                      + f"{run['finalize_s']:.2f} s, replayed forward {run['replayed_forward_ms_per_example']:.3f}"
                      + (f", write processes' start and exit {run['write_processes_start_exit_s']:.2f} s"
                         if args.write_processes else "")
                      + f"  (load {run['load_average']})", flush=True)
    return runs


def median_rate(runs: list[dict], size: str, config: str, engine: str) -> float:
    rates = [r["ex_per_s"] for r in runs if (r["size"], r["config"], r["engine"]) == (size, config, engine)]
    return statistics.median(rates) if rates else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--json", required=True, help="Where to write the results.")
    ap.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2].parent / "shared/data/glue"))
    ap.add_argument("--sizes", default="minilm,base")
    ap.add_argument("--configs", nargs="+", default=["3,8,0.2", "1,9,0.1"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--shard-rows", type=int, default=1024)
    ap.add_argument("--probe-batches", type=int, default=4, help="Real forward batches recorded and replayed.")
    ap.add_argument("--write-depth", type=int, default=2,
                    help="Shards written at once (a dump on a GPU writes 2; on a CPU, 1).")
    ap.add_argument("--tokenize-threads", type=int, default=None,
                    help="Threads a shard is tokenized on (default: the dump's, the cores up to 4).")
    ap.add_argument("--torch-threads", type=int, default=1, help="torch CPU threads (the 'device' here).")
    ap.add_argument("--write-processes", type=int, default=0,
                    help="hsk dump --write-processes: shards compressed and written by processes (their CPU is "
                         "reported as the stage 'write processes', their start-up apart).")
    args = ap.parse_args()
    torch.set_num_threads(args.torch_threads)
    work = Path(tempfile.mkdtemp(prefix="hsk-ceiling-"))
    started_load = load_average()
    try:
        runs = [run for size in args.sizes.split(",") for run in run_size(size, args, work)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "rows": args.rows, "task": "qnli/dev", "max_length": args.max_length, "batch_size": args.batch_size,
        "shard_rows": args.shard_rows, "write_depth": args.write_depth, "device": "cpu",
        "torch_threads": args.torch_threads, "write_processes": args.write_processes,
        "cpu_count": os.cpu_count(), "load_average_at_start": started_load, "load_average_at_end": load_average(),
        "torch_ex_per_s": median_rate(runs, "minilm", "3,8,0.2", "torch"),
        "numpy_ex_per_s": median_rate(runs, "minilm", "3,8,0.2", "numpy"),
        "note": "median round per engine in the *_ex_per_s keys (MiniLM size, 3,8,0.2); every round in runs",
        "runs": runs,
    }
    print(f"MiniLM 3,8,0.2: torch {result['torch_ex_per_s']:.0f} ex/s, numpy {result['numpy_ex_per_s']:.0f} ex/s")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
