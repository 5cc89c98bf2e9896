"""The fitted basis of the hidden-state support (`--support hidden:fit`, hskstore.format.hidden_fit) on a real
teacher (issue 55): per target KL, the measured mean KL(teacher || stored) and top-1 agreement of held-out
positions, the bytes per token on disk through the store's compressor, raw, and the indices' entropy.

    OMP_NUM_THREADS=1 nice -n 15 python benchmarks/evidence/lm/hidden_fit.py \\
        --teacher ~/.cache/hsk/models/smollm2-135m --text ../shared/data/glue/QNLI/dev.tsv --tokens 8192 --threads 1

The first half of the positions is fitted (as `hsk dump` fits its corpus's first --hidden-fit-tokens), the second
half measured. The states are those a store keeps: rotated by the seeded Hadamard rotation (seed 0), rounded to
float16; the head is the stored (rotated) one. On disk: the indices of the measured half in the store's chunks
(16 blocks of 256 positions, token-major, as `clm/hidden` of a dump with --shard-rows 64) through the store's
compressor (Blosc zstd, the level and shuffle of hskstore.format.schema.ArraySpec). The fit's and the encoding's
wall time (the host's float64 numpy, its BLAS threads as OMP_NUM_THREADS sets them) are printed too.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from hidden_codecs import sentences  # noqa: E402  (run from this folder's path)
from numcodecs import Blosc

from hskstore.format.clm import pack_blocks, rotation
from hskstore.format.hidden_fit import fit_basis
from hskstore.format.schema import ArraySpec
from pipelines.dump.clm_hidden import head_of, kl_and_agreement, teacher_hidden

TARGETS = (0.005, 0.0086, 0.01, 0.02)
CHUNK_BLOCKS = 16


def on_disk(indices: np.ndarray, block: int) -> float:
    """Bytes per position of int8 indices [N, d] in the store's chunks through its compressor."""
    spec = ArraySpec("x", (1,), "int8", 1, 1)
    blosc = Blosc(cname="zstd", clevel=spec.clevel, shuffle=Blosc.SHUFFLE)
    rows = indices.reshape(-1, block, indices.shape[1])
    stored = sum(len(blosc.encode(np.ascontiguousarray(rows[i:i + CHUNK_BLOCKS])))
                 for i in range(0, len(rows), CHUNK_BLOCKS))
    return stored / len(indices)


def entropy_bytes(indices: np.ndarray) -> float:
    """The indices' empirical entropy per position (bytes), each coordinate on its own."""
    total = 0.0
    for column in indices.T:
        _, counts = np.unique(column, return_counts=True)
        p = counts / counts.sum()
        total -= float((p * np.log2(p)).sum())
    return total / 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(args.teacher)
    model = AutoModelForCausalLM.from_pretrained(args.teacher, dtype=torch.float32).eval()
    docs = tok(sentences(args.text)[: args.tokens], add_special_tokens=False)["input_ids"]
    blocks, _ = pack_blocks(docs, 256, tok.eos_token_id, args.tokens)
    hs, logits = zip(*(teacher_hidden(model, torch.as_tensor(b[None]), "fp32") for b in blocks))
    h, teacher = torch.cat(hs).flatten(0, 1), torch.cat(logits).flatten(0, 1)
    r = torch.as_tensor(rotation(h.shape[1], 0), dtype=torch.float32)
    stored = (h @ r.T).half().numpy()
    head = head_of(model).rotated(r)
    weight = head.weight.numpy()
    half = len(stored) // 2
    print(f"captured {len(stored)} positions in {time.perf_counter() - started:.0f}s", flush=True)
    rows = []
    for target in TARGETS:
        began = time.perf_counter()
        basis = fit_basis(stored[:half], weight, None, head.softcap, target)
        fitted = time.perf_counter() - began
        began = time.perf_counter()
        q = basis.encoder.encode(stored[half:])
        encoded = (time.perf_counter() - began) / len(q)
        folded, bias = basis.folded(weight, None)
        recon = torch.as_tensor(q, dtype=torch.float32) @ torch.as_tensor(folded).T + torch.as_tensor(bias)
        kl, top1 = kl_and_agreement(teacher[half:], recon)
        row = {"target_kl": target, "theta": basis.theta, "predicted_kl": basis.predicted_kl, "kl": kl, "top1": top1,
               "clipped": basis.encoder.clipped(stored[half:]), "on_disk": on_disk(q, 256), "raw": q.shape[1],
               "entropy": entropy_bytes(q), "fit_seconds": fitted, "encode_us_per_token": 1e6 * encoded}
        rows.append(row)
        print(f"target {target:<7} KL {kl:.5f} top-1 {top1:.4f} clipped {row['clipped']:.2e} on disk "
              f"{row['on_disk']:.1f} B/token (raw {row['raw']}, entropy {row['entropy']:.1f}) fit {fitted:.0f}s, "
              f"encode {1e6 * encoded:.1f} us/token",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "fit_tokens": half, "eval_tokens": len(stored) - half}, f, indent=1)


if __name__ == "__main__":
    main()
