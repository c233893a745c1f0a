"""slime compatibility module (slime.rollout.sft_rollout), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md."""

from slime_ref.rollout.sft_rollout import generate_rollout
from slime_rehearse.compat._missing import missing_name

__all__ = ["generate_rollout"]


def __getattr__(name: str):
    raise missing_name(__name__, name, __all__)
