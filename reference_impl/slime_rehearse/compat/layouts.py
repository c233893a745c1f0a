"""The compatibility namespace's finder: serves a module under the name the target slime gives it and
refuses the other slime's name with the reason. The table of names it reads, and the static check of
hook files, live in :mod:`slime_check.slime_layouts` (config reads them without running anything);
their names are re-exported here.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

from slime_check.slime_layouts import (  # noqa: F401 (re-exported)
    MAIN,
    MODULES,
    NEW_PACKAGE,
    TARGET_ENV,
    TARGETS,
    V031,
    Module,
    _row,
    env_target,
    explain,
    explain_import_error,
    has,
    imported_modules,
    known_target,
    layout_findings,
    served,
)

# ---------------------------------------------------------------------------------------------
# the compatibility namespace: serve the target's names, refuse the other slime's
# ---------------------------------------------------------------------------------------------


class _Alias(importlib.abc.Loader):
    """Loads a compat module that re-exports a backing module's public names."""

    def __init__(self, backing: str | None):
        self.backing = backing

    def create_module(self, spec):
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        from slime_rehearse.compat._missing import missing_name, package_getattr

        name = module.__name__
        if self.backing is None:  # the slime.observability package
            module.__path__ = []
            module.__all__ = []
            module.__getattr__ = lambda attr: package_getattr(name, attr)
            return
        backing = importlib.import_module(self.backing)
        public = list(getattr(backing, "__all__", [n for n in vars(backing) if not n.startswith("_")]))
        module.__dict__.update({n: getattr(backing, n) for n in public})
        module.__all__ = public
        module.__doc__ = backing.__doc__

        def __getattr__(attr):
            raise missing_name(name, attr, public)

        module.__getattr__ = __getattr__


class LayoutFinder:
    """First on ``sys.meta_path`` while the compat ``slime`` is imported: a module the table lists is
    served under the target's name (where slime-check backs it) and refused under the other slime's
    name; every other name is left to the usual finders."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if not fullname.startswith("slime.") or not getattr(sys.modules.get("slime"), "SLIME_CHECK_COMPAT", False):
            return None
        slime = env_target()
        why = explain(fullname, slime)
        if why is not None:
            raise ModuleNotFoundError(why, name=fullname)
        if fullname == NEW_PACKAGE:
            return importlib.machinery.ModuleSpec(fullname, _Alias(None), is_package=True)
        found = _row(fullname)
        if found is not None and found[1] == fullname and found[0].backing:
            return importlib.machinery.ModuleSpec(fullname, _Alias(found[0].backing))
        return None

    @classmethod
    def invalidate_caches(cls):
        pass


def install_finder() -> None:
    if not any(finder is LayoutFinder for finder in sys.meta_path):
        sys.meta_path.insert(0, LayoutFinder)
