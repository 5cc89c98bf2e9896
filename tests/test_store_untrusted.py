"""Stores and folders someone hands you (issue 34): each attack is built here, run through the real CLI, and the
user's bytes (inside and outside the store) are hashed before and after.

Links inside a store, planted temporary names, script in the catalog page, terminal escapes in any metadata
field, forged lineage, metadata URLs, FIFOs and endless files, duplicate bundle members, one bad entry in a
catalog, and the leftovers of killed commands.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
import zarr
from conftest import HSK, hsk, hsk_env, one_error_line, save_tiny_teacher, tree_hashes
from conftest import dump_args as shared_dump_args

from hskstore.format.manifest import compute_manifest, list_arrays
from pipelines.cli import main

REPO = Path(__file__).resolve().parents[1]
ROWS = 24
PAYLOAD = "\x1b[2J\x07\"'><svg onload=alert(1)>\n\u202e"  # a terminal escape, a bell, an HTML break-out, a newline


dump_args = functools.partial(shared_dump_args, rows=ROWS)


def refused(capsys, code: int, *words: str) -> str:
    captured = capsys.readouterr()
    return one_error_line((code, captured.out, captured.err), *words)


def reseal(store: Path, edit) -> None:
    """Edit a store's hsk metadata and recompute its manifest: what a forger who knows the format does."""
    doc = json.loads((store / "zarr.json").read_text())
    edit(doc["attributes"]["hsk"])
    (store / "zarr.json").write_text(json.dumps(doc))
    meta = doc["attributes"]["hsk"]
    meta.pop("manifest", None)
    meta["manifest"] = compute_manifest(meta, list_arrays(zarr.open_group(str(store), mode="r")))
    (store / "zarr.json").write_text(json.dumps(doc))


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, tiny_tokenizer) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher") / "t", tiny_tokenizer, num_layers=2, seed=3)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, teacher, glue_dir) -> Path:
    out = tmp_path_factory.mktemp("ref") / "s.zarr"
    assert main(dump_args(teacher, glue_dir, out)) == 0
    return out


@pytest.fixture
def store(reference, tmp_path) -> Path:
    return Path(shutil.copytree(reference, tmp_path / "s.zarr"))


@pytest.fixture
def secret(tmp_path) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    (folder / "secret.txt").write_text("my ssh passphrase\n")
    (folder / "outside").mkdir()
    (folder / "outside" / "keep.txt").write_text("keep me\n")
    return folder


# 1: links inside a store are never followed -------------------------------------------------------------------

def _plant_link(store: Path, where: str, secret: Path) -> None:
    target = store / where
    if where == "README.md":
        target.unlink()
        target.symlink_to(secret / "secret.txt")
    else:  # a folder of the store replaced by a link to a folder outside it
        shutil.rmtree(target)
        target.symlink_to(secret / "outside", target_is_directory=True)


@pytest.mark.parametrize("where", ["README.md", "label/c", "_progress", "zarr.json"])
def test_a_link_inside_a_store_is_refused_by_every_command(where, store, secret, teacher, glue_dir, tmp_path,
                                                           capsys):
    if where == "zarr.json":  # the root metadata as a link to a genuine zarr.json elsewhere
        shutil.copy(store / "zarr.json", secret / "zarr.json")
        (store / "zarr.json").unlink()
        (store / "zarr.json").symlink_to(secret / "zarr.json")
    else:
        _plant_link(store, where, secret)
    mine, kept = tree_hashes(secret), tree_hashes(store)
    for args in (["info", str(store)], ["info", "--card", str(store)], ["verify", str(store)],
                 ["pack", "--no-progress", str(store), str(tmp_path / "b.hsk.zip")],
                 ["export", "--no-progress", str(store), str(tmp_path / "b.parquet")],
                 dump_args(teacher, glue_dir, store)):  # a rerun of the dump: it would resume or repair the store
        err = refused(capsys, main(args), "symbolic link")
        assert "passphrase" not in err
    assert tree_hashes(secret) == mine and tree_hashes(store) == kept
    assert not (tmp_path / "b.hsk.zip").exists() and not (tmp_path / "b.parquet").exists()


def test_a_resume_never_writes_through_a_link(reference, teacher, glue_dir, secret, tmp_path, capsys):
    """An unfinished store whose chunk folder links outside: the resume is refused, nothing is written there."""
    out = tmp_path / "u.zarr"
    shutil.copytree(reference, out)
    doc = json.loads((out / "zarr.json").read_text())
    doc["attributes"]["hsk"]["complete"] = False  # an interrupted dump: shards 1 and 2 still to write
    (out / "zarr.json").write_text(json.dumps(doc))
    done = zarr.open_array(str(out / "_progress" / "done"), mode="r+")
    done[1:] = 0
    shutil.rmtree(out / "logits" / "c")
    (out / "logits" / "c").symlink_to(secret / "outside", target_is_directory=True)
    mine = tree_hashes(secret)
    refused(capsys, main(dump_args(teacher, glue_dir, out)), "symbolic link", "logits/c")
    assert tree_hashes(secret) == mine


# 2: temporaries never go through planted links ----------------------------------------------------------------

def _plant_old_names(folder: Path, name: str, victim: Path) -> list[Path]:
    """Links at every temporary name hsk used to derive from its pid (this process runs the commands)."""
    pid = os.getpid()
    names = [f".{name}.{pid}.tmp", f".{name}.{pid}.tmp.zip", f".{name}.hsk-staged-{pid}", f".{name}.hsk-old-{pid}"]
    links = []
    for n in names:
        (folder / n).symlink_to(victim)
        links.append(folder / n)
    return links


def test_planted_links_at_temporary_names_are_never_written_through(store, secret, tmp_path, capsys):
    victim = secret / "secret.txt"
    work = tmp_path / "work"
    work.mkdir()
    for name in ("out.parquet", "page.html", "b.hsk.zip", "b.croissant.json"):
        _plant_old_names(work, name, victim)
    mine = tree_hashes(secret)
    assert main(["export", "--no-progress", str(store), str(work / "out.parquet")]) == 0
    assert main(["catalog", str(store), "--html", str(work / "page.html")]) == 0
    assert main(["pack", "--no-progress", str(store), str(work / "b.hsk.zip")]) == 0
    assert tree_hashes(secret) == mine
    for name in ("out.parquet", "page.html", "b.hsk.zip", "b.croissant.json"):
        assert (work / name).is_file() and not (work / name).is_symlink()
    # unpack --overwrite stages in a new folder of its own, never in a planted one
    target = tmp_path / "u.zarr"
    assert main(["unpack", str(work / "b.hsk.zip"), str(target)]) == 0
    _plant_old_names(tmp_path, "u.zarr", secret / "outside")
    mine = tree_hashes(secret)
    assert main(["unpack", "--overwrite", str(work / "b.hsk.zip"), str(target)]) == 0
    assert tree_hashes(secret) == mine
    assert main(["verify", str(target)]) == 0
    capsys.readouterr()


def test_lease_takeover_never_writes_through_a_link(store, secret, tmp_path, capsys):
    """A stale lease (its writer gone) taken over: the new lease is written beside it and renamed in."""
    bundle = tmp_path / "b.hsk.zip"
    assert main(["pack", "--no-progress", str(store), str(bundle)]) == 0
    (store / ".hsk-lease.json").write_text(json.dumps({"pid": dead_pid(), "host": os.uname().nodename,
                                                       "refreshed_at": 0, "token": "x"}))
    for n in (f".hsk-lease.json.{os.getpid()}.tmp",):
        (store / n).symlink_to(secret / "secret.txt")
    mine = tree_hashes(secret)
    assert main(["unpack", "--overwrite", str(bundle), str(store)]) == 0
    assert tree_hashes(secret) == mine
    assert main(["verify", str(store)]) == 0
    capsys.readouterr()


# 3 + 4: every metadata field escaped, in the page and on the terminal -----------------------------------------

def _leaves(value, path=()):
    """Every leaf of a metadata document, by its path of keys and indices."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _leaves(child, (*path, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _leaves(child, (*path, i))
    else:
        yield path


def _set(doc, path, value) -> None:
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


def _with_lineage(meta: dict) -> dict:
    """The reference's metadata as a derived store's: the derived_from fields are fields like the others."""
    return dict(meta, derived_from={"url": "p.zarr", "identity": "sha256:" + "1" * 64, "config": "2,4,0.25",
                                    "value_dtype": "float16", "created": "2026-01-01", "checksums": {"label": "x"},
                                    "content_address": "sha256:" + "2" * 64,
                                    "options": {"config": "2,4,0.25", "value_dtype": None}})


def _no_control(text: str) -> None:
    assert not any(ch in text for ch in "\x1b\x07\u202e"), repr(text[:2000])


def test_every_metadata_field_is_escaped_in_the_catalog_page_and_table(reference, tmp_path, capsys):
    meta = _with_lineage(json.loads((reference / "zarr.json").read_text())["attributes"]["hsk"])
    paths = list(_leaves(meta))
    assert len(paths) > 40  # generic: every field the store has, whatever it is called
    root = tmp_path / "stores"
    for i, path in enumerate(paths):
        forged = json.loads(json.dumps(meta))
        _set(forged, path, PAYLOAD)
        folder = root / f"s{i}.zarr"
        (folder / "_progress").mkdir(parents=True)
        (folder / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group",
                                                      "attributes": {"hsk": forged}}))
        (folder / "README.md").write_text(PAYLOAD)
    named = root / "evil\n\x1b[2Jname.zarr"  # a folder name is a field too
    shutil.copytree(root / "s0.zarr", named)
    page = tmp_path / "page.html"
    assert main(["catalog", str(root), "--html", str(page)]) == 0
    captured = capsys.readouterr()
    _no_control(captured.out + captured.err)
    rows = [line for line in captured.out.splitlines() if not line.startswith("wrote ")]
    assert len(rows) == 1 + len(paths) + 1  # the header, one row per store: no newline split a row
    html = page.read_text()
    assert "<svg" not in html and "\"'>" not in html  # no element, no attribute broken out of
    assert html.count("&lt;svg onload=alert(1)&gt;") >= len(paths)  # shown as text, every field


def test_every_metadata_field_is_escaped_by_info(store, capsys):
    meta = _with_lineage(json.loads((store / "zarr.json").read_text())["attributes"]["hsk"])
    original = (store / "zarr.json").read_text()
    paths = [p for p in _leaves(meta) if p[0] not in ("manifest",)]
    for path in paths:
        (store / "zarr.json").write_text(original)
        reseal(store, lambda m, path=path: (m.update(_with_lineage(m)), _set(m, path, PAYLOAD)))
        for args in (["info", str(store)], ["info", "--card", str(store)]):
            code = main(args)
            captured = capsys.readouterr()
            assert code in (0, 2), (path, captured.err)
            assert "Traceback" not in captured.err, (path, captured.err)
            _no_control(captured.out + captured.err)


# 5: lineage compares recomputed addresses, and never fetches a URL from metadata -------------------------------

def test_lineage_trusts_no_claimed_address(store, tmp_path, capsys):
    child = tmp_path / "child.zarr"
    assert main(["derive", str(store), "--config", "1,4,0.25", "--out", str(child), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["info", str(child)]) == 0
    assert f"  at {store}" in capsys.readouterr().out
    address = json.loads((store / "zarr.json").read_text())["attributes"]["hsk"]["manifest"]
    # the parent replaced by an unrelated store claiming the parent's address
    other = tmp_path / "other.zarr"
    assert main(["derive", str(store), "--config", "2,2,0.25", "--out", str(other), "--no-progress"]) == 0
    shutil.rmtree(store)
    shutil.move(other, store)
    doc = json.loads((store / "zarr.json").read_text())
    doc["attributes"]["hsk"]["manifest"] = address
    (store / "zarr.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["info", str(child)]) == 0
    shown = capsys.readouterr().out
    assert f"not reachable (recorded at {store})" in shown and f"  at {store}" not in shown


def test_info_never_opens_a_url_from_metadata(store, tmp_path, capsys):
    asked = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the stdlib's name)
            asked.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/p.zarr"
        reseal(store, lambda m: m.update(derived_from={"url": url, "content_address": "sha256:" + "3" * 64,
                                                        "config": "2,4,0.25"}))
        assert main(["info", str(store)]) == 0
        assert main(["catalog", str(store)]) == 0
    finally:
        server.shutdown()
    assert asked == []
    assert f"not reachable (recorded at {url})" in capsys.readouterr().out


# 6: FIFOs, devices and endless files ---------------------------------------------------------------------------

def test_a_fifo_in_a_store_is_refused_without_hanging(store, teacher, glue_dir, tmp_path):
    chunk = store / "label" / "c" / "1"
    chunk.unlink()
    os.mkfifo(chunk)
    one_error_line(hsk("verify", str(store)), "FIFO", "label/c/1")
    lease = store / ".hsk-lease.json"
    os.mkfifo(lease)
    one_error_line(hsk(*dump_args(teacher, glue_dir, store)), "FIFO")


def test_a_fifo_or_endless_zarr_json_is_listed_as_damaged(store, tmp_path):
    root = tmp_path / "stores"
    root.mkdir()
    fifo = Path(shutil.copytree(store, root / "fifo.zarr"))
    (fifo / "zarr.json").unlink()
    os.mkfifo(fifo / "zarr.json")
    zero = Path(shutil.copytree(store, root / "zero.zarr"))
    (zero / "zarr.json").unlink()
    (zero / "zarr.json").symlink_to("/dev/zero")
    code, out, err = hsk("catalog", str(root), "--json")
    assert code == 0, err
    status = {Path(e["url"]).name: e["status"] for e in json.loads(out)}
    assert status["fifo.zarr"].startswith("damaged") and "FIFO" in status["fifo.zarr"]
    assert status["zero.zarr"].startswith("damaged") and "symbolic link" in status["zero.zarr"]
    one_error_line(hsk("info", str(zero)), "symbolic link")
    one_error_line(hsk("info", str(fifo)), "FIFO")


# 7: duplicate bundle members -----------------------------------------------------------------------------------

def test_a_bundle_with_two_members_of_one_name_is_refused(store, tmp_path, capsys):
    genuine = tmp_path / "g.hsk.zip"
    assert main(["pack", "--no-progress", str(store), str(genuine)]) == 0
    forged = tmp_path / "f.hsk.zip"
    doc = json.loads((store / "zarr.json").read_text())
    doc["attributes"]["hsk"]["task"]["name"] = "forged"
    with zipfile.ZipFile(genuine) as src, zipfile.ZipFile(forged, "w") as out:
        with pytest.warns(UserWarning, match="Duplicate name"):
            out.writestr("zarr.json", json.dumps(doc))  # forged first: what a zip tool extracts
            for info in src.infolist():
                out.writestr(info, src.read(info))  # genuine last: what a reader taking the last entry sees
    before = tree_hashes(tmp_path)
    capsys.readouterr()
    for args in (["verify", str(forged)], ["info", str(forged)], ["unpack", str(forged), str(tmp_path / "u.zarr")]):
        refused(capsys, main(args), "two members named 'zarr.json'")
    assert main(["catalog", str(forged), "--json"]) == 0
    assert "damaged: it holds two members" in capsys.readouterr().out
    assert tree_hashes(tmp_path) == before


# 11: one bad entry never stops the catalog ----------------------------------------------------------------------

def _patch_member(bundle: Path, name: str, *, flags: int | None = None, method: int | None = None) -> None:
    """Set a member's flag bits or compression method in both its local and central headers."""
    with zipfile.ZipFile(bundle) as zf:
        info = zf.getinfo(name)
    data = bytearray(bundle.read_bytes())
    offsets = [info.header_offset + 6]  # local header: flags at +6, method at +8
    pos = data.find(b"PK\x01\x02")
    while True:  # the central entry of this member: flags at +8, method at +10
        pos = data.find(b"PK\x01\x02", pos)
        n = int.from_bytes(data[pos + 28:pos + 30], "little")
        if data[pos + 46:pos + 46 + n].decode() == name:
            offsets.append(pos + 8)
            break
        pos += 4
    for at in offsets:
        if flags is not None:
            data[at:at + 2] = (int.from_bytes(data[at:at + 2], "little") | flags).to_bytes(2, "little")
        if method is not None:
            data[at + 2:at + 4] = method.to_bytes(2, "little")
    bundle.write_bytes(bytes(data))


def test_damaged_entries_are_listed_and_the_rest_still_are(store, tmp_path, capsys):
    root = tmp_path / "stores"
    root.mkdir()
    shutil.copytree(store, root / "good.zarr")
    infinite = Path(shutil.copytree(store, root / "infinite.zarr"))
    text = (infinite / "zarr.json").read_text()
    (infinite / "zarr.json").write_text(text.replace('"n_rows": 24', '"n_rows": Infinity'))
    assert "Infinity" in (infinite / "zarr.json").read_text()
    deep = Path(shutil.copytree(store, root / "deep.zarr"))
    (deep / "zarr.json").write_text('{"attributes": {"hsk": ' + "[" * 100000 + "]" * 100000 + "}}")
    headless = Path(shutil.copytree(store, root / "headless.zarr"))
    (headless / "zarr.json").unlink()
    for name, patch in (("encrypted", {"flags": 1}), ("compressed", {"method": 99})):
        bundle = root / f"{name}.hsk.zip"
        assert main(["pack", "--no-progress", str(store), str(bundle)]) == 0
        (root / f"{name}.croissant.json").unlink()
        _patch_member(bundle, "zarr.json", **patch)
    before = tree_hashes(root)
    capsys.readouterr()
    assert main(["catalog", str(root), "--json"]) == 0
    status = {Path(e["url"]).name: e["status"] for e in json.loads(capsys.readouterr().out)}
    assert status.pop("good.zarr") == "complete"
    assert set(status) == {"infinite.zarr", "deep.zarr", "headless.zarr", "encrypted.hsk.zip", "compressed.hsk.zip"}
    assert all(s.startswith("damaged") for s in status.values()), status
    assert tree_hashes(root) == before
    assert main(["catalog", str(root)]) == 0  # the table too
    assert len(capsys.readouterr().out.splitlines()) == 7


# 13: leftovers of killed commands are cleaned by the next command on that path ---------------------------------

def test_leftovers_of_killed_commands_are_removed_by_the_next_one(store, tmp_path, capsys):
    bundle = tmp_path / "b.hsk.zip"
    assert main(["pack", "--no-progress", str(store), str(bundle)]) == 0
    pid = dead_pid()
    staged = tmp_path / f".u.zarr.hsk-staged-{pid}-abcdef"  # an unpack killed before the root zarr.json
    shutil.copytree(store / "label", staged / "label")
    (staged / "README.md").write_text("half\n")
    old_style = tmp_path / f".u.zarr.hsk-staged-{pid}"  # as an older hsk named it
    shutil.copytree(store / "label", old_style / "label")
    tmps = [tmp_path / f".out.parquet.hsk-tmp-{pid}-x1y2.tmp", tmp_path / f".page.html.hsk-tmp-{pid}-z9.tmp",
            tmp_path / f".c.hsk.zip.hsk-tmp-{pid}-q8.zip"]
    for t in tmps:
        t.write_bytes(b"PAR1 half")
    mine = tmp_path / f".u.zarr.hsk-staged-{pid}-mine"  # the same name, but not hsk's: left alone
    (mine / "notes").mkdir(parents=True)
    assert main(["unpack", str(bundle), str(tmp_path / "u.zarr")]) == 0
    assert main(["export", "--no-progress", str(store), str(tmp_path / "out.parquet")]) == 0
    assert main(["catalog", str(store), "--html", str(tmp_path / "page.html")]) == 0
    assert main(["pack", "--no-progress", str(store), str(tmp_path / "c.hsk.zip")]) == 0
    capsys.readouterr()
    assert not staged.exists() and not old_style.exists() and not any(t.exists() for t in tmps)
    assert (mine / "notes").is_dir()


def test_a_failed_catalog_page_leaves_no_temporary(store, tmp_path, capsys, monkeypatch):
    import errno

    import hskstore.share.catalog

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(hskstore.share.catalog, "render_html", full)
    before = tree_hashes(tmp_path)
    refused(capsys, main(["catalog", str(store), "--html", str(tmp_path / "page.html")]), "disk full")
    assert tree_hashes(tmp_path) == before


def test_quickstart_without_its_data_leaves_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    refused(capsys, main(["quickstart", "--data-dir", str(tmp_path / "nonexistent"), "--no-progress"]),
            "does not exist")
    assert list(tmp_path.iterdir()) == []


def test_dump_to_an_unreachable_scheduler_leaves_nothing(teacher, glue_dir, tmp_path, capsys):
    import dask
    import distributed  # noqa: F401  its defaults in dask's config first: set() would drop a section it made

    before = tree_hashes(tmp_path)
    with dask.config.set({"distributed.comm.timeouts.connect": "3s"}):  # the user's dask config is honoured
        refused(capsys, main(dump_args(teacher, glue_dir, tmp_path / "o.zarr", "--scheduler", "tcp://127.0.0.1:1")),
                "no dask scheduler")
    assert tree_hashes(tmp_path) == before and not (tmp_path / "o.zarr").exists()


def _bad_crc(bundle: Path, member: str) -> None:
    with zipfile.ZipFile(bundle) as zf:
        info = zf.getinfo(member)
    data = bytearray(bundle.read_bytes())
    at = info.header_offset + 30 + int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little")
    at += int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    data[at + info.compress_size // 2] ^= 0xFF
    bundle.write_bytes(bytes(data))


def test_derive_from_a_damaged_bundle_leaves_no_store(store, tmp_path, capsys):
    bundle = tmp_path / "b.hsk.zip"
    assert main(["pack", "--no-progress", str(store), str(bundle)]) == 0
    _bad_crc(bundle, "logits/c/2/0")  # the last shard: the derive has written the others when it meets it
    before = tree_hashes(tmp_path)
    capsys.readouterr()
    for _ in range(2):  # and a rerun says the same
        refused(capsys, main(["derive", str(bundle), "--config", "1,4,0.25", "--out", str(tmp_path / "d.zarr"),
                              "--no-progress"]), "CRC")
        assert tree_hashes(tmp_path) == before and not (tmp_path / "d.zarr").exists()


def _under_a_tty(*args: str) -> str:
    """What `hsk ARGS` writes to a terminal (a pseudo-terminal: stdout and stderr are TTYs)."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen([*HSK, *args], env=hsk_env(), stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=120)
    os.close(master)
    return b"".join(chunks).decode(errors="replace")


def test_escapes_in_metadata_never_reach_a_real_terminal(store, tmp_path):
    reseal(store, lambda m: (m["task"].update(name="sst2\x1b[2J\x1b]0;owned\x07"), m.update(created="\x1b[31mred")))
    for args in (["catalog", str(tmp_path)], ["info", str(store)]):
        shown = _under_a_tty(*args)
        assert "\x1b" not in shown and "\x07" not in shown, repr(shown)
        assert "\\x1b[2J" in shown or "\\x1b[31mred" in shown, shown


def test_lineage_of_a_format1_parent_checks_identity_and_data(store, tmp_path, capsys):
    """A child whose record names no address (its parent was of format 1): found by recomputed identity and
    checksums, never by whatever store sits at the recorded path."""
    child = tmp_path / "child.zarr"
    assert main(["derive", str(store), "--config", "1,4,0.25", "--out", str(child), "--no-progress"]) == 0
    reseal(child, lambda m: m["derived_from"].update(content_address=None))
    capsys.readouterr()
    assert main(["info", str(child)]) == 0
    assert f"  at {store}" in capsys.readouterr().out
    other = tmp_path / "other.zarr"
    assert main(["derive", str(store), "--config", "2,2,0.25", "--out", str(other), "--no-progress"]) == 0
    shutil.rmtree(store)
    shutil.move(other, store)
    capsys.readouterr()
    assert main(["info", str(child)]) == 0
    assert f"not reachable (recorded at {store})" in capsys.readouterr().out


@pytest.mark.parametrize("value", [None, [], {}, float("inf"), -(10**30), True, [[[[]]]]], ids=repr)
def test_any_value_in_any_field_lists_the_store_and_the_others(reference, value, tmp_path, capsys):
    """Whatever type a forged store puts in whichever field, the catalog lists it (damaged or not) with the rest."""
    meta = _with_lineage(json.loads((reference / "zarr.json").read_text())["attributes"]["hsk"])
    paths = list(_leaves(meta)) + [(key,) for key in meta]  # leaves, and whole sections replaced
    root = tmp_path / "stores"
    for i, path in enumerate(paths):
        forged = json.loads(json.dumps(meta))
        _set(forged, path, value)
        folder = root / f"s{i}.zarr"
        folder.mkdir(parents=True)
        (folder / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group",
                                                      "attributes": {"hsk": forged}}))
    shutil.copytree(reference, root / "good.zarr")
    assert main(["catalog", str(root), "--json", "--html", str(tmp_path / "page.html")]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert len(listed) == len(paths) + 1
    assert [e["status"] for e in listed if e["url"].endswith("good.zarr")] == ["complete"]
