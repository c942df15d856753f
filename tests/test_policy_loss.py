"""The RL objective's options (trainer.clip_eps_high, token_mask_low/high): what each changes in the
loss and its gradient, per token, and how the recipe's fields reach the trainer and are refused."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from slurmrl.runtime.trainer.losses import PolicyLoss, ppo_clip_terms  # noqa: E402


def terms(ratios, adv, loss: PolicyLoss):
    old = torch.zeros(len(ratios))
    logp = torch.tensor([math.log(r) for r in ratios], requires_grad=True)
    out = ppo_clip_terms(logp, old, torch.tensor(adv), torch.ones(len(ratios), dtype=torch.bool), loss)
    out["loss"].backward()
    return out, logp.grad


def test_clip_higher_lets_a_positive_advantage_grow_past_the_symmetric_clip():
    # ratio 1.25, A = 1: clipped at 1.2 by the symmetric clip (no gradient), inside 1 + 0.28
    sym, g_sym = terms([1.25], [1.0], PolicyLoss(0.2, 0.2))
    high, g_high = terms([1.25], [1.0], PolicyLoss(0.2, 0.28))
    assert sym["loss"].item() == pytest.approx(-1.2) and g_sym[0].item() == 0.0 and sym["clip"].item() == 1
    assert high["loss"].item() == pytest.approx(-1.25) and g_high[0].item() == pytest.approx(-1.25)
    assert high["clip"].item() == 0
    # the low side keeps clip_low: ratio 0.7 with A < 0 is clipped at 0.8 either way
    low, g_low = terms([0.7], [-1.0], PolicyLoss(0.2, 0.28))
    assert low["loss"].item() == pytest.approx(0.8) and g_low[0].item() == 0.0


def test_the_token_mask_drops_tokens_whose_ratio_is_out_of_range():
    loss = PolicyLoss(0.2, 0.2, mask_low=0.5, mask_high=2.0)
    out, grad = terms([0.25, 1.0, 4.0, 1.1], [1.0, 1.0, -1.0, 1.0], loss)
    assert out["masked"].item() == 2
    assert grad[0].item() == 0.0 and grad[2].item() == 0.0  # dropped: no gradient at all
    assert grad[1].item() == pytest.approx(-1.0) and grad[3].item() == pytest.approx(-1.1)
    assert out["loss"].item() == pytest.approx(-1.0 - 1.1)
    # one side only
    out, _ = terms([0.25, 4.0], [1.0, 1.0], PolicyLoss(0.2, 0.2, mask_high=2.0))
    assert out["masked"].item() == 1


def test_policy_loss_of_settings_defaults_the_upper_clip_to_clip_eps():
    s = SimpleNamespace(clip_eps=0.1, clip_eps_high=None, token_mask_low=None, token_mask_high=8.0, kl_coef=0.0)
    assert PolicyLoss.of(s) == PolicyLoss(0.1, 0.1, None, 8.0, 0.0)
    s.clip_eps_high = 0.3
    assert PolicyLoss.of(s).clip_high == 0.3
