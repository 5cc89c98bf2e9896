"""Pre-softmax attention scores of the kept query rows, computed so that every device gives the same bits.

A float32 matmul's result depends on its summation order (blocking, split-K, FMA contraction), which
differs between CPU BLAS and CUDA kernels: the torch engine on a GPU and the numpy reference on its
host would write different attention rows from the same q and k. Here each product of
two float32 (or float16/bfloat16) numbers is exact in float64 (24 + 24 significant bits < 53), the
products are added one head dimension after another in float64 (each add an IEEE operation: the same
on every device, fused or not, since the products are exact), divided by sqrt(d/H) in float64 (an
IEEE division) and rounded once to float32. docs/STORE_FORMAT.md ("Optional: attention rows") says it.

The price is time: a loop of d/H elementwise float64 steps instead of one float32 matmul (several times
that matmul on a CPU; only dumps with --attention-rows pay it).
"""

from __future__ import annotations

import math

import torch


def query_key_scores(rows: torch.Tensor, k: torch.Tensor, num_heads: int) -> torch.Tensor:
    """rows [B, N, d] (query rows), k [B, T, d] -> float32 [B, H, N, T]: q . k / sqrt(d/H), the same bits anywhere."""
    device = rows.device
    if device.type == "mps":  # no float64 there: the host computes (the same bits)
        return query_key_scores(rows.cpu(), k.cpu(), num_heads).to(device)
    b, n, d = rows.shape
    t = k.shape[1]
    head = d // num_heads
    q = rows.double().view(b, n, num_heads, head).permute(0, 2, 1, 3)  # [B, H, N, e]
    keys = k.double().view(b, t, num_heads, head).permute(0, 2, 3, 1)  # [B, H, e, T]
    acc = torch.zeros((b, num_heads, n, t), dtype=torch.float64, device=device)
    for e in range(head):  # in order: the sum's rounding is fixed by it
        acc.addcmul_(q[..., e, None], keys[:, :, e, None, :])
    root = torch.tensor(math.sqrt(head), dtype=torch.float64, device=device)  # tensor / tensor: a true division
    return (acc / root).float()
