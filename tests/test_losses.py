"""The distillation losses on tiny tensors whose values are computed by hand (METHOD.md 3, 5, 7, 8)."""

import math

import pytest
import torch
from torch import nn

from pipelines.train.losses.terms import (
    hsk_mse,
    kd_loss,
    pkd_loss,
    regression_mse,
    soft_cross_entropy,
)


def test_hsk_mse_gathers_positions_and_averages_over_valid_tokens():
    # One example, T=3, d=2. Stored positions [2, 0]; the second slot is unused (valid False).
    student = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]])
    positions = torch.tensor([[2, 0]])
    valid = torch.tensor([[True, False]])
    teacher = torch.tensor([[[5.0, 0.0], [9.0, 9.0]]])  # width-masked: second element zero-filled
    # Only slot 0 counts: student [5, 6] vs teacher [5, 0]: errors 0 and 36 over 2 elements.
    assert hsk_mse(student, positions, valid, teacher).item() == pytest.approx(18.0)
    # masked-only: the zero-filled element is left out: 0 over 1 element.
    assert hsk_mse(student, positions, valid, teacher, masked_only=True).item() == pytest.approx(0.0)


def test_hsk_mse_negative_positions_and_two_examples():
    student = torch.tensor([[[1.0], [2.0]], [[3.0], [4.0]]])  # B=2, T=2, d=1
    positions = torch.tensor([[1, -1], [0, 1]])
    valid = positions >= 0
    teacher = torch.tensor([[[0.0], [7.0]], [[1.0], [1.0]]])
    # valid pairs: (2 vs 0) -> 4, (3 vs 1) -> 4, (4 vs 1) -> 9 ; mean = 17/3
    assert hsk_mse(student, positions, valid, teacher).item() == pytest.approx(17 / 3)


def test_hsk_mse_projection_maps_student_width_to_teacher_width():
    proj = nn.Linear(1, 2, bias=False)
    with torch.no_grad():
        proj.weight.copy_(torch.tensor([[2.0], [-1.0]]))
    student = torch.tensor([[[3.0]]])
    teacher = torch.tensor([[[6.0, 0.0]]])
    # W s = [6, -3]: errors 0 and 9 over 2 elements
    loss = hsk_mse(student, torch.tensor([[0]]), torch.tensor([[True]]), teacher, projection=proj)
    assert loss.item() == pytest.approx(4.5)
    loss.backward()
    assert proj.weight.grad is not None
    with pytest.raises(ValueError, match="projection"):
        hsk_mse(student, torch.tensor([[0]]), torch.tensor([[True]]), teacher)


def test_hsk_mse_no_valid_token_is_zero_with_graph():
    student = torch.ones(1, 2, 2, requires_grad=True)
    loss = hsk_mse(student, torch.tensor([[-1]]), torch.tensor([[False]]), torch.zeros(1, 1, 2))
    assert loss.item() == 0.0
    loss.backward()


def test_soft_cross_entropy_by_hand():
    s = torch.tensor([[0.0, math.log(3.0)]])  # softmax = [1/4, 3/4]
    t = torch.tensor([[0.0, 0.0]])  # softmax = [1/2, 1/2]
    expected = -(0.5 * math.log(0.25) + 0.5 * math.log(0.75))
    assert soft_cross_entropy(s, t).item() == pytest.approx(expected, rel=1e-6)
    # T=2 divides both before the softmax
    s2, t2 = torch.tensor([[0.0, 2 * math.log(3.0)]]), torch.tensor([[0.0, 0.0]])
    assert soft_cross_entropy(s2, t2, T=2.0).item() == pytest.approx(expected, rel=1e-6)


def test_kd_loss_mixture_by_hand():
    s = torch.tensor([[0.0, math.log(3.0)]])  # q = [1/4, 3/4]
    t = torch.tensor([[0.0, 0.0]])  # p = [1/2, 1/2]
    y = torch.tensor([1])
    ce = -math.log(0.75)
    kl = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert kd_loss(s, t, y, T=1.0, alpha=0.0).item() == pytest.approx(ce, rel=1e-6)
    assert kd_loss(s, t, y, T=1.0, alpha=1.0).item() == pytest.approx(kl, rel=1e-5)
    assert kd_loss(s, t, y, T=1.0, alpha=0.3).item() == pytest.approx(0.7 * ce + 0.3 * kl, rel=1e-5)
    # T scales the KL term by T^2 (logits scaled by T give the same distributions)
    assert kd_loss(2 * s, 2 * t, y, T=2.0, alpha=1.0).item() == pytest.approx(4 * kl, rel=1e-5)
    # rows without a gold label contribute only the KD term
    assert kd_loss(s, t, torch.tensor([-1]), T=1.0, alpha=0.5).item() == pytest.approx(0.5 * kl, rel=1e-5)


def test_regression_mse_skips_missing_gold():
    pred = torch.tensor([[1.0], [2.0], [5.0]])
    gold = torch.tensor([3.0, float("nan"), 4.0])
    assert regression_mse(pred, gold).item() == pytest.approx((4 + 1) / 2)


def test_pkd_loss_normalises_then_averages_over_elements():
    s = [torch.tensor([[3.0, 4.0]])]  # -> [0.6, 0.8]
    t = [torch.tensor([[10.0, 0.0]])]  # -> [1, 0]
    expected = ((0.6 - 1) ** 2 + 0.8**2) / 2
    assert pkd_loss(s, t).item() == pytest.approx(expected, rel=1e-6)
    # two layer pairs: mean over both (second pair identical direction -> 0)
    s2 = s + [torch.tensor([[0.0, 2.0]])]
    t2 = t + [torch.tensor([[0.0, 5.0]])]
    assert pkd_loss(s2, t2).item() == pytest.approx(expected / 2, rel=1e-6)
    with pytest.raises(ValueError):
        pkd_loss(s2, t)
