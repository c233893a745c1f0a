"""slime compatibility module (slime.rollout.data_source), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md."""

from slime_ref.data.source import RolloutDataSource, RolloutDataSourceWithBuffer, pop_first
from slime_rehearse.compat._missing import missing_name

DataSource = RolloutDataSource

__all__ = ["DataSource", "RolloutDataSource", "RolloutDataSourceWithBuffer", "pop_first"]


def __getattr__(name: str):
    raise missing_name(__name__, name, __all__)
