"""The catalog: every store and bundle under local folders and fsspec prefixes (s3://...), from root metadata.

A store is found by its root: a folder holding `zarr.json` with hsk attributes (or only a writer
lease: a store whose creation was cut short). The walk never descends into a store, and reads of
each store only its root `zarr.json` (which records `stored_bytes`), plus its card (`README.md`)
for the HTML page or for a store written before `stored_bytes` was recorded: no chunk, no array
metadata. A local store's folders are listed, to mark one holding a link or a FIFO as damaged. A
bundle (`*.zip`) is read through its zip directory: the same objects. On an object
store the walk costs one batch of concurrent reads per folder level, not one request per store.
A store whose metadata cannot be read is listed as damaged, one that is not finished as
incomplete; neither stops the listing. The catalog does not verify (`hsk verify` does): `status`
is what the store says of itself.

`render_html` writes one self-contained page (no network, inline JS): a table sorted and filtered
in the browser, each row's card, and links from a derived store to its parent's row.
"""

from __future__ import annotations

import html
import json
import re
import zipfile
import zlib
from dataclasses import asdict, dataclass, fields, replace

import fsspec

from ..errors import StoreError, printable
from ..format.meta import objective_of
from ..format.schema import PROGRESS_GROUP
from ..io.access import raise_if_access
from ..io.card import selection_text
from ..io.info import human_bytes
from ..io.location import check_plain_tree, is_bundle, is_local, local_path, location, zip_problem
from ..io.outputs import LEASE_NAME
from ..plugins import PluginError

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


def _needs_card(root: bytes | None, cards: bool) -> bool:
    """The card is read when asked for, or for the bytes of a store written before `stored_bytes` was recorded."""
    return root is not None and (cards or b'"stored_bytes"' not in root)


# --- reading one root ------------------------------------------------------------------------------
_BYTES = re.compile(r"^bytes: (\d+)$", re.M)


def _ancestors(meta: dict) -> tuple[str, ...]:
    out, record = [], meta.get("derived_from")
    while isinstance(record, dict) and len(out) < 64:
        out.append(record.get("content_address") or record.get("identity"))
        record = record.get("derived_from")
    return tuple(a for a in out if a)


# What metadata someone handed over can make the parsing raise: each lists that store as damaged, never more.
_DAMAGE = (KeyError, TypeError, AttributeError, ValueError, OverflowError, RecursionError)


def entry_from(url: str, kind: str, root: bytes | None, card: bytes | None, lease: bool = False,
               problem: str | None = None) -> Entry | None:
    """The catalog entry of one store from its root zarr.json and card bytes (either may be missing; `problem`
    says why the root could not be read); None for a zarr group that is not an hsk store."""
    if root is None:
        if problem:
            return Entry(url, kind, f"damaged: zarr.json unreadable ({problem})")
        return Entry(url, kind, "incomplete: creation cut short (writer lease only)" if lease
                     else "damaged: no zarr.json")
    try:
        doc = json.loads(root)
        if not isinstance(doc, dict):
            raise TypeError("zarr.json is not a mapping")
    except (ValueError, TypeError, RecursionError) as exc:  # RecursionError: JSON nested thousands deep
        return Entry(url, kind, f"damaged: root metadata unreadable ({exc.__class__.__name__})")
    meta = (doc.get("attributes") or {}).get("hsk")
    if meta is None and not lease:
        return None  # a zarr group that is no hsk store: not listed
    if not isinstance(meta, dict):
        return Entry(url, kind, "incomplete: creation cut short (no hsk metadata yet)" if lease
                     else "damaged: hsk metadata is not a mapping")
    try:
        return _entry(url, kind, meta, None if card is None else card.decode(errors="replace"))
    except _DAMAGE as exc:
        return Entry(url, kind, f"damaged: metadata lacks or mangles {exc.__class__.__name__}: {exc}"[:300])
    except PluginError as exc:  # its kind's package is broken here: the store may be fine, the catalog goes on
        return Entry(url, kind, f"unreadable here: {exc}"[:300])


def _as_declared(e: Entry) -> Entry:
    """The entry with every field of the type it declares (a forged store may put a number where text goes, a
    list where a count goes): text as text, a count that is no integer as None, so nothing downstream fails."""
    changes = {f.name: _declared(f.type, getattr(e, f.name)) for f in fields(e)
               if getattr(e, f.name) is not None and f.type in _DECLARED_AS}
    return replace(e, **{name: value for name, value in changes.items() if value is not _AS_IS})


_AS_IS = object()
_DECLARED_AS = ("str | None", "int | None", "tuple[str, ...]")


def _declared(declared: str, value):
    """`value` as the declared type wants it, or _AS_IS when it already is."""
    if declared == "str | None":
        return _AS_IS if isinstance(value, str) else str(value)
    if declared == "int | None":
        return None if isinstance(value, bool) or not isinstance(value, int) else _AS_IS
    return tuple(str(v) for v in value)


def _entry(url: str, kind: str, meta: dict, card: str | None) -> Entry:
    complete = bool(meta.get("complete"))
    found = _BYTES.search(card or "")
    teacher = meta.get("teacher") or {}
    objective = objective_of(meta)
    config, codec = selection_text(meta)[:2]  # its kind's selection record; None for a damaged selection
    return _as_declared(Entry(
        url=url, kind=kind, status="complete" if complete else "incomplete",
        content_address=meta.get("manifest") if complete else None,
        objective=objective, task=meta["task"]["name"], split=meta["task"].get("split"),
        rows=int(meta["layout"]["n_rows"]), teacher=teacher.get("name"), teacher_hash=teacher.get("weights_hash"),
        config=config, codec=codec,
        bytes=meta.get("stored_bytes") or (int(found.group(1)) if found else None), created=meta.get("created"),
        parent=(meta.get("derived_from") or {}).get("content_address"), ancestors=_ancestors(meta),
        license=(meta.get("sharing") or {}).get("license"), card=card,
    ))


def _read_bundle(url: str, cards: bool = False) -> Entry | None:
    try:
        with fsspec.open(url, "rb") as raw, zipfile.ZipFile(raw) as zf:
            problem = zip_problem(zf)
            if problem:
                return Entry(url, "bundle", f"damaged: {problem}")
            names = set(zf.namelist())
            root = zf.read("zarr.json") if "zarr.json" in names else None
            card = zf.read(CARD) if CARD in names and _needs_card(root, cards) else None
    # NotImplementedError: an unknown compression method; RuntimeError: a password is needed; the rest: a bad
    # CRC, a truncated or garbled member
    except (OSError, zipfile.BadZipFile, ValueError, NotImplementedError, RuntimeError, EOFError, zlib.error) as exc:
        return Entry(url, "bundle", f"damaged: not a readable zip ({exc.__class__.__name__})")
    return entry_from(url, "bundle", root, card)


def _raise_if_unreachable(top, url: str) -> None:
    """s3fs answers `exists` on a bucket with False for a wrong secret, an unknown key or an endpoint it cannot
    reach: a listing raises the error itself, which names the cause (hskstore.io.access) instead of "nothing"."""
    if is_local(url):
        return
    try:
        top.names()
    except Exception as exc:
        raise_if_access(exc, url)


def scan(location_url: str, cards: bool = False) -> list[Entry]:
    """Every store and bundle under one local folder or fsspec URL (a store or bundle itself included).
    `cards`: also read each store's card (for the HTML page); otherwise only zarr.json is read."""
    top = location(location_url)
    problem = top.problem()  # an unknown URL scheme, or one whose package is missing
    if problem:
        raise StoreError(problem)
    if not top.exists():
        _raise_if_unreachable(top, location_url)
        raise FileNotFoundError(location_url)
    if top.is_file():  # a bundle named itself
        bundles, roots = ([location_url] if is_bundle(location_url) else []), []
    else:
        # a folder holding _progress is a store whose root zarr.json was deleted: listed as damaged
        roots, bundles = top.find_roots("zarr.json", LEASE_NAME, is_bundle, also=(PROGRESS_GROUP,))
    got = top.read_many([r.name_under(CARD) for r in roots if _needs_card(r.head, cards)])
    entries = [entry_from(r.url, "store", r.head, got.get(r.name_under(CARD)), r.marked, r.problem) for r in roots]
    entries = [_plain(e) for e in entries if e is not None]
    entries += [_read_bundle(b, cards) for b in bundles]
    return [e for e in entries if e is not None]


def _plain(e: Entry) -> Entry:
    """A local store holding a link, a FIFO, a device or an oversized metadata file is damaged: every other command
    refuses it, so the catalog must not call it complete. Only the folders are listed (no file is opened), and
    an object store holds no such entries."""
    if e.status.startswith("damaged") or not is_local(e.url):
        return e
    try:
        check_plain_tree(local_path(e.url))
    except StoreError as exc:
        return replace(e, status=f"damaged: {exc}"[:300])
    return e


def catalog(locations: list[str], filters: Filters = Filters(), cards: bool = False) -> list[Entry]:
    """The entries under every location that pass the filters, sorted by URL."""
    entries = [e for loc in locations for e in scan(loc, cards)]
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
    if column == "bytes" and value is not None:
        return human_bytes(value)  # as `hsk info` prints them; --json and the page's sort keep the count
    return "-" if value is None else str(value)


def format_table(entries: list[Entry]) -> str:
    """A plain-text table, one line per entry (addresses shortened to 12 hex digits). Every cell comes from a
    store or a folder name: control characters (a newline would split the row) are shown escaped."""
    rows = [[c.replace("content_address", "address").replace("teacher_hash", "teacher") for c in COLUMNS]]
    rows += [[printable(_cell(e, c)) for c in COLUMNS] for e in entries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def to_json(entries: list[Entry]) -> str:
    return json.dumps([asdict(e) for e in entries], indent=2, default=str)


def _escape(value):
    """A value as it may stand anywhere in the page, text or attribute (`&<>"'` escaped)."""
    if value is None or isinstance(value, (int, float)):
        return value
    if isinstance(value, tuple):
        return tuple(_escape(v) for v in value)
    return html.escape(str(value), quote=True)  # text, or whatever else a forged store put in a field


def escaped(e: Entry) -> Entry:
    """The entry with every text field HTML-escaped: the one place the page escapes what a store says (every
    field, whatever it is, so a field added later is escaped too). The page is built from these alone."""
    return replace(e, **{f.name: _escape(getattr(e, f.name)) for f in fields(e)})


def _row_id(address: str | None) -> str:
    return "store-" + (address or "").removeprefix("sha256:")[:24]


def _html_cell(e: Entry, column: str, present: set[str]) -> str:
    """One cell of an escaped entry."""
    value = getattr(e, column)
    text = _cell(e, column)
    if column == "parent" and e.parent:
        text = (f'<a href="#{_row_id(e.parent)}">{text}</a>' if e.parent in present
                else f'<span title="not in this listing">{text}</span>')
    elif column == "content_address" and e.content_address:
        text = f'<span title="{e.content_address}">{text}</span>'
    elif column == "url" and e.card:
        text += f"<details><summary>card</summary><pre>{e.card}</pre></details>"
    return f'<td data-sort="{"" if value is None else value}">{text}</td>'


def _html_row(e: Entry, present: set[str], anchors: dict[str, int], index: int) -> str:
    """One table row of an escaped entry; one row per content address carries its anchor (a store folder rather
    than its bundle)."""
    anchored = e.content_address and anchors[e.content_address] == index
    row_id = f' id="{_row_id(e.content_address)}"' if anchored else ""
    status = "ok" if e.status == "complete" else "bad"
    return (f'<tr{row_id} class="{status}" data-task="{e.task or ""}" data-status="{e.status}">'
            + "".join(_html_cell(e, c, present) for c in COLUMNS) + "</tr>")


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
    entries, title = [escaped(e) for e in entries], _escape(title)  # nothing below escapes again
    present = {e.content_address for e in entries if e.content_address}
    heads = "".join(
        f'<th data-type="{"num" if c in _NUMERIC else "text"}">'
        f'{c.replace("content_address", "address").replace("teacher_hash", "teacher")}</th>' for c in COLUMNS)
    tasks = "".join(f'<option value="{t}">{t}</option>' for t in sorted({e.task for e in entries if e.task}))
    anchors: dict[str, int] = {}
    for i in sorted(range(len(entries)), key=lambda i: (entries[i].kind != "store", i)):
        anchors.setdefault(entries[i].content_address or "", i)
    rows = "\n".join(_html_row(e, present, anchors, i) for i, e in enumerate(entries))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="generator" content="{GENERATOR}">
<title>{title}</title><style>{_STYLE}</style></head>
<body><h1>{title}</h1>
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
