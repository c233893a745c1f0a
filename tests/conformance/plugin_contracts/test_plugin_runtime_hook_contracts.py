"""Port of slime v0.3.1 ``tests/plugin_contracts/test_plugin_runtime_hook_contracts.py`` (THUDM/slime @ a6272da).

Of slime's five runtime hooks, slime-ref implements ``--custom-reward-post-process-path``
(``f(args, samples) -> (raw_rewards, rewards)``); that case is ported.

Rewritten: ``test_runtime_hook_callsite_is_stable`` searched slime's source files for the line that
calls each hook (an internal detail); the port calls slime-ref's caller, ``post_process_rewards``,
and checks the hook's result is what it returns.

Left out: ``--custom-rollout-log-function-path``, ``--custom-eval-rollout-log-function-path``,
``--custom-convert-samples-to-train-data-path`` and ``--rollout-data-postprocess-path``: slime-ref
refuses these flags by name.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

from plugin_contracts._shared import get_contract_path, load
from slime_ref.algo.advantages import post_process_rewards
from slime_ref.types import Sample

DEFAULT_PATH = "plugin_contracts.test_plugin_runtime_hook_contracts.reference_reward_post_process"


def reference_reward_post_process(args, samples):
    raw_rewards = [sample.reward for sample in samples]
    rewards = [reward + 1.0 for reward in raw_rewards]
    return raw_rewards, rewards


def make_sample(index: int, reward: float = 1.0) -> Sample:
    return Sample(
        index=index,
        reward=reward,
        tokens=[index, index + 1],
        response_length=2,
        status=Sample.Status.COMPLETED,
        loss_mask=[1, 1],
    )


def test_runtime_hook_path_aligns_with_expected_format():
    fn = load(get_contract_path("CUSTOM_REWARD_POST_PROCESS_PATH", DEFAULT_PATH))
    assert tuple(inspect.signature(fn).parameters) == ("args", "samples")
    raw_rewards, rewards = fn(SimpleNamespace(), [make_sample(0, 0.5), make_sample(1, 1.5)])
    assert len(raw_rewards) == len(rewards) == 2


def test_runtime_hook_callsite_is_stable():
    args = SimpleNamespace(custom_reward_post_process_path=DEFAULT_PATH, advantage_estimator="grpo",
                           rewards_normalization=True, n_samples_per_prompt=2, reward_key=None)
    assert post_process_rewards(args, [make_sample(0, 0.5), make_sample(1, 1.5)]) == ([0.5, 1.5], [1.5, 2.5])
