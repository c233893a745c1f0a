"""slime compatibility package (slime.utils), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md."""

from slime_rehearse.compat._missing import package_getattr

__all__ = []


def __getattr__(name: str):
    return package_getattr(__name__, name)
