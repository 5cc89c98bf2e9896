"""Load a task's examples from a user file, a local glue_data folder, or the Hugging Face hub.

Everything ends up as `Examples`: columnar texts, labels with an explicit "no gold label" value
(-1, or NaN for regression: unlabeled text is allowed, docs/METHOD.md section 9), the row index within
the source split, and checksums so that stored features join to their data by content, never by
row position alone (the PKD cache's weakness, docs/METHOD.md section 7).
"""

from __future__ import annotations

import contextlib
import csv
import functools
import hashlib
import io
import json
import os
import socket
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from hskstore.errors import UserError
from pipelines.core.tasks import Task, get_task

DATA_DIR_ENV = "HSK_DATA_DIR"
FILE_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".ndjson", ".parquet")

# Our split names -> the hub's; "validation*" are accepted as aliases of "dev*".
_HUB_SPLITS = {
    "train": "train",
    "dev": "validation",
    "dev_matched": "validation_matched",
    "dev_mismatched": "validation_mismatched",
    "test": "test",
    "test_matched": "test_matched",
    "test_mismatched": "test_mismatched",
}
_SPLIT_ALIASES = {v: k for k, v in _HUB_SPLITS.items()}


class DataError(UserError, RuntimeError):
    """The requested examples cannot be loaded; the message says what was tried and what to pass."""


@dataclass
class Examples:
    """A task split held in memory, column by column. Treat it as immutable: `select` makes a new one."""

    texts: tuple[list[str], ...]  # 1 or 2 text columns, each with one string per row
    labels: np.ndarray  # int64 (-1 = no gold label) or float32 (NaN = none) for regression
    rows: np.ndarray  # int64 row index within the source split
    source: str  # human-readable origin, e.g. "glue_data:/data/SST-2/train.tsv"
    _fingerprint: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.texts = tuple(self.texts)
        if len(self.texts) not in (1, 2):
            raise ValueError(f"Examples need 1 or 2 text columns, got {len(self.texts)}")
        n = len(self.texts[0])
        sizes = [len(c) for c in self.texts] + [len(self.labels), len(self.rows)]
        if any(s != n for s in sizes):
            raise ValueError(f"Examples columns differ in length: {sizes}")

    def __len__(self) -> int:
        return len(self.texts[0])

    @property
    def has_label(self) -> np.ndarray:
        """Boolean mask of rows that carry a gold label."""
        if self.labels.dtype.kind == "f":
            return ~np.isnan(self.labels)
        return self.labels >= 0

    def select(self, indices: Sequence[int] | np.ndarray) -> Examples:
        """A new Examples with the given rows (integer indices or a boolean mask), in that order."""
        idx = np.asarray(indices)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        idx = idx.astype(np.int64, copy=False)
        return Examples(
            texts=tuple([col[i] for i in idx] for col in self.texts),
            labels=self.labels[idx],
            rows=self.rows[idx],
            source=self.source,
        )

    @property
    def fingerprint(self) -> str:
        """sha256 hex over the texts and labels (not the source), computed once."""
        if self._fingerprint is None:
            h = hashlib.sha256(f"hsk-examples-v1 columns={len(self.texts)} rows={len(self)}\n".encode())
            for col in self.texts:
                for text in col:
                    # Length prefix: ("ab", "c") and ("a", "bc") must not collide.
                    b = text.encode("utf-8")
                    h.update(len(b).to_bytes(8, "little"))
                    h.update(b)
            labels = np.ascontiguousarray(self.labels, dtype=self.labels.dtype.newbyteorder("<"))
            if labels.dtype.kind == "f":
                labels = np.where(np.isnan(labels), np.nan, labels).astype(labels.dtype)  # one NaN pattern
            h.update(str(labels.dtype).encode())
            h.update(labels.tobytes())
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    def text_hashes(self) -> np.ndarray:
        """uint64 per row: the first 8 bytes (little-endian) of blake2b over the row's texts joined by tab."""
        digests = b"".join(
            hashlib.blake2b("\t".join(fields).encode("utf-8")).digest()[:8]
            for fields in zip(*self.texts, strict=True)
        )
        return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


# --------------------------------------------------------------------------------------------------
# Hub access that never hangs: honour HF_HUB_OFFLINE read at call time (the hub libraries read it
# once, at import), and skip the network when a quick probe cannot reach the endpoint, instead of
# waiting through the hub client's ~25 s of retries.


def hub_offline() -> bool:
    """True when offline mode is asked for (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE or HF_DATASETS_OFFLINE)."""
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    if any(os.environ.get(n, "").strip().upper() in {"1", "ON", "YES", "TRUE"} for n in names):
        return True
    with contextlib.suppress(Exception):
        import huggingface_hub.constants as hub_constants

        return bool(hub_constants.HF_HUB_OFFLINE)
    return False


@functools.lru_cache(maxsize=8)
def _probe(host: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub endpoint opens (cached per process; True behind a proxy)."""
    proxies = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
    if any(os.environ.get(n) for n in proxies):
        return True  # the proxy decides; a direct probe would say nothing
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    return _probe(url.hostname or "huggingface.co", port, timeout)


def hub_unavailable_reason() -> str | None:
    """Why the hub network should not be tried now (None: go ahead)."""
    if hub_offline():
        return "offline mode is set (HF_HUB_OFFLINE)"
    if not hub_reachable():
        return f"{os.environ.get('HF_ENDPOINT', 'https://huggingface.co')} is unreachable"
    return None


@contextlib.contextmanager
def hub_cache_only() -> Iterator[None]:
    """Make `datasets` / `huggingface_hub` use their local caches only, for the duration of the block."""
    patched = []
    with contextlib.suppress(ImportError):
        import huggingface_hub.constants as hub_constants

        patched.append((hub_constants, hub_constants.HF_HUB_OFFLINE))
    with contextlib.suppress(ImportError):
        import datasets.config as ds_config

        patched.append((ds_config, ds_config.HF_HUB_OFFLINE))
    try:
        for module, _ in patched:
            module.HF_HUB_OFFLINE = True
        yield
    finally:
        for module, value in patched:
            module.HF_HUB_OFFLINE = value


# --------------------------------------------------------------------------------------------------
# Labels


def _is_missing(value: object) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and np.isnan(value):
        return True
    return isinstance(value, str) and value.strip() == ""


def _parse_labels(values: Sequence[object], task: Task, where: str) -> np.ndarray:
    """Map raw label cells to int64 class ids (-1 = none) or float32 scores (NaN = none)."""
    if task.is_regression:
        out = np.full(len(values), np.nan, dtype=np.float32)
        for i, v in enumerate(values):
            if _is_missing(v):
                continue
            try:
                out[i] = float(v)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise DataError(f"{where}: row {i}: label {v!r} is not a number (task {task.name})") from None
        return out

    assert task.labels is not None
    by_name = {name: i for i, name in enumerate(task.labels)}
    cache: dict[object, int] = {}

    def convert(v: object) -> int:
        if _is_missing(v):
            return -1
        key = v.strip() if isinstance(v, str) else v
        if isinstance(key, str) and key in by_name:
            return by_name[key]
        try:
            number = float(key)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            number = None
        if number is not None and number.is_integer() and -1 <= number < task.num_labels:
            return int(number)
        raise DataError(
            f"{where}: label {v!r} is not one of the {task.name} labels "
            f"{list(task.labels)} (or their ids 0..{task.num_labels - 1}; empty or -1 = no label)"
        )

    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        hashable = v if isinstance(v, (str, int, float, type(None))) else repr(v)
        if hashable not in cache:
            cache[hashable] = convert(v)
        out[i] = cache[hashable]
    return out


# --------------------------------------------------------------------------------------------------
# (a) the user's own file


def _decode(path: Path) -> str:
    """The file's text (UTF-8, a BOM dropped), or a DataError naming the file and line of the first bad byte."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); save the file as UTF-8"
        ) from None


def _read_tsv(path: Path) -> dict[str, list]:
    # GLUE-style: split on tabs, no quoting (stray '"' are text, not quotes).
    lines = _split_lines(path)
    if not lines:
        return {}
    header = lines[0].split("\t")
    cols: dict[str, list] = {h: [] for h in header}
    for lineno, line in enumerate(lines[1:], start=2):
        cells = line.split("\t")
        for j, h in enumerate(header):
            cols[h].append(cells[j] if j < len(cells) else None)
        if len(cells) > len(header):
            raise DataError(f"{path}:{lineno}: {len(cells)} tab-separated fields; the header has {len(header)}")
    return cols


def _read_csv(path: Path) -> dict[str, list]:
    reader = csv.DictReader(io.StringIO(_decode(path), newline=""))
    cols: dict[str, list] = {h: [] for h in reader.fieldnames or []}
    try:
        for record in reader:
            for h in cols:
                cols[h].append(record.get(h))
    except csv.Error as exc:
        raise DataError(f"{path}:{reader.line_num}: {exc}") from None
    return cols


def _read_jsonl(path: Path) -> dict[str, list]:
    records = []
    for lineno, line in enumerate(_decode(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as exc:
            raise DataError(f"{path}:{lineno}: not a JSON record ({exc})") from None
    return _records_to_columns(records, path)


def _read_json(path: Path) -> dict[str, list]:
    try:
        obj = json.loads(_decode(path))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno})") from None
    if isinstance(obj, dict) and all(isinstance(v, list) for v in obj.values()):
        return obj  # column-oriented {"sentence": [...], "label": [...]}
    if isinstance(obj, list):
        return _records_to_columns(obj, path)
    raise DataError(f"{path}: expected a JSON list of records or an object of equal-length columns")


def _read_parquet(path: Path) -> dict[str, list]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pydict()
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None


_READERS = {
    ".tsv": _read_tsv, ".csv": _read_csv, ".jsonl": _read_jsonl, ".ndjson": _read_jsonl, ".json": _read_json,
    ".parquet": _read_parquet,
}


def _read_table(path: Path) -> dict[str, list]:
    """Read a csv/tsv/json/jsonl/parquet file into named columns; errors name the file and line."""
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise DataError(f"{path}: unsupported file type {path.suffix!r}; use one of {', '.join(FILE_SUFFIXES)}")
    return reader(path)


def _records_to_columns(records: list, path: Path) -> dict[str, list]:
    names: dict[str, None] = {}
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise DataError(f"{path}: record {i} is not a JSON object")
        names.update(dict.fromkeys(r))
    return {n: [r.get(n) for r in records] for n in names}


def _parse_columns(text_columns: str | Sequence[str] | None, task: Task) -> tuple[str, ...]:
    if text_columns is None:
        return task.text_columns
    if isinstance(text_columns, str):
        text_columns = text_columns.split(",")
    cols = tuple(c.strip() for c in text_columns if c.strip())
    if len(cols) not in (1, 2):
        raise DataError(f"--text-columns takes 1 or 2 column names, got {list(cols)}")
    return cols


def _load_file(
    task: Task,
    path: Path,
    text_columns: str | Sequence[str] | None,
    label_column: str | None,
    limit: int | None,
) -> Examples:
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    cols = _read_table(path)
    n = len(next(iter(cols.values()), []))
    if any(len(v) != n for v in cols.values()):
        raise DataError(f"{path}: columns have different lengths")
    names = _parse_columns(text_columns, task)
    _check_columns(path, cols, names, label_column, task)
    label_name = label_column or ("label" if "label" in cols else None)
    stop = n if limit is None else min(n, limit)
    texts = [_text_column(path, c, cols[c][:stop]) for c in names]
    raw = cols[label_name][:stop] if label_name else [None] * stop
    return Examples(
        texts=tuple(texts),
        labels=_parse_labels(raw, task, str(path)),
        rows=np.arange(stop, dtype=np.int64),
        source=f"file:{path}",
    )


def _check_columns(path: Path, cols: dict, names: Sequence[str], label_column: str | None, task: Task) -> None:
    """Refuse a file that lacks a named text column or the named label column."""
    missing = [c for c in names if c not in cols]
    if missing:
        raise DataError(
            f"{path}: no text column(s) {missing}; the file has {list(cols)}. "
            f"Name them with --text-columns a,b (task {task.name} defaults to {','.join(task.text_columns)})"
        )
    if label_column is not None and label_column not in cols:
        raise DataError(f"{path}: no label column {label_column!r}; the file has {list(cols)}")


def _text_column(path: Path, name: str, values: Sequence[object]) -> list[str]:
    """A text column as strings, refused at its first row without text."""
    for i, v in enumerate(values):
        if _is_missing(v):
            raise DataError(f"{path}: row {i} has no text in column {name!r}")
    return [v if isinstance(v, str) else str(v) for v in values]


# --------------------------------------------------------------------------------------------------
# (b) a local glue_data folder

# Header names of the text and label columns in the original GLUE TSVs. CoLA train/dev have no
# header (source, label, author mark, sentence); its test file does ("index", "sentence").
_GLUE_TSV: dict[str, tuple[tuple[str, ...], str]] = {
    "cola": (("sentence",), "label"),
    "sst2": (("sentence",), "label"),
    "mrpc": (("#1 String", "#2 String"), "Quality"),
    "qqp": (("question1", "question2"), "is_duplicate"),
    "stsb": (("sentence1", "sentence2"), "score"),
    "mnli": (("sentence1", "sentence2"), "gold_label"),
    "qnli": (("question", "sentence"), "label"),
    "rte": (("sentence1", "sentence2"), "label"),
    "wnli": (("sentence1", "sentence2"), "label"),
}
_HEADERLESS = {"cola": ("source", "label", "mark", "sentence")}


def _split_lines(path: Path) -> list[str]:
    # Not str.splitlines(): it also splits on \x1c, \x85, \u2028..., which occur inside texts.
    text = _decode(path)  # -sig drops MRPC's BOM
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline (CoLA/dev has none)
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def glue_tsv_path(task: Task, split: str, data_dir: str | os.PathLike) -> Path:
    """Where the original glue_data layout keeps a split: <dir>/<glue_dir>/<split>.tsv."""
    return Path(data_dir).expanduser() / task.glue_dir / f"{split}.tsv"


def _glue_header(task: Task, path: Path, lines: list[str],
                 text_names: tuple[str, ...]) -> tuple[list[str], list[str], int]:
    """(the column names, the data lines, the first data line's number): the file's header line, or the
    known columns of a headerless split (CoLA train/dev)."""
    first = lines[0].split("\t") if lines else []
    if all(c in first for c in text_names):
        return first, lines[1:], 2
    if task.name in _HEADERLESS:
        return list(_HEADERLESS[task.name]), lines, 1
    raise DataError(f"{path}: expected a header with columns {list(text_names)}, got {first[:12]}")


def _load_glue_tsv(task: Task, split: str, path: Path, limit: int | None) -> Examples:
    text_names, label_name = _GLUE_TSV[task.name]
    header, body, first_lineno = _glue_header(task, path, _split_lines(path), text_names)
    text_idx = [header.index(c) for c in text_names]
    label_idx = header.index(label_name) if label_name in header else None
    needed = max(text_idx + [label_idx if label_idx is not None else -1]) + 1
    texts: tuple[list[str], ...] = tuple([] for _ in text_idx)
    raw_labels: list[str | None] = []
    for lineno, line in enumerate(body, start=first_lineno):
        if limit is not None and len(raw_labels) >= limit:
            break
        cells = _glue_cells(path, lineno, line, needed, header)
        for col, j in zip(texts, text_idx, strict=True):
            col.append(cells[j])
        raw_labels.append(cells[label_idx] if label_idx is not None else None)
    return Examples(
        texts=texts,
        labels=_parse_labels(raw_labels, task, str(path)),
        rows=np.arange(len(raw_labels), dtype=np.int64),
        source=f"glue_data:{os.path.abspath(path)}",  # absolute: a store moved elsewhere still finds its folder
    )


def _glue_cells(path: Path, lineno: int, line: str, needed: int, header: list[str]) -> list[str]:
    """A TSV line's fields, refused when it has fewer than the columns read need."""
    cells = line.split("\t")
    if len(cells) < needed:
        raise DataError(
            f"{path}:{lineno}: {len(cells)} tab-separated fields, expected at least {needed} "
            f"(columns {header})"
        )
    return cells


# --------------------------------------------------------------------------------------------------
# (c) the Hugging Face hub


def _load_hub(task: Task, split: str, limit: int | None) -> Examples:
    import datasets

    hub_split = _HUB_SPLITS[split] + (f"[:{limit}]" if limit is not None else "")
    reason = hub_unavailable_reason()
    with hub_cache_only() if reason else contextlib.nullcontext():
        ds = datasets.load_dataset(task.hub_path, task.hub_name, split=hub_split)
    cols = ds.select_columns([*task.text_columns, "label"]).to_dict()
    labels = np.asarray(cols["label"])
    if task.is_regression:
        labels = np.where(labels < 0, np.nan, labels).astype(np.float32)  # test split: -1
    else:
        labels = labels.astype(np.int64)
    return Examples(
        texts=tuple(list(cols[c]) for c in task.text_columns),
        labels=labels,
        rows=np.arange(len(labels), dtype=np.int64),
        source=f"hub:{task.hub_path}/{task.hub_name}:{_HUB_SPLITS[split]}",
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    # Shortened at a word boundary: a cut name ("TinyBERT_Gene") reads as a typo.
    return textwrap.shorten(f"{type(exc).__name__}: {text[0] if text else ''}", 300, placeholder=" ...")


def normalize_split(task: Task, split: str) -> str:
    """'validation' -> 'dev' etc.; checks the split exists for the task (MNLI has dev_matched/_mismatched)."""
    s = _SPLIT_ALIASES.get(split.strip().lower(), split.strip().lower())
    valid = ["train", *task.dev_splits, *[d.replace("dev", "test") for d in task.dev_splits]]
    if s not in valid:
        raise DataError(f"task {task.name} has no split {split!r}; choose one of {', '.join(valid)}")
    return s


def _hub_failure(task: Task, split: str, exc: Exception) -> str:
    """Why the hub could not give the split, as one line of load_examples' list of what it tried."""
    reason = hub_unavailable_reason()
    where = f"Hugging Face hub {task.hub_path} ({task.hub_name}, split {_HUB_SPLITS[split]})"
    if reason:
        return f"{where}: {reason}, and the local hub cache cannot serve it ({_first_line(exc)})"
    return f"{where}: {_first_line(exc)}"


def load_examples(
    task: Task | str,
    split: str,
    *,
    data_dir: str | os.PathLike | None = None,
    data_file: str | os.PathLike | None = None,
    text_columns: str | Sequence[str] | None = None,
    label_column: str | None = None,
    limit: int | None = None,
) -> Examples:
    """Load one split of a task.

    Sources, first match wins: `data_file` (the user's csv/tsv/json/jsonl/parquet; `text_columns` and
    `label_column` name its columns, the split is then only a label), `data_dir` or $HSK_DATA_DIR (a
    glue_data folder), the Hugging Face hub. An explicit `data_file` or `data_dir` that lacks the file
    is an error at once (no silent fallback to other data). `limit` keeps the first N rows.
    """
    task = get_task(task)
    if limit is not None and limit < 0:
        raise DataError(f"limit must be >= 0, got {limit}")
    if data_file is not None:
        return _load_file(task, Path(data_file).expanduser(), text_columns, label_column, limit)
    split = normalize_split(task, split)
    tried: list[str] = []

    if data_dir is not None:
        path = glue_tsv_path(task, split, data_dir)
        if not path.is_file():
            raise DataError(
                f"no {task.name}/{split} data: {path} does not exist. --data-dir must be a glue_data "
                f"folder laid out as DIR/{task.glue_dir}/{split}.tsv"
            )
        return _load_glue_tsv(task, split, path, limit)
    env_dir = os.environ.get(DATA_DIR_ENV)
    if env_dir:
        path = glue_tsv_path(task, split, env_dir)
        if path.is_file():
            return _load_glue_tsv(task, split, path, limit)
        tried.append(f"local glue_data: {path} does not exist (${DATA_DIR_ENV}={env_dir})")
    else:
        tried.append(f"local glue_data: no --data-dir given and ${DATA_DIR_ENV} is not set")

    try:
        return _load_hub(task, split, limit)
    except Exception as exc:  # any hub failure falls through to the one clear error below
        tried.append(_hub_failure(task, split, exc))

    raise DataError(
        f"no data for task {task.name}, split {split}. Tried:\n"
        + "".join(f"  - {t}\n" for t in tried)
        + f"Pass --data-dir DIR (a glue_data folder with DIR/{task.glue_dir}/{split}.tsv), or set "
        f"{DATA_DIR_ENV}=DIR, or --data-file FILE --text-columns {','.join(task.text_columns)} "
        f"[--label-column label] (csv, tsv, json, jsonl or parquet)."
    )
