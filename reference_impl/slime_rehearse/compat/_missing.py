"""The error a compat module gives for a name it does not provide.

Three ways a hook reaches a name the layer lacks, one message for all of them:

- an attribute of a compat module (``from slime.utils.types import Nope``): the module's
  ``__getattr__`` calls :func:`missing_name`;
- a submodule of a compat package (``from slime.rollout.rm_hub.nope import f``, ``from slime.agent
  import sandbox``): Python's own finders find no file, then :class:`MissingSubmoduleFinder` (last on
  ``sys.meta_path``) raises instead of the bare "No module named ...";
- an attribute of a compat package (``from slime.rollout import fully_async_rollout``): the
  package's ``__getattr__`` (:func:`package_getattr`) imports it as a submodule, which ends in one of
  the two above.

A name slime's v0.3.1 examples use and slime-ref cannot back is listed with its reason in
``examples_v0.3.1.json`` next to this file; the message then says what the name is in slime, what
slime-ref lacks, and what to do instead. Any other name gets the generic message with the names the
module does provide.
"""

from __future__ import annotations

import functools
import importlib
import json
import pkgutil
import sys
from pathlib import Path

INVENTORY = Path(__file__).resolve().parent / "examples_v0.3.1.json"
PREFIX = "is not provided by slime-check's slime compatibility layer"
GENERIC_FIX = ("rehearse this hook on a machine with slime installed (slime-check smoke --with slime), "
               "or see skill/references/smoke.md for the names it provides")


@functools.lru_cache(maxsize=1)
def refused() -> dict[str, dict]:
    """slime name -> its inventory entry, for every name the inventory marks refused."""
    try:
        names = json.loads(INVENTORY.read_text())["names"]
    except (OSError, ValueError, KeyError):
        return {}
    return {name: entry for name, entry in names.items() if entry.get("status") == "refused"}


def _refusal(fullname: str) -> dict | None:
    """The entry that explains ``fullname``: its own, an enclosing module's, or that of a name inside it."""
    table = refused()
    if fullname in table:
        return table[fullname]
    parts = fullname.split(".")
    for end in range(len(parts) - 1, 1, -1):  # the nearest refused module around it
        if (outer := ".".join(parts[:end])) in table:
            return table[outer]
    inner = sorted(name for name in table if name.startswith(fullname + "."))
    return table[inner[0]] if inner else None


def message(fullname: str, provided: list[str]) -> str:
    """One line: the name, why the layer lacks it, and what to do instead."""
    entry = _refusal(fullname)
    if entry is not None:
        return f"{fullname} {PREFIX}: {entry['reason']}; {entry['with_slime']}"
    have = ", ".join(provided) or "no names, only submodules"
    return f"{fullname} {PREFIX} (it has: {have}); {GENERIC_FIX}"


def missing_name(module: str, name: str, provided: list[str]):
    if name.startswith("__"):  # Python's own probes (__path__, __file__ ...) must see a plain AttributeError
        return AttributeError(name)
    return ImportError(message(f"{module}.{name}", provided), name=module)


def _provided_by(module_name: str) -> list[str]:
    """What a compat module offers: its ``__all__``, and for a package its submodules."""
    module = sys.modules.get(module_name)
    if module is None:
        return []
    from slime_rehearse.compat.layouts import env_target, served

    names = list(getattr(module, "__all__", [])) + served(module_name, env_target())
    for info in pkgutil.iter_modules(getattr(module, "__path__", None) or []):
        if not info.name.startswith("_"):
            names.append(info.name)
    return sorted(set(names))


def package_getattr(package: str, name: str):
    """A compat package's ``__getattr__``: ``from slime.rollout import sglang_rollout`` imports the
    submodule (Python asks the package for the attribute first); a name with no submodule raises the
    layer's ImportError."""
    if name.startswith("__"):
        raise AttributeError(name)
    return importlib.import_module(f"{package}.{name}")


class MissingSubmoduleFinder:
    """Last on ``sys.meta_path``: a ``slime.*`` module no file provides is the layer's ImportError.

    Python's own finders run first, so every compat module that exists is found as usual. Acts only
    while ``slime`` is this layer's package (not a real slime that came later on the path).
    """

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if not fullname.startswith("slime.") or not getattr(sys.modules.get("slime"), "SLIME_CHECK_COMPAT", False):
            return None
        parent = fullname.rpartition(".")[0]
        raise ModuleNotFoundError(message(fullname, _provided_by(parent)), name=fullname)

    @classmethod
    def invalidate_caches(cls):
        pass


def install_finder() -> None:
    if not any(finder is MissingSubmoduleFinder for finder in sys.meta_path):
        sys.meta_path.append(MissingSubmoduleFinder)
