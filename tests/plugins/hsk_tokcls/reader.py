"""The reader of token-classification stores (hsk_tokcls.store_kind): `hsk info`'s report, the rules, the refusals."""

from __future__ import annotations

from hskstore.format.config import ConfigError
from hskstore.format.domain import DomainCheck
from hskstore.io import info
from hskstore.io.reader import HSKStore

from .store_kind import GROUP, NAME, TokClsSelection, domain_checks


class TokClsStore(HSKStore):
    """A token-classification store: per word-piece, the teacher's label distribution (top-k or full)."""

    objective = NAME
    reads = frozenset({NAME})  # its Stage.read (declared by hsk_tokcls.method)

    @property
    def labelling(self) -> TokClsSelection:
        return self.selection_record

    def domain_checks(self) -> list[DomainCheck]:
        return domain_checks(self.meta)

    def tokens(self) -> int:
        """Real word-pieces over the whole store (the positions that hold a distribution)."""
        lengths = (self.read(slice(*self.shard_bounds(s)), ["length"])["length"] for s in range(self.n_shards))
        return sum(int(length.sum()) for length in lengths)

    def storage_report(self) -> dict:
        arrays = info.array_bytes(self)
        tokens = self.tokens()
        total = sum(a["stored"] for a in arrays.values())
        knowledge = sum(a["stored"] for name, a in arrays.items() if name.startswith(f"{GROUP}/"))
        return {"rows": len(self), "arrays": arrays, "total_bytes": total,
                "bytes_per_example": total / max(len(self), 1), "tokens": tokens, "tokcls_bytes": knowledge,
                "bytes_per_token": knowledge / tokens if tokens else float("nan")}

    def format_report(self, report: dict) -> str:
        meta, sel = self.metadata, self.labelling
        which = f"top-{sel.top_k} of" if sel.support == "topk" else "all"
        teacher = meta.teacher
        lines = [f"store      {self.url}", info.status_line(meta, f"   objective {NAME}"),
                 *info.upgrade_lines(self.meta),
                 f"corpus     rows {report['rows']}   source {meta.dataset.source}",
                 f"teacher    {teacher.name} ({teacher.architecture})   weights {teacher.weights_hash[:19]}",
                 info.tokenizer_line(meta),
                 f"labels     {which} {len(sel.labels)} per word-piece: {', '.join(sel.labels)}", "",
                 *info.array_lines(report["arrays"]), "",
                 f"total      {info.human_bytes(report['total_bytes'])}  ({report['bytes_per_example']:.1f} B/example)",
                 f"per token  {report['bytes_per_token']:.2f} B stored ({report['tokens']} word-pieces; {GROUP}/ only)"]
        return info.join_report(lines)

    def refuse_derive(self) -> None:
        raise ConfigError(f"{self.url} is a token-classification store: derive makes smaller task stores")

    def refuse_task_training(self) -> None:
        raise ConfigError(f"{self.url} is a token-classification store: train from it with --method tokcls-kd")
