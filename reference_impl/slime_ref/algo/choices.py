"""Names of the estimators, kept free of torch so the flag parser imports quickly."""

ADVANTAGE_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo")
KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")
