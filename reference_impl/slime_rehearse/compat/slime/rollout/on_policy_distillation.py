"""slime compatibility module (slime.rollout.on_policy_distillation), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md.

The two hooks of slime's on-policy-distillation example: ``reward_func`` asks the teacher at --rm-url
(an SGLang /generate) for the log-prob of every token of the sample; ``post_process_rewards`` keeps
the response part in ``sample.teacher_log_probs`` and returns reward 0.0 for every sample. slime-ref
runs both, but has no --use-opd KL penalty: the teacher's log-probs are carried, not trained on."""

from slime_ref.utils.hooks import opd_post_process_rewards as post_process_rewards
from slime_ref.utils.hooks import opd_teacher_reward as reward_func
from slime_rehearse.compat._missing import missing_name

__all__ = ["post_process_rewards", "reward_func"]


def __getattr__(name: str):
    raise missing_name(__name__, name, __all__)
