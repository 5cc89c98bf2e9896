"""Dump throughput relative to the teacher's plain forward, measured in one run on the same batches.

    python benchmarks/dump/dump_throughput.py --data-dir ../shared/data/glue            # CPU
    python benchmarks/dump/dump_throughput.py --data-dir ../shared/data/glue --device cuda --size base --precision fp16

From Python (benchmarks/gpu/gpu_suite.py): `measure(size, device, precision, limit, batch_size)` returns a dict
with `dump_ex_per_s`, `forward_ex_per_s` and `ratio` (medians over alternated rounds).

The baseline is the bare teacher forward (logits only, default attention implementation) over
the same length-bucketed batches a dump uses. The dump is the real `hsk dump` path: tokenizing,
forward with hidden states and [CLS] attention rows, selection, encoding and writing the store.
Rounds alternate baseline and dump so machine noise hits both; the median ratio is reported.
Random teacher weights: throughput does not depend on them.
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

import torch
from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

from hskstore.format.config import HSKConfig
from pipelines.core.batching import batch_inputs, length_bucketed_batches
from pipelines.core.data import load_examples
from pipelines.core.tasks import get_task
from pipelines.core.tokenize import encode
from pipelines.dump.probe import TeacherProbe
from pipelines.dump.select_torch import HostCopies, host_arrays, select_batch
from pipelines.dump.stage import DumpOptions, build_selection, dump
from pipelines.dump.targets import encode_batch

SIZES = {
    "minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}


def make_teacher(size: str, num_labels: int, folder: Path) -> str:
    """A random-weight BERT of the given size with the bert-base-uncased vocabulary, saved as a checkpoint."""
    from pipelines.core.models import resolve_model

    tok = BertTokenizerFast.from_pretrained(resolve_model("minilm"))
    cfg = BertConfig(vocab_size=tok.vocab_size, num_labels=num_labels, **SIZES[size])
    torch.manual_seed(0)
    BertForSequenceClassification(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def bare_forward(model, enc: dict, batch_size: int, device: str) -> float:
    """Seconds for logits-only forwards over the dump's batches (inputs already tokenized)."""
    start = time.perf_counter()
    with torch.inference_mode():
        for batch in length_bucketed_batches(enc["length"], batch_size):
            model(**batch_inputs(enc, batch, device)).logits.float().cpu()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def host_side_ms_per_example(model, tok, texts, options: DumpOptions) -> dict:
    """Milliseconds per example of the dump's work that stays on the host whatever the device.

    On a GPU the forward leaves the host, so the host's own work bounds the dump's throughput.
    There the dump runs it in stages on their own threads (tokenizing the next shard, selecting
    and encoding the previous batch, writing the previous shard) while the main thread queues
    forwards; the slower of tokenizing and selection is the ceiling reported here (writing is
    concurrent Blosc encoding on several threads). `select_encode_ms` is the numpy engine's host work;
    `select_encode_torch_engine_ms` the torch engine's (on a GPU: launching, the device's work and the
    copy back of the selected bytes; benchmarks/dump/dump_ceiling.py measures the whole pipeline).
    """
    selection = build_selection(options, model.config.num_hidden_layers, model.config.hidden_size)
    probe = TeacherProbe(model, list(selection.ranking_layers))
    start = time.perf_counter()
    enc = encode(tok, texts, options.max_length)
    tokenize_s = time.perf_counter() - start
    select_s = torch_s = 0.0
    copies = HostCopies()
    for batch in length_bucketed_batches(enc["length"], options.batch_size):
        inputs = batch_inputs(enc, batch, options.device)
        ids, lengths = enc["input_ids"][batch, : inputs["input_ids"].shape[1]], enc["length"][batch]
        out = probe(**inputs, hidden_layers=sorted(set(selection.teacher_layers)))
        host_out, copied = out.start_host_copy()  # as the dump does; the transfer is not timed
        if copied is not None:
            copied.synchronize()
        start = time.perf_counter()
        encode_batch(host_out, ids, lengths, selection, tok.sep_token_id)
        select_s += time.perf_counter() - start
        start = time.perf_counter()  # the torch engine: selection on the device, selected bytes copied back
        host_arrays(*copies.start(select_batch(out, ids, lengths, selection, tok.sep_token_id)))
        torch_s += time.perf_counter() - start
    probe.close()
    n = len(enc["length"])
    per_ex = {"tokenize_ms": 1e3 * tokenize_s / n, "select_encode_ms": 1e3 * select_s / n,
              "select_encode_torch_engine_ms": 1e3 * torch_s / n}
    per_ex["host_ceiling_ex_s"] = 1e3 / max(per_ex["tokenize_ms"], per_ex["select_encode_ms"])
    return per_ex


DATA_DIR = str(Path(__file__).resolve().parents[2].parent / "shared/data/glue")


def resolved_precision(precision: str, device: str) -> str:
    from pipelines.core.precision import resolve_forward

    return resolve_forward(precision, device)


def measure(size: str = "minilm", device: str = "cpu", precision: str = "fp32", limit: int = 1024,
            batch_size: int = 32, *, rounds: int = 3, data_dir: str = DATA_DIR, task_name: str = "qnli",
            split: str = "dev", config: str = "3,8,0.2", max_length: int = 128, host_overlap: bool | None = None,
            write_processes: int = 0, log=print) -> dict:
    """The dump against the bare forward in `precision` (both), `rounds` alternated rounds, medians reported.

    Returns `dump_ex_per_s`, `forward_ex_per_s` and `ratio` (medians over rounds; ratio per round, then the
    median) plus the rounds, the resolved precision, torch's threads and the load average (callers such as
    benchmarks/gpu/gpu_suite.py read the first three).
    """
    from pipelines.core.precision import forward_precision

    task = get_task(task_name)
    precision = resolved_precision(precision, device)
    work = Path(tempfile.mkdtemp(prefix="hsk-bench-"))
    try:
        teacher = make_teacher(size, task.num_labels, work / "teacher")
        model = BertForSequenceClassification.from_pretrained(teacher).to(device).eval()
        examples = load_examples(task, split, data_dir=data_dir, limit=limit)
        tok = BertTokenizerFast.from_pretrained(teacher)
        enc = encode(tok, examples.texts, max_length)
        options = DumpOptions(config=HSKConfig.parse(config), max_length=max_length, batch_size=batch_size,
                              device=device, precision=precision, progress=False, overwrite=True,
                              host_overlap=host_overlap, write_processes=write_processes)

        def forward_s() -> float:
            with forward_precision(precision, device):
                return bare_forward(model, enc, batch_size, device)

        def dump_s() -> float:
            return dump(task.name, options, teacher=teacher, out=str(work / "store.zarr"), split=split,
                        data_dir=data_dir, limit=limit, log=lambda *_: None).seconds

        forward_s()  # warm-up
        rows = []
        for r in range(rounds):
            timed = {}
            for arm in (("forward", "dump") if r % 2 == 0 else ("dump", "forward")):  # the order flips each round
                timed[arm] = forward_s() if arm == "forward" else dump_s()
            rows.append({"round": r, "forward_ex_per_s": len(examples) / timed["forward"],
                         "dump_ex_per_s": len(examples) / timed["dump"], "ratio": timed["forward"] / timed["dump"],
                         "load_average": [round(x, 2) for x in os.getloadavg()]})
            last = rows[-1]
            log(f"round {r}: bare forward {last['forward_ex_per_s']:.1f} ex/s, dump {last['dump_ex_per_s']:.1f} "
                f"ex/s, ratio {last['ratio']:.3f} (load {last['load_average']})")
        return {
            "size": size, "device": device, "precision": precision, "examples": len(examples), "task": task.name,
            "split": split, "config": config, "max_length": max_length, "batch_size": batch_size,
            "torch_threads": torch.get_num_threads(), "host_overlap": host_overlap, "write_processes": write_processes,
            "forward_ex_per_s": statistics.median(r["forward_ex_per_s"] for r in rows),
            "dump_ex_per_s": statistics.median(r["dump_ex_per_s"] for r in rows),
            "ratio": statistics.median(r["ratio"] for r in rows), "rounds": rows,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def host_side(args) -> dict:
    """host_side_ms_per_example on a fresh teacher of the measured size (in fp32: the host's work)."""
    task = get_task(args.task)
    work = Path(tempfile.mkdtemp(prefix="hsk-bench-"))
    try:
        teacher = make_teacher(args.size, task.num_labels, work / "teacher")
        model = BertForSequenceClassification.from_pretrained(teacher).to(args.device).eval()
        texts = load_examples(task, args.split, data_dir=args.data_dir, limit=args.limit).texts
        options = DumpOptions(config=HSKConfig.parse(args.config), max_length=args.max_length,
                              batch_size=args.batch_size, device=args.device)
        return host_side_ms_per_example(model, BertTokenizerFast.from_pretrained(teacher), texts, options)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=DATA_DIR)
    ap.add_argument("--task", default="qnli")
    ap.add_argument("--split", default="dev")
    ap.add_argument("--limit", type=int, default=1024)
    ap.add_argument("--size", choices=sorted(SIZES), default="minilm")
    ap.add_argument("--config", default="3,8,0.2")
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="auto", help="auto, fp32, tf32, fp16, bf16 (hsk dump --precision); "
                    "the bare forward runs in the same")
    ap.add_argument("--host-overlap", choices=["auto", "on", "off"], default="auto",
                    help="The host stages beside the forward (on), between forwards (off), or the dump's default.")
    ap.add_argument("--write-processes", type=int, default=0,
                    help="hsk dump --write-processes: processes that compress and write shards (0: threads).")
    ap.add_argument("--out", default="benchmarks/dump/results/dump_throughput.json")
    args = ap.parse_args()
    overlap = {"auto": None, "on": True, "off": False}[args.host_overlap]
    result = measure(args.size, args.device, args.precision, args.limit, args.batch_size, rounds=args.rounds,
                     data_dir=args.data_dir, task_name=args.task, split=args.split, config=args.config,
                     max_length=args.max_length, host_overlap=overlap, write_processes=args.write_processes)
    host = host_side(args)
    print(f"host side: tokenize {host['tokenize_ms']:.3f} ms/ex, selection + encoding "
          f"{host['select_encode_ms']:.3f} ms/ex: host ceiling for a GPU dump {host['host_ceiling_ex_s']:.0f} ex/s")
    result.update(host_side=host, median_ratio=result["ratio"],
                  note="dump time: tokenizing, forward, selection, encoding, writing (not model/data loading)")
    print(f"median dump / bare-forward throughput ratio: {result['ratio']:.3f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
