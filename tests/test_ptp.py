"""PEA-KD's PTP labels: hand-computed cases, the authors' thresholds and the override flags."""

from __future__ import annotations

import math

import pytest
import torch

from hskstore.format.config import ConfigError
from pipelines.methods.ptp import (
    IGNORE,
    PTPThresholds,
    ptp_label_array,
    ptp_label_counts,
    ptp_label_warning,
    ptp_thresholds,
)
from pipelines.train.losses.ptp import ptp_labels


def test_four_classes_by_hand():
    # softmax([0, log 9]) = [0.1, 0.9]: the teacher says class 1 with confidence 0.9.
    # softmax([log 3, 0]) = [0.75, 0.25]: class 0 with confidence 0.75.
    logits = torch.tensor([[0.0, math.log(9.0)], [math.log(3.0), 0.0]] * 2)
    gold = torch.tensor([1, 0, 0, 1])  # right, right, wrong, wrong
    th = PTPThresholds(t1=0.8, t2=0.8, source="test")
    # right & 0.9 > 0.8 -> 0; right & 0.75 <= 0.8 -> 1; wrong & 0.9 > 0.8 -> 2; wrong & 0.75 <= 0.8 -> 3
    assert ptp_labels(logits, gold, th).tolist() == [0, 1, 2, 3]
    # t1 and t2 act on their own side only: raising t1 turns class 0 into 1, leaves the wrong rows alone.
    assert ptp_labels(logits, gold, PTPThresholds(0.95, 0.8, "test")).tolist() == [1, 1, 2, 3]
    assert ptp_labels(logits, gold, PTPThresholds(0.8, 0.7, "test")).tolist() == [0, 1, 2, 2]


def test_threshold_is_strict_and_unlabelled_rows_are_ignored():
    logits = torch.tensor([[0.0, 0.0], [0.0, 0.0], [2.0, 0.0]])  # confidence exactly 0.5 (ties: argmax 0)
    gold = torch.tensor([0, 1, -1])
    labels = ptp_labels(logits, gold, PTPThresholds(0.5, 0.5, "test"))
    assert labels.tolist() == [1, 3, IGNORE]  # conf == t is "not above": unsure
    assert ptp_label_counts(labels) == {
        "right-confident": 0, "right-unsure": 1, "wrong-confident": 0, "wrong-unsure": 1, "no-gold": 1,
    }
    # IGNORE is cross_entropy's ignore_index: unlabelled rows add nothing to the PTP loss.
    head = torch.tensor([[1.0, 0.0, 0.0, 0.0]] * 3)
    assert torch.nn.functional.cross_entropy(head, labels).item() == pytest.approx(
        torch.nn.functional.cross_entropy(head[:2], labels[:2]).item()
    )


def test_authors_thresholds_and_overrides():
    assert (ptp_thresholds("SST-2").t1, ptp_thresholds("SST-2").t2) == (0.98, 0.8)
    assert (ptp_thresholds("mrpc").t1, ptp_thresholds("mrpc").t2) == (0.95, 0.75)
    assert (ptp_thresholds("rte").t1, ptp_thresholds("qnli").t2, ptp_thresholds("cola").t2) == (0.8, 0.7, 0.7)
    assert "authors" in ptp_thresholds("rte").source
    one = ptp_thresholds("rte", t1=0.9)
    assert (one.t1, one.t2) == (0.9, 0.6) and "override" in one.source
    both = ptp_thresholds("mnli", t1=0.7, t2=0.5)  # no published thresholds: both flags needed
    assert (both.t1, both.t2, both.source) == (0.7, 0.5, "--ptp-t1/--ptp-t2")
    with pytest.raises(ConfigError, match="--ptp-t1 and --ptp-t2"):
        ptp_thresholds("mnli", t1=0.7)
    with pytest.raises(ConfigError, match="regression"):
        ptp_thresholds("stsb", t1=0.5, t2=0.5)
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        ptp_thresholds("rte", t2=1.5)


def _logits_with_confidence(conf: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
    """Two-class logits whose softmax gives `conf` to class `predicted`."""
    margin = torch.log(conf / (1 - conf))
    return torch.stack([torch.where(predicted == 0, margin, 0.0), torch.where(predicted == 1, margin, 0.0)], -1)


def test_a_weak_teacher_gives_degenerate_labels_and_the_warning_says_which_thresholds_split_them():
    # A weak teacher: confidences 0.55..0.78 (never above SST-2's t1 0.98 nor t2 0.8), 80 right, 20 wrong.
    conf = torch.linspace(0.55, 0.78, 100)
    gold = torch.randint(0, 2, (100,), generator=torch.Generator().manual_seed(0))
    wrong = torch.arange(100) % 5 == 0
    logits = _logits_with_confidence(conf, torch.where(wrong, 1 - gold, gold))
    th = ptp_thresholds("sst2")
    counts = ptp_label_counts(ptp_labels(logits, gold, th))
    assert counts["right-confident"] == 0 and counts["wrong-confident"] == 0  # two of four classes empty
    warning = ptp_label_warning(logits, gold, th)
    assert warning is not None and "right-confident" in warning and "empty" in warning
    t1 = float(conf[~wrong].median())
    t2 = float(conf[wrong].median())
    assert f"--ptp-t1 {t1:.3f} --ptp-t2 {t2:.3f}" in warning
    # The suggested thresholds split each half of the rows: every class is used, none dominates.
    split = ptp_label_counts(ptp_labels(logits, gold, PTPThresholds(t1, t2, "test")))
    assert min(split[c] for c in ("right-confident", "right-unsure", "wrong-confident", "wrong-unsure")) >= 9
    assert ptp_label_warning(logits, gold, PTPThresholds(t1, t2, "test")) is None


def test_no_warning_for_a_teacher_whose_labels_use_every_class():
    logits = torch.tensor([[0.0, math.log(99.0)], [0.0, 0.5], [math.log(99.0), 0.0], [0.5, 0.0]] * 3)
    gold = torch.tensor([1, 1, 1, 1] * 3)  # right-confident, right-unsure, wrong-confident, wrong-unsure
    assert ptp_label_warning(logits, gold, ptp_thresholds("sst2")) is None
    # one class over 80% of the labelled rows is degenerate too, even with no class empty
    many = torch.cat([logits, logits[:1].repeat(60, 1)]), torch.cat([gold, gold[:1].repeat(60)])
    assert "right-confident" in ptp_label_warning(*many, ptp_thresholds("sst2"))
    # rows without gold say nothing about the teacher: no labels, no warning
    assert ptp_label_warning(logits, torch.full_like(gold, -1), ptp_thresholds("sst2")) is None


def test_the_torch_free_labels_of_the_warning_are_the_training_labels():
    """pipelines/methods/ptp.py (numpy, for the warning before training) and pipelines/train/losses/ptp.py (torch, per
    batch) apply one rule: on random logits, ties and rows without gold they give the same labels."""
    g = torch.Generator().manual_seed(3)
    logits = torch.cat([torch.randn(500, 3, generator=g) * 3, torch.zeros(4, 3)])
    gold = torch.cat([torch.randint(-1, 3, (500,), generator=g), torch.tensor([0, 1, 2, -1])])
    for th in (PTPThresholds(0.8, 0.6, "test"), PTPThresholds(0.5, 0.9, "test"), ptp_thresholds("sst2")):
        torch_labels = ptp_labels(logits, gold, th)
        assert ptp_label_array(logits.numpy(), gold.numpy(), th).tolist() == torch_labels.tolist()
        assert len(set(torch_labels.tolist())) == 5  # every class and IGNORE occur: the comparison covers them
