"""slime compatibility module (slime.rollout.filter_hub.base_types), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md."""

from slime_ref.rollout.filters import DynamicFilterOutput
from slime_rehearse.compat._missing import missing_name

__all__ = ["DynamicFilterOutput"]


def __getattr__(name: str):
    raise missing_name(__name__, name, __all__)
