"""Seq2seq evidence (issue 48): SmolLM2-135M-Instruct as a decoder-only teacher paraphrasing MRPC's positive
pairs (sentence 1 -> sentence 2), students trained on the reference alone, with word-level KD, with
sequence-level KD (the teacher's greedy output) and with both, at equal steps and seeds.

    nice python benchmarks/evidence/lm/prepare_teacher.py      # once: the teacher as a plain folder
    nice python benchmarks/evidence/s2s/run.py --glue ../shared/data/glue --work ~/.cache/hsk/s2s_evidence \\
        --train-pairs 256 --dev-pairs 48 --steps 40 --seeds 3

Two stores of the same training pairs: `word` (top-32 on the reference, no decoding) and `seqword` (the
teacher's greedy output, top-32 on it). Arms (`hsk train --method s2s-kd --student first2`, the teacher's
embeddings, first 2 of 30 layers and tied head):

    reference   word store, --set on=reference lam=0   the reference alone (no teacher knowledge)
    word        word store, lam=0.5                     word-level KD on the reference
    sequence    seqword store, --set on=teacher lam=0   sequence-level KD: the teacher's output as the target
    both        seqword store, lam=0.5                  word-level KD on the teacher's output

Each student is scored with `hsk eval --pairs-file` on the first dev positive pairs (greedy, sacrebleu BLEU
and chrF against sentence 2; the reference's perplexity); so are the teacher and two fixed baselines, the
source copied as the output and the teacher. Bytes per pair: what the arm reads from the store beyond the
pairs (word-level: the s2s/ arrays; sequence-level: teacher_ids and teacher_length). Resumable: existing
stores, runs and evaluations are kept. Writes WORK/results.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

PROMPT = "<|im_start|>user\\nParaphrase this sentence: {source}<|im_end|>\\n<|im_start|>assistant\\n"
ARMS = {  # arm -> (store, --set options)
    "reference": ("word", ["on=reference", "lam=0"]),
    "word": ("word", ["on=reference", "lam=0.5"]),
    "sequence": ("seqword", ["on=teacher", "lam=0"]),
    "both": ("seqword", ["on=teacher", "lam=0.5"]),
}
STORES = {"word": ["--support", "topk:32", "--supports-on", "reference"],
          "seqword": ["--support", "topk:32", "--decode", "greedy"]}
SIZES = ["--max-length", "96", "--max-target", "48"]


def positive_pairs(glue: Path, split: str, n: int, out: Path) -> Path:
    """The first n MRPC pairs of `split` labelled paraphrases, as a source/target TSV."""
    if out.exists():
        return out
    rows = (glue / "MRPC" / f"{split}.tsv").read_text(encoding="utf-8-sig").splitlines()[1:]
    pairs = [(r[3], r[4]) for r in (line.split("\t") for line in rows) if len(r) == 5 and r[0] == "1"][:n]
    out.write_text("source\ttarget\n" + "".join(f"{a}\t{b}\n" for a, b in pairs), encoding="utf-8")
    return out


def hsk(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pipelines.cli", *args], check=True)


def evaluate(model: str, dev: Path, out: Path) -> dict:
    if not out.exists():
        from pipelines.dump.seq2seq import load_pairs, typed_prompt
        from pipelines.train.run.s2s_eval import evaluate_pairs

        result = evaluate_pairs(model, load_pairs(data_file=str(dev)), prompt=typed_prompt(PROMPT), max_source=96,
                                max_target=48)
        out.write_text(json.dumps(result, indent=2))
    return json.loads(out.read_text())


def copy_baseline(dev: Path) -> dict:
    import sacrebleu

    from pipelines.dump.seq2seq import load_pairs

    pairs = load_pairs(data_file=str(dev))
    sources, targets = list(pairs.texts[0]), list(pairs.texts[1])
    return {"bleu": sacrebleu.corpus_bleu(sources, [targets]).score,
            "chrf": sacrebleu.corpus_chrf(sources, [targets]).score}


def knowledge_bytes(store: Path) -> dict:
    from hskstore import open_store

    s = open_store(str(store))
    report = s.storage_report()
    return {"word": report["word_bytes_per_pair"], "sequence": report["sequence_bytes_per_pair"]}


def arm_bytes(arm: str, sizes: dict) -> float:
    store, options = ARMS[arm]
    word = sizes[store]["word"] if "lam=0.5" in options else 0.0
    sequence = sizes[store]["sequence"] if "on=teacher" in options else 0.0
    return word + sequence


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", default=os.path.expanduser("~/.cache/hsk/models/smollm2-135m"))
    ap.add_argument("--glue", default="../shared/data/glue")
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/hsk/s2s_evidence"))
    ap.add_argument("--train-pairs", type=int, default=256)
    ap.add_argument("--dev-pairs", type=int, default=48)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--student", default="first2")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    train = positive_pairs(Path(args.glue), "train", args.train_pairs, work / "train.tsv")
    dev = positive_pairs(Path(args.glue), "dev", args.dev_pairs, work / "dev.tsv")
    for name, options in STORES.items():
        store = work / f"{name}.zarr"
        hsk("dump", "--objective", "seq2seq", "--teacher", args.teacher, "--data-file", str(train), "--prompt",
            PROMPT, *SIZES, *options, "--batch-size", "16", "--out", str(store), "--no-progress")
    sizes = {name: knowledge_bytes(work / f"{name}.zarr") for name in STORES}
    rows = []
    for seed in range(args.seeds):
        for arm, (store, options) in ARMS.items():
            run = work / "runs" / f"{arm}-s{seed}"
            if not (run / "summary.json").exists():
                sets = [x for o in options for x in ("--set", o)]
                hsk("train", "--store", str(work / f"{store}.zarr"), "--method", "s2s-kd", "--student", args.student,
                    *sets, "--set", f"lr={args.lr}", "--set", "epochs=4", "--max-steps", str(args.steps),
                    "--batch-size", str(args.batch_size), "--seed", str(seed), "--out", str(run), "--no-progress")
            result = evaluate(str(run / "best"), dev, run / "eval.json")
            rows.append({"arm": arm, "seed": seed, "bytes_per_pair": arm_bytes(arm, sizes),
                         **{k: result[k] for k in ("bleu", "chrf", "perplexity")}})
            print(json.dumps(rows[-1]), flush=True)
    teacher = evaluate(args.teacher, dev, work / "teacher_eval.json")
    summary = {"args": vars(args), "store_bytes": sizes, "rows": rows, "copy_source": copy_baseline(dev),
               "teacher": {k: teacher[k] for k in ("bleu", "chrf", "perplexity")}}
    (work / "results.json").write_text(json.dumps(summary, indent=2))
    print(table(summary))


def table(summary: dict) -> str:
    lines = ["| arm | bytes/pair | chrF | BLEU | reference ppl |", "|---|---:|---:|---:|---:|"]
    for arm in ARMS:
        rows = [r for r in summary["rows"] if r["arm"] == arm]

        def stat(key: str, rows: list = rows) -> str:
            values = [r[key] for r in rows]
            spread = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
            return f"{statistics.mean(values):.2f}{spread}"

        lines.append(f"| {arm} | {rows[0]['bytes_per_pair']:.0f} | {stat('chrf')} | {stat('bleu')} | "
                     f"{stat('perplexity')} |")
    t, c = summary["teacher"], summary["copy_source"]
    lines.append(f"| teacher (SmolLM2-135M) | - | {t['chrf']:.2f} | {t['bleu']:.2f} | {t['perplexity']:.2f} |")
    lines.append(f"| copy the source | - | {c['chrf']:.2f} | {c['bleu']:.2f} | - |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
