"""An LM dump's corpus as a stream: documents (or a seq2seq dump's pairs) read, tokenized and packed as the
teacher consumes them, so that memory and the time to the first shard do not grow with the corpus (`hsk dump
--objective clm|seq2seq`).

Sources: a UTF-8 text file (one document per non-empty line), a folder or glob of them, JSON lines or Parquet
with a named text column (or two: a pair's source and target); local paths or fsspec URLs (s3://...); a
Hugging Face dataset (pipelines.dump.hf_corpus); anything else `--data-file` reads (CSV, TSV) is read whole, a
file at a time. Every row has a `Cursor` (file, byte offset or row, part of its line; for a streamed Hugging Face
dataset also its iteration state at or before the row), so a resumed dump seeks to where its first pending shard
starts instead of reading the corpus again.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import chain

import numpy as np

from hskstore.format.clm import DocumentText, documents_owned, owned_of_ends
from hskstore.format.config import ConfigError
from hskstore.io.zarr_adapter import put_row
from pipelines.core.data import DataError
from pipelines.dump.byte_ends import ByteTable, byte_table, table_ends
from pipelines.dump.hf_corpus import StreamState, dataset_rows, is_dataset, open_dataset

TEXT_SUFFIXES = (".txt", ".text", ".md", "")
TOKENIZE_DOCS = 512  # documents per tokenizer call: the fast tokenizer's batch API, off the teacher's thread


@dataclass(frozen=True, order=True)
class Cursor:
    """Where a document starts: the file's index in the source's sorted list, the byte offset of its line (text,
    JSON lines) or its row (tables), and which part of that line (str.splitlines parts, as the whole-file read
    split it); a streamed dataset's row also carries the stream's state at or before it (`state`, not compared:
    where a resume takes up the stream, reading only the rows between it and the row)."""

    file: int = 0
    offset: int = 0
    part: int = 0
    state: StreamState | None = field(default=None, compare=False)

    def to_list(self) -> list[int]:
        return [self.file, self.offset, self.part]


@dataclass(frozen=True)
class CorpusSource:
    """The files of a corpus, their format (text | jsonl | parquet | table | hf | hf-stream), the text column of a
    table and, for a seq2seq corpus, its source and target columns."""

    files: tuple[str, ...]
    sizes: tuple[int, ...]
    kind: str
    column: str | None
    described: str
    pair: tuple[str, str] | None = None

    @property
    def signature(self) -> str:
        """What identifies the corpus before it is read (names, sizes, format): a resume must find the same."""
        fields = [self.kind, self.column, [f.rsplit("/", 1)[-1] for f in self.files], self.sizes]
        text = json.dumps(fields + ([list(self.pair)] if self.pair else []))
        return hashlib.sha256(text.encode()).hexdigest()

    def records(self, start: Cursor = Cursor()) -> Iterator[tuple[tuple, Cursor]]:
        """(values, cursor) of every row from `start` on: a text file's documents, else a table's named columns
        (the pair's two, or the text column), None where a row lacks one."""
        read = _ROWS[self.kind]
        for index in range(start.file, len(self.files)):
            yield from read(self, index, start if index == start.file else Cursor(index))

    def place(self, cursor: Cursor) -> str:
        """Where a row is, in words: its line's byte offset (text, JSON lines) or its row, in its file."""
        where = f"the line at byte {cursor.offset}" if self.kind in ("text", "jsonl") else f"row {cursor.offset}"
        return f"{self.files[cursor.file] if len(self.files) > 1 else self.described}: {where}"

    def documents(self, start: Cursor = Cursor()) -> Iterator[tuple[str, Cursor]]:
        """(text, cursor) of every non-empty document from `start` on."""
        for (value, *_), cursor in self.records(start):
            if value is not None and str(value).strip():
                yield str(value), cursor


def _fs(path: str):
    import fsspec

    return fsspec.core.url_to_fs(path)


def open_corpus(text_file: str | None, data_file: str | None, column: str | None,
                pair: tuple[str, str] | None = None) -> CorpusSource:
    """The corpus `--text-file` (a file, folder or glob of UTF-8 text) or `--data-file` (JSON lines, Parquet, CSV,
    TSV, a Hugging Face dataset; `--text-columns` names the column, or with `pair` the source and target columns)
    names; a one-line DataError or ConfigError when there is none."""
    if bool(text_file) == bool(data_file):
        raise ConfigError("an LM dump (--objective mlm or clm) reads raw text: pass --text-file (one text per line; "
                          "a file, folder or glob) or --data-file")
    if data_file and is_dataset(data_file):
        return _open_dataset(data_file, column, pair)
    given = text_file or data_file
    urls, sizes = _files("--text-file" if text_file else "--data-file", given)
    kind = "text" if text_file else _table_kind(urls[0])
    source = CorpusSource(urls, sizes, kind, column, f"{'text' if text_file else 'table'}:{given}", pair)
    return replace(source, pair=_first_names(source)) if pair and None in pair else source


def _files(flag: str, given: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The files (URLs) a file, folder or glob names, sorted, and their sizes; a one-line DataError for none."""
    fs, path = _fs(given)
    if any(ch in path for ch in "*?["):
        files = sorted(fs.glob(path))
    elif fs.isdir(path):
        files = sorted(p for p in fs.find(path) if not p.rsplit("/", 1)[-1].startswith("."))
    elif fs.isfile(path):
        files = [path]
    else:
        raise DataError(f"{flag} {given}: no such file, folder or glob")
    files = [f for f in files if fs.isfile(f)]
    if not files:
        raise DataError(f"{flag} {given}: no files there; pass a text file, a folder of them or a glob (data/*.txt)")
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    urls = tuple(f if protocol in ("file", "local") else f"{protocol}://{f}" for f in files)
    return urls, tuple(int(fs.size(f)) for f in files)


def _open_dataset(data_file: str, column: str | None, pair: tuple | None) -> CorpusSource:
    """A Hugging Face dataset (pipelines.dump.hf_corpus) as a corpus: one "file", its rows counted from 0."""
    found = open_dataset(data_file)
    wanted = pair or (column or ("text" if "text" in found.columns else found.columns[0]),)
    names = named_columns(list(found.columns), wanted, data_file)
    return CorpusSource((found.location,), (found.size,), found.kind, None if pair else names[0], found.described,
                        names if pair else None)


def _table_kind(path: str) -> str:
    name = path.lower()
    return "jsonl" if name.endswith((".jsonl", ".ndjson")) else "parquet" if name.endswith(".parquet") else "table"


def named_columns(available: list[str], wanted: tuple, where: str) -> tuple[str, ...]:
    """The columns `wanted` (a None: the next of the file's own, in order), checked against those `available`."""
    if None in wanted:
        if len(available) < len(wanted):
            raise DataError(f"{where} has {len(available)} column(s) ({', '.join(available)}); a pair needs a source "
                            "and a target: pass --text-columns SOURCE,TARGET")
        wanted = tuple(available[: len(wanted)])
    for name in wanted:
        if name not in available:
            raise DataError(f"{where} has no column {name!r}; its columns: {', '.join(available)}: pass "
                            "--text-columns")
    return wanted


def _first_names(source: CorpusSource) -> tuple[str, str]:
    """A pair's columns when --text-columns names none: a JSON-lines file's first object's first two keys, a
    Parquet file's first two columns (a CSV/TSV's, read whole, are found as it is read)."""
    if source.kind == "parquet":
        import fsspec
        import pyarrow.parquet as pq

        with fsspec.open(source.files[0], "rb") as handle:
            return named_columns(pq.ParquetFile(handle).schema_arrow.names, source.pair, source.files[0])
    if source.kind == "jsonl":
        for line, offset in _lines(source, 0, Cursor()):
            if line.strip():
                return named_columns(list(_json_object(line, source.files[0], offset)), source.pair, source.files[0])
    return source.pair


def _lines(source: CorpusSource, index: int, start: Cursor) -> Iterator[tuple[str, int]]:
    """(decoded line, byte offset) from `start` on; a one-line DataError at bytes that are not UTF-8 text."""
    import fsspec

    path = source.files[index]
    with fsspec.open(path, "rb") as handle:
        handle.seek(start.offset)
        offset = start.offset
        for raw in handle:
            if b"\0" in raw:
                raise DataError(f"{path}: binary data (a NUL byte) in the line at byte {offset}: pass UTF-8 text, "
                                "one document per line")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{path}: the line at byte {offset} is not UTF-8 ({exc.reason} at byte "
                                f"{offset + exc.start}): pass UTF-8 text, one document per line") from None
            yield line, offset
            offset += len(raw)


def _text_rows(source: CorpusSource, index: int, start: Cursor) -> Iterator[tuple[tuple, Cursor]]:
    for line, offset in _lines(source, index, start):
        parts = line.splitlines() if line.strip() else ()  # the whole-file read split lines at \r, \x0c, ... too
        for part, text in enumerate(parts):
            if (offset, part) >= (start.offset, start.part) and text.strip():
                yield (text.strip(),), Cursor(index, offset, part)


def _json_object(line: str, path: str, offset: int) -> dict:
    try:
        value = json.loads(line)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise DataError(f"{path}: the line at byte {offset} is not a JSON object")
    return value


def _jsonl_rows(source: CorpusSource, index: int, start: Cursor) -> Iterator[tuple[tuple, Cursor]]:
    names = source.pair or (source.column or "text",)
    for line, offset in _lines(source, index, start):
        if line.strip():
            value = _json_object(line, source.files[index], offset)
            yield tuple(value.get(name) for name in names), Cursor(index, offset)


def _parquet_rows(source: CorpusSource, index: int, start: Cursor) -> Iterator[tuple[tuple, Cursor]]:
    import fsspec
    import pyarrow.parquet as pq

    with fsspec.open(source.files[index], "rb") as handle:
        table = pq.ParquetFile(handle)
        available = table.schema_arrow.names
        names = named_columns(available, source.pair or (source.column or available[0],), source.files[index])
        row = 0
        for group in range(table.num_row_groups):
            rows = table.metadata.row_group(group).num_rows
            if row + rows > start.offset:  # row groups before the start are never read
                values = table.read_row_group(group, columns=list(names))
                yield from rows_from([values.column(n).to_pylist() for n in names], row, start.offset, index)
            row += rows


def rows_from(columns: list[list], first_row: int, start: int, index: int) -> Iterator[tuple[tuple, Cursor]]:
    """The rows of `columns` (whose first is row `first_row` of file `index`) from row `start` on."""
    for i in range(max(start - first_row, 0), len(columns[0])):
        yield tuple(column[i] for column in columns), Cursor(index, first_row + i)


def _table_rows(source: CorpusSource, index: int, start: Cursor) -> Iterator[tuple[tuple, Cursor]]:
    from pathlib import Path

    from pipelines.core.data import _read_table

    columns = _read_table(Path(source.files[index]))  # CSV/TSV/JSON: read whole, as before
    available = list(columns)
    wanted = source.pair or (source.column or next(iter(available), None),)
    names = named_columns(available, wanted, source.files[index])
    yield from rows_from([columns[n] for n in names], 0, start.offset, index)


def _hf_rows(source: CorpusSource, index: int, start: Cursor) -> Iterator[tuple[tuple, Cursor]]:
    names = source.pair or (source.column,)
    for values, row, state in dataset_rows(source.files[index], source.kind, names, start.offset, start.state):
        yield values, Cursor(index, row, 0, state)


_ROWS = {"text": _text_rows, "jsonl": _jsonl_rows, "parquet": _parquet_rows, "table": _table_rows, "hf": _hf_rows,
         "hf-stream": _hf_rows}


def tokenized(documents: Iterator[tuple[str, Cursor]], tokenizer, batch: int = TOKENIZE_DOCS, text: bool = False
              ) -> Iterator[tuple]:
    """(ids, (cursor, digest of the text)) per document, tokenized `batch` documents per call; with `text`, also
    the document's DocumentText (its bytes and those each token owns: the fast tokenizer's offsets, or for a
    byte-level BPE its ids' byte lengths, pipelines.dump.byte_ends)."""
    encode = partial(_encode_text, table=text_table(tokenizer)) if text else _encode
    pending: list[tuple[str, Cursor]] = []
    for item in documents:
        pending.append(item)
        if len(pending) == batch:
            yield from encode(pending, tokenizer)
            pending = []
    if pending:
        yield from encode(pending, tokenizer)


def _encode(pending: list[tuple[str, Cursor]], tokenizer) -> Iterator[tuple]:
    ids = encode_ids(tokenizer, [text for text, _ in pending])
    for (text, cursor), doc in zip(pending, ids, strict=True):
        yield doc, (cursor, document_digest(text))


def _encode_text(pending: list[tuple[str, Cursor]], tokenizer, table: ByteTable | None = None) -> Iterator[tuple]:
    texts = [text for text, _ in pending]
    data = [text.encode("utf-8") for text in texts]
    found = encode_owned(tokenizer, texts, data, table)
    for (_, cursor), doc_ids, doc_owned, doc_data in zip(pending, *found, data, strict=True):
        yield doc_ids, (cursor, _digest(doc_data)), DocumentText(doc_owned, doc_data)


def text_table(tokenizer) -> ByteTable | None:
    """The byte table of a fast tokenizer whose backend is a plain byte-level BPE (else None: the offsets)."""
    backend = _backend(tokenizer)
    return byte_table(backend) if backend is not None and hasattr(backend, "encode_batch_fast") else None


def encode_owned(tokenizer, texts: list[str], data: list[bytes], table: ByteTable | None = None
                 ) -> tuple[list[list[int]], list[np.ndarray]]:
    """(ids of each text, the bytes each of its tokens then its EOS owns): from the byte table over the ids
    without offsets for the texts it vouches for, from the tokenizer's offsets for the others (`data`: the
    texts' UTF-8)."""
    if table is None:
        ids, char_ends, counts = encode_offsets(tokenizer, texts)
        return ids, documents_owned(char_ends, counts, texts)
    ids = encode_ids(tokenizer, texts)
    counts = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(counts.sum()))
    ends, vouched = table_ends(table, flat, counts, texts, data)
    sizes = np.fromiter(map(len, data), dtype=np.int64, count=len(data))[vouched]
    owned = iter(owned_of_ends(ends, counts[vouched], np.cumsum(sizes)) if vouched.any() else ())
    if vouched.all():
        return ids, list(owned)
    rest = [text for text, ok in zip(texts, vouched, strict=True) if not ok]
    rest_ids, char_ends, rest_counts = encode_offsets(tokenizer, rest)
    exact = zip(rest_ids, documents_owned(char_ends, rest_counts, rest), strict=True)
    found = [(doc_ids, next(owned)) if ok else next(exact) for doc_ids, ok in zip(ids, vouched, strict=True)]
    return [f[0] for f in found], [f[1] for f in found]


def _backend(tokenizer):
    """A fast tokenizer's Rust backend, to be called directly where that gives what `tokenizer(texts,
    add_special_tokens=False)` gives: no truncation or padding set on it, special tokens split as the wrapper
    splits them; else None (the wrapper is called)."""
    backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if backend is None or backend.truncation is not None or backend.padding is not None:
        return None
    if getattr(backend, "encode_special_tokens", False) != bool(getattr(tokenizer, "split_special_tokens", False)):
        return None
    return backend


def encode_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    """The ids of each text without special tokens, as `tokenizer(texts, add_special_tokens=False)` gives them;
    a fast tokenizer's backend is called directly (its batch API without offsets: half the time per token)."""
    backend = _backend(tokenizer)
    if backend is None or not hasattr(backend, "encode_batch_fast"):
        return tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [encoding.ids for encoding in backend.encode_batch_fast(texts, add_special_tokens=False)]


def encode_offsets(tokenizer, texts: list[str]) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
    """(ids of each text, its tokens' character end offsets concatenated over the texts, tokens per text), as
    `tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)` gives them; a fast tokenizer's
    backend is called directly (the wrapper's per-token dicts cost more than the Rust encoding)."""
    backend = _backend(tokenizer)
    if backend is None:
        encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    else:
        encodings = backend.encode_batch(texts, add_special_tokens=False)
        ids, offsets = [e.ids for e in encodings], [e.offsets for e in encodings]
    counts = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(chain.from_iterable(chain.from_iterable(offsets)), dtype=np.int64, count=2 * int(counts.sum()))
    return ids, flat[1::2], counts


_DONE = object()


def ahead(items: Iterator, depth: int = 2) -> Iterator:
    """`items`, computed by a thread up to `depth` ahead of the consumer (reading and tokenizing beside the
    teacher's forward); its exceptions are raised here, in order."""
    box: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def fill() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        box.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            box.put((_DONE, None))
        except BaseException as exc:  # handed to the consumer
            box.put((_DONE, exc))

    thread = threading.Thread(target=fill, name="hsk-corpus", daemon=True)
    thread.start()
    try:
        while True:
            item, exc = box.get()
            if exc is not None:
                raise exc
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()


CURSORS = "_progress/stream"  # int64 [shards, 9]: start cursor, its skip, end cursor, its skip, documents
CHAINS = "_progress/corpus"  # uint8 [shards, 32]: the corpus fingerprint's chain after the shard's documents
STATES = "_progress/stream_state"  # uint8 [shards, STATE_BYTES]: a streamed dataset's state at its end cursor
STATE_BYTES = 2048  # its JSON, zero-padded (datasets' state of a Parquet or JSON stream: ~400 bytes)
STREAM_SEED = b"hsk-corpus-stream-v1\n"


def document_digest(text: str) -> bytes:
    """BLAKE2b-128 of a document's UTF-8 bytes, length-prefixed (8 bytes, little-endian)."""
    return _digest(text.encode("utf-8"))


def _digest(data: bytes) -> bytes:
    digest = hashlib.blake2b(len(data).to_bytes(8, "little"), digest_size=16)
    digest.update(data)
    return digest.digest()


def chained(chain: bytes, digests: list[bytes]) -> bytes:
    """The fingerprint's chain after these documents: SHA-256 of the chain so far and each document's digest."""
    for digest in digests:
        chain = hashlib.sha256(chain + digest).digest()
    return chain


class ShardCursors:
    """Where each written shard's rows start and end in the corpus, and the corpus fingerprint's chain after its
    documents (those whose first token it holds), and for a streamed dataset its state at the shard's end (created
    with the first): a dump's own bookkeeping beside the writer's progress records, removed when the store is
    finalized. The chain makes the fingerprint of the whole corpus, in order, without reading again what a resumed
    dump has already written."""

    def __init__(self, group, n_shards: int):
        self.group = group
        if CURSORS not in group:
            group.create_array(CURSORS, shape=(n_shards, 9), dtype="int64", chunks=(1, 9), fill_value=0)
            group.create_array(CHAINS, shape=(n_shards, 32), dtype="uint8", chunks=(1, 32), fill_value=0)
        # opened once: only the process that drives the dump writes and resizes them (opening reads their metadata)
        self.cursors, self.chains = group[CURSORS], group[CHAINS]
        self.states = group[STATES] if STATES in group else None
        self.chain = hashlib.sha256(STREAM_SEED).digest()

    def resize(self, n_shards: int) -> None:
        self.cursors.resize((n_shards, 9))
        self.chains.resize((n_shards, 32))
        if self.states is not None:
            self.states.resize((n_shards, STATE_BYTES))

    def advance(self, shard: int, rows, record: bool) -> None:
        """The chain past the shard's documents; recorded (with its cursors) before the shard itself, whose done
        flag is the commit, when `record` (a shard already written is not recorded again)."""
        self.chain = chained(self.chain, [mark[1] for mark in rows.marks])
        if not record:
            return
        end = rows.end[0] if rows.end is not None else Cursor()
        if end.state is not None or self.states is not None:
            self._record_state(shard, end.state)
        put_row(self.cursors, shard, np.array([*rows.start[0].to_list(), rows.start_skip, *end.to_list(),
                                               rows.end_skip, len(rows.marks)]))
        put_row(self.chains, shard, np.frombuffer(self.chain, dtype=np.uint8))

    def _record_state(self, shard: int, state: StreamState | None) -> None:
        """The stream's state at the shard's end cursor (zeros where there is none, or it outgrows its row: a
        resume then reads the stream from its start)."""
        if self.states is None:
            self.states = self.group.create_array(STATES, shape=(self.cursors.shape[0], STATE_BYTES), dtype="uint8",
                                                  chunks=(1, STATE_BYTES), fill_value=0)
        data = state.to_json() if state is not None else b""
        row = np.zeros(STATE_BYTES, dtype=np.uint8)
        if len(data) <= STATE_BYTES:
            row[: len(data)] = np.frombuffer(data, dtype=np.uint8)
        self.states[shard] = row

    def resume_point(self, shard: int) -> tuple[Cursor, int]:
        """Where shard `shard` starts: the end of the one before it (the corpus's start for the first); the chain
        is taken up from there."""
        if shard == 0:
            return Cursor(), 0
        row = [int(v) for v in self.cursors[shard - 1]]
        self.chain = bytes(self.chains[shard - 1])
        return Cursor(*row[4:7], self._state(shard - 1)), row[7]

    def _state(self, shard: int) -> StreamState | None:
        if self.states is None:
            return None
        data = bytes(self.states[shard]).rstrip(b"\0")  # JSON holds no NUL byte
        try:
            return StreamState.from_json(data) if data else None
        except (ValueError, KeyError, TypeError):  # unreadable: the stream is read from its start, as without one
            return None

    def documents_before(self, shard: int) -> int:
        """Documents whose first token is in the shards before `shard`."""
        return int(self.cursors[:shard, 8].sum()) if shard else 0

    def fingerprint(self) -> tuple[str, int]:
        """The corpus as read (hex of the chain after the last shard) and how many documents it held."""
        return bytes(self.chains[self.cursors.shape[0] - 1]).hex(), int(self.cursors[:, 8].sum())

    def remove(self) -> None:
        for name in (CURSORS, CHAINS, STATES):
            if name in self.group:
                del self.group[name]
