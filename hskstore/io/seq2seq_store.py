"""The reader of sequence-to-sequence stores (hskstore.format.seq2seq): targets, `hsk info`, derive.

`store.targets(rows)` gives the stored supports decoded (LMTargets over the target they sit on); `hsk info`
counts what each kind of knowledge costs per pair: the teacher's output (sequence-level KD) and the supports
(word-level KD).
"""

from __future__ import annotations

import numpy as np

from ..format.config import ConfigError
from ..format.domain import DomainCheck
from ..format.seq2seq import GROUP, SEQ2SEQ, LMTargets, Seq2seqSelection, decode, domain_checks
from . import info
from .reader import HSKStore


class Seq2seqStore(HSKStore):
    """Pairs, the teacher's output for each source, and per target token its distribution on a sparse support."""

    objective = SEQ2SEQ
    reads = frozenset({"seq2seq"})

    @property
    def s2s(self) -> Seq2seqSelection:
        return self.selection_record

    def support(self) -> tuple[Seq2seqSelection, str, int]:
        """(selection, group, positions per row) of the stored support, for derive."""
        if self.s2s.support is None:
            raise ConfigError(f"{self.url} keeps no word-level support (dumped without --support): nothing to derive")
        return self.s2s, GROUP, self.s2s.max_target

    def domain_checks(self) -> list[DomainCheck]:
        return domain_checks(self.s2s)

    def targets(self, data: dict[str, np.ndarray]) -> LMTargets:
        """Rows read with read_shard / read (every array) -> the decoded supports over their target."""
        if self.s2s.support is None:
            raise ConfigError(f"{self.url} keeps no word-level support (dumped without --support)")
        return decode(data, self.s2s)

    def token_counts(self) -> dict[str, int]:
        """Real tokens of each stored sequence over the whole store, and the kept support positions."""
        names = [n for n in ("source_length", "reference_length", "teacher_length", f"{GROUP}/kept") if n in self.specs]
        totals = dict.fromkeys(names, 0)
        for shard in range(self.n_shards):
            data = self.read(slice(*self.shard_bounds(shard)), names)
            for name in names:
                totals[name] += int(np.unpackbits(data[name], axis=-1).sum() if name.endswith("kept")
                                    else data[name].sum())
        return totals

    def storage_report(self) -> dict:
        arrays = info.array_bytes(self)
        counts, pairs = self.token_counts(), max(len(self), 1)
        word = sum(a["stored"] for name, a in arrays.items() if name.startswith(f"{GROUP}/"))
        sequence = sum(a["stored"] for name, a in arrays.items() if name.startswith("teacher_"))
        total = sum(a["stored"] for a in arrays.values())
        kept = counts.get(f"{GROUP}/kept", 0)
        return {"rows": len(self), "arrays": arrays, "total_bytes": total, "bytes_per_example": total / pairs,
                "tokens": counts, "word_bytes": word, "sequence_bytes": sequence,
                "word_bytes_per_pair": word / pairs, "sequence_bytes_per_pair": sequence / pairs,
                "knowledge_bytes_per_pair": (word + sequence) / pairs,
                "bytes_per_kept_position": word / max(kept, 1),
                "support": None if self.s2s.support is None else str(self.s2s.described),
                "vocab_size": self.s2s.vocab_size}

    def size_summary(self, report: dict) -> str:
        """One line: the support and what the teacher's knowledge costs per pair."""
        return (f"support {report['support']}: {report['word_bytes_per_pair']:.1f} B/pair word-level, "
                f"{report['sequence_bytes_per_pair']:.1f} B/pair sequence-level")

    def _knowledge_lines(self, report: dict) -> list[str]:
        sel, lines = self.s2s, []
        if sel.decoding is not None:
            d = sel.decoded
            how = "greedy" if d.strategy == "greedy" else f"beam search, {d.beams} beams"
            lines.append(f"sequence   the teacher's output ({how}, up to {d.max_new_tokens} tokens): "
                         f"{report['sequence_bytes_per_pair']:.1f} B/pair")
        if sel.support is not None:
            what = (f"top-{sel.k} ids + log-probs ({sel.logprob_codec}); tail = 1 - sum" if sel.support == "topk"
                    else f"{sel.draws} draws from the teacher (seed {sel.sample_seed}): distinct ids + counts")
            on = "the teacher's output" if sel.supports_on == "teacher" else "the reference"
            lines.append(f"word       on {on}: {what}; ids at {sel.id_bits} bits: "
                         f"{report['word_bytes_per_pair']:.1f} B/pair ({report['bytes_per_kept_position']:.2f} B "
                         "per target token)")
        return lines

    def format_report(self, report: dict) -> str:
        meta, sel = self.metadata, self.s2s
        tokens = report["tokens"]
        prompt = f"   prompt {sel.prompt!r}" if sel.prompt else ""
        lines = [f"store      {self.url}", info.status_line(meta, "   objective seq2seq"),
                 *info.upgrade_lines(self.meta),
                 f"pairs      {report['rows']} ({tokens.get('source_length', 0)} source and "
                 f"{tokens.get('reference_length', 0)} reference tokens; at most {sel.max_source} + "
                 f"{sel.max_target})   source {meta.dataset.source}",
                 f"teacher    {meta.teacher.name} ({meta.teacher.architecture}, {sel.architecture}){prompt}",
                 info.tokenizer_line(meta), *self._knowledge_lines(report),
                 "", *info.array_lines(report["arrays"]), "",
                 f"total          {info.human_bytes(report['total_bytes'])}  ({report['bytes_per_example']:.1f} B/pair "
                 f"with the pairs; the teacher's knowledge {report['knowledge_bytes_per_pair']:.1f} B/pair)"]
        return info.join_report(lines)

    def refuse_derive(self) -> None:
        raise ConfigError(f"{self.url} is a seq2seq store: derive it with --support topk:K or sample:N "
                          "(and --logprobs), not a config")

    def refuse_task_training(self) -> None:
        raise ConfigError(f"{self.url} is a seq2seq store: train from it with --method s2s-kd")

    derives_by_support = True  # hskstore.share.support_derive, called by `hsk derive --support`
