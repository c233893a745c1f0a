"""KL estimators k1, k2, k3 and low_var_kl on hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from slime_ref.algo.kl import compute_approx_kl

# log p - log q = [0.5, 0.0, -1.0]
LOG_P = torch.tensor([-1.0, -0.5, -2.0])
LOG_Q = torch.tensor([-1.5, -0.5, -1.0])


def test_k1_is_the_log_ratio():
    assert torch.equal(compute_approx_kl(LOG_P, LOG_Q, "k1"), torch.tensor([0.5, 0.0, -1.0]))


def test_k2_is_half_the_squared_log_ratio():
    # 0.5**2/2 = 0.125; 0; (-1)**2/2 = 0.5
    assert torch.allclose(compute_approx_kl(LOG_P, LOG_Q, "k2"), torch.tensor([0.125, 0.0, 0.5]))


@pytest.mark.parametrize("kind", ["k3", "low_var_kl"])
def test_k3_is_ratio_minus_one_minus_log_ratio(kind):
    # exp(-lr) - 1 + lr:  lr=0.5 -> e^-0.5 - 0.5 = 0.1065306597;  lr=0 -> 0;  lr=-1 -> e - 2 = 0.7182818285
    expected = torch.tensor([math.exp(-0.5) - 0.5, 0.0, math.e - 2.0])
    assert torch.allclose(compute_approx_kl(LOG_P, LOG_Q, kind), expected, atol=1e-7)


def test_only_low_var_kl_is_clamped():
    # lr = -20: e^20 - 21 = 4.85e8; low_var_kl clamps to 10, k3 keeps it
    log_p, log_q = torch.tensor([-21.0]), torch.tensor([-1.0])
    assert compute_approx_kl(log_p, log_q, "low_var_kl").item() == 10.0
    assert compute_approx_kl(log_p, log_q, "k3").item() == pytest.approx(math.exp(20) - 21, rel=1e-6)


def test_importance_ratio_reweights_each_token():
    # [2, 1, 0.5] * k3 = [0.2130613, 0, 0.3591409]
    ratio = torch.tensor([2.0, 1.0, 0.5])
    expected = torch.tensor([2 * (math.exp(-0.5) - 0.5), 0.0, 0.5 * (math.e - 2.0)])
    assert torch.allclose(compute_approx_kl(LOG_P, LOG_Q, "k3", importance_ratio=ratio), expected, atol=1e-7)


def test_identical_policies_have_zero_kl_for_every_estimator():
    for kind in ("k1", "k2", "k3", "low_var_kl"):
        assert torch.equal(compute_approx_kl(LOG_P, LOG_P.clone(), kind), torch.zeros(3))


def test_unknown_estimator_is_rejected():
    with pytest.raises(ValueError, match="k4"):
        compute_approx_kl(LOG_P, LOG_Q, "k4")
