"""Which exact mask encoding costs least, measured on a real store's activations.

    hsk dump --task sst2 --teacher runs/sweep_sst2/teacher --data-dir ../shared/data/glue --limit 2000 \
        --student-layers 4 --config 5,16,1 --out /tmp/sst2-full.zarr
    python benchmarks/store/mask_codecs.py --store /tmp/sst2-full.zarr

The store must hold full-width float16 vectors (W = 1): each width W below recomputes the dump's
magnitude mask (`selection.width_mask`) on them, encodes it each candidate way, and writes it as
a store would (Zarr v3, shards of 1,024 rows, chunks of 256, Blosc zstd at level 3 or 9) to count
the bytes actually stored. Candidates:

- packbits/bitshuffle/3: format 1 (np.packbits over d, bit-shuffled zstd 3);
- packbits/bytes/1, /3, /5, /9: the same bytes compressed whole at zstd level 1, 3, 5 or 9 (format 2
  wrote level 9 until the dump had to keep up with a GPU; it writes level 5 now);
- gaps16/shuffle/3 and /9: N^W uint16 distances between sorted kept indices (from -1),
  byte-shuffled so the mostly-zero high bytes compress away;
- gaps8/bytes/9: the gaps as uint8 (a lower bound: only exact when d - N^W + 1 <= 255);
- indices16/bitshuffle/3: the sorted kept indices themselves.

Bounds: H(W) * d bits (independent dims), and sum_j H(p_j) (each dim its own keep rate p_j, which
a real teacher's outlier dims push below H(W)); neither counts correlations across vectors, which
a compressor may still find. Each candidate's cost to write is measured too (`encode_us_per_vector`:
wall microseconds per kept vector to compress and store it, one Blosc thread; the dump pays it once
per example and layer). Writes benchmarks/store/results/mask_codecs.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numcodecs.blosc
import numpy as np
import zarr
from zarr.codecs import BloscCodec, BloscShuffle

from hskstore.format import codec
from hskstore.io.reader import open_store
from hskstore.method.selection import width_mask

WIDTHS = (0.1, 0.2, 0.3, 0.5)
SHARD_ROWS, CHUNK_ROWS = 1024, 256
SHUFFLES = {"bitshuffle": BloscShuffle.bitshuffle, "shuffle": BloscShuffle.shuffle,
            "noshuffle": BloscShuffle.noshuffle}


def stored_bytes(array: np.ndarray, shuffle: str, clevel: int = 3) -> tuple[int, float]:
    """Bytes a store would hold for `array` [rows, ...] with the store's sharding and Blosc zstd, and
    the seconds writing it took (best of 3)."""
    tail = array.shape[1:]
    rows = array.shape[0]
    shard = min(SHARD_ROWS, rows)
    z = zarr.create_array(
        zarr.storage.MemoryStore(), shape=array.shape, dtype=array.dtype,
        chunks=(min(CHUNK_ROWS, shard), *tail), shards=(shard, *tail),
        compressors=BloscCodec(cname="zstd", clevel=clevel, shuffle=SHUFFLES[shuffle]), fill_value=0,
    )
    seconds = []
    for _ in range(3):
        start = time.perf_counter()
        z[...] = array
        seconds.append(time.perf_counter() - start)
    return int(z.nbytes_stored()), min(seconds)


def load_vectors(url: str, max_rows: int | None) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """Per kept layer: full-width fp16 vectors [rows, N^L, d] and slot validity [rows, N^L]."""
    store = open_store(url)
    if store.selection.n_width != store.hidden_size or store.selection.value_dtype != "float16":
        raise SystemExit(f"{url}: need a full-width (W=1) float16 store, got W={store.config.width} "
                         f"{store.selection.value_dtype}")
    vectors, valid = [], []
    for layer in store.layers:
        parts, ok = [], []
        for shard in range(store.n_shards):
            data = store.read_shard(shard, names=[f"{layer.name}/{a}" for a in ("positions", "values", "masks")])
            parts.append(data[f"{layer.name}/values"])
            ok.append(data[f"{layer.name}/positions"] >= 0)
        vectors.append(np.concatenate(parts)[:max_rows])
        valid.append(np.concatenate(ok)[:max_rows])
    return vectors, valid, store.hidden_size


def entropy_bits(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return -(p * np.log2(p) + (1 - p) * np.log2(1 - p))


def kept_indices(mask: np.ndarray, n_width: int) -> np.ndarray:
    """[..., d] bool -> [..., N^W] increasing kept indices (-1 throughout an unused slot)."""
    flat = mask.reshape(-1, mask.shape[-1])
    used = flat.any(axis=-1)
    idx = np.full((flat.shape[0], n_width), -1, dtype=np.int64)
    idx[used] = np.nonzero(flat[used])[1].reshape(-1, n_width)
    return idx.reshape(*mask.shape[:-1], n_width)


def candidates(mask: np.ndarray, n_width: int) -> dict[str, tuple[np.ndarray, str, int]]:
    idx = kept_indices(mask, n_width)
    gaps = np.where(idx >= 0, np.diff(idx, axis=-1, prepend=-1), 0).astype(np.uint16)
    packed = codec.pack_mask(mask)
    return {
        "packbits/bitshuffle/3": (packed, "bitshuffle", 3),
        "packbits/bytes/1": (packed, "noshuffle", 1),
        "packbits/bytes/3": (packed, "noshuffle", 3),
        "packbits/bytes/5": (packed, "noshuffle", 5),
        "packbits/bytes/9": (packed, "noshuffle", 9),
        "gaps16/shuffle/3": (gaps, "shuffle", 3),
        "gaps16/shuffle/9": (gaps, "shuffle", 9),
        "gaps8/bytes/9": (np.minimum(gaps, 255).astype(np.uint8), "noshuffle", 9),
        "indices16/bitshuffle/3": (np.maximum(idx, 0).astype(np.uint16), "bitshuffle", 3),
    }


def measure_width(vectors: list[np.ndarray], valid: list[np.ndarray], d: int, width: float) -> dict:
    n_width = max(1, round(width * d))
    totals: dict[str, int] = {}
    seconds: dict[str, float] = {}
    kept_vectors, keep_rate = 0, np.zeros(d)
    for vec, ok in zip(vectors, valid, strict=True):
        mask = width_mask(vec, n_width, "mag", valid=ok)
        kept_vectors += int(ok.sum())
        keep_rate += mask[ok].sum(axis=0)
        for name, (array, shuffle, clevel) in candidates(mask, n_width).items():
            stored, took = stored_bytes(array, shuffle, clevel)
            totals[name] = totals.get(name, 0) + stored
            seconds[name] = seconds.get(name, 0.0) + took
    keep_rate /= max(kept_vectors, 1)
    bits = {name: 8 * b / kept_vectors for name, b in totals.items()}
    exact_gaps8 = d - n_width + 1 <= 255
    return {
        "width": width, "n_width": n_width, "kept_vectors": kept_vectors,
        "bits_per_vector": bits,
        "bytes_per_kept_value": {name: b / 8 / n_width for name, b in bits.items()},
        "encode_us_per_vector": {name: 1e6 * s / kept_vectors for name, s in seconds.items()},
        "bound_iid_bits_per_vector": float(entropy_bits(np.array(n_width / d)) * d),
        "bound_per_dim_bits_per_vector": float(entropy_bits(keep_rate).sum()),
        "gaps8_exact": exact_gaps8,
        "best": min((b, name) for name, b in bits.items() if exact_gaps8 or not name.startswith("gaps8"))[1],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True, help="a full-width float16 store (W=1)")
    ap.add_argument("--rows", type=int, default=None, help="use only the first ROWS rows")
    ap.add_argument("--out", default="benchmarks/store/results/mask_codecs.json")
    args = ap.parse_args()
    numcodecs.blosc.set_nthreads(1)  # the dump encodes each array on one thread
    vectors, valid, d = load_vectors(args.store, args.rows)
    store = open_store(args.store)
    rows = [measure_width(vectors, valid, d, w) for w in WIDTHS]
    result = {"store": args.store, "task": store.meta["task"]["name"], "teacher": store.meta["teacher"]["name"],
              "rows": int(vectors[0].shape[0]), "hidden_size": d, "layers": list(store.selection.teacher_layers),
              "n_tokens": store.config.n_tokens, "widths": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    names = list(rows[0]["bits_per_vector"])
    print(f"bits per kept vector and encode microseconds per vector (d={d}; packbits raw = "
          f"{8 * ((d + 7) // 8)}), {result['rows']} rows, layers {result['layers']}")
    print("| W | N^W | " + " | ".join(names) + " | bound H(W)*d | bound per-dim |")
    print("|---" * (len(names) + 4) + "|")
    for r in rows:
        cells = " | ".join(f"{r['bits_per_vector'][n]:.0f} ({r['encode_us_per_vector'][n]:.2f} us)" for n in names)
        print(f"| {r['width']} | {r['n_width']} | {cells} | {r['bound_iid_bits_per_vector']:.0f} | "
              f"{r['bound_per_dim_bits_per_vector']:.0f} |")


if __name__ == "__main__":
    main()
