"""Causal-LM capture at scale (`hsk dump --objective clm`, streamed): does memory or the time to the first shard
grow with the corpus, what rate does capture reach, and what does the host cost per token?

    python benchmarks/lm/capture_scale.py scale --tokens 1e6 1e7        # peak RSS, first shard, tokens/s by size
    python benchmarks/lm/capture_scale.py scale --tokens 1e6 1e7 1e8 --cap 262144   # the same capture of each
    python benchmarks/lm/capture_scale.py null --tokens 1e7             # the host's share, µs per token
    python benchmarks/lm/capture_scale.py null --tokens 1e6 --code /tmp/base --code . --rounds 3   # A/B, alternating
    python benchmarks/lm/capture_scale.py null --tokens 1e7 --tokenizer smollm2   # SmolLM2's tokenizer, GLUE text
    python benchmarks/lm/capture_scale.py limit --text big.txt --teacher T --limit-tokens 8192   # a big text, cut

`scale` runs each capture as its own `hsk dump` process (peak RSS from /usr/bin/time) with a tiny random Llama
(2 layers, d 32; --threads 1) over a word-level tokenizer of 512 words, on generated corpora of one document per
line: what grows with the corpus shows. With `--cap N` each captures only its corpus's first N tokens
(--limit-tokens): the same work over corpora of every size, so that a corpus too large to capture here still
shows whether memory or the time to the first shard grow with it. `null` runs the dump in this process with
the teacher's forward and its support choice replaced by fixed arrays of the same shape (the "null teacher",
with the text arrays): what remains is the host's
share (reading, tokenizing, packing, encoding, digests, writes), per token, with the setup before the first shard
and the rate between the first and last shards apart; `--tokenizer smollm2` measures it with SmolLM2's own
tokenizer (byte-level BPE, 49,152 ids; the teacher a tiny random Llama over it) over documents of GLUE's
Wikipedia and news sentences (`--data-dir`, default ../shared/data/glue), what users run; with `--code` (a
checkout of the repository, given once per arm) each run is its own process on that code, the arms alternating
for `--rounds` rounds, so that a shared machine's load falls on both alike. `limit` is the issue's case: a large
text file captured with --limit-tokens. Everything is written under a temporary folder, removed after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
WORDS = 510  # + EOS and UNK: a vocabulary of 512
BLOCK = 256


def build_teacher(out: Path, tokenizer_kind: str = "words") -> Path:
    """A tiny random Llama (negligible compute per token) over a word-level tokenizer (w0 ... w509, EOS) or, with
    `tokenizer_kind` "smollm2", over SmolLM2's own tokenizer (byte-level BPE, 49,152 ids)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    tokenizer = _smollm2_tokenizer() if tokenizer_kind == "smollm2" else _word_tokenizer()
    eos = tokenizer.eos_token_id
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=BLOCK,
                         eos_token_id=eos, bos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(WORDS)} | {"<unk>": WORDS, "</s>": WORDS + 1}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="</s>", unk_token="<unk>")


def _smollm2_tokenizer():
    from transformers import AutoTokenizer

    from pipelines.core.models import smollm2_path

    return AutoTokenizer.from_pretrained(smollm2_path())


def glue_documents(glue: Path) -> list[str]:
    """Real-ish English documents: the sentences of GLUE's QNLI (Wikipedia: names, numbers, accents, Greek, IPA),
    MRPC (news) and STS-B, in file order, 1-16 consecutive sentences to a document (fixed seed)."""
    import csv

    sentences = []
    for name, columns in (("QNLI/dev.tsv", (1, 2)), ("MRPC/train.tsv", (3, 4)), ("STS-B/train.tsv", (7, 8))):
        with open(glue / name, encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
        sentences += [row[c].strip() for row in rows for c in columns if len(row) > max(columns) and row[c].strip()]
    rng = np.random.default_rng(0)
    bounds = np.cumsum(rng.integers(1, 17, len(sentences)))
    bounds = np.concatenate([[0], bounds[bounds < len(sentences)], [len(sentences)]])
    return [" ".join(sentences[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def write_text_corpus(path: Path, tokens: int, teacher: Path, glue: Path) -> int:
    """GLUE's documents (glue_documents), repeated in order until `tokens` tokens of the teacher's tokenizer (its
    ids + one EOS each); returns the bytes."""
    from transformers import AutoTokenizer

    documents = glue_documents(glue)
    counts = [len(ids) + 1 for ids in AutoTokenizer.from_pretrained(teacher)(documents)["input_ids"]]
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < tokens:
            for document, count in zip(documents, counts, strict=True):
                f.write(document + "\n")
                written += count
                if written >= tokens:
                    break
    return path.stat().st_size


def write_corpus(path: Path, tokens: int, seed: int = 0) -> int:
    """Documents of 5-200 words, one per line, until `tokens` tokens (words + one EOS each); returns the bytes."""
    rng = np.random.default_rng(seed)
    names = np.array([f"w{i}" for i in range(WORDS)])
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < tokens:
            lengths = rng.integers(5, 200, 10_000)
            lengths = lengths[: int(np.searchsorted(np.cumsum(lengths + 1), tokens - written)) + 1]
            words = names[rng.integers(0, WORDS, int(lengths.sum()))]
            bounds = np.concatenate([[0], np.cumsum(lengths)])
            f.write("".join(" ".join(words[a:b]) + "\n" for a, b in zip(bounds[:-1], bounds[1:], strict=True)))
            written += int(lengths.sum()) + len(lengths)
    return path.stat().st_size


def _hsk_dump(args: list[str], out: Path) -> dict:
    """One `hsk dump` process: wall seconds, seconds to its first shard written, peak RSS (MiB)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    cmd = ["/usr/bin/time", "-f", "maxrss_kb=%M", sys.executable, "-m", "pipelines.cli", *args, "--out", str(out)]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = None
    while proc.poll() is None:
        if first is None and _shards_done(out) > 0:
            first = time.perf_counter() - started
        time.sleep(0.05)
    wall = time.perf_counter() - started
    stdout, stderr = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"hsk dump failed ({proc.returncode}): {stderr[-2000:]}")
    rss = int(next(line for line in stderr.splitlines() if line.startswith("maxrss_kb=")).split("=")[1])
    return {"wall_s": round(wall, 2), "first_shard_s": round(first if first is not None else wall, 2),
            "peak_rss_mib": round(rss / 1024, 1), "log": stdout.strip().splitlines()[-2:]}


def _shards_done(out: Path) -> int:
    import zarr

    try:
        return int(zarr.open_group(str(out), mode="r")["_progress/done"][:].sum())
    except Exception:  # not created yet
        return 0


def _dump_args(teacher: Path, text: Path, extra: list[str]) -> list[str]:
    return ["dump", "--objective", "clm", "--teacher", str(teacher), "--text-file", str(text), "--support",
            "topk:8", "--block-size", str(BLOCK), "--shard-rows", "64", "--batch-size", "16", "--device", "cpu",
            "--no-progress", *extra]


def scale(sizes: list[float], work: Path, cap: int | None = None) -> list[dict]:
    """One capture per corpus size (each its own process, one at a time); with `cap`, each captures at most
    `cap` tokens of its corpus (--limit-tokens): the same work over corpora of every size."""
    import zarr

    teacher = build_teacher(work / "teacher")
    rows = []
    for size in sizes:
        text = work / f"corpus-{int(size)}.txt"
        started = time.perf_counter()
        corpus_bytes = write_corpus(text, int(size))
        made = time.perf_counter() - started
        extra = ["--limit-tokens", str(cap)] if cap else []
        out = work / f"s-{int(size)}.zarr"
        result = _hsk_dump(_dump_args(teacher, text, extra), out)
        tokens = int(zarr.open_group(str(out), mode="r")["length"][:].sum())
        rows.append({"corpus_tokens": int(size), "corpus_mb": round(corpus_bytes / 1e6, 1),
                     "corpus_written_s": round(made, 1), "limit_tokens": cap, "tokens": tokens, **result,
                     "tokens_per_s": round(tokens / result["wall_s"]), "store_mb": round(_size(out) / 1e6, 1),
                     "load_avg": os.getloadavg()})
        print(json.dumps(rows[-1]), flush=True)
        text.unlink()
        shutil.rmtree(out)
    return rows


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def null(tokens: float, work: Path, tokenizer_kind: str = "words", glue: Path | None = None) -> dict:
    """The dump in this process with a null teacher: the host's share per token (over the word-level
    tokenizer's generated corpus, or with "smollm2" SmolLM2's tokenizer over GLUE's documents)."""
    import torch

    import pipelines.dump.clm as clm
    from hskstore.format.clm import (
        ACTUAL,
        TEXT,
        TOKEN_BYTES,
        Support,
        actual_logprobs,
        block_hashes,
        encode_support,
        kept_positions,
    )
    from pipelines.dump.corpus import open_corpus

    torch.set_num_threads(1)
    teacher = build_teacher(work / "teacher", tokenizer_kind)
    text = work / "null.txt"
    if tokenizer_kind == "smollm2":
        write_text_corpus(text, int(tokens), teacher, glue)
    else:
        write_corpus(text, int(tokens))
    fixed: dict = {}
    calls: list[tuple[float, int]] = []  # (when each shard's compute began, tokens of the shards before it)
    last = [0]

    def null_shard(model, blocks, lengths, rows, sel, batch_size, device, precision, text=None):
        calls.append((time.perf_counter(), calls[-1][1] + last[0] if calls else 0))
        last[0] = int(lengths.sum())
        key = blocks.shape
        if key not in fixed:  # what the device hands over: ids [n, T, K] int32, log-probs fp16
            rng = np.random.default_rng(0)
            ids = rng.integers(0, sel.vocab_size, (*blocks.shape, sel.k)).astype(np.int32)
            fixed[key] = (ids, np.log(rng.dirichlet(np.ones(sel.k), blocks.shape)).astype(np.float16))
        ids, weights = fixed[key]
        kept = kept_positions(np.zeros(blocks.shape), lengths, sel.positions)
        arrays = encode_support(ids, weights, kept, sel)
        arrays.update(row=rows, text_hash=block_hashes(blocks), input_ids=blocks, length=lengths)
        if text is not None:  # the text arrays (on by default): the actual tokens' log-probs, bytes, text
            arrays.update({ACTUAL: actual_logprobs(weights[..., 0].astype(np.float32), lengths),
                           TOKEN_BYTES: text[0], TEXT: text[1]})
        return arrays

    clm.compute_clm_shard = null_shard
    request = clm.ClmRequest(Support.parse("topk:8"), block_size=BLOCK, batch_size=16, shard_rows=64)
    corpus = open_corpus(str(text), None, None)
    started, cpu = time.perf_counter(), time.process_time()
    clm.dump_clm(str(teacher), str(work / "null.zarr"), corpus, request, progress=False, log=lambda _: None)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    import zarr

    real = int(zarr.open_group(str(work / "null.zarr"), mode="r")["length"][:].sum())
    # setup: from the call to the first shard's compute (tokenizer, teacher, store); stream: from the first
    # shard's compute to the last one's, per token of the shards between (the rate a long capture keeps)
    stream = (calls[-1][0] - calls[0][0]) / max(calls[-1][1], 1)
    return {"tokens": real, "wall_s": round(wall, 2), "host_us_per_token": round(wall / real * 1e6, 3),
            "cpu_us_per_token": round(cpu / real * 1e6, 3),  # CPU time of every thread: less sensitive to load
            "setup_s": round(calls[0][0] - started, 2), "stream_us_per_token": round(stream * 1e6, 3)}


def compare(tokens: float, codes: list[str], rounds: int, work: Path, extra: list[str]) -> list[dict]:
    """null() on each checkout in turn, `rounds` times, each in its own process: alternating arms (`extra`: the
    null run's own options)."""
    runs = []
    for round_ in range(rounds):
        for code in codes:
            out = work / f"arm-{round_}-{len(runs)}.json"
            env = dict(os.environ, PYTHONPATH=str(Path(code).resolve()), HF_HUB_OFFLINE="1")
            done = subprocess.run([sys.executable, __file__, "null", "--tokens", str(tokens), "--json-out", str(out),
                                   *extra], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if done.returncode:
                raise SystemExit(f"null on {code} failed ({done.returncode}): {done.stderr[-2000:]}")
            result = json.loads(out.read_text())
            runs.append({"code": code, "round": round_, **result["result"], "load_avg": result["load_avg"]})
            print(json.dumps(runs[-1]), flush=True)
    return runs


def limit(text: str, teacher: str, limit_tokens: int, work: Path) -> dict:
    args = ["dump", "--objective", "clm", "--teacher", teacher, "--text-file", text, "--support", "topk:8",
            "--limit-tokens", str(limit_tokens), "--device", "cpu", "--no-progress"]
    return {"text_mb": round(Path(text).stat().st_size / 1e6, 1), "limit_tokens": limit_tokens,
            **_hsk_dump(args, work / "limit.zarr")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("scale", "null", "limit"))
    parser.add_argument("--tokens", type=float, nargs="+", default=[1e6, 1e7])
    parser.add_argument("--text")
    parser.add_argument("--teacher")
    parser.add_argument("--limit-tokens", type=int, default=8192)
    parser.add_argument("--cap", type=float, help="scale: capture at most this many tokens of each corpus")
    parser.add_argument("--code", action="append", help="null: a checkout to run (once per arm)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json-out")
    parser.add_argument("--tokenizer", choices=("words", "smollm2"), default="words",
                        help="null: the generated corpus over a 512-word tokenizer, or GLUE's text over SmolLM2's")
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "glue"),
                        help="null --tokenizer smollm2: the GLUE folder whose sentences make the documents")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hsk-capture-") as tmp:
        work = Path(tmp)
        if args.what == "scale":
            result = scale(args.tokens, work, int(args.cap) if args.cap else None)
        elif args.what == "null" and args.code:
            result = compare(args.tokens[0], args.code, args.rounds, work,
                             ["--tokenizer", args.tokenizer, "--data-dir", args.data_dir])
        elif args.what == "null":
            result = null(args.tokens[0], work, args.tokenizer, Path(args.data_dir))
        else:
            result = limit(args.text, args.teacher, args.limit_tokens, work)
    result = {"what": args.what, "result": result, "load_avg": os.getloadavg(), "cpus": os.cpu_count()}
    print(json.dumps(result, indent=1))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
