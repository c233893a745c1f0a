"""Loading user hooks given as dotted import paths (``--custom-rm-path my_pkg.rewards.fn``).

slime loads every hook with ``importlib.import_module`` + ``getattr`` (``slime.utils.misc.load_function``);
so does slime-ref, but a bad path becomes a :class:`~slime_ref.errors.UserError` that names the flag,
what failed, and the fix, instead of a bare ``ModuleNotFoundError`` deep inside a Ray actor.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable
from typing import Any

from slime_ref.errors import UserError

# slime's own built-in hooks, so a slime launch script runs unchanged: slime path -> slime-ref's counterpart.
# Only names whose counterpart takes the same arguments and returns the same kind of value.
SLIME_BUILTINS = {
    "slime.rollout.sglang_rollout.generate_rollout": "slime_ref.rollout.sglang_rollout.generate_rollout",
    "slime.rollout.sglang_rollout.generate": "slime_ref.rollout.sglang_rollout.generate",
    "slime.rollout.sglang_rollout.generate_and_rm": "slime_ref.rollout.sglang_rollout.generate_and_rm",
    "slime.rollout.sglang_rollout.generate_and_rm_group": "slime_ref.rollout.sglang_rollout.generate_and_rm_group",
    "slime.rollout.sft_rollout.generate_rollout": "slime_ref.rollout.sft_rollout.generate_rollout",
    "slime.rollout.data_source.RolloutDataSource": "slime_ref.data.source.RolloutDataSource",
    "slime.rollout.data_source.RolloutDataSourceWithBuffer": "slime_ref.data.source.RolloutDataSourceWithBuffer",
    "slime.rollout.data_source.pop_first": "slime_ref.data.source.pop_first",
    "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std":
        "slime_ref.rollout.filters.check_reward_nonzero_std",
    "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std_with_fallback":
        "slime_ref.rollout.filters.check_reward_nonzero_std_with_fallback",
    "slime.rollout.rm_hub.async_rm": "slime_ref.rollout.rewards.async_rm",
    "slime.rollout.rm_hub.batched_async_rm": "slime_ref.rollout.rewards.batched_async_rm",
    "slime.rollout.rm_hub.remote_rm": "slime_ref.rollout.rewards.remote_rm",
}

_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
FIX = "use a dotted path like my_pkg.rewards.fn, importable on PYTHONPATH"


def _split(path: str, flag: str) -> tuple[str, str]:
    if not isinstance(path, str) or not path.strip():
        raise UserError(f"{flag}: empty hook path; {FIX}")
    if path.endswith(".py") or "/" in path or "\\" in path or ":" in path:
        raise UserError(f"{flag} {path!r}: a file path, not an import path; {FIX}")
    if not _DOTTED.match(path):
        raise UserError(f"{flag} {path!r}: not a dotted import path module.function; {FIX}")
    module_name, _, attr = SLIME_BUILTINS.get(path, path).rpartition(".")
    return module_name, attr


def check_hook_path(path: str, flag: str) -> None:
    """Cheap parse-time check: the path is dotted and its top-level package can be found.

    Does not import the module (hooks may import heavy libraries); :func:`load_function` does that.
    """
    module_name, _ = _split(path, flag)
    top = module_name.split(".")[0]
    if importlib.util.find_spec(top) is None:
        raise UserError(f"{flag} {path!r}: no module named {top!r} on the Python path; {FIX}")


def load_function(path: str, flag: str) -> Callable[..., Any]:
    """Import ``module.attr`` and return the attribute; any failure is a UserError naming ``flag``."""
    module_name, attr = _split(path, flag)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or any error raised while the module runs
        detail = " ".join(str(e).split())  # one line, even for a multi-line error
        failure = f"importing {module_name!r} failed ({type(e).__name__}: {detail})"
        raise UserError(f"{flag} {path!r}: {failure}; {FIX}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise UserError(f"{flag} {path!r}: module {module_name!r} has no attribute {attr!r}; {FIX}") from None
