"""The RL math: KL estimators, advantages and returns, policy/value/SFT losses. Pure tensor functions.

- :mod:`slime_ref.algo.kl`: k1, k2, k3 / low_var_kl.
- :mod:`slime_ref.algo.advantages`: group reward normalisation (rollout side) and per-token
  advantages/returns for grpo, gspo, cispo, reinforce_plus_plus(_baseline), ppo (trainer side).
- :mod:`slime_ref.algo.losses`: PPO-clip (clip-higher, dual clip), GSPO, CISPO, TIS, entropy bonus,
  KL loss, value and SFT losses, reduced so that micro-batch results add up to the step's value.
- :mod:`slime_ref.algo.choices`: the estimator names the flags accept (no torch import).
"""
