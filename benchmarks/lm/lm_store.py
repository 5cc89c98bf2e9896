"""Causal-LM stores: bytes per token of each support, and the dump against the teacher's bare forward.

    python benchmarks/lm/lm_store.py --teacher ~/.cache/hsk/models/smollm2-135m --text-file KJV_TRAIN.txt \\
        --tokens 16384 --block-size 256 --rounds 3 --json benchmarks/lm/results/lm_store.json

Bytes: one `hsk dump --objective clm` at top-128 (float16 log-probs) and one at sample:64 over the first
--tokens tokens, then `hsk derive` to every smaller support and codec; each store's bytes per token as
`hsk info` counts them (the clm/ arrays over the real tokens), with the mean distinct ids per position of
the sampled ones. Speed: the same blocks, the teacher loaded once, alternating round by round between its bare
forward with the LM head (`model(input_ids).logits`, batch by batch) and the dump's whole hot path (forward,
log-softmax, support, entropy, encoding, compression, digests, writing, finalize: `compute_clm_shard` and
the writer, as `hsk dump` runs them); each round's ratio and the median. The teacher's load is in neither.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from hskstore import open_store
from hskstore.io.writer import writing
from pipelines.cli import main as hsk
from pipelines.core.data import Examples
from pipelines.dump.clm import ClmRequest, clm_metadata, compute_clm_shard, eos_of, load_clm_teacher, tokenize_corpus
from pipelines.train.run.lm_eval import read_documents

DERIVED_TOPK = [(k, codec) for k in (128, 32, 8, 1) for codec in ("float16", "int8", "int4", "nf3")]
DERIVED_SAMPLE = (32, 12, 4)


def _store_row(path: Path) -> dict:
    store = open_store(str(path))
    report = store.storage_report()
    row = {"support": report["support"], "codec": store.clm.logprob_codec, "bytes_per_token": report["bytes_per_token"],
           "total_bytes_per_token": report["total_bytes_per_token"], "tokens": report["tokens"]}
    if store.clm.support == "sample":
        used = [store.targets(store.read_shard(s)).used for s in range(store.n_shards)]
        kept = [store.targets(store.read_shard(s)).kept for s in range(store.n_shards)]
        row["distinct_ids_per_position"] = float(np.mean(np.concatenate([u.sum(-1)[k] for u, k in zip(used, kept)])))
    return row


def measure_bytes(teacher: str, text_file: str, tokens: int, block: int, work: Path) -> list[dict]:
    common = ["--objective", "clm", "--teacher", teacher, "--text-file", text_file, "--block-size", str(block),
              "--limit-tokens", str(tokens), "--no-progress", "--device", "cpu"]
    rows = []
    for support, name in (("topk:128", "top128.zarr"), ("sample:64", "s64.zarr")):
        assert hsk(["dump", *common, "--support", support, "--out", str(work / name)]) == 0
        rows.append(_store_row(work / name))
    for k, codec in DERIVED_TOPK:
        out = work / f"top{k}-{codec}.zarr"
        if (k, codec) != (128, "float16"):
            assert hsk(["derive", str(work / "top128.zarr"), "--support", f"topk:{k}", "--logprobs", codec, "--out",
                        str(out), "--no-progress"]) == 0
            rows.append(_store_row(out))
    for n in DERIVED_SAMPLE:
        out = work / f"s{n}.zarr"
        assert hsk(["derive", str(work / "s64.zarr"), "--support", f"sample:{n}", "--out", str(out),
                    "--no-progress"]) == 0
        rows.append(_store_row(out))
    positions = work / "top8-q.zarr"
    assert hsk(["dump", *common, "--support", "topk:8", "--positions", "0.25", "--out", str(positions)]) == 0
    rows.append({**_store_row(positions), "positions": 0.25})
    return rows


def _forward(model, blocks: np.ndarray, batch: int, device: str, precision: str) -> None:
    from pipelines.core.precision import forward_precision

    with torch.no_grad(), forward_precision(precision, device):
        for start in range(0, len(blocks), batch):
            model(input_ids=torch.as_tensor(blocks[start:start + batch], device=device)).logits.sum().item()


def _dump(model, tokenizer, teacher: str, corpus: Examples, blocks: np.ndarray, lengths: np.ndarray,
          request: ClmRequest, out: Path, device: str, precision: str) -> None:
    from hskstore.format.clm import ClmSelection

    sel = ClmSelection.make(request.support, vocab_size=model.config.vocab_size, block_size=request.block_size,
                            eos_id=eos_of(tokenizer, teacher))
    meta = clm_metadata(corpus, teacher, model, tokenizer, sel, len(blocks), request.shard_rows, precision)
    with writing(str(out), meta) as writer:
        for shard in writer.pending_shards():
            start, stop = writer.shard_bounds(shard)
            rows = np.arange(start, stop, dtype=np.int64)
            writer.write_shard(shard, compute_clm_shard(model, blocks[start:stop], lengths[start:stop], rows, sel,
                                                        request.batch_size, device, precision))
        writer.finalize()


def _teacher_model(teacher: str, device: str, random_weights: bool):
    """The teacher as `hsk dump` loads it, or (a GPU host without the weights) its config with random weights."""
    if not random_weights:
        return load_clm_teacher(teacher, device)
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(teacher)).to(device).eval()


def measure_speed(teacher: str, text_file: str, tokens: int, block: int, batch: int, rounds: int,
                  support: str, work: Path, device: str = "cpu", random_weights: bool = False) -> dict:
    from hskstore.format.clm import Support
    from pipelines.core.models import load_tokenizer
    from pipelines.core.precision import resolve_forward

    precision = resolve_forward("auto", device)
    tokenizer, model = load_tokenizer(teacher), _teacher_model(teacher, device, random_weights)
    docs = read_documents(text_file)
    corpus = Examples(texts=(docs,), labels=np.full(len(docs), -1), rows=np.arange(len(docs)), source=text_file)
    blocks, lengths = tokenize_corpus(tokenizer, docs, block, eos_of(tokenizer, teacher), tokens)
    request = ClmRequest(Support.parse(support), block_size=block, batch_size=batch, shard_rows=16)
    _forward(model, blocks[:batch], batch, device, precision)  # warm-up
    forward, dump = [], []
    for r in range(rounds):
        started = time.perf_counter()
        _forward(model, blocks, batch, device, precision)
        forward.append(time.perf_counter() - started)
        started = time.perf_counter()
        out = work / f"speed-{support.replace(':', '-')}-{r}.zarr"
        _dump(model, tokenizer, teacher, corpus, blocks, lengths, request, out, device, precision)
        dump.append(time.perf_counter() - started)
    ratios = [f / d for f, d in zip(forward, dump)]
    n = int(lengths.sum())
    return {"support": support, "device": device, "precision": precision, "random_weights": random_weights,
            "tokens": n, "batch_blocks": batch, "forward_s": forward, "dump_s": dump,
            "ratio_dump_over_forward": ratios, "median_ratio": statistics.median(ratios),
            "forward_tokens_per_s": n / statistics.median(forward), "dump_tokens_per_s": n / statistics.median(dump),
            "torch_threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--text-file", required=True)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--block-size", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--speed-support", default="topk:32", help="comma-separated supports to time")
    ap.add_argument("--skip-bytes", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--random-weights", action="store_true", help="the teacher folder's config with random weights "
                    "(for a host without the weights: speed only)")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    result = {"teacher": args.teacher, "text_file": Path(args.text_file).name, "block_size": args.block_size}
    with tempfile.TemporaryDirectory(prefix="hsk-lm-store-") as tmp:
        if not args.skip_bytes:
            result["bytes"] = measure_bytes(args.teacher, args.text_file, args.tokens, args.block_size, Path(tmp))
            for row in result["bytes"]:
                print(json.dumps(row))
        result["speed"] = [measure_speed(args.teacher, args.text_file, args.tokens, args.block_size,
                                         args.batch_size, args.rounds, support, Path(tmp), args.device,
                                         args.random_weights) for support in args.speed_support.split(",")]
    for row in result["speed"]:
        print(json.dumps({k: v for k, v in row.items() if not isinstance(v, list)}))
    Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
