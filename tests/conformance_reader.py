"""A minimal hsk reader written from docs/STORE_FORMAT.md alone: numpy, zarr and the standard library.

It does not import hskstore or pipelines: it is the second implementation the conformance vectors
(docs/conformance/) are for, and each function cites the section of the doc it follows. It
verifies in the doc's order ("Writing a reader"): manifest, checksums, shard digests, then decodes.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

# "Shard digests": the dtype string hashed for each zarr data_type (little-endian; "|" for 1 byte).
DIGEST_DTYPE = {
    "int8": "|i1", "uint8": "|u1", "int16": "<i2", "uint16": "<u2", "int32": "<i4", "uint32": "<u4",
    "int64": "<i8", "uint64": "<u8", "float16": "<f2", "float32": "<f4", "float64": "<f8",
}
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
# "nf3: 3-bit values": the levels in ascending order; code c is level (c + 3) mod 8
NF3 = np.array([-1.0, -0.5350, -0.2469, 0.0, 0.1833, 0.3819, 0.6229, 1.0], dtype=np.float32)
# "nf4: 4-bit values": QLoRA's NormalFloat-4 levels in ascending order; code c is level (c + 7) mod 16
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044006, 0.5626170039176941,
                0.7229568362236023, 1.0], dtype=np.float32)


# --- formats 2 and 3's canonical JSON ("Manifest: the exact bytes") -------------------------------------------------
def _string(text: str) -> str:
    escapes = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}
    out = []
    for ch in text:
        if ch in escapes:
            out.append(escapes[ch])
        elif " " <= ch <= "~":
            out.append(ch)
        elif ord(ch) > 0xFFFF:  # a UTF-16 surrogate pair, each half escaped
            v = ord(ch) - 0x10000
            out.append(f"\\u{0xD800 + (v >> 10):04x}\\u{0xDC00 + (v & 0x3FF):04x}")
        else:
            out.append(f"\\u{ord(ch):04x}")
    return '"' + "".join(out) + '"'


def _scalar(value) -> str:
    if value is None or value is True or value is False:
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _string(value)
    if math.isnan(value) or math.isinf(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return repr(value)  # a float: shortest round-trip digits; the doc spells out the notation


def canonical(value, comma: str = ",", colon: str = ":") -> str:
    """The doc's canonical JSON: sorted keys, no whitespace, ASCII only, Python-repr floats.

    The identity's JSON is the same with ", " and ": " as separators."""
    if isinstance(value, list):
        return "[" + comma.join(canonical(v, comma, colon) for v in value) + "]"
    if isinstance(value, dict):
        items = sorted(value.items())  # code point order of the keys
        return "{" + comma.join(f"{_string(k)}{colon}{canonical(v, comma, colon)}" for k, v in items) + "}"
    return _scalar(value)


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


IDENTITY_FIELDS = ("format_version", "task", "dataset", "teacher", "tokenizer", "max_length", "selection", "layout")


def identity(meta: dict) -> str:
    """`identity`: the fields that decide content (absent ones as null); format 4: their RFC 8785 JSON, before:
    the legacy canonical JSON with ", " and ": " separators."""
    fields = {k: meta.get(k) for k in IDENTITY_FIELDS}
    if meta.get("format_version", 0) >= 4:
        return sha256(jcs(fields).encode("utf-8"))
    return sha256(canonical(fields, ", ", ": ").encode("ascii"))


def inputs_hash(meta: dict) -> str:
    """`inputs_hash`: the checksum strings of input_ids and token_type_ids (where the store has them: causal-LM
    stores have no token_type_ids), or of source_ids and reference_ids (sequence-to-sequence stores), concatenated."""
    names = ("source_ids", "reference_ids") if meta.get("objective") == "seq2seq" else ("input_ids", "token_type_ids")
    return sha256("".join(meta["checksums"][n] for n in names if n in meta["checksums"]).encode("ascii"))


# --- the bundle ------------------------------------------------------------------------------------
@dataclass
class Bundle:
    """A store packed as a zip: its objects by key, and the zarr group over them."""

    path: Path
    attrs: dict  # the group's attributes, "hsk" among them
    nodes: dict[str, dict]  # array path (no leading slash) -> its zarr.json, as parsed JSON
    group: zarr.Group

    @classmethod
    def open(cls, path: Path) -> Bundle:
        with zipfile.ZipFile(path) as zf:
            docs = {name[: -len("zarr.json")].rstrip("/"): json.loads(zf.read(name))
                    for name in zf.namelist() if name == "zarr.json" or name.endswith("/zarr.json")}
        nodes = {key: doc for key, doc in docs.items() if doc["node_type"] == "array"}
        group = zarr.open_group(zarr.storage.ZipStore(path, mode="r"), mode="r")
        return cls(path, docs[""]["attributes"], nodes, group)

    @property
    def meta(self) -> dict:
        return self.attrs["hsk"]


def array_entry(node: dict) -> dict:
    """The manifest's description of one array, read from its zarr.json (formats 2 and 3: `codecs` too, and
    `dimension_names` only where it has them; format 4: no codecs, `dimension_names` always, null if absent)."""
    grid = node["chunk_grid"]["configuration"]["chunk_shape"]
    codecs = node["codecs"]
    sharded = codecs[0]["name"] == "sharding_indexed"
    entry = {
        "shape": node["shape"],
        "dtype": node["data_type"],
        "chunks": codecs[0]["configuration"]["chunk_shape"] if sharded else grid,
        "shards": grid if sharded else None,
        "codecs": codecs,
        "fill_value": node["fill_value"],
        "attributes": node.get("attributes", {}),
    }
    if node.get("dimension_names") is not None:
        entry["dimension_names"] = node["dimension_names"]
    return entry


# --- format 4's canonical JSON ("Manifest: the exact bytes": RFC 8785) ------------------------------------
WRITER_NOTES = ("manifest", "stored_bytes", "created", "software_version", "upgraded")


def es_number(x: float) -> str:
    """ECMAScript's Number::toString of a float64: the fewest significant digits that read back as x, then
    plain digits for 1e-7 < |x| < 1e21, else `d.ddde+N`."""
    if x != x or x in (math.inf, -math.inf):
        return "null"
    if x == 0:
        return "0"
    if x < 0:
        return "-" + es_number(-x)
    for p in range(1, 18):
        text = f"{x:.{p - 1}e}"
        if float(text) == x:
            break
    mantissa, exp = text.split("e")
    digits = mantissa.replace(".", "").rstrip("0") or "0"
    k, n = len(digits), int(exp) + 1
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + digits
    rest = "." + digits[1:] if k > 1 else ""
    return f"{digits[0]}{rest}e{'+' if n - 1 >= 0 else '-'}{abs(n - 1)}"


def jcs(value) -> str:
    """RFC 8785: keys by UTF-16 code units, no whitespace, numbers as float64 in ECMAScript's notation, strings as
    JSON.stringify writes them; the caller encodes the text as UTF-8."""
    if value is None or value is True or value is False:
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int) and abs(value) < 2**53:
        return str(value)
    if isinstance(value, (int, float)):  # a float64 as JSON.parse reads it: too large an integer is an infinity
        return es_number(float(value) if abs(value) < 2**1024 else math.inf)
    if isinstance(value, list):
        return "[" + ",".join(jcs(v) for v in value) + "]"
    keys = sorted(value, key=lambda k: k.encode("utf-16-be"))
    return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + jcs(value[k]) for k in keys) + "}"


def manifest(bundle: Bundle) -> str:
    meta = bundle.meta
    if meta["format_version"] >= 4:
        hsk = {k: v for k, v in meta.items() if k not in WRITER_NOTES}
        arrays = {}
        for path, node in bundle.nodes.items():
            entry = array_entry(node)
            arrays[path] = {k: entry.get(k) for k in ("shape", "dtype", "chunks", "shards", "fill_value",
                                                      "dimension_names", "attributes")}
        return sha256(jcs({"hsk": hsk, "arrays": arrays}).encode("utf-8"))
    hsk = {k: v for k, v in meta.items() if k != "manifest"}
    doc = {"hsk": hsk, "arrays": {path: array_entry(node) for path, node in bundle.nodes.items()}}
    return sha256(canonical(doc).encode("ascii"))


# --- dataset fingerprint ("Metadata", "Masked-LM stores") ---------------------------------------------
def examples_fingerprint(columns: list[list[str]], labels: np.ndarray) -> str:
    """`dataset.fingerprint`: hex SHA-256 of the header line, each text length-prefixed, the labels' dtype and bytes."""
    h = hashlib.sha256(f"hsk-examples-v1 columns={len(columns)} rows={len(labels)}\n".encode("ascii"))
    for column in columns:
        for text in column:
            data = text.encode("utf-8")
            h.update(len(data).to_bytes(8, "little") + data)
    h.update(str(labels.dtype).encode("ascii"))
    h.update(np.ascontiguousarray(labels, dtype=labels.dtype.newbyteorder("<")).tobytes())
    return h.hexdigest()


def corpus_stream_fingerprint(texts: list[str]) -> str:
    """A causal-LM store's `dataset.fingerprint`: the SHA-256 chain over each document's length-prefixed BLAKE2b-128."""
    return pair_stream_fingerprint([[text] for text in texts])


def pair_stream_fingerprint(rows: list[list[str]]) -> str:
    """The chain over rows of texts (a seq2seq store's pairs: [source, target]): each row's BLAKE2b-128 is over its
    texts in turn, each its 8-byte little-endian UTF-8 length then those bytes."""
    chain = hashlib.sha256(b"hsk-corpus-stream-v1\n").digest()
    for row in rows:
        data = b"".join(len(t.encode("utf-8")).to_bytes(8, "little") + t.encode("utf-8") for t in row)
        chain = hashlib.sha256(chain + hashlib.blake2b(data, digest_size=16).digest()).digest()
    return chain.hex()


def shard_index(raw: bytes, n_chunks: int) -> list[tuple[int, int] | None]:
    """(offset, length) of each inner chunk of a shard object ("Shard objects"); None for a chunk not stored."""
    index = raw[-(16 * n_chunks + 4):]
    pairs = np.frombuffer(index[:-4], dtype="<u8").reshape(n_chunks, 2)
    return [None if int(o) == 2**64 - 1 else (int(o), int(n)) for o, n in pairs]


def _unshuffle_bytes(block: bytes, typesize: int) -> bytes:
    n = len(block) // typesize
    head = np.frombuffer(block[: n * typesize], np.uint8).reshape(typesize, n).T.reshape(-1)
    return head.tobytes() + block[n * typesize:]


def _unshuffle_bits(block: bytes, typesize: int) -> bytes:
    n = len(block) // typesize
    if n % 8:
        return block  # only whole groups of 8 elements are bit-shuffled: the block is as it is
    planes = np.frombuffer(block, np.uint8).reshape(typesize * 8, n // 8)  # row 8j + k: bit k of byte j
    bits = np.unpackbits(planes, axis=1, bitorder="little")
    return np.packbits(bits.T.reshape(n, typesize, 8), axis=-1, bitorder="little").tobytes()


def blosc_decode(frame: bytes) -> bytes:
    """One Blosc frame ("Blosc frames"): header, block offsets, streams (raw or zstd), unshuffle."""
    from numcodecs.zstd import Zstd  # a plain zstd decoder (zarr's dependency); Blosc itself is decoded here

    flags, typesize = frame[2], frame[3]
    nbytes, blocksize, _ = struct.unpack_from("<III", frame, 4)
    assert flags >> 5 == 4, "zstd"
    if flags & 0x02:
        return frame[16:16 + nbytes]
    n_blocks = -(-nbytes // blocksize)
    out = []
    for b, start in enumerate(struct.unpack_from(f"<{n_blocks}i", frame, 16)):
        size = min(blocksize, nbytes - b * blocksize)
        split = not flags & 0x10 and typesize <= 16 and blocksize // typesize >= 128 and size == blocksize
        streams = typesize if split else 1
        pos, parts = start, []
        for _ in range(streams):
            (length,) = struct.unpack_from("<i", frame, pos)
            raw = frame[pos + 4: pos + 4 + length]
            parts.append(raw if length == size // streams else bytes(Zstd().decode(raw)))
            pos += 4 + length
        block = b"".join(parts)
        if flags & 0x01 and typesize > 1:
            block = _unshuffle_bytes(block, typesize)
        elif flags & 0x04:
            block = _unshuffle_bits(block, typesize)
        out.append(block)
    return b"".join(out)


# --- digests -----------------------------------------------------------------------------------------
UNSCALED = ("float16", "int8u")  # the value codecs without a scale array ("Codecs")


def data_arrays(meta: dict) -> list[str]:
    """The data arrays in digest order (section "Digest order")."""
    if meta.get("objective") == "mlm":
        return ["row", "text_hash", "input_ids", "token_type_ids", "length", "mlm/positions", "mlm/labels",
                "mlm/kind", "mlm/topk_ids", "mlm/topk_logits", "mlm/lse"]
    if meta.get("objective") == "clm":
        return clm_arrays(meta["selection"]) + layer_arrays(meta["selection"])
    if meta.get("objective") == "seq2seq":
        return seq2seq_arrays(meta["selection"])
    names = ["row", "text_hash", "label", "logits", "input_ids", "token_type_ids", "length"]
    sel = meta["selection"]
    quantised = sel["value_dtype"] not in UNSCALED
    for i in range(len(sel["teacher_layers"])):
        names += [f"layers/{i}/{a}" for a in ("positions", "scores", "values", "masks")]
        names += [f"layers/{i}/scale"] if quantised else []
    if sel.get("attention_heads"):
        names += [f"layers/{i}/attention" for i, j in enumerate(sel["teacher_layers"]) if j >= 1]
    return names


def shape_text(shape: tuple[int, ...]) -> str:
    inner = ", ".join(str(n) for n in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"


def shard_digest(data: np.ndarray, data_type: str) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update((DIGEST_DTYPE[data_type] + shape_text(data.shape)).encode("ascii"))
    h.update(np.ascontiguousarray(data, dtype=np.dtype(DIGEST_DTYPE[data_type])).tobytes())
    return h.digest()


def read_verified(bundle: Bundle) -> dict[str, np.ndarray]:
    """Every data array, each shard checked against its digest; raises AssertionError on any mismatch."""
    meta = bundle.meta
    assert meta["manifest"] == manifest(bundle), "manifest"
    names = data_arrays(meta)
    digests = bundle.group["_progress/digests"][:]
    assert digests.shape[1] == len(names)
    for i, name in enumerate(names):
        assert meta["checksums"][name] == sha256(b"".join(bytes(d) for d in digests[:, i])), name
    rows, n = meta["layout"]["shard_rows"], meta["layout"]["n_rows"]
    out = {}
    for i, name in enumerate(names):
        data = bundle.group[name][:]
        for s in range(digests.shape[0]):
            shard = data[s * rows: min((s + 1) * rows, n)]
            assert shard_digest(shard, bundle.nodes[name]["data_type"]) == bytes(digests[s, i]), (name, s)
        out[name] = data
    return out


# --- decoding (sections "Arrays" and "Format 2") ----------------------------------------------------
def nibbles(packed: np.ndarray, n: int) -> np.ndarray:
    both = np.stack([packed & 0x0F, packed >> 4], axis=-1)
    return both.reshape(*packed.shape[:-1], -1)[..., :n]


def triplets(packed: np.ndarray, n: int) -> np.ndarray:
    """"nf3: 3-bit values": code 8m + i is bits 3i..3i+2 of the little-endian 24-bit word of bytes 3m..3m+2."""
    bits = np.unpackbits(packed, axis=-1, bitorder="little")[..., : 3 * n]
    bits = bits.reshape(*packed.shape[:-1], n, 3).astype(np.uint8)
    return bits[..., 0] | (bits[..., 1] << 1) | (bits[..., 2] << 2)


def nf3_scale(b: np.ndarray) -> np.ndarray:
    """s = 2^((b - 128) / 8): 2^(r/8) rounded to float32, times 2^q, for b - 128 = 8q + r, 0 <= r < 8."""
    q, r = np.divmod(b.astype(np.int64) - 128, 8)
    return (np.float32(2.0) ** (r / 8)).astype(np.float32) * (2.0 ** q).astype(np.float32)


def decode(values: np.ndarray, scale: np.ndarray | None, value_dtype: str, n_width: int) -> np.ndarray:
    """Stored values -> the kept values as float32 [..., N^W]."""
    if value_dtype == "nf3":
        group = np.arange(n_width) // 32
        return NF3[(triplets(values, n_width) + 3) % 8] * nf3_scale(scale)[..., group]
    if value_dtype == "nf4":  # nf3's scale byte, one per 64 values
        group = np.arange(n_width) // 64
        return NF4[(nibbles(values, n_width) + 7) % 16] * nf3_scale(scale)[..., group]
    if value_dtype in ("float16", "int8u"):  # int8u: the integer codes themselves ("int8u: unscaled indices")
        return values.astype(np.float32)
    if value_dtype == "int8":
        return values.astype(np.float32) * scale.astype(np.float32)[..., None]
    codes = nibbles(values, n_width)
    group = np.arange(n_width) // 32
    if value_dtype == "int4":
        signed = np.where(codes >= 8, codes.astype(np.int16) - 16, codes).astype(np.float32)
        return signed * scale.astype(np.float32)[..., group]
    magnitude = E2M1[codes & 7]
    factor = np.exp2(scale.astype(np.float32) - 127)[..., group]
    return np.where(codes & 8, -magnitude, magnitude) * factor


def dense(values: np.ndarray, masks: np.ndarray, d: int) -> np.ndarray:
    """Zero-filled [..., d] vectors: the kept values at the mask's ones, in increasing index order."""
    keep = np.unpackbits(masks, axis=-1)[..., :d].astype(bool)
    out = np.zeros(keep.shape, dtype=np.float32)  # unused slots (no ones) stay all zero
    out[keep] = values[keep.any(axis=-1)].reshape(-1)
    return out


# --- causal-LM stores ("Causal-LM stores") -------------------------------------------------------------
def clm_arrays(sel: dict) -> list[str]:
    """A causal-LM store's arrays in digest order, but the intermediate layers (which come last)."""
    if sel["support"] == "hidden":  # "The hidden-state support"
        scaled = sel["hidden_codec"] not in UNSCALED
        return ["row", "text_hash", "input_ids", "length", "clm/kept", "clm/hidden", *(["clm/hidden_scale"] * scaled)]
    text = ["clm/actual", "clm/token_bytes", "clm/text"] if sel.get("text_bytes") is not None else []
    return ["row", "text_hash", "input_ids", "length", "clm/kept", "clm/ids", *clm_weight_arrays(sel), *text]


def layer_arrays(sel: dict) -> list[str]:
    """"Intermediate layers": clm/layers, then clm/layers_scale for every codec but float16 (none without
    selection.layer_states)."""
    layers = sel.get("layer_states")
    if layers is None:
        return []
    return ["clm/layers"] + ([] if layers["codec"] in UNSCALED else ["clm/layers_scale"])


def clm_layers(arrays: dict[str, np.ndarray], sel: dict) -> np.ndarray:
    """The stored layer vectors, rotated, through the value codec: [n, P, L, d] float32."""
    layers = sel["layer_states"]
    return decode(arrays["clm/layers"], arrays.get("clm/layers_scale"), layers["codec"], layers["width"])


def rotation(d: int, seed: int) -> np.ndarray:
    """R of "The hidden-state support", from its words: per round (two), random signs then a random permutation
    from numpy default_rng(SeedSequence([seed, d])), then the block-diagonal Walsh-Hadamard transform of blocks of b
    = min(the largest power of two dividing d, 256); the +-1 product divided once by b. Row i of R gives h'_i."""
    b = min(d & -d, 256)
    hadamard = np.array([[1.0]])
    while len(hadamard) < b:
        hadamard = np.vstack([np.hstack([hadamard, hadamard]), np.hstack([hadamard, -hadamard])])
    rng = np.random.default_rng(np.random.SeedSequence([seed, d]))
    r = np.eye(d)
    for _ in range(2):
        signs = rng.choice((-1.0, 1.0), size=d)
        permuted = r[rng.permutation(d)] * signs[:, None]
        r = np.concatenate([hadamard @ permuted[i:i + b] for i in range(0, d, b)])
    return r / b


def clm_weight_arrays(sel: dict, group: str = "clm") -> list[str]:
    """What follows <group>/ids: the counts (sampled), or the log-probs and, for every codec but float16, their scale
    (causal-LM stores: group clm; sequence-to-sequence stores: s2s)."""
    if sel["support"] == "sample":
        return [f"{group}/counts"]
    return [f"{group}/values"] + ([] if sel["logprob_codec"] in UNSCALED else [f"{group}/scale"])


def unpack_ids(packed: np.ndarray, bits: int, slots: int) -> np.ndarray:
    """Bit j of a position's bytes is bit j % 8 (least significant first) of byte j // 8; slot s's id is bits
    s*bits .. s*bits + bits - 1, its least significant bit first. Written bit by bit (no numpy bitorder)."""
    ids = np.zeros((*packed.shape[:-1], slots), dtype=np.int64)
    for s in range(slots):
        for b in range(bits):
            j = s * bits + b
            ids[..., s] |= ((packed[..., j // 8].astype(np.int64) >> (j % 8)) & 1) << b
    return ids


def kept_mask(packed: np.ndarray, block_size: int) -> np.ndarray:
    """`clm/kept`: position t is bit 7 - t % 8 of byte t // 8 (numpy packbits' big-endian order)."""
    t = np.arange(block_size)
    return ((packed[..., t // 8] >> (7 - t % 8)) & 1).astype(bool)


def clm_logprobs(arrays: dict[str, np.ndarray], sel: dict, group: str = "clm") -> np.ndarray:
    """Top-K log-probs through the value codec (float16: the stored values; others: as "Format 2" decodes)."""
    return decode(arrays[f"{group}/values"], arrays.get(f"{group}/scale"), sel["logprob_codec"], sel["k"])


def clm_tail(logprobs: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """The mass outside the top K, in float32 ("Causal-LM stores"): each slot's probability float32(exp(log-prob))
    (exp in float64), added to a float32 sum one slot at a time from slot 0, 1 - that sum, clipped to [0, 1]; 0
    where a position is not kept."""
    probs = np.exp(logprobs.astype(np.float64)).astype(np.float32)
    total = np.zeros(probs.shape[:-1], dtype=np.float32)
    for s in range(probs.shape[-1]):
        total = np.add(total, probs[..., s], dtype=np.float32)
    tail = np.minimum(np.maximum(np.subtract(np.float32(1), total, dtype=np.float32), 0), 1).astype(np.float32)
    return np.where(kept, tail, np.float32(0))


def clm_block_text(arrays: dict[str, np.ndarray], row: int) -> tuple[str, list[int]]:
    """A block's text and its tokens' end offsets in bytes: the text is the first sum(token_bytes) bytes of
    `clm/text` (UTF-8), token t ends at token_bytes[0] + ... + token_bytes[t] ("Block text, offsets and
    actual-token log-probs")."""
    ends, total = [], 0
    for n in arrays["clm/token_bytes"][row].tolist():
        total += int(n)
        ends.append(total)
    return bytes(arrays["clm/text"][row][:total].tolist()).decode("utf-8"), ends


def clm_hidden(arrays: dict[str, np.ndarray], sel: dict) -> np.ndarray:
    """"The hidden-state support": each position's hidden state (rotated) through the value codec, [n, T, d]."""
    return decode(arrays["clm/hidden"], arrays.get("clm/hidden_scale"), sel["hidden_codec"], sel["hidden_size"])


def clm_head(bundle: Bundle, sel: dict) -> tuple[np.ndarray, np.ndarray | None]:
    """The head stored once (clm/head [V, d] float32, clm/head_bias [V] when head_bias), checked against the
    selection's head_sha256: sha256 over the weight's float32 little-endian bytes, then the bias's."""
    weight = bundle.group["clm/head"][:]
    bias = bundle.group["clm/head_bias"][:] if sel["head_bias"] else None
    digest = hashlib.sha256(np.ascontiguousarray(weight, dtype="<f4").tobytes())
    if bias is not None:
        digest.update(np.ascontiguousarray(bias, dtype="<f4").tobytes())
    assert "sha256:" + digest.hexdigest() == sel["head_sha256"], "head_sha256"
    return weight, bias


def hidden_logits(hidden: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, softcap: float | None
                  ) -> np.ndarray:
    """The teacher's logits: hidden @ head.T (+ bias), then softcap * tanh(logits / softcap) when it is set."""
    logits = hidden.astype(np.float32) @ weight.T
    if bias is not None:
        logits = logits + bias
    return softcap * np.tanh(logits / softcap) if softcap else logits


def block_hash(ids: np.ndarray) -> int:
    """A causal-LM block's `text_hash`: the first 8 bytes, little-endian, of BLAKE2b-512 over its ids as int32 LE."""
    digest = hashlib.blake2b(np.ascontiguousarray(ids, dtype="<i4").tobytes()).digest()
    return int.from_bytes(digest[:8], "little")


def pack_documents(documents: list[list[int]], block_size: int, eos: int) -> tuple[np.ndarray, np.ndarray]:
    """Blocks and lengths: each document then EOS, concatenated, cut every block_size tokens, the last padded."""
    stream = [t for doc in documents for t in (*doc, eos)]
    n = -(-len(stream) // block_size)
    padded = stream + [eos] * (n * block_size - len(stream))
    lengths = [min(block_size, len(stream) - i * block_size) for i in range(n)]
    return np.array(padded, dtype=np.int64).reshape(n, block_size), np.array(lengths)


# --- sequence-to-sequence stores ("Sequence-to-sequence stores") -------------------------------------
def seq2seq_arrays(sel: dict) -> list[str]:
    """The pairs; the teacher's output when `decoding` is not null; the s2s/ support (as clm/, over max_target
    positions) when `support` is not null: in digest order."""
    names = ["row", "text_hash", "source_ids", "source_length", "reference_ids", "reference_length"]
    if sel["decoding"] is not None:
        names += ["teacher_ids", "teacher_length"]
    if sel["support"] is not None:
        names += ["s2s/kept", "s2s/ids", *clm_weight_arrays(sel, "s2s")]
    return names


def supported_target(arrays: dict[str, np.ndarray], sel: dict) -> tuple[np.ndarray, np.ndarray]:
    """(ids, length) of the target the support sits on: `<supports_on>_ids` and `<supports_on>_length`."""
    return arrays[f"{sel['supports_on']}_ids"], arrays[f"{sel['supports_on']}_length"]


def padded(ids: list[int], width: int, pad_id: int) -> tuple[list[int], int]:
    """A sequence cut to its first `width` ids, then padded with pad_id to `width`; and its length."""
    kept = list(ids[:width])
    return kept + [pad_id] * (width - len(kept)), len(kept)


def with_eos(ids: list[int], eos_id: int) -> list[int]:
    """A target as stored before the cut: EOS appended unless it already ends with EOS."""
    return list(ids) if ids[-1:] == [eos_id] else [*ids, eos_id]


def pair_hash(source_ids: np.ndarray, reference_ids: np.ndarray) -> int:
    """A pair's `text_hash`: the first 8 bytes, little-endian, of BLAKE2b-512 over its whole source_ids row then its
    whole reference_ids row (padding included), each id as int32 LE."""
    data = b"".join(np.ascontiguousarray(ids, dtype="<i4").tobytes() for ids in (source_ids, reference_ids))
    return int.from_bytes(hashlib.blake2b(data).digest()[:8], "little")


# --- masked-LM masking ("Masked-LM stores") ------------------------------------------------------------
def mask_count(rate: float, maskable: int) -> int:
    """floor(mask_rate x maskable + 0.5) in float64, at least 1 (0 when nothing is maskable)."""
    return max(1, math.floor(rate * maskable + 0.5)) if maskable else 0


def remask(original: np.ndarray, length: int, row: int, meta: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(masked ids, positions, kinds) of one row, drawn as the doc orders the draws."""
    sel, tok = meta["selection"], meta["tokenizer"]
    special = {tok["cls_id"], tok["sep_id"], tok["pad_id"]}
    candidates = np.array([p for p in range(length) if int(original[p]) not in special], dtype=np.int64)
    rng = np.random.default_rng([sel["mask_seed"], row])
    n = mask_count(sel["mask_rate"], len(candidates))
    positions = np.sort(rng.choice(candidates, size=n, replace=False))
    u = rng.random(n)
    random_ids = rng.integers(0, tok["vocab_size"], size=n)
    random_below = sel["mask_token_rate"] + sel["random_token_rate"]
    kinds = np.where(u < sel["mask_token_rate"], 1, np.where(u < random_below, 2, 3))
    masked = original.copy()
    masked[positions] = np.where(kinds == 1, tok["mask_id"], np.where(kinds == 2, random_ids, original[positions]))
    return masked, positions, kinds


# --- quantisation ("Format 2": the arithmetic, all in float32) --------------------------------------
def quantize_int8(values16: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = values16.astype(np.float32)
    scale = (np.abs(v).max(axis=-1) / np.float32(127)).astype(np.float16)
    s = scale.astype(np.float32)[..., None]
    q = np.where(s > 0, np.rint(v / np.where(s > 0, s, 1)), 0)
    return np.clip(q, -127, 127).astype(np.int8), scale


def _groups(x: np.ndarray) -> np.ndarray:
    n = x.shape[-1]
    padded = np.zeros((*x.shape[:-1], -(-n // 32) * 32), dtype=np.float32)
    padded[..., :n] = x
    return padded.reshape(*x.shape[:-1], -1, 32)


def _pack(codes: np.ndarray) -> np.ndarray:
    """4-bit codes [..., n] -> bytes: code 2k in the low nibble, 2k+1 in the high one, odd n padded with 0."""
    codes = codes.astype(np.uint8) & 0x0F
    if codes.shape[-1] % 2:
        codes = np.concatenate([codes, np.zeros((*codes.shape[:-1], 1), np.uint8)], axis=-1)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def quantize_int4(q8: np.ndarray, scale8: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = q8.shape[-1]
    x = _groups(q8.astype(np.float32) * scale8.astype(np.float32)[..., None])
    scale = (np.abs(x).max(axis=-1) / np.float32(7)).astype(np.float16)
    s = scale.astype(np.float32)[..., None]
    code = np.clip(np.where(s > 0, np.rint(x / np.where(s > 0, s, 1)), 0), -7, 7).astype(np.int8)
    return _pack(code.reshape(*q8.shape[:-1], -1)[..., :n]), scale


def quantize_mxfp4(q8: np.ndarray, scale8: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = q8.shape[-1]
    x = _groups(q8.astype(np.float32) * scale8.astype(np.float32)[..., None])
    peak = np.abs(x).max(axis=-1)
    floor_log2 = np.frexp(peak)[1].astype(np.int32) - 1  # exact: from the float32 exponent
    exponent = np.where(peak > 0, np.clip(floor_log2 - 2, -127, 127), -127)
    m = np.minimum(np.abs(x) / np.exp2(exponent.astype(np.float32))[..., None], np.float32(6))
    # nearest grid value; a tie goes to the even index
    dist = np.abs(m[..., None] - E2M1)
    best = dist.min(axis=-1, keepdims=True)
    candidates = np.where(dist == best, np.arange(8), 99)
    even = np.where(candidates % 2 == 0, candidates, 99).min(axis=-1)
    index = np.where(even < 99, even, candidates.min(axis=-1))
    code = np.where((x < 0) & (index > 0), index | 8, index)  # never the negative-zero code 8
    return _pack(code.reshape(*q8.shape[:-1], -1)[..., :n]), (exponent + 127).astype(np.uint8)
