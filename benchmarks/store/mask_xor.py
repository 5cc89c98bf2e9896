"""Would masks coded against the previous kept layer's mask of the same token cost less?

    hsk dump --task sst2 --teacher TEACHER --data-dir ../shared/data/glue --limit 1024 \
        --config 3,8,0.2 --student-layers 4 --out /tmp/s382.zarr
    python benchmarks/store/mask_xor.py --store /tmp/s382.zarr

A store's `layers/<i>/masks` are per-vector magnitude masks (np.packbits over d). The same token's
vectors at neighbouring kept layers share outlier dimensions (the residual stream), so this measures,
on the store's own masks, what each layer's masks would cost stored as:

- `stored`: the store's array as written (the baseline; re-encoded here too, as a check);
- `xor-token`: layer i > 0, slot p: mask XOR the mask of the same token position in layer i - 1 when
  that layer kept it (a reader finds it through both layers' `positions`), else the mask itself;
- `xor-slot`: mask XOR layer i - 1's mask in the same slot (whatever token it holds).

Each candidate is written as the store writes masks (same chunks, shards and Blosc codec, in memory),
and again at zstd level 9, and counted in bytes per kept value (used slots x N^W), the unit of
docs/guide/adding-a-codec.md. It also reports how many of a token's kept dimensions its previous kept
layer kept too, and two entropy bounds: each dimension an independent bit at its own keep rate
(`bound_per_dim`), and the same conditioned on whether the token's previous-layer mask kept that
dimension (`bound_per_dim_given_previous`; slots without that token: the unconditioned rate).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import zarr
from zarr.codecs import BloscCodec, BloscShuffle

ZSTD9 = BloscCodec(cname="zstd", clevel=9, shuffle=BloscShuffle.noshuffle)


def stored_like(template: zarr.Array, data: np.ndarray, compressors=None) -> int:
    """Bytes `data` takes written with `template`'s chunks, shards and (unless given) compressors."""
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=data.shape, dtype=data.dtype, chunks=template.chunks,
                          shards=template.shards, compressors=compressors or template.compressors, fill_value=0)
    z[...] = data
    return int(z.nbytes_stored())


def same_token(prev_pos: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """[N, L] index into the previous layer's slots of each slot's token position (-1: not kept there)."""
    match = (pos[:, :, None] == prev_pos[:, None, :]) & (pos[:, :, None] >= 0)
    return np.where(match.any(-1), match.argmax(-1), -1)


def xor_against(masks: np.ndarray, prev: np.ndarray, slot: np.ndarray) -> np.ndarray:
    ref = np.take_along_axis(prev, np.maximum(slot, 0)[..., None], axis=1)
    return np.where((slot >= 0)[..., None], masks ^ ref, masks)


def entropy_bits(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return -(p * np.log2(p) + (1 - p) * np.log2(1 - p))


def per_dim_bits(bits: np.ndarray) -> float:
    """Bits to code the rows of `bits` [n, d] bool, each dimension at its own keep rate."""
    return float(entropy_bits(bits.mean(0)).sum() * len(bits)) if len(bits) else 0.0


def given_previous_bits(bits: np.ndarray, prev: np.ndarray) -> float:
    """The same, each dimension's rate conditioned on the previous layer's bit."""
    total = 0.0
    for cond in (prev, ~prev):
        n = cond.sum(0)
        total += float((entropy_bits((bits & cond).sum(0) / np.maximum(n, 1)) * n).sum())
    return total


def candidates(masks, prev_masks, slot) -> dict[str, np.ndarray]:
    if prev_masks is None:
        return {"stored-rewritten": masks, "xor-token": masks, "xor-slot": masks}
    return {"stored-rewritten": masks, "xor-token": xor_against(masks, prev_masks, slot),
            "xor-slot": masks ^ prev_masks}


def measure(url: str) -> dict:
    group = zarr.open_group(url, mode="r")
    n_layers = len(group["layers"])
    arrays = [(group[f"layers/{i}/masks"], group[f"layers/{i}/masks"][...], group[f"layers/{i}/positions"][...])
              for i in range(n_layers)]
    n_width = int(np.unpackbits(arrays[0][1][0, 0]).sum())
    totals = {"stored": 0}
    kept_values, shared, kept_prev, bound, bound_prev = 0, 0, 0, 0.0, 0.0
    for i, (array, masks, pos) in enumerate(arrays):
        used = pos >= 0
        kept_values += int(used.sum()) * n_width
        totals["stored"] += int(array.nbytes_stored())
        bits = np.unpackbits(masks, axis=-1).astype(bool)
        bound += per_dim_bits(bits[used])
        prev_masks = slot = None
        if i == 0:
            bound_prev += per_dim_bits(bits[used])
        else:
            prev_masks, slot = arrays[i - 1][1], same_token(arrays[i - 1][2], pos)
            prev_bits = np.unpackbits(np.take_along_axis(prev_masks, np.maximum(slot, 0)[..., None], 1), axis=-1)
            matched = slot >= 0
            bound_prev += given_previous_bits(bits[matched], prev_bits[matched].astype(bool))
            bound_prev += float((entropy_bits(bits[used].mean(0)) * (used & ~matched).sum()).sum())
            shared += int((bits & prev_bits.astype(bool))[matched].sum())
            kept_prev += int(matched.sum()) * n_width
        for name, data in candidates(masks, prev_masks, slot).items():
            totals[name] = totals.get(name, 0) + stored_like(array, data)
            totals[f"{name}/zstd9"] = totals.get(f"{name}/zstd9", 0) + stored_like(array, data, ZSTD9)
    return {"store": url, "layers": n_layers, "n_width": n_width, "kept_values": kept_values,
            "bytes_per_kept_value": {k: v / kept_values for k, v in totals.items()},
            "bound_per_dim": bound / 8 / kept_values, "bound_per_dim_given_previous": bound_prev / 8 / kept_values,
            "kept_dims_shared_with_previous_layer": shared / max(kept_prev, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True)
    ap.add_argument("--out", default="benchmarks/store/results/mask_xor.json")
    args = ap.parse_args()
    result = json.dumps(measure(args.store), indent=2)
    Path(args.out).write_text(result + "\n")
    print(result)


if __name__ == "__main__":
    main()
