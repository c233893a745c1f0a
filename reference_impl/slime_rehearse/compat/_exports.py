"""What a compat module exports: the names slime-ref's map (:mod:`slime_ref.slime_names`) gives its
slime module, plus the names the module defines itself (wrappers where slime-ref's function has another
signature, or helpers slime-ref lacks).

Each compat module ends with ``__all__, __getattr__ = exports(__name__, *its_own_names)``; a name it
lacks then raises the layer's ImportError (:mod:`slime_rehearse.compat._missing`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from slime_ref.slime_names import names_in, resolve
from slime_rehearse.compat._missing import missing_name, package_getattr


def exports(module_name: str, *own_names: str) -> tuple[list[str], Callable[[str], object]]:
    """Put the map's names for ``module_name`` into the module; return its ``__all__`` and ``__getattr__``.

    Called while the module runs, so ``sys.modules`` already holds it. A package's ``__getattr__``
    imports a submodule by the name asked for; a plain module's raises the layer's ImportError.
    """
    module = sys.modules[module_name]
    mapped = {attr: resolve(ref) for attr, ref in names_in(module_name).items()}
    vars(module).update(mapped)
    public = sorted({*mapped, *own_names}, key=str.lower)
    if hasattr(module, "__path__"):
        def __getattr__(name: str):
            return package_getattr(module_name, name)
    else:
        def __getattr__(name: str):
            raise missing_name(module_name, name, public)
    return public, __getattr__
