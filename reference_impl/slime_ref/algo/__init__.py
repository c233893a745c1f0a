"""The RL math: KL estimators, advantages and returns, policy/value/SFT losses. Pure tensor functions.

- :mod:`slime_ref.algo.kl`: k1, k2, k3 / low_var_kl.
- :mod:`slime_ref.algo.advantages`: group reward normalisation (rollout side) and per-token
  advantages/returns for grpo, gspo, cispo, reinforce_plus_plus(_baseline), ppo (trainer side).
- :mod:`slime_ref.algo.losses`: PPO-clip (clip-higher, dual clip), GSPO, CISPO, TIS, entropy bonus,
  KL loss, value and SFT losses, reduced so that micro-batch results add up to the step's value.
"""

from slime_ref.algo.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages_and_returns,
    group_normalize,
    masked_whiten,
    post_process_rewards,
)
from slime_ref.algo.kl import KL_ESTIMATORS, compute_approx_kl
from slime_ref.algo.losses import (
    StepMean,
    count_loss_tokens,
    policy_loss_function,
    sft_loss_function,
    value_loss_function,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_ESTIMATORS",
    "StepMean",
    "compute_advantages_and_returns",
    "compute_approx_kl",
    "count_loss_tokens",
    "group_normalize",
    "masked_whiten",
    "policy_loss_function",
    "post_process_rewards",
    "sft_loss_function",
    "value_loss_function",
]
