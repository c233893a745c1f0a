"""slime compatibility module (slime.rollout.filter_hub.dynamic_sampling_filters), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md."""

from slime_ref.rollout.filters import check_reward_nonzero_std, check_reward_nonzero_std_with_fallback
from slime_rehearse.compat._missing import missing_name

__all__ = ["check_reward_nonzero_std", "check_reward_nonzero_std_with_fallback"]


def __getattr__(name: str):
    raise missing_name(__name__, name, __all__)
