"""slime compatibility module (slime.rollout.rm_hub), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md."""

from slime_check.compat._missing import missing_name
from slime_ref.rollout.rewards import async_rm, batched_async_rm, remote_rm

__all__ = ["async_rm", "batched_async_rm", "remote_rm"]


def __getattr__(name: str):
    raise missing_name(__name__, name, __all__)
