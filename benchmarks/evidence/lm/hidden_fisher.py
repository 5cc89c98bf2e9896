"""Prototype (issue 55): a KL-aligned basis for the final hidden state, fitted on held-out positions, its
coordinates by decreasing importance stored in tiers of codecs (more bits for the important ones).

The KL of a small error e in h is about 1/2 e^T F e, F = E_t[Cov_{y ~ p_t}(w_y)] (the head's rows under the
teacher's distribution). In the coordinates z = V^T S^-1/2 (h - mu) (S the covariance of h, V the eigenvectors
of S^1/2 F S^1/2) the z_i have unit variance and each costs about lambda_i / 2 nats when dropped, so keeping the
m largest is the best width mask (measured: dropping even the least important quarter costs ~0.15 nats, so no
coordinate is dropped here), and bits are best spent by importance; the store's head becomes W S^1/2 V and its
bias W mu + b: readers need nothing new. Fitted on the first half of the tokens, measured on the second half.

    nice -n 15 python benchmarks/evidence/lm/hidden_fisher.py --teacher ~/.cache/hsk/models/smollm2-135m \\
        --text ../shared/data/glue/QNLI/dev.tsv --tokens 4096 --threads 1
"""

from __future__ import annotations

import argparse
import json

import torch
from hidden_codecs import bytes_per_vector, sentences  # noqa: E402  (run from this folder's path)

from hskstore.format.clm import pack_blocks
from pipelines.dump.clm_hidden import head_of, kl_and_agreement, round_trip, teacher_hidden

# coordinates by decreasing importance, in tiers of one codec each
TIERS = (((576, "int8"),), ((576, "nf4"),), ((576, "nf3"),), ((576, "int4"),), ((64, "int8"), (512, "nf4")),
         ((32, "int8"), (544, "nf4")), ((32, "int8"), (224, "nf4"), (320, "nf3")),
         ((64, "int8"), (192, "nf4"), (320, "nf3")), ((96, "int8"), (480, "nf3")), ((128, "int8"), (448, "nf3")),
         ((64, "int8"), (128, "nf4"), (384, "nf3")))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.teacher)
    model = AutoModelForCausalLM.from_pretrained(args.teacher, dtype=torch.float32).eval()
    docs = tok(sentences(args.text)[: args.tokens], add_special_tokens=False)["input_ids"]
    blocks, _ = pack_blocks(docs, 256, tok.eos_token_id, args.tokens)
    hs, logits = zip(*(teacher_hidden(model, torch.as_tensor(b[None]), "fp32") for b in blocks))
    h, teacher = torch.cat(hs).flatten(0, 1).double(), torch.cat(logits).flatten(0, 1)
    half = len(h) // 2
    w = head_of(model).weight.double()
    fit = h[:half]
    mu = fit.mean(0)
    cov = torch.cov(fit.T) + 1e-6 * torch.eye(h.shape[1], dtype=torch.float64)
    p = torch.softmax(teacher[:half].double(), -1)
    first = w.T @ (p.mean(0)[:, None] * w)
    m_t = p @ w
    fisher = first - m_t.T @ m_t / half
    evals, evecs = torch.linalg.eigh(cov)
    root = evecs @ torch.diag(evals.sqrt()) @ evecs.T
    lam, v = torch.linalg.eigh(root @ fisher @ root)
    lam, v = lam.flip(0), v.flip(1)
    print("importance spectrum (nats per unit coordinate): top", [round(float(x), 4) for x in lam[:5]],
          "median", round(float(lam[len(lam) // 2]), 6), "sum/2", round(float(lam.sum() / 2), 3))
    transform = v.T @ torch.linalg.inv(root)  # z = T (h - mu)
    basis_head = w @ root @ v  # logits = basis_head z + W mu
    z = ((h[half:] - mu) @ transform.T).float()
    bias = (w @ mu).float()
    rows = []
    for tiers in TIERS:
        parts, start, size = [], 0, 0
        for count, codec in tiers:
            parts.append(round_trip(z[:, start:start + count].contiguous(), codec))
            size += bytes_per_vector(codec, count)
            start += count
        recon = torch.cat(parts, -1) @ basis_head[:, :start].float().T + bias
        kl, top1 = kl_and_agreement(teacher[half:], recon)
        name = " + ".join(f"{count} {codec}" for count, codec in tiers)
        rows.append({"tiers": name, "kl": kl, "top1": top1, "bytes_per_token": size})
        print(f"{name:32} {size:5d} B/token  KL {kl:.5f}  top-1 {top1:.4f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "fit_tokens": half, "eval_tokens": len(h) - half}, f, indent=1)


if __name__ == "__main__":
    main()
