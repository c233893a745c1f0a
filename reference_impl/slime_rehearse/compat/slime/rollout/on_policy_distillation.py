"""slime compatibility module (slime.rollout.on_policy_distillation), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md.

The two hooks of slime's on-policy-distillation example: ``reward_func`` asks the teacher at --rm-url
(an SGLang /generate) for the log-prob of every token of the sample; ``post_process_rewards`` keeps
the response part in ``sample.teacher_log_probs`` and returns reward 0.0 for every sample. slime-ref
runs both, but has no --use-opd KL penalty: the teacher's log-probs are carried, not trained on."""

from slime_rehearse.compat._exports import exports

__all__, __getattr__ = exports(__name__)
