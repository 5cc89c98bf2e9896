"""PEA-KD's Pretraining with Teacher Predictions (PTP): 4-way labels from stored logits + gold labels.

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
teacher was right: they get IGNORE and drop out of the PTP loss. Everything here is a pure function
of tensors, so a store and a live teacher give the same labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hskstore.config import ConfigError
from pipelines.core.tasks import get_task
from pipelines.train.losses import TermInputs, loss_term

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
    if (t1, t2) == (None, None):
        source = f"PEA-KD authors' code ({spec.name})"
    elif default is None or (t1 is not None and t2 is not None):
        source = "--ptp-t1/--ptp-t2"
    else:
        source = f"override of the PEA-KD defaults for {spec.name}"
    return PTPThresholds(float(chosen[0]), float(chosen[1]), source)


def ptp_labels(teacher_logits: torch.Tensor, gold: torch.Tensor, thresholds: PTPThresholds) -> torch.Tensor:
    """[B] long labels 0..3 from teacher logits [B, C] and gold class ids [B] (< 0: no gold -> IGNORE)."""
    conf, predicted = F.softmax(teacher_logits.float(), dim=-1).max(dim=-1)
    gold = gold.long()
    right = predicted == gold
    labels = torch.where(
        right,
        torch.where(conf > thresholds.t1, 0, 1),
        torch.where(conf > thresholds.t2, 2, 3),
    ).long()
    return labels.masked_fill(gold < 0, IGNORE)


def ptp_label_counts(labels: torch.Tensor) -> dict[str, int]:
    """How many rows fall in each PTP class (and how many have no gold label): for the run's log."""
    counts = {name: int((labels == i).sum()) for i, name in enumerate(PTP_CLASSES)}
    counts["no-gold"] = int((labels == IGNORE).sum())
    return counts


DOMINANT = 0.8  # one PTP class holding more of the labelled rows than this says little about any example


def ptp_label_warning(teacher_logits: torch.Tensor, gold: torch.Tensor, thresholds: PTPThresholds) -> str | None:
    """A warning when the PTP labels of these rows are degenerate, with thresholds that would split them; else None.

    The authors' thresholds fit confident BERT-base teachers. A weaker teacher is rarely sure above t1
    or t2: then a class is empty or one class holds nearly every row, and PTP reduces to predicting a
    near-constant label. The suggested thresholds are the median confidence of the rows the teacher
    got right (t1) and wrong (t2): each of its halves splits in two.
    """
    labels = ptp_labels(teacher_logits, gold, thresholds)
    counts = ptp_label_counts(labels)
    labelled = sum(counts[name] for name in PTP_CLASSES)
    if labelled == 0:
        return None
    empty = [name for name in PTP_CLASSES if counts[name] == 0]
    top = max(PTP_CLASSES, key=lambda name: counts[name])
    if not empty and counts[top] <= DOMINANT * labelled:
        return None
    conf, predicted = F.softmax(teacher_logits.float(), dim=-1).max(dim=-1)
    has_gold = gold >= 0
    right = (predicted == gold.long()) & has_gold
    wrong = (predicted != gold.long()) & has_gold
    t1 = float(conf[right].median()) if right.any() else thresholds.t1
    t2 = float(conf[wrong].median()) if wrong.any() else thresholds.t2
    shown = ", ".join(f"{counts[name]} {name}" for name in PTP_CLASSES)
    what = f"{', '.join(empty)} empty" if empty else f"{counts[top] / labelled:.0%} {top}"
    return (f"PTP labels of this store are degenerate ({shown}; {what}) at t1 {thresholds.t1:g}, t2 "
            f"{thresholds.t2:g}, the authors' values for a confident BERT-base teacher: PTP then teaches a "
            f"near-constant label and can leave the student worse off for KD (docs/methods/pea.md). "
            f"Thresholds at this teacher's median confidences split them: --ptp-t1 {t1:.3f} --ptp-t2 {t2:.3f}")


@loss_term("ptp_ce")
def term_ptp_ce(x: TermInputs, t1: float, t2: float) -> torch.Tensor:
    """Cross-entropy of the student's 4-way (ptp4) head to the PTP labels of the batch's stored logits."""
    labels = ptp_labels(x.batch["logits"], x.batch["labels"], PTPThresholds(t1, t2, "stage"))
    logits = x.outputs.logits.float()
    if logits.shape[-1] != NUM_PTP_CLASSES:
        raise ValueError(f"ptp_ce needs the 4-way ptp4 head on the student, got {logits.shape[-1]} outputs")
    if not (labels != IGNORE).any():
        return logits.sum() * 0.0  # no gold label in this batch: nothing to learn, the graph is kept
    return F.cross_entropy(logits, labels, ignore_index=IGNORE)
