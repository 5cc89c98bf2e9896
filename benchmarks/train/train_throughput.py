"""Training-step throughput: offline (targets from a store) vs online (teacher loaded) vs in-memory targets.

    HF_HUB_OFFLINE=1 python benchmarks/train/train_throughput.py --data-dir ../shared/data/glue        # CPU
    python benchmarks/train/train_throughput.py --data-dir ../shared/data/glue --device cuda --batch-size 64

The paper's setting (docs/METHOD.md section 4): a BERT-base-sized teacher (12 layers, d 768), a TinyBERT4
student, sequence length 128 (every batch padded to it), config (1,9,0.1), stage-1 (HSK) steps.
All three runs go through the real code: `pipelines.train.run.driver.train` offline (StoreStream reading
and decoding the store) and online (teacher forward + selection + encoding per batch), timed per
step from inside the run; the ceiling runs the same student step on batches decoded beforehand.
The modes alternate round by round (each round: warm-up steps, then timed steps) so that machine
noise, e.g. other jobs on a shared CPU, hits all three alike; medians over all timed steps.
--attribution adds two arms that split an offline/in-memory gap: offline with no read-ahead threads
(--workers 0: reads in the training thread, so no thread competes with the step), and the training
loop on targets decoded beforehand (the loop's own cost beside the hand-written in-memory step).
Process CPU seconds per step (threads included) are reported beside wall time: on a loaded machine
they are the robust figure. The dump that writes the store is timed separately and is not part
of any ratio. --precision and --compile are the run's (`hsk train --precision / --compile`; the in-memory
arm runs its hand-written step the same way: autocast, fused AdamW on CUDA, no host read of the loss);
--arms picks the arms (batch-size scaling times offline alone); --teacher-size tiny makes a quick run.
Random weights everywhere: throughput does not depend on them (the student's random
init warning is expected).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

from hskstore.format.config import HSKConfig
from hskstore.io.reader import open_store
from pipelines.core.precision import StepPrecision, resolve_step
from pipelines.core.tasks import get_task
from pipelines.dump.stage import DumpOptions, dump
from pipelines.train.data.sources import BatchMaker, open_offline
from pipelines.train.data.stream import StoreStream
from pipelines.train.losses.pairs import layer_pairs
from pipelines.train.losses.terms import hsk_mse
from pipelines.train.options import TrainOptions
from pipelines.train.run.driver import train
from pipelines.train.run.loop import _adamw, param_groups
from pipelines.train.students.build import build_student

BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=2, intermediate_size=128)
TEACHERS = {"base": BASE, "tiny": TINY}
ARMS = ("offline", "online", "in_memory")


def make_teacher(num_labels: int, folder: Path, size: str = "base") -> str:
    """A random-weight BERT classifier (BERT-base, or a tiny one for quick runs) with the bert-base-uncased
    vocabulary, saved as a checkpoint."""
    from pipelines.core.models import resolve_model

    tok = BertTokenizerFast.from_pretrained(resolve_model("minilm"))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tok.vocab_size, num_labels=num_labels, **TEACHERS[size])
    BertForSequenceClassification(config).save_pretrained(
        folder
    )
    tok.save_pretrained(folder)
    return str(folder)


def step_times(stamps: list[float], warmup: int) -> list[float]:
    """Seconds of each step after the warm-up ones, from the end-of-step timestamps."""
    return [b - a for a, b in zip(stamps[warmup - 1 : -1], stamps[warmup:], strict=True)]


def timed_train(options: TrainOptions, out: Path, cpu: list[float] | None = None, **kw) -> tuple[list[float], dict]:
    stamps: list[float] = []

    def on_step(_record: dict) -> None:
        stamps.append(time.perf_counter())
        if cpu is not None:
            cpu.append(time.process_time())

    shutil.rmtree(out, ignore_errors=True)  # each round is a new run (a finished run is kept unless replaced)
    summary = train(options, out_dir=str(out), on_step=on_step, log=lambda *_: None, **kw)
    return stamps, summary


class CachedDecoding:
    """BatchMaker with its output cached by row ids: the training loop's step on targets decoded
    beforehand (the attribution arm "loop_decoded": the loop and the stream, without the decoding)."""

    def __init__(self):
        self._cache: dict[bytes, dict] = {}
        self._call = BatchMaker.__call__

    def __enter__(self):
        cache, call = self._cache, self._call

        def cached(maker, raw):
            key = raw["row"].tobytes()
            if key not in cache:
                cache[key] = call(maker, raw)
            return cache[key]

        BatchMaker.__call__ = cached
        return self

    def __exit__(self, *exc):
        BatchMaker.__call__ = self._call


class InMemory:
    """The same student step on batches decoded beforehand (the ceiling: no reading, no teacher)."""

    def __init__(self, store_url: str, options: TrainOptions, student: str, teacher: str, n_batches: int):
        source = open_offline(store_url, None)
        torch.manual_seed(options.seed)
        self.model, info = build_student(
            student,
            num_labels=source.task.num_labels,
            teacher_hidden_size=source.selection.hidden_size,
            tokenizer_fallback=teacher,
            base=teacher,  # bert<k>: the first k layers of the store's teacher, as `hsk train` takes them
        )
        self.device = options.device or "cpu"
        self.model.to(self.device).train()
        pairs = layer_pairs("store", source.selection, info.num_layers, loss="hsk_mse", projection=True)
        self.pairs = [(p.kept, p.student_layer, p.teacher_layer) for p in pairs]
        layers = [f"layers/{i}" for i, _, _ in self.pairs]
        stream = StoreStream(source.store, batch_size=options.batch_size, seed=options.seed, workers=0)
        maker = BatchMaker(source, layers, self.device, source.metadata.max_length, None, 0)
        self.batches = []
        for raw in stream:
            self.batches.append(maker(raw))
            if len(self.batches) == n_batches:
                break
        self.projection = info.projection.to(self.device) if info.projection is not None else None
        self.modules = [self.model] + ([self.projection] if self.projection is not None else [])
        self.optimizer = _adamw(param_groups(self.modules, 0.01), 5e-5, self.device)
        self.precision = StepPrecision.make(resolve_step(options.precision, self.device), self.device)
        self.forward = self._forward if options.compile is None else torch.compile(self._forward, mode=options.compile)

    def _forward(self, batch: dict) -> torch.Tensor:
        with self.precision.autocast():
            out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             token_type_ids=batch["token_type_ids"], output_hidden_states=True)
            return sum(
                hsk_mse(out.hidden_states[s], batch[f"positions_{i}"], batch[f"valid_{i}"], batch[f"dense_{i}"],
                        self.projection)
                for i, s, _ in self.pairs
            )

    def steps(self, warmup: int) -> list[float]:
        """Seconds per step (end-of-step stamps, as the loop's arms are timed: like the training loop, the
        loss is not read every step, so on a GPU a stamp is when the host has queued the step)."""
        stamps = [time.perf_counter()]
        for batch in self.batches:
            loss = self.forward(batch)
            self.optimizer.zero_grad(set_to_none=True)
            self.precision.backward(loss)
            self.precision.unscale(self.optimizer)
            torch.nn.utils.clip_grad_norm_([p for m in self.modules for p in m.parameters()], 1.0)
            self.precision.step(self.optimizer)
            stamps.append(time.perf_counter())
        float(loss.detach())  # one read at the end, like a logging step
        return step_times(stamps[1:], warmup)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--task", default="qnli")
    ap.add_argument("--split", default="dev", help="rows to train on (shared/ has QNLI dev only)")
    ap.add_argument("--config", default="1,9,0.1")
    ap.add_argument("--values", default="float16", help="the store's value codec: float16, int8, int4, mxfp4")
    ap.add_argument("--student", default="tinybert4")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per mode, over all rounds")
    ap.add_argument("--rounds", type=int, default=4, help="modes alternate round by round, so noise hits all")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps at the start of every round")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32", help="the run's --precision: fp32, bf16, fp16 or auto")
    ap.add_argument("--compile", default=None, help="torch.compile mode of the step (default, reduce-overhead)")
    ap.add_argument("--arms", default=",".join(ARMS), help="arms to time, e.g. offline (batch-size scaling)")
    ap.add_argument("--teacher-size", choices=sorted(TEACHERS), default="base")
    ap.add_argument("--attribution", action="store_true",
                    help="also time offline with no read-ahead threads (--workers 0) and the loop on decoded targets")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch's CPU threads for every arm (default: torch's own; `hsk train` on a CPU takes the "
                         "physical cores less one, leaving one to its store readers)")
    ap.add_argument("--out", default="benchmarks/train/results/train_throughput.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)

    task = get_task(args.task)
    per_round = max(1, args.steps // args.rounds)
    run_steps = args.warmup + per_round
    rows = run_steps * args.batch_size  # one epoch per round, no wrap-around
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="hsk-train-bench-"))
    try:
        teacher = make_teacher(task.num_labels, work / "teacher", args.teacher_size)
        arms = [a for a in args.arms.split(",") if a]
        dump_options = DumpOptions(
            config=HSKConfig.parse(args.config),
            value_dtype=args.values,
            max_length=args.max_length,
            batch_size=args.batch_size,
            shard_rows=4 * args.batch_size,
            device=args.device,
            progress=False,
        )
        store = str(work / "store.zarr")
        result = dump(
            task.name,
            dump_options,
            teacher=teacher,
            out=store,
            split=args.split,
            data_dir=args.data_dir,
            limit=rows,
            log=lambda *_: None,
        )
        opened = open_store(store)
        store_bytes = sum(opened.group[n].nbytes_stored() for n in opened.specs)
        print(f"dump: {rows} examples in {result.seconds:.1f}s ({result.examples_per_s:.1f} ex/s), {store_bytes} bytes")

        common = dict(
            method_options=dict(stages=("hsk",), epochs_hsk=1),
            max_steps=run_steps,
            batch_size=args.batch_size,
            pad_to_max_length=True,
            device=args.device,
            progress=False,
            log_every=10**6,
            checkpoint_every=10**6,
            eval_limit=8,
            seed=0,
            data_dir=args.data_dir,
            resume=False,
            precision=args.precision,
            compile=args.compile,
        )
        memory = InMemory(store, TrainOptions(**common), args.student, teacher, run_steps) if "in_memory" in arms \
            else None
        times: dict[str, list[float]] = {arm: [] for arm in arms}
        cpu: dict[str, list[float]] = {arm: [] for arm in ("offline", "in_memory") if arm in arms}  # CPU s per step
        if args.attribution:
            times |= {"offline_workers0": [], "loop_decoded": []}
        cached = CachedDecoding()
        summaries = {}
        for r in range(args.rounds):
            stamps, clock = [], []
            if "offline" in arms:
                stamps, summaries["offline"] = timed_train(
                    TrainOptions(**common), work / "offline", clock, student=args.student, store=store
                )
                times["offline"] += step_times(stamps, args.warmup)
                cpu["offline"] += step_times(clock, args.warmup)
            if args.attribution:
                stamps, _ = timed_train(TrainOptions(**common, workers=0), work / "offline0", student=args.student,
                                        store=store)
                times["offline_workers0"] += step_times(stamps, args.warmup)
                with cached:  # round 0 fills the cache: its steps decode, like the offline arm
                    stamps, _ = timed_train(TrainOptions(**common), work / "decoded", student=args.student,
                                            store=store)
                if r:
                    times["loop_decoded"] += step_times(stamps, args.warmup)
            if "online" in arms:
                stamps, summaries["online"] = timed_train(
                    TrainOptions(**common, train_limit=rows, train_split=args.split, online=dump_options),
                    work / "online",
                    student=args.student,
                    teacher=teacher,
                    task=task.name,
                    config=args.config,
                )
                times["online"] += step_times(stamps, args.warmup)
            if memory is not None:
                before = time.process_time()
                times["in_memory"] += memory.steps(args.warmup)
                cpu["in_memory"].append((time.process_time() - before) / run_steps)
            print(
                f"round {r} (load {os.getloadavg()[0]:.1f}): "
                + ", ".join(f"{k} {statistics.median(v):.3f} s/step" for k, v in times.items() if v),
                flush=True,
            )

        def stats(values: list[float]) -> dict:
            med = statistics.median(values)
            return {
                "median_s_per_step": med,
                "mean_s_per_step": statistics.fmean(values),
                "min_s_per_step": min(values),
                "examples_per_s": args.batch_size / med,
                "steps": len(values),
            }

        report = {
            "task": task.name,
            "split": args.split,
            "config": args.config,
            "teacher": "random BERT-base (12 layers, d 768)",
            "student": args.student,
            "student_init": next(iter(summaries.values()))["student_init"] if summaries else None,
            "precision": resolve_step(args.precision, args.device),
            "compile": args.compile,
            "teacher_size": args.teacher_size,
            "batch_size": args.batch_size,
            "max_length": args.max_length,
            "padded_to_max_length": True,
            "rounds": args.rounds,
            "timed_steps_per_round": per_round,
            "warmup_per_round": args.warmup,
            "device": args.device,
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "load_average_before_after": [load_before[0], os.getloadavg()[0]],
            "dump": {
                "examples": rows,
                "seconds": result.seconds,
                "examples_per_s": result.examples_per_s,
                "store_bytes": store_bytes,
            },
            **{k: stats(v) for k, v in times.items() if v},
            "cpu_s_per_step_median": {k: statistics.median(v) for k, v in cpu.items()},
            "raw_step_seconds": times,
        }
        for other in ("online", "in_memory"):
            if "offline" not in report or other not in report:
                continue
            for stat, suffix in (("min_s_per_step", "_min"), ("median_s_per_step", "")):
                report[f"ratio_offline_over_{other}{suffix}"] = report[other][stat] / report["offline"][stat]
            print(f"throughput offline / {other}: {report[f'ratio_offline_over_{other}']:.3f}x (median steps), "
                  f"{report[f'ratio_offline_over_{other}_min']:.3f}x (fastest steps)")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.out}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
