"""The masked-LM kind's compute (`--objective mlm`, LightPAFF): per masked position the teacher's top-k.

Its dump is pipelines.dump.mlm, its run plan pipelines.train.kinds.lightpaff_pretrain, its teacher (a
BertForMaskedLM head) pipelines.train.kinds.mlm_teacher. It has no evaluation of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from hskstore.format.config import BATCH_SIZE, MASK_SEED, MAX_LENGTH, MLM_BOUNDS, SHARD_ROWS, TOP_K, ConfigError
from pipelines.core.flags import flag
from pipelines.kinds import lm_flags
from pipelines.runkinds import FORWARD, DumpCommon, Log, RunKind, TeacherCommon


@dataclass(frozen=True)
class MlmDumpOptions:
    """`hsk dump --objective mlm`: BERT's masking over raw text, the teacher's top-k per masked position."""

    text_file: str | None = lm_flags.text_file()
    data_file: str | None = lm_flags.data_file()
    text_columns: str | None = lm_flags.text_columns()
    limit: int | None = lm_flags.limit()
    top_k: int = flag(TOP_K.default, TOP_K.help, TOP_K.flag)
    mask_seed: int = flag(MASK_SEED.default, MASK_SEED.help, MASK_SEED.flag)
    max_length: int | None = flag(MAX_LENGTH.default, MAX_LENGTH.help, MAX_LENGTH.flag)
    batch_size: int = flag(BATCH_SIZE.default, BATCH_SIZE.help, BATCH_SIZE.flag, section=FORWARD)
    shard_rows: int = flag(SHARD_ROWS.default, SHARD_ROWS.help, SHARD_ROWS.flag, section=FORWARD)
    precision: str = flag("auto", "The teacher forward's arithmetic: a masked-LM dump runs in fp32.", section=FORWARD)


def dump(options: MlmDumpOptions, common: DumpCommon, log: Log) -> None:
    if options.precision not in ("auto", "fp32"):  # not silently ignored: the MLM dump's forward is fp32
        raise ConfigError(f"--precision {options.precision}: a masked-LM dump (--objective mlm) runs its teacher in "
                          "fp32")
    for bound in MLM_BOUNDS:  # before the teacher loads, as for a task dump
        bound.check(getattr(options, bound.field))
    if not common.teacher or not common.out:
        raise ConfigError("an MLM dump needs --teacher (a BertForMaskedLM, e.g. from `hsk teacher --objective mlm`) "
                          "and --out")
    from pipelines.core.devices import pick_device
    from pipelines.core.threads import use_threads
    from pipelines.dump.mlm import Masking, dump_mlm, load_corpus

    device = pick_device(common.device)
    use_threads(common.threads, "dump")
    corpus = load_corpus(options.text_file, options.data_file, options.text_columns, options.limit)
    dump_mlm(common.teacher, common.out, corpus, top_k=options.top_k, masking=Masking(mask_seed=options.mask_seed),
             max_length=options.max_length or 128, batch_size=options.batch_size, shard_rows=options.shard_rows,
             device=device, overwrite=common.overwrite, progress=common.progress, log=log,
             extra_meta=common.sharing())
    log(f"done: {common.out} (see `hsk info {common.out}`)")


@dataclass(frozen=True)
class MlmTeacherOptions:
    """`hsk teacher --objective mlm`: a masked-LM head (decoder tied to the word embeddings) on raw text."""

    text_file: str | None = flag(None, "--objective mlm/clm: raw in-domain text, one example per line.")
    data_file: str | None = flag(None, "Your own labelled csv/tsv/json/parquet file.")
    train_limit: int | None = flag(None, "Use only the first N training examples.", "--limit")
    max_length: int | None = flag(None, "Max tokens [default: the task's].")
    train_layers: int = flag(0, "--objective mlm: also train the top N encoder layers.")


def teacher(options: MlmTeacherOptions, common: TeacherCommon, device: str, log: Log) -> None:
    from pipelines.dump.mlm import load_corpus
    from pipelines.train.kinds.mlm_teacher import train_mlm_teacher

    if not common.out:
        raise ConfigError("an MLM teacher needs --out (the folder for its BertForMaskedLM checkpoint)")
    corpus = load_corpus(options.text_file, options.data_file, None, options.train_limit)
    summary = train_mlm_teacher(common.base, corpus, common.out, train_layers=options.train_layers,
                                epochs=common.epochs, lr=common.lr, batch_size=common.batch_size,
                                max_length=options.max_length or 128, seed=common.seed, device=device,
                                precision=common.precision, overwrite=common.overwrite, progress=common.progress,
                                log=log)
    log(f"MLM teacher saved to {common.out}: held-out masked tokens {summary['dev_metrics']}")


RUN_KIND = RunKind(
    name="mlm", summary="a masked LM's top-k at BERT-masked positions (LightPAFF)",
    dump="pipelines.kinds.mlm:dump", dump_options=MlmDumpOptions, heading=lm_flags.HEADING,
    prepare="pipelines.train.kinds.lightpaff_pretrain:prepare_pretraining", default_method="lightpaff-pretrain",
    teacher="pipelines.kinds.mlm:teacher", teacher_options=MlmTeacherOptions,
)
