"""PEA-KD's Pretraining with Teacher Predictions (PTP), the torch-free part: thresholds, the label rule, the warning.

The method is pipelines/methods/pea.py; its loss term `ptp_ce` is in pipelines/train/losses/terms.py and
labels a batch on the training device with pipelines/train/losses/ptp.py (the same rule, `ptp_classes`).

PTP (Cho et al., "Pea-KD: Parameter-efficient and accurate Knowledge Distillation on BERT") pre-trains
the student to predict, for each training example, what the teacher did with it:

    conf = max softmax(teacher logits)        (the teacher's confidence)
    0  teacher right, conf >  t1              (an easy example)
    1  teacher right, conf <= t1
    2  teacher wrong, conf >  t2              (a confidently wrong teacher)
    3  teacher wrong, conf <= t2

The thresholds are per task; the defaults are the values in the authors' code (their SST-2 and QNLI
branches compare a lower-cased task name with "SST-2" / "QNLI" and so never fire: we use the values
those branches meant). Rows without a gold label (teacher-labelled data) cannot say whether the
teacher was right: they get IGNORE and drop out of the PTP loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hskstore.format.config import ConfigError
from pipelines.core.tasks import get_task

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

# (t1, t2) per task, from the authors' code; other tasks need --ptp-t1 and --ptp-t2.
PTP_THRESHOLDS: dict[str, tuple[float, float]] = {
    "rte": (0.8, 0.6),
    "mrpc": (0.95, 0.75),
    "sst2": (0.98, 0.8),
    "qnli": (0.98, 0.7),
    "cola": (0.95, 0.7),
}
PTP_CLASSES = ("right-confident", "right-unsure", "wrong-confident", "wrong-unsure")
NUM_PTP_CLASSES = len(PTP_CLASSES)
IGNORE = -100  # the label of rows without gold: F.cross_entropy's default ignore_index


@dataclass(frozen=True)
class PTPThresholds:
    t1: float  # confidence above which a right teacher counts as confident
    t2: float  # confidence above which a wrong teacher counts as confident
    source: str  # where they came from, for the run's log and summary

    def to_dict(self) -> dict:
        return {"t1": self.t1, "t2": self.t2, "source": self.source}


def ptp_thresholds(task: str, t1: float | None = None, t2: float | None = None) -> PTPThresholds:
    """The task's (t1, t2), each replaceable by an explicit value; ConfigError when none can be had."""
    spec = get_task(task)
    if spec.is_regression:
        raise ConfigError(f"PTP labels say whether the teacher predicted the right class; {spec.name} is a "
                          "regression task: use another method")
    default = PTP_THRESHOLDS.get(spec.name)
    if default is None and (t1 is None or t2 is None):
        raise ConfigError(f"the PEA-KD authors give no PTP thresholds for {spec.name}: pass both --ptp-t1 and "
                          f"--ptp-t2 (known defaults: {', '.join(PTP_THRESHOLDS)})")
    chosen = (default[0] if t1 is None else t1, default[1] if t2 is None else t2)
    for name, value in zip(("--ptp-t1", "--ptp-t2"), chosen, strict=True):
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"{name} is a softmax confidence and must be in [0, 1]; got {value}")
    return PTPThresholds(float(chosen[0]), float(chosen[1]), _source(spec.name, default, t1, t2))


def _source(task: str, default: tuple[float, float] | None, t1: float | None, t2: float | None) -> str:
    """Where the thresholds came from: the authors' defaults, the flags, or the flags over the defaults."""
    if (t1, t2) == (None, None):
        return f"PEA-KD authors' code ({task})"
    if default is None or (t1 is not None and t2 is not None):
        return "--ptp-t1/--ptp-t2"
    return f"override of the PEA-KD defaults for {task}"


def ptp_classes(conf: Any, right: Any, thresholds: PTPThresholds) -> Any:  # numpy arrays or torch tensors
    """The PTP class 0..3 of each row from its confidence and whether the teacher was right (the table above).

    Bool/float operators only, so numpy arrays and torch tensors (on any device) take the same rule."""
    wrong = ~right
    unsure = (right & (conf <= thresholds.t1)) | (wrong & (conf <= thresholds.t2))
    return wrong * 2 + unsure


def _confidence(teacher_logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(max softmax, argmax) per row, in float32 as the torch path computes them."""
    z = np.asarray(teacher_logits, dtype=np.float32)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    return p.max(axis=-1), p.argmax(axis=-1)


def ptp_label_array(teacher_logits: ArrayLike, gold: ArrayLike, thresholds: PTPThresholds) -> np.ndarray:
    """[B] int64 PTP labels from teacher logits [B, C] and gold class ids [B] (< 0: no gold -> IGNORE)."""
    conf, predicted = _confidence(teacher_logits)
    gold = np.asarray(gold).astype(np.int64)
    labels = ptp_classes(conf, predicted == gold, thresholds).astype(np.int64)
    return np.where(gold < 0, IGNORE, labels)


def ptp_label_counts(labels: np.ndarray) -> dict[str, int]:
    """How many rows fall in each PTP class (and how many have no gold label): for the run's log."""
    counts = {name: int((labels == i).sum()) for i, name in enumerate(PTP_CLASSES)}
    counts["no-gold"] = int((labels == IGNORE).sum())
    return counts


DOMINANT = 0.8  # one PTP class holding more of the labelled rows than this says little about any example


def _lower_median(values: np.ndarray, default: float) -> float:
    """The lower of the two middle values for an even count (torch.median's convention), `default` when empty."""
    return float(np.sort(values)[(len(values) - 1) // 2]) if len(values) else default


def ptp_label_warning(teacher_logits: ArrayLike, gold: ArrayLike, thresholds: PTPThresholds) -> str | None:
    """A warning when the PTP labels of these rows are degenerate, with thresholds that would split them; else None.

    The authors' thresholds fit confident BERT-base teachers. A weaker teacher is rarely sure above t1
    or t2: then a class is empty or one class holds nearly every row, and PTP reduces to predicting a
    near-constant label. The suggested thresholds are the median confidence of the rows the teacher
    got right (t1) and wrong (t2): each of its halves splits in two.
    """
    counts = ptp_label_counts(ptp_label_array(teacher_logits, gold, thresholds))
    labelled = sum(counts[name] for name in PTP_CLASSES)
    if labelled == 0:
        return None
    empty = [name for name in PTP_CLASSES if counts[name] == 0]
    top = max(PTP_CLASSES, key=lambda name: counts[name])
    if not empty and counts[top] <= DOMINANT * labelled:
        return None
    conf, predicted = _confidence(teacher_logits)
    gold = np.asarray(gold).astype(np.int64)
    has_gold = gold >= 0
    t1 = _lower_median(conf[(predicted == gold) & has_gold], thresholds.t1)
    t2 = _lower_median(conf[(predicted != gold) & has_gold], thresholds.t2)
    shown = ", ".join(f"{counts[name]} {name}" for name in PTP_CLASSES)
    what = f"{', '.join(empty)} empty" if empty else f"{counts[top] / labelled:.0%} {top}"
    return (f"PTP labels of this store are degenerate ({shown}; {what}) at t1 {thresholds.t1:g}, t2 "
            f"{thresholds.t2:g}, the authors' values for a confident BERT-base teacher: PTP then teaches a "
            f"near-constant label and can leave the student worse off for KD (docs/methods/pea.md). "
            f"Thresholds at this teacher's median confidences split them: --ptp-t1 {t1:.3f} --ptp-t2 {t2:.3f}")
