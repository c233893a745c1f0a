"""Port of slime v0.3.1 ``tests/test_chunked_gae.py`` (THUDM/slime @ a6272da): chunked GAE equals serial GAE.

``vanilla_gae`` and ``chunked_gae`` have slime's names and arguments (``slime_ref.algo.advantages``).
The shapes, chunk sizes, seed and tolerance are slime's. Changed: slime's test also timed both and
printed the speed-up; timing is not a test here (benchmarks live in bench/). The largest shape
(256 x 131072, 128 MiB per tensor, a 131072-step serial loop) is marked slow.
"""

import pytest
import torch

from slime_ref.algo.advantages import chunked_gae, compute_advantages_and_returns, vanilla_gae


@pytest.mark.parametrize(
    "B,T",
    [
        (16, 4096),
        (32, 8192),
        pytest.param(256, 128 * 1024, marks=pytest.mark.slow),
    ],
)
@pytest.mark.parametrize("chunk_size", [64, 128, 256])
def test_gae_parallel_matches_serial(B, T, chunk_size):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    rewards = torch.randn(B, T, device=device, dtype=torch.float32)
    values = torch.randn(B, T, device=device, dtype=torch.float32)
    gamma, lam = 0.99, 0.95

    adv_s, ret_s = vanilla_gae(rewards, values, gamma, lam)
    adv_p, ret_p = chunked_gae(rewards, values, gamma, lam, chunk_size=chunk_size)

    atol = 1e-5
    assert (adv_s - adv_p).abs().max().item() < atol
    assert (ret_s - ret_p).abs().max().item() < atol


def test_ppo_advantages_use_the_chunked_scan_across_chunk_boundaries():
    # (not in slime's file) slime's PPO path calls the chunked scan; a 300-token response spans three
    # 128-step chunks, so a wrong carry between chunks would show here against the serial sum
    from types import SimpleNamespace

    torch.manual_seed(1)
    values, reward = torch.randn(300), 1.5
    args = SimpleNamespace(advantage_estimator="ppo", kl_coef=0.0, kl_loss_type="k1", gamma=0.99, lambd=0.95,
                           normalize_advantages=False, use_rollout_logprobs=False)
    advantages, returns = compute_advantages_and_returns(args, rewards=[reward], loss_masks=[torch.ones(300)],
                                                         values=[values])
    token_rewards = torch.zeros(1, 300)
    token_rewards[0, -1] = reward
    expected, expected_returns = vanilla_gae(token_rewards, values[None], 0.99, 0.95)
    torch.testing.assert_close(advantages[0], expected[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(returns[0], expected_returns[0], rtol=0, atol=1e-5)
