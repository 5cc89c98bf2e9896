"""4-bit value encodings compared at their stored bytes, on a real store's activations.

    python benchmarks/store/value_codecs.py --store /tmp/sst2-full.zarr      # a full-width float16 store

For each width W the dump's magnitude mask picks the kept fp16 values of every stored vector
(as `hsk dump --config ...,W` would); each candidate encodes them in groups along the kept
values, and we report the round-trip error (relative RMSE: ||v - v'|| / ||v|| over all kept
values; and the worst error in units of the candidate's own half step) and the bytes a store
holds for codes + scales (Zarr shards, Blosc zstd 3; 1-byte arrays whole, wider ones bit-shuffled,
as the store writes them).

- int8: one fp16 scale per vector (format 1), for reference;
- int4/fp16/32 direct: codes -7..7, one fp16 scale (max|v|/7) per group of 32: 4.5 bits per value;
- int4/fp16/32 via int8: the same, quantised from the int8 values (format 2's `int4`: the chain
  float16 -> int8 -> int4 that makes int8 -> int4 derive equal a direct dump);
- int4/pow2/32: one power-of-two scale per group (an 8-bit exponent, the smallest 2^e >= max/7): 4.25;
- int4/pow2/16: the same with groups of 16, i.e. the bytes of fp16 scales at 32: 4.5;
- e2m1/pow2/32 via int8: MXFP4 (OCP microscaling; format 2's `mxfp4`): e2m1 codes
  {0,.5,1,1.5,2,3,4,6}, shared scale 2^(floor(log2 max) - 2), values beyond 6*scale saturate: 4.25;
- e2m1/fp16/32: e2m1 codes with an fp16 scale max/6 per group: 4.5;
- nf3/log8/32 via int8: the `nf3` codec: 3-bit NormalFloat codes, 8 per 3 bytes, one scale byte
  2^(b/8) per group of 32: 3.25. benchmarks/store/results/value_codecs_3bit.md: the 3-bit candidates it
  was chosen from (int3, e2m0, no-zero and fitted grids; fp16, power-of-two and log scales).

Writes benchmarks/store/results/value_codecs.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from hskstore import codecs
from hskstore.codecs import int4, layout, mxfp4
from hskstore.method.selection import width_mask

try:  # run as a script (python benchmarks/store/value_codecs.py) or as a module
    from mask_codecs import load_vectors, stored_bytes
except ImportError:  # pragma: no cover
    from benchmarks.store.mask_codecs import load_vectors, stored_bytes

WIDTHS = (0.1, 0.2, 0.3)


def _groups(v: np.ndarray, size: int) -> np.ndarray:
    n = v.shape[-1]
    g = -(-n // size)
    padded = np.zeros((*v.shape[:-1], g * size), dtype=np.float32)
    padded[..., :n] = v
    return padded.reshape(*v.shape[:-1], g, size)


def int4_pow2(v: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """int4 codes under one power-of-two scale per group (the smallest 2^e >= max/7, an int8 exponent)."""
    grouped = _groups(v, size)
    peak = np.abs(grouped).max(axis=-1)
    exp = np.ceil(np.log2(np.maximum(peak, 1e-30) / int4.INT4_MAX)).astype(np.int8)
    scale = np.where(peak > 0, np.exp2(exp.astype(np.float32)), 0.0)
    safe = np.where(scale > 0, scale, 1.0)[..., None]
    q = np.clip(np.rint(grouped / safe), -int4.INT4_MAX, int4.INT4_MAX)
    decoded = (q * scale[..., None]).reshape(*v.shape[:-1], -1)[..., : v.shape[-1]]
    packed = layout.pack_nibbles(q.reshape(*v.shape[:-1], -1)[..., : v.shape[-1]].astype(np.int8))
    return decoded, packed, exp


def e2m1_fp16(v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """e2m1 codes under an fp16 scale max/6 per group of 32 (not in the format)."""
    grouped = _groups(v, layout.GROUP)
    scale16 = (np.abs(grouped).max(axis=-1) / 6.0).astype(np.float16)
    scale = scale16.astype(np.float32)
    # an fp16 scale is 2^e times a mantissa: quantise v / mantissa with MXFP4's rounding at exponent e
    codes, _ = mxfp4.quantize_mxfp4_values((grouped / np.where(scale > 0, scale, 1.0)[..., None] * 4.0
                                            ).reshape(*v.shape[:-1], -1)[..., : v.shape[-1]])
    mag = mxfp4.E2M1_GRID[codes & 7] * np.where(codes & 8, -1, 1)
    decoded = mag * np.repeat(scale, layout.GROUP, axis=-1)[..., : v.shape[-1]]
    return decoded, layout.pack_nibbles(codes), scale16


def registered(name: str):
    """A registered codec (hskstore.codecs), exactly as a dump stores it."""
    def run(v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        codec = codecs.get(name)
        values, s = codec.encode(v.astype(np.float16))
        return codec.decode(values, s, v.shape[-1]), values, s
    return run


def int4_direct(v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    codec = codecs.get("int4")
    values, s = codec.quantize(v.astype(np.float16).astype(np.float32))
    return codec.decode(values, s, v.shape[-1]), values, s


CANDIDATES = {
    "int8": (registered("int8"), 8.0),
    "int4/fp16/32 direct": (int4_direct, 4.5),
    "int4/fp16/32 via int8 (int4)": (registered("int4"), 4.5),
    "int4/pow2/32": (lambda v: int4_pow2(v, 32), 4.25),
    "int4/pow2/16": (lambda v: int4_pow2(v, 16), 4.5),
    "e2m1/pow2/32 via int8 (mxfp4)": (registered("mxfp4"), 4.25),
    "e2m1/fp16/32": (e2m1_fp16, 4.5),
    "nf3/log8/32 via int8 (nf3)": (registered("nf3"), 3.25),
}


def kept_values(vectors: list[np.ndarray], valid: list[np.ndarray], n_width: int) -> np.ndarray:
    """[vectors, N^W] fp16 kept values of every used slot, in index order (as the dump keeps them)."""
    out = []
    for vec, ok in zip(vectors, valid, strict=True):
        used = vec[ok].astype(np.float32)
        mask = width_mask(used, n_width, "mag")
        out.append(used[mask].reshape(-1, n_width).astype(np.float16))
    return np.concatenate(out)


def measure(values16: np.ndarray) -> dict:
    v = values16.astype(np.float32)
    norm = float(np.sqrt((v**2).sum()))
    rows = {}
    for name, (fn, nominal_bits) in CANDIDATES.items():
        decoded, codes, scales = fn(v)
        err = decoded - v
        stored = sum(stored_bytes(a.reshape(a.shape[0], -1), "noshuffle" if a.itemsize == 1 else "bitshuffle")[0]
                     for a in (codes, scales))
        rows[name] = {
            "rel_rmse": float(np.sqrt((err**2).sum()) / norm),
            "max_abs_err": float(np.abs(err).max()),
            "nominal_bits_per_value": nominal_bits,
            "stored_bytes_per_value": stored / v.size,
        }
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True, help="a full-width float16 store (W=1)")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--out", default="benchmarks/store/results/value_codecs.json")
    args = ap.parse_args()
    vectors, valid, d = load_vectors(args.store, args.rows)
    widths = []
    for w in WIDTHS:
        n_width = max(1, round(w * d))
        widths.append({"width": w, "n_width": n_width, "candidates": measure(kept_values(vectors, valid, n_width))})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"store": args.store, "rows": int(vectors[0].shape[0]),
                                          "hidden_size": d, "widths": widths}, indent=2))
    print("| W | encoding | rel. RMSE | nominal bits/value | stored bytes/value |")
    print("|---|---|---|---|---|")
    for row in widths:
        for name, r in row["candidates"].items():
            print(f"| {row['width']} | {name} | {r['rel_rmse']:.4f} | {r['nominal_bits_per_value']} | "
                  f"{r['stored_bytes_per_value']:.3f} |")


if __name__ == "__main__":
    main()
