"""slime compatibility package (slime.utils.external_utils):
slime's launcher helpers (execute_train ...), which slime-ref lacks.
Used by `slime-check smoke --with slime-ref` when slime is not importable. It provides no names:
each one raises an ImportError that says why (slime_rehearse/compat/examples_v0.3.1.json)."""

from slime_rehearse.compat._missing import package_getattr

__all__ = []


def __getattr__(name: str):
    return package_getattr(__name__, name)
