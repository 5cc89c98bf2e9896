"""The reader of masked-LM stores (hskstore.format.mlm): the masking, `hsk info`, the refusals.

A masked-LM store has no HSK selection (`selection` is None); `masking` holds its masking and top-k. `hsk info`
counts bytes per masked token of the knowledge (the mlm/ arrays) beside today's top-k logit caches.
"""

from __future__ import annotations

from ..format.config import ConfigError
from ..format.domain import DomainCheck
from ..format.mlm import GROUP, MLM, MaskedLMSelection, domain_checks
from . import info
from .reader import HSKStore

# Top-k logit caches of LLM distillation, bytes per token before compression: Megatron's top-128
# fp16 format (~528 B), DistillKit's (114-300 B depending on k and encoding).
MEGATRON_TOPK_BYTES = 528
DISTILLKIT_BYTES = (114, 300)


class MLMStore(HSKStore):
    """A masked-LM store (LightPAFF pre-training): masked inputs and the teacher's top-k per masked position.

    It has no HSK selection (`selection` is None); `masking` holds its masking and top-k.
    """

    objective = MLM
    reads = frozenset({"mlm"})  # its Stage.read (pipelines/registry.py READS)

    @property
    def masking(self) -> MaskedLMSelection:
        return self.selection_record

    def domain_checks(self) -> list[DomainCheck]:
        return domain_checks(self.meta)

    def masked_tokens(self) -> int:
        """Masked positions over the whole store (unused slots are -1)."""
        masked, name = 0, f"{GROUP}/positions"
        for shard in range(self.n_shards):
            masked += int((self.read(slice(*self.shard_bounds(shard)), [name])[name] >= 0).sum())
        return masked

    def storage_report(self) -> dict:
        """What a masked-LM store costs per masked token (its teacher knowledge is the mlm/ arrays)."""
        arrays = info.array_bytes(self)
        masked = self.masked_tokens()
        total = sum(a["stored"] for a in arrays.values())
        knowledge = sum(a["stored"] for name, a in arrays.items() if name.startswith(f"{GROUP}/"))
        raw = sum(a["raw"] for name, a in arrays.items() if name.startswith(f"{GROUP}/"))
        per_token = knowledge / masked if masked else float("nan")
        return {
            "rows": len(self),
            "arrays": arrays,
            "total_bytes": total,
            "bytes_per_example": total / max(len(self), 1),
            "masked_tokens": masked,
            "top_k": self.masking.top_k,
            "mlm_bytes": knowledge,
            "bytes_per_masked_token": per_token,
            "raw_bytes_per_masked_slot": raw / max(len(self) * self.masking.max_masked, 1),
            "ratio_vs_megatron": MEGATRON_TOPK_BYTES / per_token if masked else float("nan"),
        }

    def format_report(self, report: dict) -> str:
        meta, sel = self.metadata, self.masking
        lines = [
            f"store      {self.url}",
            info.status_line(meta, "   objective mlm"),
            *info.upgrade_lines(self.meta),
            f"corpus     rows {report['rows']}   source {meta.dataset.source}",
            f"teacher    {meta.teacher.name} ({meta.teacher.architecture})   weights {meta.teacher.weights_hash[:19]}",
            info.tokenizer_line(meta),
            f"masking    {sel.mask_rate:.0%} of tokens (seed {sel.mask_seed}): {sel.mask_token_rate:.0%} [MASK],"
            f" {sel.random_token_rate:.0%} random, {sel.keep_rate:.0%} kept; at most {sel.max_masked} per row",
            f"teacher    top-{sel.top_k} ids and logits + log-sum-exp per masked position",
            "",
            *info.array_lines(report["arrays"]),
        ]
        low, high = DISTILLKIT_BYTES
        lines += [
            "",
            f"total          {info.human_bytes(report['total_bytes'])}  ({report['bytes_per_example']:.1f} B/example)",
            f"per masked token {report['bytes_per_masked_token']:.1f} B stored ({report['masked_tokens']} masked "
            f"tokens; mlm/ arrays only)   vs Megatron top-128 fp16 ~{MEGATRON_TOPK_BYTES} B"
            f" ({report['ratio_vs_megatron']:.1f}x smaller), DistillKit {low}-{high} B",
        ]
        return info.join_report(lines)

    def refuse_derive(self) -> None:
        raise ConfigError(f"{self.url} is a masked-LM store: derive makes smaller task stores (ND,NL,W)")

    def refuse_task_training(self) -> None:
        raise ConfigError(f"{self.url} is a masked-LM store (LightPAFF pre-training): train from it with --method "
                          "lightpaff-pretrain; the other methods distil from task stores")
