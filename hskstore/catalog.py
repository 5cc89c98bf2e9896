"""The catalog: every store and bundle under local folders and fsspec prefixes (s3://...), from root metadata.

A store is found by its root: a folder holding `zarr.json` with hsk attributes (or only a writer
lease: a store whose creation was cut short). The walk never descends into a store, and reads of
each store only its root `zarr.json` and its card (`README.md`, for the bytes and to show it):
no chunk, no array metadata. A bundle (`*.zip`) is read through its zip directory: the same two
objects. A store whose metadata cannot be read is listed as damaged, one that is not finished as
incomplete; neither stops the listing. The catalog does not verify (`hsk verify` does): `status`
is what the store says of itself.

`render_html` writes one self-contained page (no network, inline JS): a table sorted and filtered
in the browser, each row's card, and links from a derived store to its parent's row.
"""

from __future__ import annotations

import html
import json
import os
import re
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import fsspec

from .bundle import is_bundle
from .outputs import LEASE_NAME, is_local, local_path

CARD = "README.md"
GENERATOR = "hsk catalog"


@dataclass(frozen=True)
class Entry:
    """One store or bundle as the catalog lists it (None: not recorded, or not readable)."""

    url: str
    kind: str  # "store" or "bundle"
    status: str  # "complete", "incomplete", or "damaged: <why>"
    content_address: str | None = None
    objective: str | None = None
    task: str | None = None
    split: str | None = None
    rows: int | None = None
    teacher: str | None = None
    teacher_hash: str | None = None
    config: str | None = None
    codec: str | None = None
    bytes: int | None = None
    created: str | None = None
    parent: str | None = None
    ancestors: tuple[str, ...] = ()
    license: str | None = None
    card: str | None = None


@dataclass(frozen=True)
class Filters:
    task: str | None = None
    teacher: str | None = None  # weights hash (prefix, with or without sha256:) or part of the teacher's name
    config: str | None = None
    values: str | None = None
    derived_from: str | None = None  # content address (prefix) of any ancestor

    def keep(self, e: Entry) -> bool:
        checks = [
            self.task is None or e.task == self.task,
            self.config is None or e.config == self.config,
            self.values is None or e.codec == self.values,
            self.teacher is None or _teacher_matches(self.teacher, e),
            self.derived_from is None or any(_address_matches(self.derived_from, a) for a in e.ancestors),
        ]
        return all(checks)


def _address_matches(query: str, address: str | None) -> bool:
    if not address:
        return False
    q = query if query.startswith("sha256:") else f"sha256:{query}"
    return address.startswith(q)


def _teacher_matches(query: str, e: Entry) -> bool:
    return _address_matches(query, e.teacher_hash) or (query in (e.teacher or ""))


# --- finding roots ----------------------------------------------------------------------------------
def _local_roots(top: str) -> tuple[list[str], list[str]]:
    """(store folders, bundle files) under a local folder; never descends into a store or a hidden folder."""
    top_path = local_path(top)
    if top_path.is_file():
        return [], [str(top_path)] if is_bundle(str(top_path)) else []
    stores, bundles, stack = [], [], [str(top_path)]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        names = {e.name for e in entries}
        if "zarr.json" in names or LEASE_NAME in names:
            stores.append(folder)
            continue
        for e in entries:
            if e.name.startswith("."):
                continue  # staged outputs, leases, editors' files
            if e.is_dir(follow_symlinks=False):
                stack.append(e.path)
            elif is_bundle(e.name) and e.is_file():
                bundles.append(e.path)
    return sorted(stores), sorted(bundles)


def _remote_roots(fs, top: str) -> tuple[list[str], list[str]]:
    """The same walk over an object store, one delimiter listing per folder level."""
    if fs.isfile(top):
        return [], [top] if is_bundle(top) else []
    stores, bundles, stack = [], [], [top.rstrip("/")]
    while stack:
        folder = stack.pop()
        try:
            entries = fs.ls(folder, detail=True)
        except (FileNotFoundError, OSError):
            continue
        names = {e["name"].rstrip("/").rsplit("/", 1)[-1]: e for e in entries}
        if "zarr.json" in names or LEASE_NAME in names:
            stores.append(folder)
            continue
        for name, e in names.items():
            if name.startswith("."):
                continue
            if e["type"] == "directory":
                stack.append(e["name"].rstrip("/"))
            elif is_bundle(name):
                bundles.append(e["name"])
    return sorted(stores), sorted(bundles)


# --- reading one root ------------------------------------------------------------------------------
_BYTES = re.compile(r"^bytes: (\d+)$", re.M)


def _ancestors(meta: dict) -> tuple[str, ...]:
    out, record = [], meta.get("derived_from")
    while isinstance(record, dict) and len(out) < 64:
        out.append(record.get("content_address") or record.get("identity"))
        record = record.get("derived_from")
    return tuple(a for a in out if a)


def entry_from(url: str, kind: str, root: bytes | None, card: bytes | None, lease: bool = False) -> Entry:
    """The catalog entry of one store from its root zarr.json and card bytes (either may be missing)."""
    if root is None:
        return Entry(url, kind, "incomplete: creation cut short (writer lease only)" if lease
                     else "damaged: no zarr.json")
    try:
        meta = json.loads(root)["attributes"]["hsk"]
        if not isinstance(meta, dict):
            raise TypeError("hsk attributes are not a mapping")
    except (ValueError, KeyError, TypeError) as exc:
        return Entry(url, kind, f"damaged: root metadata unreadable ({exc.__class__.__name__})")
    try:
        return _entry(url, kind, meta, None if card is None else card.decode(errors="replace"))
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        return Entry(url, kind, f"damaged: metadata lacks or mangles {exc}")


def _entry(url: str, kind: str, meta: dict, card: str | None) -> Entry:
    sel = meta.get("selection") or {}
    complete = bool(meta.get("complete"))
    found = _BYTES.search(card or "")
    teacher = meta.get("teacher") or {}
    objective = meta.get("objective", "task")
    return Entry(
        url=url, kind=kind, status="complete" if complete else "incomplete",
        content_address=meta.get("manifest") if complete else None,
        objective=objective, task=meta["task"]["name"], split=meta["task"].get("split"),
        rows=int(meta["layout"]["n_rows"]), teacher=teacher.get("name"), teacher_hash=teacher.get("weights_hash"),
        config=sel.get("config") if objective == "task" else f"top-{sel.get('top_k')}",
        codec=sel.get("value_dtype") if objective == "task" else None,
        bytes=int(found.group(1)) if found else None, created=meta.get("created"),
        parent=(meta.get("derived_from") or {}).get("content_address"), ancestors=_ancestors(meta),
        license=(meta.get("sharing") or {}).get("license"), card=card,
    )


def _read_bundle(url: str) -> Entry:
    try:
        with fsspec.open(url, "rb") as raw, zipfile.ZipFile(raw) as zf:
            names = set(zf.namelist())
            root = zf.read("zarr.json") if "zarr.json" in names else None
            card = zf.read(CARD) if CARD in names else None
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        return Entry(url, "bundle", f"damaged: not a readable zip ({exc.__class__.__name__})")
    return entry_from(url, "bundle", root, card)


def _read_local_store(folder: str) -> Entry:
    def read(name: str) -> bytes | None:
        try:
            with open(os.path.join(folder, name), "rb") as f:
                return f.read()
        except OSError:
            return None

    return entry_from(folder, "store", read("zarr.json"), read(CARD), os.path.exists(os.path.join(folder, LEASE_NAME)))


def _read_remote_stores(fs, protocol: str, folders: list[str]) -> list[Entry]:
    paths = [f"{f}/{name}" for f in folders for name in ("zarr.json", CARD, LEASE_NAME)]
    got = fs.cat(paths, on_error="return") if paths else {}

    def value(path: str) -> bytes | None:
        v = got.get(path)
        return v if isinstance(v, bytes) else None

    return [entry_from(f"{protocol}://{f}", "store", value(f"{f}/zarr.json"), value(f"{f}/{CARD}"),
                       value(f"{f}/{LEASE_NAME}") is not None) for f in folders]


def scan(location: str) -> list[Entry]:
    """Every store and bundle under one local folder or fsspec URL (a store or bundle itself included)."""
    if is_local(location):
        if not local_path(location).exists():
            raise FileNotFoundError(location)
        stores, bundles = _local_roots(location)
        with ThreadPoolExecutor(max_workers=8) as pool:
            entries = list(pool.map(_read_local_store, stores))
        return entries + [_read_bundle(b) for b in bundles]
    fs, top = fsspec.core.url_to_fs(location)
    if not fs.exists(top):
        raise FileNotFoundError(location)
    protocol = location.split("://", 1)[0]
    stores, bundles = _remote_roots(fs, top)
    return _read_remote_stores(fs, protocol, stores) + [_read_bundle(f"{protocol}://{b}") for b in bundles]


def catalog(locations: list[str], filters: Filters = Filters()) -> list[Entry]:
    """The entries under every location that pass the filters, sorted by URL."""
    entries = [e for loc in locations for e in scan(loc)]
    return sorted((e for e in entries if filters.keep(e)), key=lambda e: e.url)


# --- showing it ------------------------------------------------------------------------------------
COLUMNS = ("content_address", "task", "split", "rows", "teacher_hash", "config", "codec", "bytes", "created",
           "parent", "status", "url")


def _short(address: str | None) -> str:
    return "-" if not address else address.removeprefix("sha256:")[:12]


def _cell(e: Entry, column: str) -> str:
    value = getattr(e, column)
    if column in ("content_address", "teacher_hash", "parent"):
        return _short(value)
    return "-" if value is None else str(value)


def format_table(entries: list[Entry]) -> str:
    """A plain-text table, one line per entry (addresses shortened to 12 hex digits)."""
    rows = [[c.replace("content_address", "address").replace("teacher_hash", "teacher") for c in COLUMNS]]
    rows += [[_cell(e, c) for c in COLUMNS] for e in entries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def to_json(entries: list[Entry]) -> str:
    return json.dumps([asdict(e) for e in entries], indent=2, default=str)


def _row_id(address: str | None) -> str:
    return "store-" + (address or "").removeprefix("sha256:")[:24]


def _html_row(e: Entry, present: set[str], anchors: dict[str, int], index: int) -> str:
    """One table row; one row per content address carries its anchor (a store folder rather than its bundle)."""
    esc = html.escape
    cells = []
    for c in COLUMNS:
        text = esc(_cell(e, c))
        sort = esc(str(getattr(e, c) if getattr(e, c) is not None else ""))
        if c == "parent" and e.parent:
            text = (f'<a href="#{_row_id(e.parent)}">{text}</a>' if e.parent in present
                    else f'<span title="not in this listing">{text}</span>')
        if c == "content_address" and e.content_address:
            text = f'<span title="{esc(e.content_address)}">{text}</span>'
        if c == "url":
            card = (f"<details><summary>card</summary><pre>{esc(e.card)}</pre></details>" if e.card else "")
            text = f"{text}{card}"
        cells.append(f'<td data-sort="{sort}">{text}</td>')
    status = "ok" if e.status == "complete" else "bad"
    row_id = f' id="{_row_id(e.content_address)}"' if e.content_address and anchors[e.content_address] == index else ""

    return (f'<tr{row_id} class="{status}" data-task="{esc(e.task or "")}" data-status="{esc(e.status)}">'
            + "".join(cells) + "</tr>")


_NUMERIC = {"rows", "bytes"}

_SCRIPT = """
const body = document.querySelector('#catalog tbody');
const query = document.getElementById('filter'), task = document.getElementById('task');
const shown = document.getElementById('shown');
function apply() {
  const q = query.value.toLowerCase(), t = task.value;
  let n = 0;
  for (const tr of body.rows) {
    const ok = (!q || tr.textContent.toLowerCase().includes(q)) && (!t || tr.dataset.task === t);
    tr.hidden = !ok;
    if (ok) n++;
  }
  shown.textContent = n;
}
query.addEventListener('input', apply);
task.addEventListener('change', apply);
document.querySelectorAll('#catalog th').forEach((th, i) => th.addEventListener('click', () => {
  const up = th.dataset.dir !== 'asc';
  document.querySelectorAll('#catalog th').forEach(h => delete h.dataset.dir);
  th.dataset.dir = up ? 'asc' : 'desc';
  const numeric = th.dataset.type === 'num';
  const key = tr => tr.cells[i].dataset.sort;
  const rows = Array.from(body.rows).sort((a, b) => {
    const x = key(a), y = key(b);
    const c = numeric ? (parseFloat(x || '-1') - parseFloat(y || '-1')) : x.localeCompare(y);
    return up ? c : -c;
  });
  rows.forEach(tr => body.appendChild(tr));
}));
apply();
"""

_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 1.5em; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { cursor: pointer; background: #f4f4f4; position: sticky; top: 0; }
th[data-dir=asc]::after { content: " \\25B2"; } th[data-dir=desc]::after { content: " \\25BC"; }
tr.bad td { background: #fff0f0; } tr:target td { background: #fffbd0; }
pre { white-space: pre-wrap; max-width: 60em; font-size: 12px; }
td { font-family: ui-monospace, monospace; font-size: 12px; }
"""


def render_html(entries: list[Entry], title: str = "hsk stores") -> str:
    """One self-contained page: sortable, filterable table; cards; parent links between rows."""
    esc = html.escape
    present = {e.content_address for e in entries if e.content_address}
    heads = "".join(
        f'<th data-type="{"num" if c in _NUMERIC else "text"}">'
        f'{esc(c.replace("content_address", "address").replace("teacher_hash", "teacher"))}</th>' for c in COLUMNS)
    tasks = "".join(f'<option value="{esc(t)}">{esc(t)}</option>' for t in sorted({e.task for e in entries if e.task}))
    anchors: dict[str, int] = {}
    for i in sorted(range(len(entries)), key=lambda i: (entries[i].kind != "store", i)):
        anchors.setdefault(entries[i].content_address or "", i)
    rows = "\n".join(_html_row(e, present, anchors, i) for i, e in enumerate(entries))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="generator" content="{GENERATOR}">
<title>{esc(title)}</title><style>{_STYLE}</style></head>
<body><h1>{esc(title)}</h1>
<p><input id="filter" type="search" placeholder="filter (any text)" size="40">
<select id="task"><option value="">all tasks</option>{tasks}</select>
<span id="shown">{len(entries)}</span> of {len(entries)} shown. Click a column to sort; a parent links to its row.</p>
<table id="catalog"><thead><tr>{heads}</tr></thead><tbody>
{rows}
</tbody></table>
<script>{_SCRIPT}</script></body></html>
"""


def is_catalog_page(path) -> bool:
    """Whether a file is a page `render_html` wrote (the only file `--html --overwrite` replaces)."""
    try:
        with open(path, "rb") as f:
            head = f.read(400)
    except OSError:
        return False
    return f'<meta name="generator" content="{GENERATOR}">'.encode() in head
