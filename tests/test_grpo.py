"""GRPO math against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from swarmnode.node.rl.grpo import group_advantages, grpo_loss, has_signal, length_target_reward


def test_group_advantages_normalise_and_zero_for_equal_rewards():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5)
    assert torch.equal(group_advantages(torch.tensor([0.5, 0.5, 0.5])), torch.zeros(3))
    assert not has_signal(torch.tensor([1.0, 1.0])) and has_signal(torch.tensor([1.0, 0.0]))


def test_length_target_reward():
    assert length_target_reward(1.0, 10, 0) == 1.0
    assert length_target_reward(1.0, 10, 20) == pytest.approx(1.0 - 0.003)


def test_loss_on_policy_is_minus_mean_advantage_per_budget():
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.5, 0.1]], requires_grad=False)).requires_grad_()
    mask = torch.tensor([[1, 1], [1, 0]])
    adv = torch.tensor([1.0, -2.0])
    out = grpo_loss(logp, logp.detach(), adv, mask, token_budget=10)
    # ratio 1 everywhere: per token -A; tokens: -1, -1, +2 (the masked one excluded)
    assert out.loss.item() == pytest.approx((-1 - 1 + 2) / 10)
    assert out.tokens == 3 and out.clipped_fraction == 0.0
    out.loss.backward()
    # d/dlogp of -ratio*A at ratio 1 is -A / budget, masked tokens get none
    assert torch.allclose(logp.grad, torch.tensor([[-0.1, -0.1], [0.2, 0.0]]))


def test_two_sided_clipping():
    old = torch.zeros(1, 4)
    # ratios: 1.5 (above 1+eps), 0.5 (below 1-eps), 10 (above delta), 1.1 (inside)
    new = torch.log(torch.tensor([[1.5, 0.5, 10.0, 1.1]])).requires_grad_()
    mask = torch.ones(1, 4)
    pos = grpo_loss(new, old, torch.tensor([1.0]), mask, token_budget=1)
    # A>0: max(-c1, -c2) = -min(c1, c2): 1.2, 0.5, 1.2 (c1=4 clipped to 4 then 1.2), 1.1
    assert pos.loss.item() == pytest.approx(-(1.2 + 0.5 + 1.2 + 1.1))
    pos.loss.backward()
    grad = new.grad[0]
    assert grad[0] == 0 and grad[2] == 0  # clipped above: no gradient
    assert grad[1] == pytest.approx(-0.5) and grad[3] == pytest.approx(-1.1)
    neg = grpo_loss(new.detach(), old, torch.tensor([-1.0]), mask, token_budget=1)
    # A<0: max(c1, c2): 1.5, 0.8, 4 (delta caps the ratio of 10), 1.1
    assert neg.loss.item() == pytest.approx(1.5 + 0.8 + 4.0 + 1.1)
    assert 0 < pos.clipped_fraction < 1 and math.isfinite(pos.mean_ratio)
