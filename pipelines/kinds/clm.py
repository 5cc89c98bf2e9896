"""The causal-LM kind's compute (`--objective clm`): per position, a causal LM's next-token distribution on a
sparse support.

Its dump is pipelines.dump.clm (a `ClmRequest` built from `ClmDumpOptions`), its run plan
pipelines.train.kinds.clm (method clm-kd), its teacher fine-tuning pipelines.train.kinds.clm_teacher and its
evaluation (perplexity on held-out text) pipelines.train.run.lm_eval. A new `hsk dump --objective clm` flag is a
field of `ClmDumpOptions` below, passed on to the request in `request()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hskstore.errors import UserError
from hskstore.format.config import ConfigError
from pipelines.core.flags import flag
from pipelines.kinds import lm_flags

if TYPE_CHECKING:  # the request the dump reads (torch: imported when the dump runs)
    from pipelines.dump.clm import ClmRequest

from pipelines.runkinds import FORWARD, DumpCommon, EvalCommon, Log, RunKind, TeacherCommon, warn

LM = lm_flags.HEADING


@dataclass(frozen=True)
class ClmDumpOptions:
    """`hsk dump --objective clm`: a corpus packed into blocks, the teacher's next-token support per position."""

    text_file: str | None = lm_flags.text_file()
    data_file: str | None = lm_flags.data_file()
    text_columns: str | None = lm_flags.text_columns()
    limit: int | None = lm_flags.limit()
    support: str = flag("topk:64", "--objective clm/seq2seq: per position, topk:K (the K most probable ids and their "
                        "log-probs; the tail mass is 1 - their sum) or sample:N (N draws from the teacher, RS-KD: "
                        "distinct ids and counts); clm also takes hidden[:CODEC] (the final hidden state through a "
                        "value codec, Hadamard-rotated, and the LM head once: the full distribution; hidden:fit: int8 "
                        "indices in a basis fitted to the head, see --hidden-kl); seq2seq also takes none (the "
                        "teacher's output alone).", section=LM)
    logprobs: str = flag("float16", "--objective clm with topk: the value codec of the log-probs (float16, int8, "
                         "int4, mxfp4, nf3, nf4).", section=LM)
    block_size: int = flag(256, "--objective clm: tokens per block (documents packed, EOS between).", section=LM)
    positions: float = flag(1.0, "--objective clm: the fraction of positions that keep a support, those of highest "
                            "teacher entropy (selective KD); 1 keeps all.", section=LM)
    sample_seed: int = flag(0, "--objective clm with sample:N: the draws of block r come from a generator seeded "
                            "(seed, r); with hidden: the rotation's seed.", section=LM)
    limit_tokens: int | None = flag(None, "--objective clm: dump only the first N tokens of the corpus.", section=LM)
    hidden_layers: str | None = flag(None, "--objective clm: also keep the teacher's hidden states of these layers "
                                     "(e.g. 4,8; 0 = the embeddings' output), at every --layer-stride-th position, "
                                     "Hadamard-rotated, through --layer-codec: for clm-kd --set layer_weight.",
                                     section=LM)
    layer_stride: int = flag(1, "--objective clm with --hidden-layers: keep block positions 0, N, 2N, ... (1: all).",
                             section=LM)
    layer_codec: str = flag("float16", "--objective clm with --hidden-layers: the value codec of the layer states "
                            "(float16, int8, int4, mxfp4, nf3, nf4).", section=LM)
    hidden_kl: float = flag(0.01, "--objective clm with --support hidden:fit: the mean KL(teacher || stored) in "
                            "nats per token the fitted basis's steps are made for (smaller: more bytes).", section=LM)
    hidden_fit_tokens: int = flag(8192, "--objective clm with --support hidden:fit: how many positions of the "
                                  "corpus's start the basis is fitted to.", section=LM)
    dtype: str = flag("auto", "--objective clm: the teacher's weights loaded as auto (the checkpoint's dtype), "
                      "float32, bfloat16 or float16; recorded in the store.", section=LM)
    device_map: str | None = flag(None, "--objective clm: auto spreads the teacher's layers over the visible devices "
                                  "(accelerate), for a teacher larger than one device.", section=LM)
    batch_size: int = flag(8, "Teacher batch size.", section=FORWARD)
    shard_rows: int = flag(64, "Examples per shard.", section=FORWARD)
    precision: str = flag("auto", "The teacher forward's arithmetic.", section=FORWARD)
    workers: int | None = lm_flags.workers(FORWARD)
    scheduler: str | None = lm_flags.scheduler(FORWARD)

    def request(self, threads: int | None = None) -> ClmRequest:
        """The dump's request (pipelines.dump.clm.ClmRequest), checked before the teacher loads (`threads`: per dask
        worker with --workers/--scheduler)."""
        from hskstore.format.clm import Support, check_positions
        from hskstore.format.clm_layers import parse_layers
        from pipelines.dump.clm import ClmRequest

        request = ClmRequest(Support.parse(self.support), self.logprobs, self.block_size, self.positions,
                             self.sample_seed, self.limit_tokens, self.batch_size, self.shard_rows, self.precision,
                             self.dtype, self.device_map, self.limit, self.workers, self.scheduler, threads,
                             layers=None if self.hidden_layers is None else parse_layers(self.hidden_layers),
                             layer_stride=self.layer_stride, layer_codec=self.layer_codec,
                             hidden_kl=self.hidden_kl, hidden_fit_tokens=self.hidden_fit_tokens)
        check_positions(request.positions)
        request.check()
        return request


def dump(options: ClmDumpOptions, common: DumpCommon, log: Log) -> None:
    from pipelines.core.devices import pick_device
    from pipelines.core.precision import cpu_half_warning
    from pipelines.core.threads import use_threads
    from pipelines.dump.clm import dump_clm
    from pipelines.dump.corpus import open_corpus

    device = pick_device(common.device)
    request = options.request(common.threads)
    if not common.teacher or not common.out:
        raise ConfigError("a causal-LM dump needs --teacher (an AutoModelForCausalLM folder or hub id) and --out")
    if note := cpu_half_warning(options.precision, device):
        warn(note)
    corpus = open_corpus(options.text_file, options.data_file, options.text_columns)
    if request.workers is not None or request.scheduler is not None:
        from pipelines.dump.clm_distributed import dump_clm_distributed as dump_clm
    else:
        use_threads(common.threads, "dump")
    dump_clm(common.teacher, common.out, corpus, request, device=device, overwrite=common.overwrite,
             progress=common.progress, log=log, extra_meta=common.sharing())
    log(f"done: {common.out} (see `hsk info {common.out}`)")


@dataclass(frozen=True)
class ClmTeacherOptions:
    """`hsk teacher --objective clm`: fine-tune a causal LM on a corpus (next-token cross-entropy)."""

    text_file: str | None = flag(None, "--objective mlm/clm: raw in-domain text, one example per line.")
    data_file: str | None = flag(None, "Your own labelled csv/tsv/json/parquet file.")
    train_limit: int | None = flag(None, "Use only the first N training examples.", "--limit")
    max_length: int | None = flag(None, "Max tokens [default: the task's].")


def teacher(options: ClmTeacherOptions, common: TeacherCommon, device: str, log: Log) -> None:
    from pipelines.dump.mlm import load_corpus
    from pipelines.train.kinds.clm_teacher import train_clm_teacher

    if not common.out:
        raise ConfigError("a causal-LM teacher needs --out (the folder for its checkpoint)")
    corpus = load_corpus(options.text_file, options.data_file, None, options.train_limit)
    summary = train_clm_teacher(common.base, corpus, common.out, block_size=options.max_length or 256,
                                epochs=common.epochs, lr=common.lr, batch_size=common.batch_size, seed=common.seed,
                                device=device, precision=common.precision, overwrite=common.overwrite,
                                progress=common.progress, log=log)
    log(f"causal-LM teacher saved to {common.out}: held-out {summary['dev_metrics']}")


@dataclass(frozen=True)
class ClmEvalOptions:
    """`hsk eval MODEL --text-file F`: a causal LM's perplexity on held-out text."""

    text_file: str | None = flag(None, "A causal LM's held-out text, one document per line: perplexity (token and "
                                 "word level), ECE and next-token accuracy.", "--text-file")
    block_size: int = flag(256, "--text-file: tokens per scored block (documents packed with EOS between, as a "
                           "causal-LM store packs them).", "--block-size")


def evaluate(model: str, options: ClmEvalOptions, common: EvalCommon, device: str, log: Log) -> None:
    import json

    from pipelines.train.run.lm_eval import evaluate_lm

    if not 2 <= options.block_size <= 1 << 20:
        raise UserError(f"--block-size {options.block_size}: pass a whole number from 2 to {1 << 20}")
    result = evaluate_lm(model, options.text_file, block_size=options.block_size,
                         batch_size=min(common.batch_size, 64), device=device, limit=common.limit)
    if common.as_json:
        log(json.dumps(result, indent=2))
        return
    log(f"{options.text_file}: perplexity {result['perplexity']:.3f} ({result['tokens']} tokens), per word "
        f"{result['word_perplexity']:.3f} ({result['words']} words), bits per byte {result['bits_per_byte']:.4f} "
        f"({result['bytes']} bytes), ECE {result['ece']:.4f}, next-token "
        f"accuracy {result['accuracy']:.4f}")


RUN_KIND = RunKind(
    name="clm", summary="a causal LM's next-token distributions on a sparse support",
    dump="pipelines.kinds.clm:dump", dump_options=ClmDumpOptions, heading=LM,
    prepare="pipelines.train.kinds.clm:prepare_clm", default_method="clm-kd",
    teacher="pipelines.kinds.clm:teacher", teacher_options=ClmTeacherOptions,
    evaluate="pipelines.kinds.clm:evaluate", eval_options=ClmEvalOptions, eval_by="text_file",
    feed="pipelines.train.kinds.clm:clm_feed",
)
