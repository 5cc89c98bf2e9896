"""How well a causal LM's final hidden state, through each value codec, reconstructs its next-token distribution
(issue 55): mean KL(teacher || head(decode(encode(h)))) per token, top-1 agreement and bytes per token, with and
without the seeded Hadamard rotation of `hsk dump --support hidden` (hskstore.format.clm.rotation).

    nice -n 15 python benchmarks/evidence/lm/hidden_codecs.py --teacher ~/.cache/hsk/models/smollm2-135m \\
        --text ../shared/data/glue/QNLI/dev.tsv --tokens 4096 --threads 1

The text is held out from the LM evidence's training text (KJV): QNLI dev's Wikipedia sentences (column
`sentence`), in file order, each one a document followed by EOS, packed into blocks of 256 tokens. Prints one
row per (rotation, codec) and, with --json, writes them.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from hskstore import codecs
from hskstore.format.clm import pack_blocks
from pipelines.dump.clm_hidden import head_of, kl_and_agreement, rotation_matrix, round_trip, teacher_hidden

CODECS = ("float16", "int8", "int4", "mxfp4", "nf4", "nf3")


def sentences(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    return [row[2] for row in rows if len(row) > 2]


def bytes_per_vector(codec: str, d: int) -> int:
    return sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in codecs.get(codec).arrays(d).values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.teacher)
    model = AutoModelForCausalLM.from_pretrained(args.teacher, dtype=torch.float32).eval()
    docs = tok(sentences(args.text)[: args.tokens], add_special_tokens=False)["input_ids"]
    blocks, _ = pack_blocks(docs, args.block, tok.eos_token_id, args.tokens)
    started = time.perf_counter()
    hs, logits = zip(*(teacher_hidden(model, torch.as_tensor(b[None]), "fp32") for b in blocks))
    h, teacher = torch.cat(hs).flatten(0, 1), torch.cat(logits).flatten(0, 1)
    print(f"teacher forward over {len(h)} tokens: {time.perf_counter() - started:.1f}s")
    head = head_of(model)
    p = torch.log_softmax(teacher, -1)
    entropy = float(-(p.exp() * p).sum(-1).mean())
    exact = kl_and_agreement(teacher, head.logits(h))
    print(f"teacher entropy {entropy:.3f} nats; head(h) vs logits: max |diff| "
          f"{float((head.logits(h) - teacher).abs().max()):.2e}, KL {exact[0]:.2e}")
    rows = []
    for rotated in (False, True):
        r = rotation_matrix(h.shape[-1], args.seed if rotated else None, "cpu")
        hr, rhead = (h if r is None else h @ r.T), head.rotated(r)
        for name in CODECS:
            kl, top1 = kl_and_agreement(teacher, rhead.logits(round_trip(hr, name)))
            row = {"codec": name, "rotation": "hadamard" if rotated else "none", "kl": kl, "top1": top1,
                   "bytes_per_token": bytes_per_vector(name, h.shape[-1]), "tokens": len(h), "entropy": entropy}
            rows.append(row)
            print(f"{row['rotation']:9} {name:8} {row['bytes_per_token']:5d} B/token  KL {kl:.5f}  top-1 {top1:.4f}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "teacher": args.teacher, "text": args.text}, f, indent=1)


if __name__ == "__main__":
    main()
