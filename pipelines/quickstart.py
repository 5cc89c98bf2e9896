"""The embedded default job: a real teacher, a real store and a student, offline, in minutes on a CPU.

Each step prints the `hsk` command that does the same, so the quickstart doubles as a tutorial.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hskstore.format.config import HSKConfig
from hskstore.io.info import format_report, storage_report
from hskstore.io.outputs import claim_output, mark_output
from hskstore.io.reader import open_store
from pipelines.core.data import load_examples
from pipelines.core.output_kinds import QUICKSTART
from pipelines.core.tasks import get_task
from pipelines.core.threads import physical_cores
from pipelines.dump.stage import DumpOptions, dump
from pipelines.train.options import TrainOptions
from pipelines.train.run.driver import train

OUTPUT_KIND = QUICKSTART.name
# What the default job took on this project's quiet 2-core machine (README: "Run the main job")
QUIET_SECONDS = 142


def expected_time(load: float | None, cores: int) -> str:
    """The line the quickstart starts with: what it takes on a quiet machine, and how busy this one is now
    (a shared machine's load stretches it far more than linearly: 84 minutes were seen at load 9 on 2 cores)."""
    quiet = f"about {QUIET_SECONDS // 60} min {QUIET_SECONDS % 60} s on a quiet 2-core CPU"
    if load is None:
        return f"expected: {quiet}"
    if load <= cores:
        return f"expected: {quiet}; load now {load:.1f} on {cores} cores"
    return (f"expected: {quiet}, but the load now is {load:.1f} on {cores} cores: other processes share them, and "
            "runs take many times longer (84 min at load 9 on 2 cores); `hsk doctor` says more")


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
    overwrite: bool = False,
    progress: bool = True,
    log=print,
) -> dict:
    """Teacher, store and student under `out_dir`, a "quickstart" output (hskstore.io.outputs): a new
    folder, or one a previous quickstart made (rerun: the teacher is reused, the rest redone);
    `overwrite` also fine-tunes the teacher again (each output is replaced only once its new one is
    complete). Any other folder or file is refused and left as it is."""
    from pipelines.train.kinds.teacher import fine_tune_teacher

    if data_dir is not None:  # refused before anything is created (a --data-dir without the data: one line)
        load_examples(task, "train", data_dir=data_dir, limit=1)
    log(expected_time(os.getloadavg()[0] if hasattr(os, "getloadavg") else None, physical_cores()))
    if claim_output(out_dir, OUTPUT_KIND, overwrite=overwrite) == "new":
        mark_output(out_dir, OUTPUT_KIND, task=task, config=config)
    out = Path(out_dir)
    teacher_dir, store = out / "teacher", out / f"{task}.zarr"
    data_flag = f" --data-dir {data_dir}" if data_dir else ""
    if (teacher_dir / "hsk_teacher.json").exists() and not overwrite:
        log(f"[1/4] teacher already at {teacher_dir}")
    else:
        log(
            f"[1/4] hsk teacher --task {task} --base {base} --limit {teacher_examples} --epochs 1"
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
            overwrite=overwrite,
            progress=progress,
            log=log,
        )
    log(
        f"[2/4] hsk dump --task {task} --teacher {teacher_dir} --config {config} --limit {dump_examples}"
        f" --student-layers 2{data_flag} --out {store}"
    )
    # The reference student is the 2-layer student trained in step 4, so its layers meet the store's one to one.
    # Shards of 1024 rows, as the CLI's default: the same dump gives the same checksums either way.
    options = DumpOptions(config=HSKConfig.parse(config), ref_student_layers=2, device=device, overwrite=True,
                          progress=progress)
    dump(
        task,
        options,
        teacher=str(teacher_dir),
        out=str(store),
        data_dir=data_dir,
        limit=dump_examples,
        log=log,
    )
    log(f"[3/4] hsk info {store}")
    s = open_store(str(store))
    report = storage_report(s)
    log(format_report(s, report))
    problems = s.verify()
    log("verify: ok" if not problems else f"verify: {problems}")
    student_dir = out / student
    log(
        f"[4/4] hsk train --store {store} --student {student} --epochs-hsk 1 --epochs-pred 1 --lr-hsk 1e-4 "
        f"--lr-pred 1e-4{data_flag} --out {student_dir}"
    )
    trained = train(
        TrainOptions(method_options=dict(epochs_hsk=1, epochs_pred=1, lr_hsk=1e-4, lr_pred=1e-4), device=device,
                     data_dir=data_dir, progress=progress),
        student=student,
        out_dir=str(student_dir),
        store=str(store),
        log=log,
    )
    summary = {
        "teacher": str(teacher_dir),
        "store": str(store),
        "rows": len(s),
        "bytes_per_kept_value": report["bytes_per_kept_value"],
        "ratio_vs_paper": report["ratio_vs_paper"],
        "student": str(student_dir / "best"),
        "student_metric": {trained["metric"]: trained["score"]},
    }
    (out / "quickstart.json").write_text(json.dumps(summary, indent=2))
    log(next_steps(teacher_dir, store, student_dir / "best", task, data_flag, s.config))
    return summary


def smaller_config(config: HSKConfig) -> HSKConfig | None:
    """A config `hsk derive` can make from `config`: its top layer, its tokens, half its width (None when
    there is nothing smaller to derive)."""
    if config.logits_only or config.n_tokens == 0:
        return None
    return HSKConfig.parse(f"1,{config.n_tokens},{config.width / 2:g}")


def next_steps(teacher: Path, store: Path, student: Path, task: str, data_flag: str, config: HSKConfig) -> str:
    """Where the quickstart left its outputs, and commands to try next on them (each runs as printed)."""
    smaller = smaller_config(config)
    name = f"{task}-{str(smaller).replace(',', '_')}.zarr"
    derive = [] if smaller is None else [f"  hsk derive {store} --config {smaller} --out {store.with_name(name)}"]
    return "\n".join([
        "",
        "done. Your outputs:",
        f"  teacher  {teacher}",
        f"  store    {store}",
        f"  student  {student}",
        "Next, try:",
        f"  hsk eval {student} --task {task}{data_flag}",
        *derive,
        f"  hsk train --store {store} --student bert2 --stages pred{data_flag} --out {store.parent / 'bert2-pred'}",
    ])
