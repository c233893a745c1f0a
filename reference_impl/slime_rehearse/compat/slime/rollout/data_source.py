"""slime compatibility module (slime.rollout.data_source), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md."""

from slime_rehearse.compat._exports import exports

__all__, __getattr__ = exports(__name__)
