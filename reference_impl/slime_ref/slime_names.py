"""slime's names that slime-ref stands in for: one map from a slime dotted name to slime-ref's object.

Two users read it. The hook loader (:mod:`slime_ref.utils.hooks`) takes a slime launch script's hook
path (``--rollout-function-path slime.rollout.sglang_rollout.generate_rollout``) to slime-ref's
counterpart; only entries marked ``hook`` qualify, since only those take the same arguments and return
the same kind of value as slime's hook. slime-check's compatibility namespace
(``slime_rehearse/compat/slime``) serves every entry under its slime module and name, so a hook file
that imports ``from slime.utils.types import Sample`` runs without slime.

What becomes of each name slime v0.3.1's examples use is listed in
``slime_rehearse/compat/examples_v0.3.1.json``.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple


class SlimeName(NamedTuple):
    ref: str  # slime-ref's dotted name of the same object
    hook: bool  # a hook flag may name it: slime-ref's object is called as slime's would be


def _hook(ref: str) -> SlimeName:
    return SlimeName(ref, hook=True)


def _name(ref: str) -> SlimeName:
    return SlimeName(ref, hook=False)


SLIME_NAMES: dict[str, SlimeName] = {
    # slime.rollout.sglang_rollout
    "slime.rollout.sglang_rollout.generate_rollout": _hook("slime_ref.rollout.sglang_rollout.generate_rollout"),
    "slime.rollout.sglang_rollout.generate": _hook("slime_ref.rollout.sglang_rollout.generate"),
    "slime.rollout.sglang_rollout.generate_and_rm": _hook("slime_ref.rollout.sglang_rollout.generate_and_rm"),
    "slime.rollout.sglang_rollout.generate_and_rm_group":
        _hook("slime_ref.rollout.sglang_rollout.generate_and_rm_group"),
    # slime.rollout.sft_rollout
    "slime.rollout.sft_rollout.generate_rollout": _hook("slime_ref.rollout.sft_rollout.generate_rollout"),
    # slime.rollout.data_source
    "slime.rollout.data_source.DataSource": _name("slime_ref.data.source.RolloutDataSource"),
    "slime.rollout.data_source.RolloutDataSource": _hook("slime_ref.data.source.RolloutDataSource"),
    "slime.rollout.data_source.RolloutDataSourceWithBuffer":
        _hook("slime_ref.data.source.RolloutDataSourceWithBuffer"),
    "slime.rollout.data_source.pop_first": _hook("slime_ref.data.source.pop_first"),
    # slime.rollout.filter_hub
    "slime.rollout.filter_hub.base_types.DynamicFilterOutput": _name("slime_ref.rollout.filters.DynamicFilterOutput"),
    "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std":
        _hook("slime_ref.rollout.filters.check_reward_nonzero_std"),
    "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std_with_fallback":
        _hook("slime_ref.rollout.filters.check_reward_nonzero_std_with_fallback"),
    # slime.rollout.rm_hub
    "slime.rollout.rm_hub.async_rm": _hook("slime_ref.rollout.rewards.async_rm"),
    "slime.rollout.rm_hub.batched_async_rm": _hook("slime_ref.rollout.rewards.batched_async_rm"),
    "slime.rollout.rm_hub.remote_rm": _hook("slime_ref.rollout.rewards.remote_rm"),
    "slime.rollout.rm_hub.math_utils.grade_answer_mathd": _name("slime_ref.rollout.math_grading.grade_answer_mathd"),
    "slime.rollout.rm_hub.math_utils.grade_answer_sympy": _name("slime_ref.rollout.math_grading.grade_answer_sympy"),
    "slime.rollout.rm_hub.math_utils.mathd_normalize_answer":
        _name("slime_ref.rollout.math_grading.mathd_normalize_answer"),
    # slime.rollout.on_policy_distillation
    "slime.rollout.on_policy_distillation.reward_func": _hook("slime_ref.utils.hooks.opd_teacher_reward"),
    "slime.rollout.on_policy_distillation.post_process_rewards":
        _hook("slime_ref.utils.hooks.opd_post_process_rewards"),
    # slime.utils.types
    "slime.utils.types.Sample": _name("slime_ref.types.Sample"),
}


def hook_targets() -> dict[str, str]:
    """slime hook path -> slime-ref's dotted path, for the names a hook flag may give."""
    return {slime: name.ref for slime, name in SLIME_NAMES.items() if name.hook}


def names_in(slime_module: str) -> dict[str, str]:
    """The names the map gives ``slime_module`` (its own, not its submodules'): attribute -> slime-ref path."""
    return {slime.rpartition(".")[2]: name.ref for slime, name in SLIME_NAMES.items()
            if slime.rpartition(".")[0] == slime_module}


def resolve(ref: str) -> Any:
    """slime-ref's object at a dotted path (``slime_ref.types.Sample``)."""
    module, _, attr = ref.rpartition(".")
    return getattr(importlib.import_module(module), attr)
