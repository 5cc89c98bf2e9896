"""Storage against the paper's format, as `hsk info` reports it, for the paper's configs.

    python benchmarks/store/storage.py --teacher runs/sweep_sst2/teacher --data-dir ../shared/data/glue
    python benchmarks/store/storage.py --source sst2-5_16_1.zarr      # or reuse such a dump (5,16,1, float16)

Dumps the teacher once at a generous config (every layer of a 4-layer reference student, 16
tokens, full width), derives each config in float16, int8, int4 and mxfp4 (derive is exact: the
same arrays a direct dump writes), and reports, from `hskstore.io.info.storage_report`: bytes per
kept HSK value (values, masks, positions, scores and scales included, and each part alone) and
the ratio against the paper's format (4 bytes per kept value + 1 byte per mask element, no mask
at full width). Writes benchmarks/store/results/storage.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from hskstore.format.config import HSKConfig
from hskstore.io.info import storage_report
from hskstore.io.reader import open_store
from hskstore.share.derive import derive
from pipelines.dump.stage import DumpOptions, dump

CONFIGS = ["1,9,0.1", "5,2,0.3", "3,8,0.2", "5,16,1"]
VALUE_DTYPES = ["float16", "int8", "int4", "mxfp4"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher", help="teacher to dump (with --data-dir), unless --source is given")
    ap.add_argument("--data-dir")
    ap.add_argument("--source", help="an existing float16 store at 5,16,1 (reference student 4) to derive from")
    ap.add_argument("--task", default="sst2")
    ap.add_argument("--limit", type=int, default=2000)
    ap.add_argument("--out", default="benchmarks/store/results/storage.json")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="hsk-storage-"))
    try:
        source = args.source or str(work / "source.zarr")
        if not args.source:
            if not (args.teacher and args.data_dir):
                ap.error("give --teacher and --data-dir, or --source")
            options = DumpOptions(config=HSKConfig.parse("5,16,1"), ref_student_layers=4, progress=False)
            dump(args.task, options, teacher=args.teacher, out=source, data_dir=args.data_dir, limit=args.limit)
        rows = []
        for config in CONFIGS:
            for dtype in VALUE_DTYPES:
                url = str(work / f"{config}-{dtype}.zarr")
                derive(source, config, url, value_dtype=dtype)
                r = storage_report(open_store(url))
                rows.append(
                    {
                        "config": config,
                        "values": dtype,
                        "amount_of_hsk": r["amount_of_hsk"],
                        "bytes_per_example": r["bytes_per_example"],
                        "hsk_bytes_per_example": r["hsk_bytes_per_example"],
                        "bytes_per_kept_value": r["bytes_per_kept_value"],
                        "paper_bytes_per_kept_value": r["paper_bytes_per_kept_value"],
                        "ratio_vs_paper": r["ratio_vs_paper"],
                        "ratio_vs_dense_fp32": r["ratio_vs_dense_fp32"],
                        "parts_per_kept_value": r["hsk_parts_per_kept_value"],
                    }
                )
        meta = open_store(source).meta
        result = {
            "task": meta["task"]["name"],
            "rows_dumped": meta["layout"]["n_rows"],
            "teacher": meta["teacher"]["name"],
            "hidden_size": meta["selection"]["hidden_size"],
            "max_length": meta["max_length"],
            "configs": rows,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
        print("| config | values | A | store B/example | HSK B/kept value | values | masks | positions+scores "
              "| scales | paper B/kept value | smaller than paper |")
        print("|---" * 11 + "|")
        for r in rows:
            p = r["parts_per_kept_value"]
            print(
                f"| {r['config']} | {r['values']} | {r['amount_of_hsk']:.2f} | {r['bytes_per_example']:.0f} | "
                f"{r['bytes_per_kept_value']:.2f} | {p['values']:.2f} | {p['masks']:.2f} | "
                f"{p['positions'] + p['scores']:.2f} | {p['scale']:.2f} | {r['paper_bytes_per_kept_value']:.2f} | "
                f"{r['ratio_vs_paper']:.1f}x |"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
