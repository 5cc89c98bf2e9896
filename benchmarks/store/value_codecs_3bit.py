"""The 3-bit value codecs `nf3` was chosen from, on a real store's activations (docs/guide/adding-a-codec.md).

    python benchmarks/store/value_codecs_3bit.py --store /tmp/sst2-full.zarr     # a full-width float16 store

At W = 0.2 the dump's magnitude mask picks the kept fp16 values of every stored vector; each candidate
maps each group's values onto an 8- (or 7-) level grid under one scale per group (fp16 max/top; a
power of two >= max/top in one byte; or a one-byte log scale 2^(k/4) or 2^(k/8) >= max/top) and rounds
to the nearest level. Reported: relative RMSE (||v - v'|| / ||v||), the entropy of the codes, and the
stored bytes per value of the codes (one per byte, and packed 8 per 3 bytes) and of the scales (Zarr
shards, Blosc zstd 3, as the store writes them). Writes benchmarks/store/results/value_codecs_3bit.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

try:  # run as a script or as a module
    from mask_codecs import load_vectors, stored_bytes
    from value_codecs import kept_values
except ImportError:  # pragma: no cover
    from benchmarks.store.mask_codecs import load_vectors, stored_bytes
    from benchmarks.store.value_codecs import kept_values

from hskstore import codecs
from hskstore.codecs.nf3 import NF3_GRID, pack3

GRIDS = {
    "int3 -3..3": [-3, -2, -1, 0, 1, 2, 3],
    "int3 -4..3": [-4, -3, -2, -1, 0, 1, 2, 3],
    "nf3": NF3_GRID.tolist(),
    "e2m0 (0,1,2,4)": [-4, -2, -1, 0, 1, 2, 4],
    "no zero (.5,1.5,2.5,3.5)": [-3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5],
}
SCALES = ("fp16", "pow2", "log4", "log8")


def _scale(peak: np.ndarray, top: float, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(float32 scale per group, what the store holds for it)."""
    if kind == "fp16":
        s16 = (peak / top).astype(np.float16)
        return s16.astype(np.float32), s16
    steps = {"pow2": 1, "log4": 4, "log8": 8}[kind]
    k = np.clip(np.ceil(steps * np.log2(np.maximum(peak, 1e-30) / top)), -128, 127)
    return np.where(peak > 0, np.exp2(k / steps), 0).astype(np.float32), (k + 128).astype(np.uint8)


def grid_codec(v: np.ndarray, levels: list[float], group: int, kind: str):
    levels = np.asarray(levels, np.float32)
    n = v.shape[-1]
    g = -(-n // group)
    pad = np.zeros((v.shape[0], g * group), np.float32)
    pad[:, :n] = v
    grp = pad.reshape(v.shape[0], g, group)
    s, stored = _scale(np.abs(grp).max(-1), float(np.abs(levels).max()), kind)
    idx = np.abs((grp / np.where(s > 0, s, 1)[..., None])[..., None] - levels).argmin(-1)
    decoded = (levels[idx] * s[..., None]).reshape(v.shape[0], -1)[:, :n]
    return decoded, idx.reshape(v.shape[0], -1)[:, :n].astype(np.uint8), stored


def row(name: str, v: np.ndarray, decoded: np.ndarray, codes: np.ndarray, scale: np.ndarray,
        registered: bool = False) -> str:
    """One table row; a registered codec's `codes` are its stored values (their bytes in the packed column)."""
    err = float(np.sqrt(((decoded - v) ** 2).sum()) / np.sqrt((v ** 2).sum()))
    scales = stored_bytes(scale.reshape(scale.shape[0], -1), "noshuffle" if scale.itemsize == 1 else "bitshuffle")[0]
    if registered:
        stored = stored_bytes(codes.reshape(codes.shape[0], -1), "noshuffle")[0] / v.size
        return f"| {name} | {err:.4f} | | | {stored:.3f} | {scales / v.size:.3f} |"
    p = np.bincount(codes.ravel(), minlength=8) / codes.size
    entropy = float(-(p[p > 0] * np.log2(p[p > 0])).sum())
    as_bytes = stored_bytes(codes, "noshuffle")[0] / v.size
    packed = stored_bytes(pack3(codes), "noshuffle")[0] / v.size
    return f"| {name} | {err:.4f} | {entropy:.2f} | {as_bytes:.3f} | {packed:.3f} | {scales / v.size:.3f} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True, help="a full-width float16 store (W=1)")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--width", type=float, default=0.2)
    ap.add_argument("--out", default="benchmarks/store/results/value_codecs_3bit.md")
    args = ap.parse_args()
    vectors, valid, d = load_vectors(args.store, args.rows)
    n_width = max(1, round(args.width * d))
    v16 = kept_values(vectors, valid, n_width)
    v = v16.astype(np.float32)
    lines = [f"{args.store}, W = {args.width} (N^W = {n_width} of d = {d}), {v.shape[0]} kept vectors", "",
             "| candidate | rel. RMSE | code entropy (bits) | codes as bytes (B/value) | codes packed 8 per 3 "
             "bytes (B/value) | scales (B/value) |", "|---|---|---|---|---|---|"]
    for name in ("int4", "mxfp4", "nf3"):  # the registered codecs, as stored
        codec = codecs.get(name)
        values, scale = codec.encode(v16)
        lines.append(row(f"**{name}** (registered; its stored values)", v, codec.decode(values, scale, n_width),
                         values, scale, registered=True))
    for grid_name, levels in GRIDS.items():
        for group in (32, 64):
            for kind in SCALES:
                decoded, codes, scale = grid_codec(v, levels, group, kind)
                lines.append(row(f"{grid_name} /{group} {kind}", v, decoded, codes, scale))
                print(lines[-1], flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
