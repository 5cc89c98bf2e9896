"""The CLI at its limits: two trainings on one run folder, a killed dump's helper processes,
huge integers, values that used to end in a traceback, and forged array descriptions.

Each case runs the real `hsk` in a new process under a timeout (a hang fails the test), expects one
`hsk: error:` line and exit status 2, and hashes the user's files before and after.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import HSK, hsk, hsk_env, save_tiny_teacher, tree_hashes
from conftest import dump_args as shared_dump_args
from conftest import one_error_line as one_line

from pipelines.cli import main

REPO = Path(__file__).resolve().parents[1]
ROWS = 48


dump_args = functools.partial(shared_dump_args, rows=ROWS)


def train_args(store: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--store", str(store), "--student", "bert2", "--method", "kd", "--epochs", "1",
            "--batch-size", "8", "--no-eval", "--no-progress", "--threads", "1", "--log-every", "1",
            "--out", str(out), *extra]


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


# 1: one training per run folder ---------------------------------------------------------------------------------

def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_second_train_on_a_run_folder_in_use_is_refused(store, tmp_path):
    run = tmp_path / "run"
    first = subprocess.Popen([*HSK, *train_args(store, run, "--epochs", "20")], env=hsk_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(run / "metrics.jsonl", first)
        first.send_signal(signal.SIGSTOP)  # held still mid-run, its lease fresh: its files must not change
        before = tree_hashes(run)
        line = one_line(hsk(*train_args(store, run), timeout=60), str(run), f"pid {first.pid}")
        assert "being written" in line
        line = one_line(hsk(*train_args(store, run, "--overwrite"), timeout=60), f"pid {first.pid}")
        assert tree_hashes(run) == before
    finally:
        first.send_signal(signal.SIGCONT)
        first.kill()
        first.communicate(timeout=60)
    # the killed run's lease names a process that is gone: the next run takes it over and resumes
    code, out, err = hsk(*train_args(store, run), timeout=120)
    assert code == 0, out + err
    assert "taking over the lease" in out + err
    assert not (run / ".hsk-lease.json").exists()


@pytest.mark.slow
def test_a_refused_train_leaves_no_run_folder(store, tmp_path):
    run = tmp_path / "run"
    one_line(hsk(*train_args(store, run, "--method", "no-such-method"), timeout=60), "no-such-method")
    assert not run.exists()


# 2: nothing of a dump outlives its main process -----------------------------------------------------------------

def _session(sid: int) -> list[str]:
    """The processes of session `sid` still running (zombies are dead: their parent just has not reaped them)."""
    ps = subprocess.run(["ps", "-s", str(sid), "-o", "pid=,stat=,args="], capture_output=True, text=True)
    return [line for line in ps.stdout.splitlines() if line.split()[1][0] != "Z"]


def test_a_killed_dump_leaves_no_write_process(teacher, glue_dir, tmp_path):
    out = tmp_path / "k.zarr"
    args = dump_args(teacher, glue_dir, out, "--write-processes", "2", rows=20000)
    dump = subprocess.Popen([*HSK, *args], env=hsk_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 90
    while len(_session(dump.pid)) < 3:  # the dump, its write processes (and multiprocessing's resource tracker)
        assert dump.poll() is None, dump.communicate()
        assert time.monotonic() < deadline, _session(dump.pid)
        time.sleep(0.2)
    os.kill(dump.pid, signal.SIGKILL)
    dump.communicate(timeout=30)  # stdout and stderr reach their end: nothing holds them any more
    deadline = time.monotonic() + 10
    while _session(dump.pid):
        assert time.monotonic() < deadline, _session(dump.pid)
        time.sleep(0.2)


# 3 + 4: huge numbers and other values a user can type -----------------------------------------------------------

BIG = "18446744073709551616"  # 2**64


@pytest.mark.slow
def test_huge_integers_are_refused_at_once(store, teacher, glue_dir, tmp_path):
    kept = tree_hashes(tmp_path)
    run = tmp_path / "run"
    one_line(hsk(*dump_args(teacher, glue_dir, tmp_path / "x.zarr", "--student-layers", "1000000000"), timeout=60),
             "--student-layers 1000000000", "deeper than the teacher")
    for flag, value, words in (("--read-threads", BIG, ["--read-threads", BIG]),
                               ("--read-threads", "100000", ["--read-threads", "at most 256"]),
                               ("--threads", BIG, ["--threads", BIG]),
                               ("--threads", "100000", ["--threads", "at most 1024"]),
                               ("--epochs", "1e308", ["1e+308 epochs", "fewer epochs"])):
        one_line(hsk(*train_args(store, run, flag, value), timeout=60), *words)
    assert tree_hashes(tmp_path) == kept  # no run folder, no store left behind


@pytest.mark.slow
def test_an_output_where_no_folder_can_be_made_is_refused(teacher, glue_dir, tmp_path):
    (tmp_path / "afile").write_text("mine\n")
    kept = tree_hashes(tmp_path)
    for out in ("/proc/self/x.zarr", str(tmp_path / "afile" / "x.zarr")):
        one_line(hsk(*dump_args(teacher, glue_dir, out), timeout=60), out, "choose another --out")
    assert tree_hashes(tmp_path) == kept


@pytest.mark.parametrize("command", ["info", "verify", "doctor"])
def test_a_closed_stdout_is_one_line(command, store):
    kept = tree_hashes(store)
    args = [command] if command == "doctor" else [command, str(store)]
    proc = subprocess.run(["sh", "-c", '"$@" >&-', "sh", *HSK, *args], env=hsk_env(), capture_output=True, text=True,
                          timeout=60)
    one_line((proc.returncode, "", proc.stderr), "standard output is closed")
    assert tree_hashes(store) == kept


# 4 + 9: bundle members whose names are no store keys ------------------------------------------------------------

@pytest.mark.parametrize("member", ["zarr.json/../../x", "/abs/x", "README.md\n", "label/zarr.json/x"])
def test_a_bundle_member_that_is_no_store_key_is_refused(member, store, tmp_path):
    import zipfile

    bundle = tmp_path / "b.hsk.zip"
    assert hsk("pack", "--no-progress", str(store), str(bundle), timeout=60)[0] == 0
    with zipfile.ZipFile(bundle, "a") as zf:
        zf.writestr(zipfile.ZipInfo(member), b"x")
    kept = tree_hashes(tmp_path)
    for args in (["info", str(bundle)], ["verify", str(bundle)], ["unpack", str(bundle), str(tmp_path / "u.zarr")],
                 ["derive", str(bundle), "--config", "1,4,0.25", "--out", str(tmp_path / "d.zarr"), "--no-progress"]):
        code, out, err = hsk(*args, timeout=60)
        one_line((code, out, err), "not a trustworthy bundle", "a forged bundle")
        assert "warn" not in (out + err).lower()
    assert tree_hashes(tmp_path) == kept
    assert not (tmp_path.parent / "x").exists()


# 5: a plugin whose import exits --------------------------------------------------------------------------------

# 7: a refused resume changes nothing in the store --------------------------------------------------------------

def test_a_refused_resume_keeps_the_dead_writers_lease(store, tiny_tokenizer, glue_dir, tmp_path):
    import json

    import zarr

    doc = json.loads((store / "zarr.json").read_text())
    doc["attributes"]["hsk"]["complete"] = False  # an interrupted dump: shards 1.. still to write
    (store / "zarr.json").write_text(json.dumps(doc))
    done = zarr.open_array(str(store / "_progress" / "done"), mode="r+")
    done[1:] = 0
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (store / ".hsk-lease.json").write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename,
                                                       "refreshed_at": 0, "token": "x"}))
    other = save_tiny_teacher(tmp_path / "other", tiny_tokenizer, num_layers=2, seed=11)
    kept = tree_hashes(store)
    one_line(hsk(*dump_args(other, glue_dir, store), timeout=90), "interrupted dump", "--overwrite")
    assert tree_hashes(store) == kept


# 5: codec packages: a clashing one fails only the commands that name its codec; a store of a missing one says so

def codec_site(root: Path, entry: str, *, with_example: bool = False) -> Path:
    """A folder for PYTHONPATH holding one installed package whose `hsk.codecs` entry point is `entry`."""
    site = root / "site"
    dist = site / "codec_ext-0.3.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: codec-ext\nVersion: 0.3\n")
    (dist / "entry_points.txt").write_text(f"[hsk.codecs]\n{entry}\n")
    if with_example:
        shutil.copytree(REPO / "tests" / "plugins" / "hsk_example_codec" / "hsk_example_codec",
                        site / "hsk_example_codec")
    return site


def test_a_codec_package_clashing_with_int8_blocks_only_int8(store, tmp_path):
    path = f"{REPO}{os.pathsep}{codec_site(tmp_path, 'int8 = no_such_module_here')}"
    kept = tree_hashes(store)
    derive = ["derive", str(store), "--config", "1,4,0.25", "--no-progress", "--values"]
    code, out, err = hsk(*derive, "int4", "--out", str(tmp_path / "d4.zarr"), timeout=90, PYTHONPATH=path)
    assert code == 0, out + err  # int4 quantises through hsk's own int8, whatever the package declares
    one_line(hsk(*derive, "int8", "--out", str(tmp_path / "d8.zarr"), timeout=90, PYTHONPATH=path),
             "'int8' of codec-ext 0.3", "names a value codec hsk already has", "uninstall codec-ext")
    assert not (tmp_path / "d8.zarr").exists()
    assert tree_hashes(store) == kept


@pytest.mark.slow
def test_a_store_of_a_codec_that_is_not_installed_names_the_codec(store, tmp_path):
    site = codec_site(tmp_path, "example-int3 = hsk_example_codec", with_example=True)
    made = tmp_path / "p.zarr"
    code, out, err = hsk("derive", str(store), "--config", "1,4,0.25", "--values", "example-int3", "--out", str(made),
                         "--no-progress", timeout=90, PYTHONPATH=f"{REPO}{os.pathsep}{site}")
    assert code == 0, out + err
    shutil.rmtree(site)
    kept = tree_hashes(tmp_path)
    for args in (["info", str(made)], ["verify", str(made)], ["export", str(made), str(tmp_path / "p.parquet")],
                 ["derive", str(made), "--config", "1,4,0.25", "--out", str(tmp_path / "d.zarr"), "--no-progress"],
                 train_args(made, tmp_path / "run"), ["pack", "--no-progress", str(made), str(tmp_path / "p.hsk.zip")],
                 ["upgrade", str(made)]):
        line = one_line(hsk(*args, timeout=90), str(made), "value codec 'example-int3'", "install the package")
        assert "damaged" not in line, args
    assert tree_hashes(tmp_path) == kept


# 6: array descriptions that contradict the store, their manifest recomputed ------------------------------------

def reseal_array(store: Path, array: str, edit) -> None:
    """Edit one array's zarr.json and recompute the store's manifest: what a forger who knows the format does."""
    import json

    import zarr

    from hskstore.format.manifest import compute_manifest, list_arrays

    node = store / array / "zarr.json"
    doc = json.loads(node.read_text())
    edit(doc)
    node.write_text(json.dumps(doc))
    root = json.loads((store / "zarr.json").read_text())
    meta = root["attributes"]["hsk"]
    meta.pop("manifest", None)
    meta["manifest"] = compute_manifest(meta, list_arrays(zarr.open_group(str(store), mode="r")))
    (store / "zarr.json").write_text(json.dumps(root))


@pytest.fixture(scope="module")
def nf3_reference(reference, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("nf3") / "n.zarr"
    assert main(["derive", str(reference), "--config", "2,4,0.25", "--values", "nf3", "--out", str(out),
                 "--no-progress"]) == 0
    return out


@pytest.mark.parametrize("array, edit, field", [
    ("layers/0/values", lambda d: d["attributes"].update(codec="int4"), "attributes.codec"),
    ("layers/0/scale", lambda d: d.update(dimension_names=["rows", "tokens", "groups"]), "dimension_names"),
    ("layers/1/masks", lambda d: d.pop("dimension_names"), "dimension_names"),
    ("logits", lambda d: d.update(attributes={}), "attributes."),
    ("_progress/done", lambda d: d["attributes"].update(description="anything"), "attributes.description"),
])
def test_verify_refuses_an_array_description_that_contradicts_the_store(nf3_reference, tmp_path, array, edit, field):
    store = Path(shutil.copytree(nf3_reference, tmp_path / "n.zarr"))
    reseal_array(store, array, edit)
    kept = tree_hashes(store)
    for command in ("verify", "info"):
        line = one_line(hsk(command, str(store), timeout=60), f"array {array} has {field}", "re-copy")
        assert "Traceback" not in line
    assert tree_hashes(store) == kept


# 9: the catalog on stores holding a link or a FIFO; a forged teacher precision ---------------------------------

@pytest.mark.parametrize("what", ["link", "fifo"])
def test_the_catalog_lists_a_store_holding_a_link_or_a_fifo_as_damaged(store, tmp_path, what):
    import json

    outside = tmp_path / "secret"
    outside.write_bytes(b"not the store's\n")
    chunk = next(p for p in (store / "logits").rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk.unlink()
    if what == "link":
        chunk.symlink_to(outside)
    else:
        os.mkfifo(chunk)
    kept = tree_hashes(tmp_path)
    code, out, err = hsk("catalog", str(tmp_path), "--json", timeout=60)
    assert code == 0 and "Traceback" not in err, out + err
    (entry,) = json.loads(out)
    assert entry["status"].startswith("damaged: ") and str(chunk) in entry["status"], entry["status"]
    code, out, err = hsk("catalog", str(tmp_path), timeout=60)
    row = [line for line in out.splitlines() if str(store) in line]
    assert code == 0 and len(row) == 1 and "damaged" in row[0] and " complete " not in row[0], out + err
    one_line(hsk("info", str(store), timeout=60), str(chunk), "remove it")  # as every other command says
    assert tree_hashes(tmp_path) == kept


@pytest.mark.parametrize("precision", ["fp8", "BF16", 16])
def test_a_forged_teacher_precision_is_refused(store, precision):
    from test_store_untrusted import reseal

    reseal(store, lambda meta: meta["teacher"].update(precision=precision))
    kept = tree_hashes(store)
    for command in ("info", "verify"):
        one_line(hsk(command, str(store), timeout=60), "teacher.precision", repr(precision), "bf16", "re-copy")
    assert tree_hashes(store) == kept


# 8: the catalog of a bucket behind a wrong secret, an unknown key or an unreachable endpoint ------------------

@pytest.mark.parametrize("extra, words", [
    ({"AWS_SECRET_ACCESS_KEY": "wrong"}, ["rejected the credentials", "AWS_SECRET_ACCESS_KEY"]),
    ({"AWS_ACCESS_KEY_ID": "nobody"}, ["rejected the credentials", "AWS_ACCESS_KEY_ID"]),
    # one attempt: botocore's retries of a refused connection (~20 s of backoff) are not what is tested
    ({"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"}, ["cannot be reached", "AWS_ENDPOINT_URL"]),
])
def test_the_catalog_of_a_bucket_names_why_it_cannot_be_read(s3, tmp_path, extra, words):
    from s3_server import BUCKET

    (tmp_path / "keep.txt").write_text("the user's file")
    kept = tree_hashes(tmp_path)
    for url in (f"s3://{BUCKET}/", f"s3://{BUCKET}"):
        line = one_line(hsk("catalog", url, timeout=120, **extra), url, *words)
        assert "nothing at" not in line
    assert tree_hashes(tmp_path) == kept
    code, out, err = hsk("catalog", f"s3://{BUCKET}/", timeout=120)
    assert code == 0, out + err  # the right credentials: the bucket lists
