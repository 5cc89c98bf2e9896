"""The run kind of the token-classification kind: its typed options and entry points (torch-free at import: hsk
reads this module before torch loads). A package's kind takes its options as `--set NAME=VALUE`, read as these
fields' types:

    hsk dump --objective tokcls --teacher NER_TEACHER --out ner.zarr --set text_file=corpus.txt --set support=topk:2
    hsk train --store ner.zarr --student bert2 --out runs/ner                  # tokcls-kd, the kind's default
    hsk eval runs/ner/best --objective tokcls --set store=held-out.zarr        # agreement with the teacher
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.runkinds import DumpCommon, EvalCommon, Log, RunKind

from .store_kind import NAME


@dataclass(frozen=True)
class TokClsDumpOptions:
    """`hsk dump --objective tokcls`: a token classifier's label distribution per word-piece of raw text."""

    text_file: str | None = None  # one text a line
    limit: int | None = None  # the first N texts only
    support: str = "topk:2"  # topk:K (the K likeliest labels per token) or full (every label)
    max_length: int = 64
    batch_size: int = 16
    shard_rows: int = 256


def dump(options: TokClsDumpOptions, common: DumpCommon, log: Log) -> None:
    teacher, out = common.needs("a token-classification dump (--objective tokcls)")
    from pipelines.core.devices import pick_device
    from pipelines.core.threads import use_threads

    from .compute import dump_tokcls, read_texts

    corpus = read_texts(options.text_file, options.limit)
    use_threads(common.threads, "dump")
    dump_tokcls(teacher, out, corpus, options.support, max_length=options.max_length, batch_size=options.batch_size,
                shard_rows=options.shard_rows, device=pick_device(common.device), overwrite=common.overwrite,
                progress=common.progress, log=log, extra_meta=common.sharing())
    log(f"done: {out} (see `hsk info {out}`)")


@dataclass(frozen=True)
class TokClsEvalOptions:
    """`hsk eval MODEL --objective tokcls --set store=S`: the student against the teacher on a held-out store."""

    store: str | None = None


def evaluate(model: str, options: TokClsEvalOptions, common: EvalCommon, device: str, log: Log) -> None:
    from .compute import evaluate as run

    run(model, options.store, common, device, log)


RUN_KIND = RunKind(
    name=NAME, summary="a token classifier's label distribution per word-piece (NER distillation)",
    dump="hsk_tokcls.run_kind:dump", dump_options=TokClsDumpOptions,
    prepare="hsk_tokcls.compute:prepare", default_method="tokcls-kd",
    evaluate="hsk_tokcls.run_kind:evaluate", eval_options=TokClsEvalOptions,
)
