"""Port of slime v0.3.1 ``tests/plugin_contracts/test_plugin_path_loading_contracts.py`` (THUDM/slime @ a6272da).

Hooks given as dotted paths: the dynamic sampling filter, the buffer filter, the data source and
the reward function. slime's default paths (``slime.rollout...``) are loaded as they are: slime-ref's
hook loader maps them to its counterparts. slime's ``should_drop_dynamic_filter_output`` is
slime-ref's ``should_drop``.

Left out: the ``eval_function``, ``rollout_sample_filter`` and ``rollout_all_samples_process``
cases: slime-ref has no ``--eval-function-path``, ``--rollout-sample-filter-path`` or
``--rollout-all-samples-process-path`` (it refuses them by name).
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass

import pytest

from plugin_contracts._shared import get_contract_path, load
from slime_ref.data.source import RolloutDataSourceWithBuffer
from slime_ref.rollout.filters import DynamicFilterOutput, call_dynamic_filter, should_drop
from slime_ref.rollout.rewards import async_rm, batched_async_rm
from slime_ref.types import Sample


def make_sample(index: int, reward: float = 1.0) -> Sample:
    return Sample(
        index=index,
        prompt=f"prompt-{index}",
        response=f"response-{index}",
        label=f"label-{index}",
        tokens=[100 + index, 200 + index],
        response_length=2,
        reward=reward,
        status=Sample.Status.COMPLETED,
        metadata={},
    )


def make_args(**overrides):
    class Args:
        rollout_global_dataset = False
        buffer_filter_path = None
        n_samples_per_prompt = 2
        custom_rm_path = None
        group_rm = False
        rm_type = None
        reward_key = None

    args = Args()
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


class ReferenceDataSource:
    def __init__(self, args):
        self.args = args
        self._groups = [[Sample(index=0), Sample(index=1)], [Sample(index=2), Sample(index=3)]]

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        selected = self._groups[:num_samples]
        self._groups = self._groups[num_samples:]
        return selected

    def add_samples(self, samples: list[list[Sample]]):
        self._groups.extend(samples)

    def save(self, rollout_id):
        self.last_saved_rollout_id = rollout_id

    def load(self, rollout_id=None):
        self.last_loaded_rollout_id = rollout_id

    def __len__(self) -> int:
        return len(self._groups)


def reference_dynamic_filter(args, samples: list[Sample], **kwargs):
    keep = not any(sample.metadata.get("drop") for sample in samples)
    return DynamicFilterOutput(keep=keep, reason=None if keep else "drop-flag")


def reference_buffer_filter(args, rollout_id, buffer: list[list[Sample]], num_samples: int) -> list[list[Sample]]:
    selected = list(reversed(buffer[-num_samples:]))
    del buffer[-num_samples:]
    return selected


async def reference_single_rm(args, sample: Sample, **kwargs):
    return float(sample.index or 0) + 0.1


async def reference_batched_rm(args, samples: list[Sample], **kwargs):
    return [float(sample.index or 0) + 0.2 for sample in samples]


@dataclass(frozen=True)
class SyncCase:
    name: str
    env_key: str
    default_path: str
    default_check: object
    path_check: object


def check_dynamic_filter_default() -> None:
    fn = load("slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std")
    assert tuple(inspect.signature(fn).parameters)[:2] == ("args", "samples")
    output = call_dynamic_filter(fn, make_args(), [make_sample(0, reward=1.0), make_sample(1, reward=2.0)])
    assert isinstance(output, DynamicFilterOutput)


def check_dynamic_filter_path(path: str) -> None:
    fn = load(path)
    assert tuple(inspect.signature(fn).parameters)[:2] == ("args", "samples")
    output = call_dynamic_filter(fn, make_args(), [make_sample(0, reward=1.0), make_sample(1, reward=2.0)])
    assert isinstance(output, DynamicFilterOutput)


def test_dynamic_filter_can_fall_back_to_zero_std_groups_at_target_capacity():
    fn = load("slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std_with_fallback")
    output = call_dynamic_filter(fn, make_args(), [make_sample(0, reward=1.0), make_sample(1, reward=1.0)])

    assert not bool(output.keep)
    assert output.keep_when_insufficient is True
    assert should_drop(output, remaining_batch_size=3, target_data_size=2) is True
    assert should_drop(output, remaining_batch_size=2, target_data_size=2) is False


def test_strict_dynamic_filter_still_drops_at_target_capacity():
    fn = load("slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std")
    output = call_dynamic_filter(fn, make_args(), [make_sample(0, reward=0.0), make_sample(1, reward=0.0)])

    assert not bool(output.keep)
    assert output.keep_when_insufficient is False
    assert should_drop(output, remaining_batch_size=2, target_data_size=2) is True


def check_buffer_filter_default() -> None:
    fn = load("slime.rollout.data_source.pop_first")
    assert tuple(inspect.signature(fn).parameters)[:4] == ("args", "rollout_id", "buffer", "num_samples")


def check_buffer_filter_path(path: str) -> None:
    fn = load(path)
    assert tuple(inspect.signature(fn).parameters)[:4] == ("args", "rollout_id", "buffer", "num_samples")
    data_source = RolloutDataSourceWithBuffer(make_args())
    data_source.add_samples([[Sample(index=0), Sample(index=1)], [Sample(index=2), Sample(index=3)]])
    assert isinstance(fn(make_args(buffer_filter_path=path), None, data_source.buffer, 1), list)


def check_data_source_default() -> None:
    cls = load("slime.rollout.data_source.RolloutDataSourceWithBuffer")
    assert tuple(inspect.signature(cls.__init__).parameters)[:2] == ("self", "args")


def check_data_source_path(path: str) -> None:
    cls = load(path)
    assert tuple(inspect.signature(cls.__init__).parameters)[:2] == ("self", "args")
    groups = cls(make_args()).get_samples(1)
    assert isinstance(groups, list)


SYNC_CASES = [
    SyncCase(
        "dynamic_filter",
        "DYNAMIC_SAMPLING_FILTER_PATH",
        "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std",
        check_dynamic_filter_default,
        check_dynamic_filter_path,
    ),
    SyncCase(
        "buffer_filter",
        "BUFFER_FILTER_PATH",
        "slime.rollout.data_source.pop_first",
        check_buffer_filter_default,
        check_buffer_filter_path,
    ),
    SyncCase(
        "data_source",
        "DATA_SOURCE_PATH",
        "plugin_contracts.test_plugin_path_loading_contracts.ReferenceDataSource",
        check_data_source_default,
        check_data_source_path,
    ),
]


@pytest.mark.parametrize("case", SYNC_CASES, ids=[case.name for case in SYNC_CASES])
def test_path_loading_default_behavior_is_stable(case: SyncCase):
    case.default_check()


@pytest.mark.parametrize("case", SYNC_CASES, ids=[case.name for case in SYNC_CASES])
def test_path_loading_path_aligns_with_expected_format(case: SyncCase):
    case.path_check(get_contract_path(case.env_key, case.default_path))


def test_reference_plugins_load_and_behave():
    # (not in slime's file) the local reference filter and buffer filter through the loader
    fn = load("plugin_contracts.test_plugin_path_loading_contracts.reference_dynamic_filter")
    dropped = [make_sample(0), make_sample(1)]
    dropped[0].metadata["drop"] = True
    assert call_dynamic_filter(fn, make_args(), dropped) == DynamicFilterOutput(keep=False, reason="drop-flag")
    check_buffer_filter_path("plugin_contracts.test_plugin_path_loading_contracts.reference_buffer_filter")


def test_custom_rm_default_behavior_is_stable():
    reward = asyncio.run(async_rm(make_args(rm_type="random"), make_sample(4)))
    rewards = asyncio.run(
        batched_async_rm(make_args(group_rm=True, rm_type="random"), [make_sample(1), make_sample(2)])
    )
    assert isinstance(reward, (int, float))
    assert isinstance(rewards, list) and len(rewards) == 2


def test_custom_rm_path_aligns_with_expected_format():
    path = get_contract_path("CUSTOM_RM_PATH")
    if get_contract_path("GROUP_RM") == "1":
        path = path or "plugin_contracts.test_plugin_path_loading_contracts.reference_batched_rm"
        assert tuple(inspect.signature(load(path)).parameters)[:2] == ("args", "samples")
        rewards = asyncio.run(
            batched_async_rm(make_args(group_rm=True, custom_rm_path=path), [make_sample(0), make_sample(1)])
        )
        assert isinstance(rewards, list) and len(rewards) == 2
    else:
        path = path or "plugin_contracts.test_plugin_path_loading_contracts.reference_single_rm"
        assert tuple(inspect.signature(load(path)).parameters)[:2] == ("args", "sample")
        reward = asyncio.run(async_rm(make_args(custom_rm_path=path), make_sample(3)))
        assert isinstance(reward, (int, float))


def test_batched_reference_rm_scores_each_sample():
    # (not in slime's file) slime's contract above takes the single-sample branch unless GROUP_RM=1;
    # the group branch runs here with the reference hook
    path = "plugin_contracts.test_plugin_path_loading_contracts.reference_batched_rm"
    rewards = asyncio.run(
        batched_async_rm(make_args(group_rm=True, custom_rm_path=path), [make_sample(0), make_sample(1)])
    )
    assert rewards == [0.2, 1.2]
