"""The reader of causal-LM stores (hskstore.format.clm): decoded targets, `hsk info`, derive.

`store.targets(shard)` gives a shard's teacher distributions decoded (LMTargets); `hsk info` counts bytes per
token of the knowledge (the clm/ arrays) beside today's offline-logit formats.
"""

from __future__ import annotations

import numpy as np

from ..format.clm import (
    ACTUAL,
    CLM,
    GROUP,
    TEXT_ARRAYS,
    BlockText,
    ClmSelection,
    LMTargets,
    block_texts,
    decode,
    domain_checks,
)
from ..format.config import ConfigError
from ..format.domain import DomainCheck
from . import info
from .reader import HSKStore

# What other tools store per token (bytes, before their own compression where they say so).
OTHERS = (("Megatron-LM top-128 fp16 + 17-bit ids", 528), ("DistillKit top-128, polynomial tail", 300),
          ("RS-KD 12 sampled ids of 50, 7-bit counts", 37))


class ClmStore(HSKStore):
    """A causal-LM store: packed blocks and, per kept position, the teacher's distribution on a sparse support."""

    objective = CLM
    reads = frozenset({"clm"})

    @property
    def clm(self) -> ClmSelection:
        return self.selection_record

    def domain_checks(self) -> list[DomainCheck]:
        return domain_checks(self.clm)

    def support(self) -> tuple[ClmSelection, str, int]:
        """(selection, group, positions per row) of the stored support, for derive."""
        return self.clm, GROUP, self.clm.block_size

    def targets(self, data: dict[str, np.ndarray]) -> LMTargets:
        """Rows read with read_shard / read (every array) -> their decoded teacher distributions."""
        return decode(data, self.clm)

    def texts(self, data: dict[str, np.ndarray]) -> list[BlockText]:
        """Rows read with the text arrays -> each block's text, teacher token ends and actual-token log-probs."""
        return block_texts(data)

    def tokens(self) -> tuple[int, int]:
        """(real tokens, kept positions) over the whole store."""
        real = kept = 0
        for shard in range(self.n_shards):
            data = self.read(slice(*self.shard_bounds(shard)), ["length", "clm/kept"])
            real += int(data["length"].sum())
            kept += int(np.unpackbits(data["clm/kept"], axis=-1).sum())
        return real, kept

    def storage_report(self) -> dict:
        arrays = info.array_bytes(self)
        real, kept = self.tokens()
        # the block text and its offsets are the corpus, not the teacher's knowledge; the actual-token log-probs are
        knowledge = sum(a["stored"] for name, a in arrays.items()
                        if name.startswith("clm/") and (name == ACTUAL or name not in TEXT_ARRAYS))
        total = sum(a["stored"] for a in arrays.values())
        return {"rows": len(self), "arrays": arrays, "total_bytes": total,
                "bytes_per_example": total / max(len(self), 1), "tokens": real, "kept_positions": kept,
                "knowledge_bytes": knowledge, "bytes_per_token": knowledge / max(real, 1),
                "bytes_per_kept_position": knowledge / max(kept, 1), "total_bytes_per_token": total / max(real, 1),
                "support": str(self.clm.described), "vocab_size": self.clm.vocab_size}

    def size_summary(self, report: dict) -> str:
        """One line: the support and what it costs per token."""
        return f"support {report['support']}: {report['bytes_per_token']:.2f} B/token"

    def format_report(self, report: dict) -> str:
        meta, sel = self.metadata, self.clm
        what = (f"top-{sel.k} ids + log-probs ({sel.logprob_codec}); tail = 1 - sum" if sel.support == "topk" else
                f"{sel.draws} draws from the teacher (seed {sel.sample_seed}): distinct ids + counts")
        lines = [f"store      {self.url}", info.status_line(meta, "   objective clm"), *info.upgrade_lines(self.meta),
                 f"corpus     {report['rows']} blocks of {sel.block_size} tokens ({report['tokens']} real)   source "
                 f"{meta.dataset.source}",
                 f"teacher    {meta.teacher.name} ({meta.teacher.architecture}, {meta.teacher.num_layers} layers)   "
                 f"weights {(meta.teacher.weights_hash or '?')[:19]}",
                 info.tokenizer_line(meta),
                 f"support    {what}; ids at {sel.id_bits} bits; positions kept {sel.positions:g} "
                 f"({report['kept_positions']})",
                 "", *info.array_lines(report["arrays"]), "",
                 f"total          {info.human_bytes(report['total_bytes'])}  "
                 f"({report['total_bytes_per_token']:.1f} B/token with the inputs)",
                 f"per token      {report['bytes_per_token']:.2f} B stored (clm/ arrays; "
                 f"{report['bytes_per_kept_position']:.2f} B per kept position); the full distribution in fp16: "
                 f"{2 * sel.vocab_size:,} B"]
        lines += ["for scale, what other tools store per token:"]
        lines += [f"  {name}: ~{size} B ({size / max(report['bytes_per_token'], 1e-9):.1f}x this store)"
                  for name, size in OTHERS]
        return info.join_report(lines)

    def refuse_derive(self) -> None:
        raise ConfigError(f"{self.url} is a causal-LM store: derive it with --support topk:K or sample:N "
                          "(and --logprobs), not a config")

    def refuse_task_training(self) -> None:
        raise ConfigError(f"{self.url} is a causal-LM store: train from it with --method clm-kd")

    derives_by_support = True  # hskstore.share.support_derive, called by `hsk derive --support`
