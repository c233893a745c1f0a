"""slime compatibility package (slime.utils.external_utils):
slime's launcher helpers (execute_train ...), which slime-ref lacks.
Used by `slime-check smoke --with slime-ref` when slime is not importable. It provides no names:
each one raises an ImportError that says why (slime_rehearse/compat/examples_v0.3.1.json)."""

from slime_rehearse.compat._exports import exports

__all__, __getattr__ = exports(__name__)
