"""Storage accounting: what a store costs, per array, per example and per kept HSK value.

The paper's format (docs/METHOD.md section 4) is the yardstick: about 4 bytes per kept value plus
1 byte per mask element (no mask at full width).
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import CorruptStoreError, printable

if TYPE_CHECKING:  # the store classes call in here for their reports (hskstore.io.reader)
    from ..format.meta import StoreMeta
    from .reader import HSKStore, TaskStore


def count_kept_vectors(store: HSKStore) -> int:
    """Token vectors actually kept over all layers (texts shorter than N^L keep fewer)."""
    total = 0
    for layer in store.layers:
        for shard in range(store.n_shards):
            start, stop = store.shard_bounds(shard)
            name = f"{layer.name}/positions"
            total += int((store.read(slice(start, stop), [name])[name] >= 0).sum())  # damage: CorruptStoreError
    return total


PARTS = ("values", "masks", "positions", "scores", "scale")


def part_of(name: str) -> str | None:
    """Which HSK part an array is (layers/<i>/values -> values); None for per-row arrays."""
    if not name.startswith("layers/"):
        return None
    part = name.rsplit("/", 1)[-1]
    return part if part in PARTS else None


def array_bytes(store: HSKStore) -> dict:
    arrays = {}
    for name, spec in store.specs.items():
        arr = store.group[name]
        try:
            stored = int(arr.nbytes_stored())  # a bundle's zip reader reads (and CRC-checks) each object
        except zipfile.BadZipFile as exc:
            raise CorruptStoreError(f"{store.url}: {name} cannot be read ({exc}); the bundle is damaged: re-copy "
                                    "it or pack it again") from None
        arrays[name] = {"stored": stored, "raw": int(arr.nbytes), "dtype": spec.dtype}
    return arrays


def storage_report(store: HSKStore) -> dict:
    """What `hsk info` counts for this store, by its kind."""
    return store.storage_report()


def task_storage_report(store: TaskStore) -> dict:
    """A task store's bytes, against the paper's format and dense fp32 of the kept tokens."""
    arrays = array_bytes(store)
    n = max(len(store), 1)
    total = sum(a["stored"] for a in arrays.values())
    # TinyBERT attention rows are counted on their own: they are not hidden-state knowledge.
    attention = _stored(arrays, lambda name: name.endswith("/attention"))
    hsk = _stored(arrays, lambda name: name.startswith("layers/")) - attention
    vectors = count_kept_vectors(store) if store.layers else 0
    d, k = store.hidden_size, store.metadata.layout.n_width
    kept_values = vectors * k
    paper = vectors * (4 * k + (d if k < d else 0))
    dense_fp32 = vectors * d * 4
    parts = {p: _stored(arrays, lambda name, p=p: part_of(name) == p) for p in PARTS}
    report = {
        "rows": len(store),
        "arrays": arrays,
        "total_bytes": total,
        "bytes_per_example": total / n,
        "hsk_bytes": hsk,
        "kept_vectors": vectors,
        "kept_values": kept_values,
        "amount_of_hsk": store.config.amount(d),
        "hsk_bytes_per_example": hsk / n,
        "attention_bytes": attention,
        "attention_bytes_per_example": attention / n,
        "bytes_per_kept_value": _ratio(hsk, kept_values),
        "paper_bytes": paper,
        "paper_bytes_per_kept_value": _ratio(paper, kept_values),
        "ratio_vs_paper": _ratio(paper, hsk),
        "dense_fp32_bytes": dense_fp32,
        "ratio_vs_dense_fp32": _ratio(dense_fp32, hsk),
        # HSK bytes by part (every layer together), and per kept value: where the bytes go
        "hsk_parts": parts,
        "hsk_parts_per_kept_value": {p: _ratio(b, kept_values) for p, b in parts.items()},
    }
    return report


def _stored(arrays: dict, chosen: Callable[[str], bool]) -> int:
    """The stored bytes of the arrays whose name is `chosen`."""
    return sum(a["stored"] for name, a in arrays.items() if chosen(name))


def _ratio(a: float, b: float) -> float:
    """a / b, NaN where b is 0 (nothing to divide by: an empty or logits-only store)."""
    return a / b if b else float("nan")


def array_lines(arrays: dict) -> list[str]:
    """The per-array table of `hsk info`: name, dtype, stored and raw bytes."""
    return [f"{'array':<28}{'dtype':>9}{'stored':>12}{'raw':>12}",
            *(f"{name:<28}{a['dtype']:>9}{human_bytes(a['stored']):>12}{human_bytes(a['raw']):>12}"
              for name, a in arrays.items())]


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def _no_address(store: HSKStore) -> str:
    if not store.metadata.complete:
        return "incomplete store"
    return f"format v{store.metadata.format_version}: metadata not covered"


def status_line(meta: StoreMeta, objective: str = "") -> str:
    return (f"status     {'complete' if meta.complete else 'INCOMPLETE'}   format v{meta.format_version}"
            f"{objective}   hsk {meta.software_version or '?'}   created {meta.created or '?'}")


def upgrade_lines(meta: dict) -> list[str]:
    """The `upgraded` line of a store `hsk upgrade` covered (none for others): from which format, when, by which
    hsk. Its metadata was covered as it was then: nothing vouches for edits made before."""
    done = meta.get("upgraded")
    if not isinstance(done, dict):
        return []
    return [printable(f"upgraded   from format v{done.get('from_version', '?')} by hsk "
                      f"{done.get('software_version') or '?'} at {done.get('at') or '?'} (its metadata as it was "
                      "then is covered; check it)")]


def tokenizer_line(meta: StoreMeta) -> str:
    return (f"tokenizer  vocab {meta.tokenizer.vocab_size}   {meta.tokenizer.vocab_hash[:19]}"
            f"   max length {meta.max_length}")


def teacher_fit(teacher: dict) -> str:
    """One line on what the store's teacher was fine-tuned for and whether it fits the store's task."""
    if "task_fit" not in teacher:
        return "not recorded (a store written before hsk recorded it)"
    made_for = teacher.get("task") or "task not recorded"
    labels = teacher.get("labels")
    shown = f"{made_for}, labels {labels}" if labels else f"{made_for}, generic labels"
    verdict = {
        "fits": "fits the task",
        "unknown": "fit unknown",
        "mismatch allowed": "ANOTHER TASK'S TEACHER (--allow-task-mismatch)",
    }.get(teacher["task_fit"], teacher["task_fit"])
    return printable(f"{shown}, {teacher.get('num_labels')} outputs: {verdict}")


def join_report(lines: list[str]) -> str:
    """A report's lines, each one line whatever a store's metadata put in it (hskstore.errors.printable)."""
    return "\n".join(printable(line) for line in lines)


def _scores_line(teacher, sel) -> list[str]:
    """How the [CLS] rows were read (docs/guide/teachers.md): unrecorded means the default, `projections`."""
    if not sel.ranking_layers:
        return []
    if teacher.scores is None:
        return ["scores     [CLS] attention rows read by projections (query and key Linears)"]
    return [printable(f"scores     [CLS] attention rows of a {teacher.model_type} teacher, read by {teacher.scores}")]


def format_report(store: HSKStore, report: dict) -> str:
    """`hsk info`'s text, by the store's kind."""
    return store.format_report(report)


def format_task_report(store: TaskStore, report: dict) -> str:
    meta, sel = store.metadata, store.selection
    teacher, revision = meta.teacher, meta.teacher.revision
    lines = [
        f"store      {printable(store.url)}",
        status_line(meta),
        *upgrade_lines(store.meta),
        f"address    {store.content_address or 'none (' + _no_address(store) + ')'}",
        f"task       {meta.task.name} / {meta.task.split}   rows {report['rows']}"
        f"   source {printable(meta.dataset.source)}",
        f"teacher    {printable(teacher.where)}{f'@{printable(revision)}' if revision else ''}"
        f"   layers {teacher.num_layers}   d={sel.hidden_size}   weights {teacher.weights_hash[:19]}",
        f"made for   {teacher_fit(teacher.record)}",
        *_scores_line(teacher, sel),
        f"precision  {printable(teacher.forward_precision)} (the teacher's forward)",
        tokenizer_line(meta),
        f"config     {sel.config}   A={report['amount_of_hsk']:.3g} units   values {sel.value_dtype}",
        f"layers     teacher {list(sel.teacher_layers)} <- reference student entries {sel.student_entries}"
        f" (S={sel.ref_student_layers}, L_top={sel.l_top})",
        f"tokens     {sel.token_strategy}, ranked by attention layers {list(sel.ranking_layers)}"
        f" ({sel.attention_scores})",
        f"width      {sel.width_strategy}, N^W={sel.n_width} of {sel.hidden_size}",
        "",
        *array_lines(report["arrays"]),
    ]
    lines += [
        "",
        f"total          {human_bytes(report['total_bytes'])}  ({report['bytes_per_example']:.1f} B/example)",
    ]
    if report["kept_values"]:
        lines += [
            f"HSK            {human_bytes(report['hsk_bytes'])}  ({report['hsk_bytes_per_example']:.1f} B/example,"
            f" {report['kept_values']} kept values)",
            f"per kept value {report['bytes_per_kept_value']:.2f} B   (paper's format "
            f"{report['paper_bytes_per_kept_value']:.2f} B: {report['ratio_vs_paper']:.2f}x smaller;"
            f" dense fp32 of the same tokens: {report['ratio_vs_dense_fp32']:.2f}x smaller)",
            "HSK by part    " + "   ".join(
                f"{p} {report['hsk_parts_per_kept_value'][p]:.3f}" for p, b in report["hsk_parts"].items() if b
            ) + "  (B per kept value)",
        ]
    if report["attention_bytes"]:
        lines.append(
            f"attention    {human_bytes(report['attention_bytes'])}  ({report['attention_bytes_per_example']:.1f}"
            f" B/example: {sel.attention_heads} heads x {sel.config.n_tokens} rows x {meta.max_length} keys"
            " per layer, fp16; `hsk derive --no-attention-rows` drops them)"
        )
    return join_report(lines)
