"""The GLUE task registry: what each task's data looks like and its training recipe defaults.

One frozen `Task` per GLUE task. Recipe defaults follow docs/METHOD.md section 5 (the HSK paper's
Appendix B); metrics follow docs/METHOD.md section 10. Pure Python: no numpy, no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hskstore.errors import UserError

# Primary metric first: it is the one model selection uses.
TASK_METRICS = {
    "matthews": ("matthews",),
    "spearman": ("spearman", "pearson"),
    "f1": ("f1", "accuracy"),
    "accuracy": ("accuracy",),
}


class TaskError(UserError, ValueError):
    """An unknown task name."""


class TaskMismatchError(TaskError):
    """A model fine-tuned for another task (other label names or count) where this task is needed."""


@dataclass(frozen=True)
class Task:
    """One GLUE task: its data columns, labels, metric and recipe defaults."""

    name: str  # canonical lowercase name, also the hub config name's key ("sst2")
    glue_dir: str  # folder in the original glue_data layout ("SST-2")
    text_columns: tuple[str, ...]  # hub column names, 1 or 2
    labels: tuple[str, ...] | None  # label names in the hub's ClassLabel order; None for regression
    metric: str  # primary metric: "matthews", "accuracy", "f1" or "spearman"
    dev_splits: tuple[str, ...] = ("dev",)
    hub_path: str = "nyu-mll/glue"
    hub_name: str = ""
    # Recipe defaults (docs/METHOD.md section 5).
    max_length: int = 128
    batch_size: int = 32
    hsk_epochs: int = 20
    pred_lr: float = 2e-5

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        """Output width of the classification head: 1 for a regression task."""
        return 1 if self.labels is None else len(self.labels)

    @property
    def metrics(self) -> tuple[str, ...]:
        """Every metric reported for this task, the primary one first."""
        return TASK_METRICS[self.metric]

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2


_NLI2 = ("entailment", "not_entailment")

TASKS: dict[str, Task] = {
    t.name: t
    for t in [
        Task(
            "cola",
            "CoLA",
            ("sentence",),
            ("unacceptable", "acceptable"),
            "matthews",
            hub_name="cola",
            max_length=64,
            hsk_epochs=30,
        ),
        Task(
            "sst2",
            "SST-2",
            ("sentence",),
            ("negative", "positive"),
            "accuracy",
            hub_name="sst2",
            max_length=64,
            hsk_epochs=10,
        ),
        Task(
            "mrpc",
            "MRPC",
            ("sentence1", "sentence2"),
            ("not_equivalent", "equivalent"),
            "f1",
            hub_name="mrpc",
        ),
        Task(
            "qqp",
            "QQP",
            ("question1", "question2"),
            ("not_duplicate", "duplicate"),
            "f1",
            hub_name="qqp",
            batch_size=64,
            hsk_epochs=5,
        ),
        Task("stsb", "STS-B", ("sentence1", "sentence2"), None, "spearman", hub_name="stsb"),
        Task(
            "mnli",
            "MNLI",
            ("premise", "hypothesis"),
            ("entailment", "neutral", "contradiction"),
            "accuracy",
            dev_splits=("dev_matched", "dev_mismatched"),
            hub_name="mnli",
            batch_size=64,
            hsk_epochs=5,
            pred_lr=5e-5,
        ),
        Task(
            "qnli",
            "QNLI",
            ("question", "sentence"),
            _NLI2,
            "accuracy",
            hub_name="qnli",
            batch_size=64,
            hsk_epochs=5,
        ),
        Task("rte", "RTE", ("sentence1", "sentence2"), _NLI2, "accuracy", hub_name="rte"),
        Task(
            "wnli",
            "WNLI",
            ("sentence1", "sentence2"),
            ("not_entailment", "entailment"),
            "accuracy",
            hub_name="wnli",
        ),
    ]
}


def _key(name: str) -> str:
    # "SST-2", "sst_2", "Sst2" all name the same task.
    return name.strip().lower().replace("-", "").replace("_", "")


_ALIASES = {_key(t.name): t for t in TASKS.values()} | {_key(t.glue_dir): t for t in TASKS.values()}


def get_task(name: str | Task) -> Task:
    """Look a task up by name, case-insensitively; GLUE folder names ("SST-2") work too."""
    if isinstance(name, Task):
        return name
    task = _ALIASES.get(_key(str(name)))
    if task is None:
        raise TaskError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    return task


# --------------------------------------------------------------------------------------------------
# Does a model made for one task fit another? (hsk dump and hsk eval ask before using a teacher.)

# transformers' placeholder names (LABEL_0, LABEL_1, ...): a checkpoint that says nothing about its labels.
_GENERIC_LABEL = re.compile(r"^label[_ ]?\d+$", re.IGNORECASE)
FITS, UNKNOWN, MISMATCH_ALLOWED = "fits", "unknown", "mismatch allowed"


def default_teacher_dir(task: str | Task) -> str:
    """Where `hsk teacher` saves and `hsk dump` looks when no --teacher is given (here, not in
    pipelines.train, so that a dump imports no training code)."""
    return f"runs/teacher-{get_task(task).name}"


def _label_key(name: object) -> str:
    # "NEGATIVE", "not entailment", "not-entailment" name the same labels as the task's.
    return re.sub(r"[\s-]+", "_", str(name).strip().lower())


def known_labels(labels: list[str] | tuple[str, ...] | None) -> list[str] | None:
    """The label names as given, or None when they are transformers' generic LABEL_<i> placeholders."""
    if not labels or all(_GENERIC_LABEL.match(str(name).strip()) for name in labels):
        return None
    return [str(name) for name in labels]


def task_mismatch(task: Task, *, num_labels: int, labels: list[str] | None, task_name: str | None) -> str | None:
    """Why a model with this head does not fit `task`, or None when it fits or nothing says otherwise.

    Generic label names (LABEL_0, LABEL_1) and an unrecorded task are unknown, not a mismatch.
    """
    if num_labels != task.num_labels:
        return f"it has {num_labels} output(s), {task.name} needs {task.num_labels}"
    if task_name and _key(task_name) in _ALIASES and get_task(task_name).name != task.name:
        return f"it was fine-tuned on {get_task(task_name).name}, not {task.name}"
    names = known_labels(labels)
    if names and task.labels and [_label_key(n) for n in names] != [_label_key(n) for n in task.labels]:
        return f"its labels {names} are not {task.name}'s {list(task.labels)} (in that order)"
    return None


def check_task_fit(task: Task, identity: dict, what: str, *, allow_mismatch: bool = False) -> str:
    """FITS, UNKNOWN or MISMATCH_ALLOWED for a model described by `identity` (num_labels, labels, task).

    Raises TaskMismatchError (one line, naming --allow-task-mismatch) when its labels or task say it was
    made for another task. A different number of outputs is refused even when mismatch is allowed:
    its logits could not line up with the task's labels.
    """
    reason = task_mismatch(
        task, num_labels=identity["num_labels"], labels=identity.get("labels"), task_name=identity.get("task")
    )
    if reason is None:
        known = identity.get("task") or known_labels(identity.get("labels"))
        return FITS if known else UNKNOWN
    if identity["num_labels"] != task.num_labels:
        raise TaskMismatchError(f"{what} does not fit task {task.name}: {reason}. Pass a checkpoint fine-tuned "
                                f"on {task.name} (`hsk teacher --task {task.name}` makes one)")
    if allow_mismatch:
        return MISMATCH_ALLOWED
    raise TaskMismatchError(
        f"{what} does not fit task {task.name}: {reason}. Pass a checkpoint fine-tuned on {task.name}, or "
        "--allow-task-mismatch to use it anyway (recorded in the output)"
    )
