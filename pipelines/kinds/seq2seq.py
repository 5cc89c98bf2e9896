"""The seq2seq kind's compute (`--objective seq2seq`): pairs, the teacher's output and per target token its
distribution on a sparse support.

Its dump is pipelines.dump.seq2seq (a `Seq2seqRequest` built from `Seq2seqDumpOptions`), its run plan
pipelines.train.kinds.seq2seq (method s2s-kd) and its evaluation (BLEU, chrF and the targets' perplexity)
pipelines.train.run.s2s_eval. It has no teacher fine-tuning of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hskstore.format.config import MAX_LENGTH, ConfigError
from pipelines.core.flags import flag
from pipelines.kinds import lm_flags

if TYPE_CHECKING:  # the request the dump reads (torch: imported when the dump runs)
    from pipelines.dump.seq2seq import Seq2seqRequest

from pipelines.runkinds import FORWARD, TOP, DumpCommon, EvalCommon, Log, RunKind

LM = lm_flags.HEADING


@dataclass(frozen=True)
class Seq2seqDumpOptions:
    """`hsk dump --objective seq2seq`: pairs of a table file (streamed), a Hugging Face dataset or a GLUE pair task,
    the teacher's output and/or its per-target-token support."""

    task: str | None = flag(None, "GLUE task (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli).", "--task", "-t",
                            section=TOP)
    split: str = flag("train", "Split to dump: train, dev, dev_matched, dev_mismatched.", section=TOP)
    data_dir: str | None = flag(None, "Local glue_data folder (or set HSK_DATA_DIR); else the HF hub.", section=TOP)
    data_file: str | None = lm_flags.data_file()
    text_columns: str | None = lm_flags.text_columns()
    limit: int | None = lm_flags.limit()
    support: str = flag("topk:64", "per position, topk:K, sample:N or none.", section=LM)
    decode: str = flag("none", "--objective seq2seq: also store the teacher's own output for each source "
                       "(sequence-level KD): greedy or beam:N (no sampling, no length penalty).", section=LM)
    supports_on: str | None = flag(None, "--objective seq2seq: the target the supports sit on, reference or teacher "
                                   "[default: teacher with --decode, else reference].", section=LM)
    max_target: int = flag(64, "--objective seq2seq: target tokens kept per pair (and the most the teacher "
                           "generates); --max-length bounds the source.", section=LM)
    prompt: str | None = flag(None, "--objective seq2seq with a decoder-only teacher: the prompt template, {source} "
                              "where the source goes [default: '{source}\\n'].", section=LM)
    max_length: int | None = flag(MAX_LENGTH.default, MAX_LENGTH.help, MAX_LENGTH.flag)
    logprobs: str = flag("float16", "with topk: the value codec of the log-probs.", section=LM)
    positions: float = flag(1.0, "the fraction of target positions that keep a support.", section=LM)
    sample_seed: int = flag(0, "with sample:N: the seed of the draws.", section=LM)
    batch_size: int = flag(8, "Teacher batch size.", section=FORWARD)
    shard_rows: int = flag(256, "Examples per shard.", section=FORWARD)
    precision: str = flag("auto", "The teacher forward's arithmetic.", section=FORWARD)
    workers: int | None = lm_flags.workers(FORWARD)
    scheduler: str | None = lm_flags.scheduler(FORWARD)

    def request(self, threads: int | None = None) -> Seq2seqRequest:
        """The dump's request (pipelines.dump.seq2seq.Seq2seqRequest), checked before the teacher loads (`threads`:
        per dask worker with --workers/--scheduler)."""
        from hskstore.format.clm import Support
        from pipelines.dump.seq2seq import Seq2seqRequest, typed_prompt

        support = None if self.support.strip() == "none" else Support.parse(self.support)
        request = Seq2seqRequest(support, self.decode, self.supports_on, self.logprobs, self.max_length or 128,
                                 self.max_target, typed_prompt(self.prompt), self.positions, self.sample_seed,
                                 self.batch_size, self.shard_rows, self.precision, self.limit, self.workers,
                                 self.scheduler, threads)
        request.check()
        return request


def dump(options: Seq2seqDumpOptions, common: DumpCommon, log: Log) -> None:
    from pipelines.core.devices import pick_device
    from pipelines.core.threads import use_threads
    from pipelines.dump.seq2seq import dump_seq2seq, open_pairs

    device = pick_device(common.device)
    request = options.request(common.threads)
    if not common.teacher or not common.out:
        raise ConfigError("a seq2seq dump needs --teacher (an encoder-decoder or causal-LM folder or hub id) and --out")
    pairs = open_pairs(task=options.task, split=options.split, data_dir=options.data_dir,
                       data_file=options.data_file, text_columns=options.text_columns)
    if request.workers is not None or request.scheduler is not None:
        from pipelines.dump.seq2seq_distributed import dump_seq2seq_distributed as dump_seq2seq
    else:
        use_threads(common.threads, "dump")
    dump_seq2seq(common.teacher, common.out, pairs, request, device=device, overwrite=common.overwrite,
                 progress=common.progress, log=log, extra_meta=common.sharing())
    log(f"done: {common.out} (see `hsk info {common.out}`)")


@dataclass(frozen=True)
class Seq2seqEvalOptions:
    """`hsk eval MODEL --pairs-file F`: BLEU and chrF of a seq2seq model's greedy outputs, its targets' perplexity."""

    pairs_file: str | None = flag(None, "A seq2seq model's held-out pairs (a table file; --text-columns "
                                  "SOURCE,TARGET or its first two columns): BLEU and chrF of its greedy outputs "
                                  "against the targets, and the targets' perplexity.", "--pairs-file")
    text_columns: str | None = flag(None, "--pairs-file: its source and target columns, e.g. 'src,tgt'.")
    prompt: str | None = flag(None, "--pairs-file with a decoder-only model: the prompt template its store used "
                              "({source} where the source goes; `hsk train` prints it) [default: '{source}\\n'].")
    max_target: int = flag(64, "--pairs-file: target tokens scored and generated at most.")
    max_length: int | None = flag(None, "Max tokens per example [default: 64 for CoLA/SST-2, else 128].")


def evaluate(model: str, options: Seq2seqEvalOptions, common: EvalCommon, device: str,
             log: Log) -> None:
    import json

    from hskstore.errors import UserError
    from pipelines.dump.seq2seq import load_pairs, typed_prompt
    from pipelines.train.run.s2s_eval import evaluate_pairs, stored_prompt

    for name, value in (("--max-length", options.max_length or 128), ("--max-target", options.max_target)):
        if value < 1:
            raise UserError(f"{name} {value}: pass 1 or more tokens")
    pairs = load_pairs(data_file=options.pairs_file, text_columns=options.text_columns, limit=common.limit)
    prompt = options.prompt
    if prompt is None:  # a student of an hsk store: its store's prompt
        prompt, said = stored_prompt(model)
        if said and not common.as_json:
            log(said)
    result = evaluate_pairs(model, pairs, prompt=typed_prompt(prompt), max_source=options.max_length or 128,
                            max_target=options.max_target, batch_size=min(common.batch_size, 32), device=device)
    if common.as_json:
        log(json.dumps(result, indent=2))
        return
    log(f"{options.pairs_file}: BLEU {result['bleu']:.2f}  chrF {result['chrf']:.2f}  target perplexity "
        f"{result['perplexity']:.3f} ({result['pairs']} pairs, greedy, sacrebleu)")


RUN_KIND = RunKind(
    name="seq2seq", summary="pairs: a teacher's output and per-target-token distributions",
    dump="pipelines.kinds.seq2seq:dump", dump_options=Seq2seqDumpOptions, heading=LM,
    prepare="pipelines.train.kinds.seq2seq:prepare_seq2seq", default_method="s2s-kd",
    evaluate="pipelines.kinds.seq2seq:evaluate", eval_options=Seq2seqEvalOptions, eval_by="pairs_file",
    feed="pipelines.train.kinds.seq2seq:seq2seq_feed",
)
