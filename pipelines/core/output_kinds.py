"""The folders hsk's commands write besides stores, and which rule each follows.

hskstore.io.outputs owns the generic output rule (refuse what is not ours, replace only our own kind,
swap a replacement in whole) and the one kind it knows, the store. What a run, a sweep or a teacher
folder is, and whether a rerun resumes it or must be told `--overwrite`, is the commands' business
and lives here. Each kind's folder is named by the MARKER file hskstore.io.outputs.mark_output writes
into it first.
"""

from __future__ import annotations

from dataclasses import dataclass

from hskstore.io.outputs import OutputError, claim_output


@dataclass(frozen=True)
class OutputKind:
    """One kind of output folder. `resumable`: a rerun without --overwrite resumes it (a run, a sweep);
    otherwise it is built whole in one go and such a rerun is refused (a teacher, a student, a report)."""

    name: str
    resumable: bool

    def claim(self, path: str, *, overwrite: bool) -> str:
        """"new", "replace", or (resumable kinds) "resume": hskstore.io.outputs.claim_output, plus this kind's rule."""
        status = claim_output(path, self.name, overwrite=overwrite)
        if status == "resume" and not self.resumable:
            raise OutputError(
                f"{path} already holds a {self.name}: pass --overwrite to replace it, or choose another --out"
            )
        return status


RUN = OutputKind("train-run", resumable=True)  # `hsk train --out`
SWEEP = OutputKind("sweep", resumable=True)  # a sweep's work_dir
QUICKSTART = OutputKind("quickstart", resumable=True)  # `hsk quickstart --out`
TEACHER = OutputKind("teacher", resumable=False)  # `hsk teacher --out`
STUDENT = OutputKind("student", resumable=False)  # `hsk student build --out`
REPORT = OutputKind("report", resumable=False)  # `hsk report --out`
