"""What the domain checks of a causal-LM shard cost (hskstore.format.domain, hskstore.format.clm.domain_checks),
beside the digests every verified read already computes and the decode a trainer does.

    python benchmarks/store/domain_checks.py                     # SmolLM2's vocabulary, 64 blocks of 1,024 tokens
    python benchmarks/store/domain_checks.py --rows 16 --block 512 --repeat 5
    python benchmarks/store/domain_checks.py --slack             # each codec's rounding of the probability sum

Writes benchmarks/store/results/domain_checks.json (the figures, the machine, the commit and the load).

A shard is built in memory the way the dump encodes it (encode_support over random log-softmaxes, all positions
kept), for top-K (float16, int8) and sample:N supports. Each is timed, best of --repeat: the domain checks
(first_breach over every rule), shard_digest over the same arrays (the verified read's cost today) and decode
(what the clm trainer does with the shard). Prints one line per support: milliseconds per shard and per 1,000
tokens, and the checks' cost relative to the digests and the decode.

`--slack` prints instead how far above 1 each log-prob codec's rounding lifts the decoded top-K probabilities of
a position (top-1..128 of log-softmaxes of normal logits at temperatures 0.1..10): what
hskstore.format.clm.PROBABILITY_SLACK allows, with a margin.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np

from hskstore import codecs
from hskstore.format.clm import (
    PROBABILITY_SLACK,
    ClmSelection,
    Support,
    decode,
    domain_checks,
    encode_support,
    pack_blocks,
)
from hskstore.format.digest import shard_digest
from hskstore.format.domain import first_breach


def shard(sel: ClmSelection, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    t, s = sel.block_size, sel.slots
    docs = [list(rng.integers(0, sel.vocab_size - 1, size=int(rng.integers(50, 400)))) for _ in range(rows * t // 100)]
    blocks, lengths = pack_blocks(docs, t, sel.eos_id, max_tokens=rows * t)
    ids = np.stack([rng.choice(sel.vocab_size, size=s, replace=False) for _ in range(rows * t)]).reshape(rows, t, s)
    kept = np.ones((rows, t), dtype=bool)
    if sel.support == "topk":
        logits = rng.normal(size=(rows, t, s)).astype(np.float32) * 2
        weights = -np.sort(-(logits - np.log(np.exp(logits).sum(-1, keepdims=True) * 3)), axis=-1)
    else:
        weights = rng.multinomial(sel.draws, np.full(s, 1 / s), size=(rows, t)).astype(np.uint8)
        ids = np.where(weights > 0, ids, 0)
    data = encode_support(ids, weights, kept, sel)
    data.update(input_ids=blocks.astype(np.uint16), length=lengths)
    return data


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def slack() -> None:
    rng = np.random.default_rng(0)
    for name in codecs.names():
        codec, worst = codecs.get(name), 0.0
        for k in (1, 2, 8, 32, 128):
            for temperature in (0.1, 1, 3, 10):
                logits = rng.normal(size=(200, 1000)) * temperature
                logprobs = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True))
                top = np.maximum(-np.sort(-(logprobs - logits.max(1, keepdims=True)), 1)[:, :k], -60)
                decoded = codec.decode(*codec.encode(top.astype(np.float16)), k)
                worst = max(worst, float(np.exp(decoded.astype(np.float64)).sum(1).max()))
        print(f"{name:10s} lossless {codec.lossless!s:5s} worst sum {worst:.4f}   allowed "
              f"{PROBABILITY_SLACK.get(name, '(default)')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--slack", action="store_true", help="print each codec's rounding of the probability sum")
    args = ap.parse_args()
    if args.slack:
        return slack()
    rng, rows = np.random.default_rng(0), []
    for support, codec in (("topk:32", "float16"), ("topk:32", "int8"), ("sample:32", "float16")):
        sel = ClmSelection.make(Support.parse(support), vocab_size=args.vocab, block_size=args.block, eos_id=0,
                                logprob_codec=codec)
        rows.append(report(sel, shard(sel, args.rows, rng), args.rows * args.block, args.repeat,
                           support + (f" {codec}" if support.startswith("topk") else "")))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = Path(__file__).parent / "results" / "domain_checks.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"command": f"python benchmarks/store/domain_checks.py --rows {args.rows} --block "
                               f"{args.block} --vocab {args.vocab} --repeat {args.repeat}", "commit": commit,
                               "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
                               "load_average": os.getloadavg(), "results": rows}, indent=2) + "\n")


def report(sel: ClmSelection, data: dict[str, np.ndarray], tokens: int, repeat: int, label: str) -> dict:
    checks = domain_checks(sel)
    assert first_breach(data, checks) is None, first_breach(data, checks)
    check = best(lambda: first_breach(data, checks), repeat)
    digest = best(lambda: [shard_digest(a) for a in data.values()], repeat)
    decoded = best(lambda: decode(data, sel), repeat)
    print(f"{label:18s} checks {check * 1e3:7.1f} ms/shard ({check * 1e6 / tokens:5.1f} ms per 1k tokens)   "
          f"digests {digest * 1e3:6.1f} ms   decode {decoded * 1e3:6.1f} ms   checks/digests "
          f"{check / digest:4.1f}x   checks/decode {check / decoded:4.2f}x")
    return {"support": label, "tokens": tokens, "checks_ms": check * 1e3, "digests_ms": digest * 1e3,
            "decode_ms": decoded * 1e3}


if __name__ == "__main__":
    main()
