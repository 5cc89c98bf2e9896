"""PEA-KD's PTP labels of a batch, in torch on the training device (the method: pipelines/methods/pea.py).

The thresholds, the label rule (`ptp_classes`) and the degenerate-label warning are torch-free, in
pipelines/methods/ptp.py; the loss term `ptp_ce` that reads these labels is in pipelines/train/losses/terms.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipelines.methods.ptp import IGNORE, PTPThresholds, ptp_classes


def ptp_labels(teacher_logits: torch.Tensor, gold: torch.Tensor, thresholds: PTPThresholds) -> torch.Tensor:
    """[B] long labels 0..3 from teacher logits [B, C] and gold class ids [B] (< 0: no gold -> IGNORE)."""
    conf, predicted = F.softmax(teacher_logits.float(), dim=-1).max(dim=-1)
    gold = gold.long()
    labels = ptp_classes(conf, predicted == gold, thresholds).long()
    return labels.masked_fill(gold < 0, IGNORE)
