"""Per-token KL estimators between the policy and a base (reference or old) policy.

Schulman, "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html. With tokens sampled
from the policy p and ``log_ratio = log p(x) - log q(x)`` for the base q:

- ``k1 = log_ratio``                       unbiased for KL(p||q), high variance, can be negative
- ``k2 = log_ratio**2 / 2``                biased, low variance, always >= 0
- ``k3 = exp(-log_ratio) - 1 + log_ratio`` unbiased and always >= 0 ("low_var_kl" in slime/verl)

``low_var_kl`` is k3 clamped to [-10, 10] for numerical safety; ``k3`` is the same formula unclamped.
"""

from __future__ import annotations

import torch

from slime_ref.algo.choices import KL_ESTIMATORS


def compute_approx_kl(
    log_probs: torch.Tensor,
    log_probs_base: torch.Tensor,
    kl_loss_type: str,
    importance_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL estimate of KL(policy || base).

    Args:
        log_probs: [T] log-probs of the sampled tokens under the policy.
        log_probs_base: [T] log-probs of the same tokens under the base policy.
        kl_loss_type: one of ``k1``, ``k2``, ``k3``, ``low_var_kl``.
        importance_ratio: optional [T] ratio pi_theta / pi_old that reweights each token's estimate
            (``--use-unbiased-kl``, the off-policy correction of DeepSeek-V3.2), applied before the clamp.

    Returns:
        [T] float32 KL estimate per token.
    """
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_loss_type == "k1":
        kl = log_ratio
    elif kl_loss_type == "k2":
        kl = log_ratio.pow(2) / 2.0
    elif kl_loss_type in ("k3", "low_var_kl"):
        # q/p - 1 - log(q/p): the ratio q/p has mean 1 under p, so this is unbiased and >= 0
        kl = torch.exp(-log_ratio) - 1.0 + log_ratio
    else:
        raise ValueError(f"unknown kl_loss_type {kl_loss_type!r}; choose one of {', '.join(KL_ESTIMATORS)}")

    if importance_ratio is not None:
        kl = importance_ratio * kl
    if kl_loss_type == "low_var_kl":
        kl = kl.clamp(min=-10.0, max=10.0)
    return kl
