"""Port of slime v0.3.1 ``tests/plugin_contracts/test_plugin_generate_contracts.py`` (THUDM/slime @ a6272da).

``--custom-generate-function-path`` hooks through ``generate_and_rm`` (``slime_ref.rollout.sglang_rollout``,
slime's name and arguments). slime's tests swap its ``GenerateState`` singleton for a fake; slime-ref's
per-process state is reached through ``sglang_rollout.generation_state``, so that is what the fixture swaps.
Every test is ported.
"""

from __future__ import annotations

import asyncio
import inspect

import pytest

from plugin_contracts._shared import get_contract_path, load
from slime_ref.types import Sample

REFERENCE_CUSTOM_GENERATE_PATH = "plugin_contracts.test_plugin_generate_contracts.custom_generate"
REFERENCE_CUSTOM_GENERATE_WITH_EVAL_PATH = (
    "plugin_contracts.test_plugin_generate_contracts.custom_generate_with_evaluation"
)


def make_args(**overrides):
    class Args:
        partial_rollout = False
        mask_offpolicy_in_partial_rollout = False
        group_rm = False
        custom_generate_function_path = None
        sglang_enable_deterministic_inference = False
        rollout_seed = 7
        n_samples_per_prompt = 2
        custom_rm_path = None
        rm_type = None

    args = Args()
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


async def custom_generate(args, sample: Sample, sampling_params: dict):
    sample.tokens = [11, 12, 13]
    sample.response = "generated"
    sample.response_length = len(sample.tokens)
    sample.reward = 0.25
    sample.status = Sample.Status.COMPLETED
    return sample


async def custom_generate_with_evaluation(args, sample: Sample, sampling_params: dict, evaluation: bool = False):
    sample.tokens = [21, 22]
    sample.response = "eval-generated" if evaluation else "train-generated"
    sample.response_length = len(sample.tokens)
    sample.reward = 0.5 if evaluation else 0.75
    sample.status = Sample.Status.COMPLETED
    sample.metadata["evaluation"] = evaluation
    return sample


def assert_sample_contract(sample: Sample) -> None:
    assert isinstance(sample, Sample)
    assert isinstance(sample.tokens, list)
    assert isinstance(sample.response, str)
    assert isinstance(sample.response_length, int)
    assert sample.reward is not None


def assert_custom_generate_signature_matches_expected(fn) -> None:
    assert tuple(inspect.signature(fn).parameters)[:3] == ("args", "sample", "sampling_params")


class _FakeGenerateState:
    """What generate_and_rm needs of the rollout state: a concurrency gate and the abort flag."""

    def __init__(self):
        self.semaphore = asyncio.Semaphore(1)
        self.aborted = False


@pytest.fixture
def patch_generate_state(monkeypatch):
    """No tokenizer, router or engine: returns the sglang_rollout module with a fake state."""
    from slime_ref.rollout import sglang_rollout

    state = _FakeGenerateState()
    monkeypatch.setattr(sglang_rollout, "generation_state", lambda args: state)
    return sglang_rollout


def test_generate_and_rm_default_generate_branch_is_stable(patch_generate_state, monkeypatch):
    sglang_rollout = patch_generate_state

    async def official_default_generate(args, sample: Sample, sampling_params: dict):
        sample.tokens = [31, 32]
        sample.response = "default-generate"
        sample.response_length = 2
        sample.reward = 1.0
        sample.status = Sample.Status.COMPLETED
        return sample

    monkeypatch.setattr(sglang_rollout, "generate", official_default_generate)

    result = asyncio.run(
        sglang_rollout.generate_and_rm(
            make_args(custom_generate_function_path=None),
            Sample(index=0, prompt="prompt"),
            sampling_params={"temperature": 0.3},
            evaluation=False,
        )
    )
    assert_sample_contract(result)
    assert result.response == "default-generate"


def test_generate_and_rm_prefers_per_sample_generate_function(patch_generate_state):
    args = make_args(custom_generate_function_path=REFERENCE_CUSTOM_GENERATE_PATH)
    sample = Sample(index=0, prompt="prompt", generate_function_path=REFERENCE_CUSTOM_GENERATE_WITH_EVAL_PATH)
    result = asyncio.run(
        patch_generate_state.generate_and_rm(args, sample, sampling_params={"temperature": 0.3}, evaluation=True)
    )
    assert_sample_contract(result)
    assert result.metadata["evaluation"] is True


def test_custom_generate_function_path_supports_user_override(patch_generate_state):
    custom_generate_path = get_contract_path("CUSTOM_GENERATE_FUNCTION_PATH", REFERENCE_CUSTOM_GENERATE_PATH)
    assert_custom_generate_signature_matches_expected(load(custom_generate_path))
    result = asyncio.run(
        patch_generate_state.generate_and_rm(
            make_args(custom_generate_function_path=custom_generate_path),
            Sample(index=0, prompt="prompt"),
            sampling_params={"temperature": 0.3},
            evaluation=False,
        )
    )
    assert_sample_contract(result)


def test_generate_and_rm_group_rm_accepts_list_result_from_custom_generate(patch_generate_state, monkeypatch):
    sglang_rollout = patch_generate_state

    async def custom_generate_list(args, sample: Sample, sampling_params: dict):
        sample.status = Sample.Status.COMPLETED
        sibling = Sample(index=1, prompt="prompt-1", status=Sample.Status.COMPLETED)
        return [sample, sibling]

    monkeypatch.setattr(sglang_rollout, "load_function", lambda *_args: custom_generate_list)

    result = asyncio.run(
        sglang_rollout.generate_and_rm(
            make_args(custom_generate_function_path="plugin_contracts.fake_generate", group_rm=True),
            Sample(index=0, prompt="prompt-0"),
            sampling_params={"temperature": 0.3},
            evaluation=False,
        )
    )

    assert isinstance(result, list)
    assert len(result) == 2
    assert all(isinstance(sample, Sample) for sample in result)
