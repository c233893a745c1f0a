"""slime-ref: a small, complete GRPO trainer with slime's architecture.

Megatron-core trains, engines that speak SGLang's HTTP protocol generate rollouts behind the real
sglang-router, and Ray places everything. Flag names follow slime v0.3.1.
"""

__version__ = "0.1.0"
