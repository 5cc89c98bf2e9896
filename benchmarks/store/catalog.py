"""How long `hsk catalog` takes over 1,000 stores, in a local folder and on loopback S3.

    python benchmarks/store/catalog.py --store sst2.zarr              # local folder, 1,000 stores
    python benchmarks/store/catalog.py --store sst2.zarr --s3         # and on a loopback SeaweedFS (tests/s3_server.py)

The 1,000 stores are fakes made by copying one real store's metadata tree (every file but the
chunks: root zarr.json, card, croissant.json, each array's zarr.json), 10 folders of 100, the way a
team's bucket nests them. The catalog reads root metadata only, so a fake lists exactly as the real
store would. Each round times, alternately: the library call (`hskstore.share.catalog.catalog`, what the
goal is about), the whole CLI (`hsk catalog DIR --json`: Python start-up and imports included) and
the HTML page's rendering. Every round is reported, with the load average: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hskstore.share.catalog import catalog, render_html


def metadata_files(store: Path) -> list[Path]:
    """Every file of a store but its chunks (zarr v3 keeps chunks under `<array>/c/`)."""
    return [p.relative_to(store) for p in store.rglob("*") if p.is_file() and "c" not in p.relative_to(store).parts]


def fake_stores(store: Path, root: Path, n: int) -> list[Path]:
    files = metadata_files(store)
    out = []
    for i in range(n):
        dest = root / f"team-{i // 100:02d}" / f"store-{i:04d}.zarr"
        for rel in files:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(store / rel, dest / rel)
        out.append(dest)
    return out


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def time_call(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def local_rounds(root: Path, n: int, rounds: int) -> list[dict]:
    cli = [sys.executable, "-m", "pipelines.cli", "catalog", str(root), "--json"]
    results = []
    for r in range(rounds):
        found = []
        library = time_call(lambda: found.extend(catalog([str(root)])))  # noqa: B023
        assert len(found) == n and all(e.status == "complete" for e in found), "the fakes must list as complete"
        whole = time_call(lambda: subprocess.run(cli, check=True, stdout=subprocess.DEVNULL))
        page = time_call(lambda: render_html(found))  # noqa: B023
        results.append({"round": r, "library_s": round(library, 3), "cli_s": round(whole, 3),
                        "html_render_s": round(page, 3), "load": load()})
        print(results[-1], flush=True)
    return results


def s3_rounds(store: Path, n: int, rounds: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from s3_server import BUCKET, start_s3_server

    server = start_s3_server()
    try:
        os.environ.update(server.env)
        fs = server.filesystem()
        with tempfile.TemporaryDirectory() as tmp:
            fake_stores(store, Path(tmp), n)
            started = time.perf_counter()
            fs.put(tmp + "/", f"{BUCKET}/catalog/", recursive=True)
            upload = time.perf_counter() - started
        results = []
        for r in range(rounds):
            found = []
            seconds = time_call(lambda: found.extend(catalog([f"s3://{BUCKET}/catalog"])))  # noqa: B023
            assert len(found) == n and all(e.status == "complete" for e in found)
            results.append({"round": r, "library_s": round(seconds, 3), "load": load()})
            print(results[-1], flush=True)
        return {"upload_s": round(upload, 1), "rounds": results}
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True, help="a complete store whose metadata the fakes copy")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--s3", action="store_true", help="also list them on a loopback SeaweedFS")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "catalog.json"))
    args = parser.parse_args()
    store = Path(args.store)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "bucket"
        fake_stores(store, root, args.n)
        files = sum(1 for p in root.rglob("*") if p.is_file())
        doc = {"stores": args.n, "files_on_disk": files, "metadata_files_per_store": len(metadata_files(store)),
               "cpus": os.cpu_count(), "local": local_rounds(root, args.n, args.rounds)}
    if args.s3:
        doc["s3_loopback"] = s3_rounds(store, args.n, args.rounds)
    for arm in ("library_s", "cli_s", "html_render_s"):
        doc[f"median_local_{arm}"] = statistics.median(r[arm] for r in doc["local"])
    if args.s3:
        doc["median_s3_library_s"] = statistics.median(r["library_s"] for r in doc["s3_loopback"]["rounds"])
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k.startswith("median")}))


if __name__ == "__main__":
    main()
