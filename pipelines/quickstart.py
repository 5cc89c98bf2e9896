"""The embedded default job: a real teacher, a real store and a student, offline, in minutes on a CPU.

Each step prints the `hsk` command that does the same, so the quickstart doubles as a tutorial.
"""

from __future__ import annotations

import json
from pathlib import Path

from hskstore.config import HSKConfig
from hskstore.info import format_report, storage_report
from hskstore.reader import open_store

from .dump import DumpOptions, dump
from .tasks import get_task


def quickstart(
    out_dir: str,
    *,
    data_dir: str | None,
    task: str = "sst2",
    base: str = "minilm",
    config: str = "3,8,0.2",
    teacher_examples: int = 2000,
    dump_examples: int = 4000,
    student: str = "bert2",
    device: str = "cpu",
    log=print,
) -> dict:
    from .teacher import fine_tune_teacher

    out = Path(out_dir)
    teacher_dir, store = out / "teacher", out / f"{task}.zarr"
    data_flag = f" --data-dir {data_dir}" if data_dir else ""
    if (teacher_dir / "hsk_teacher.json").exists():
        log(f"[1/3] teacher already at {teacher_dir}")
    else:
        log(
            f"[1/3] hsk teacher --task {task} --base {base} --train-limit {teacher_examples} --epochs 1"
            f"{data_flag} --out {teacher_dir}"
        )
        fine_tune_teacher(
            get_task(task),
            base,
            str(teacher_dir),
            data_dir=data_dir,
            epochs=1.0,
            train_limit=teacher_examples,
            device=device,
            log=log,
        )
    log(
        f"[2/3] hsk dump --task {task} --teacher {teacher_dir} --config {config} --limit {dump_examples}"
        f"{data_flag} --out {store}"
    )
    options = DumpOptions(config=HSKConfig.parse(config), device=device, shard_rows=512, overwrite=True)
    dump(
        task,
        options,
        teacher=str(teacher_dir),
        out=str(store),
        data_dir=data_dir,
        limit=dump_examples,
        log=log,
    )
    log(f"[3/3] hsk info {store}")
    s = open_store(str(store))
    report = storage_report(s)
    log(format_report(s, report))
    problems = s.verify()
    log("verify: ok" if not problems else f"verify: {problems}")
    summary = {
        "teacher": str(teacher_dir),
        "store": str(store),
        "rows": len(s),
        "bytes_per_kept_value": report["bytes_per_kept_value"],
        "ratio_vs_paper": report["ratio_vs_paper"],
    }
    (out / "quickstart.json").write_text(json.dumps(summary, indent=2))
    return summary
