"""slime compatibility module (slime.utils.misc), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md."""

from slime_check.compat._missing import missing_name
from slime_ref.utils.hooks import load_function as _load


def load_function(path: str):
    """Import ``module.attr`` and return it, as slime's ``load_function``."""
    return _load(path, "load_function")


class SingletonMeta(type):
    _instances: dict = {}

    def __call__(cls, *args, **kwargs):
        if cls not in cls._instances:
            cls._instances[cls] = super().__call__(*args, **kwargs)
        return cls._instances[cls]


__all__ = ["load_function", "SingletonMeta"]


def __getattr__(name: str):
    raise missing_name(__name__, name, __all__)
