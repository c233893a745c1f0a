"""Port of slime v0.3.1 ``tests/test_sample.py`` (THUDM/slime @ a6272da): ``Sample``.

slime's ``slime.utils.types.Sample`` is ``slime_ref.types.Sample``: the same constructor fields,
``to_dict``/``from_dict`` and ``append_response_tokens``. Every test is ported unchanged; the
sample is built with every one of slime's constructor fields, so a field slime-ref refused would
fail here.
"""

from __future__ import annotations

import argparse
import json

import pytest

from slime_ref.types import Sample


def _make_sample(**overrides) -> Sample:
    base = {
        "group_index": 0,
        "index": 42,
        "rollout_id": 7,
        "prompt": "hello",
        "tokens": [1, 2, 3],
        "multimodal_inputs": {"images": ["fake_url"]},
        "response": "world",
        "response_length": 5,
        "label": "42",
        "reward": 0.75,
        "loss_mask": [1, 1, 0, 1, 1],
        "weight_versions": ["v1"],
        "rollout_log_probs": [-0.1, -0.2],
        "rollout_top_p_token_ids": [10, 11, 12, 20],
        "rollout_top_p_token_offsets": [0, 3, 4],
        "rollout_routed_experts": [[0, 1], [2, 3]],
        "remove_sample": False,
        "teacher_log_probs": [-0.3, -0.4],
        "status": Sample.Status.COMPLETED,
        "metadata": {"rm_type": "math"},
        "generate_function_path": "some.module.fn",
        "train_metadata": {"loss_type": "policy_loss"},
        "session_id": "uuid-1234",
        "non_generation_time": 1.5,
    }
    base.update(overrides)
    return Sample(**base)


# ---------------------------------------------------------------------------
# to_dict / from_dict


def test_to_dict_serializes_status_as_string_value():
    d = _make_sample().to_dict()
    assert d["status"] == "completed"
    assert isinstance(d["status"], str)


def test_to_dict_flattens_spec_info_and_prefix_cache_info():
    sample = _make_sample()
    sample.spec_info.spec_accept_token_num = 10
    sample.spec_info.spec_draft_token_num = 20
    sample.prefix_cache_info.cached_tokens = 5
    sample.prefix_cache_info.total_prompt_tokens = 50

    d = sample.to_dict()
    assert d["spec_info"] == {
        "spec_accept_token_num": 10,
        "spec_draft_token_num": 20,
        "spec_verify_ct": 0,
        "completion_token_num": 0,
    }
    assert d["prefix_cache_info"] == {"cached_tokens": 5, "total_prompt_tokens": 50}


def test_round_trip_preserves_every_field():
    original = _make_sample()
    original.spec_info.spec_accept_token_num = 3
    original.prefix_cache_info.cached_tokens = 7

    restored = Sample.from_dict(original.to_dict())

    assert restored.status is Sample.Status.COMPLETED
    assert isinstance(restored.spec_info, Sample.SpecInfo)
    assert isinstance(restored.prefix_cache_info, Sample.PrefixCacheInfo)
    assert restored.spec_info.spec_accept_token_num == 3
    assert restored.prefix_cache_info.cached_tokens == 7

    for field in (
        "group_index",
        "index",
        "rollout_id",
        "prompt",
        "tokens",
        "multimodal_inputs",
        "response",
        "response_length",
        "label",
        "reward",
        "loss_mask",
        "weight_versions",
        "rollout_log_probs",
        "rollout_top_p_token_ids",
        "rollout_top_p_token_offsets",
        "rollout_routed_experts",
        "remove_sample",
        "teacher_log_probs",
        "metadata",
        "generate_function_path",
        "train_metadata",
        "session_id",
        "non_generation_time",
    ):
        assert getattr(restored, field) == getattr(original, field), f"field {field} drifted"


def test_round_trip_through_json_keeps_the_info_records():
    # (not in slime's file) the rollout manager and the buffer state write to_dict() as JSON
    original = _make_sample()
    original.prefix_cache_info.total_prompt_tokens = 9
    restored = Sample.from_dict(json.loads(json.dumps(original.to_dict())))
    assert restored == original


def test_from_dict_preserves_unknown_fields_as_attributes():
    d = _make_sample().to_dict()
    d["future_extension"] = "carried through"

    restored = Sample.from_dict(d)
    assert restored.future_extension == "carried through"


def test_round_trip_through_default_constructed_sample():
    restored = Sample.from_dict(Sample().to_dict())
    assert restored.status is Sample.Status.PENDING
    assert restored.tokens == []
    assert restored.metadata == {}


# ---------------------------------------------------------------------------
# append_response_tokens: finish_reason -> Status


def _make_args(speculative: bool = False) -> argparse.Namespace:
    return argparse.Namespace(sglang_speculative_algorithm=speculative)


@pytest.mark.parametrize(
    "finish_reason,expected_status",
    [
        ("length", Sample.Status.TRUNCATED),
        ("abort", Sample.Status.ABORTED),
        ("stop", Sample.Status.COMPLETED),
    ],
)
def test_status_mapping_for_each_finish_reason(finish_reason, expected_status):
    sample = Sample()
    sample.append_response_tokens(
        _make_args(), tokens=[], trainable=True, meta_info={"finish_reason": {"type": finish_reason}}
    )
    assert sample.status is expected_status


def test_unknown_finish_reason_leaves_status_unchanged():
    sample = Sample()
    sample.status = Sample.Status.PENDING
    sample.append_response_tokens(
        _make_args(), tokens=[], trainable=True, meta_info={"finish_reason": {"type": "something_new"}}
    )
    assert sample.status is Sample.Status.PENDING


def test_weight_version_is_appended_when_present():
    sample = Sample()
    sample.weight_versions = ["v1"]
    sample.append_response_tokens(
        _make_args(),
        tokens=[],
        trainable=True,
        meta_info={"finish_reason": {"type": "stop"}, "weight_version": "v2"},
    )
    assert sample.weight_versions == ["v1", "v2"]


def test_prefix_cache_info_is_accumulated_across_calls():
    sample = Sample()
    for prompt_tokens, cached_tokens in [(100, 0), (200, 50)]:
        sample.append_response_tokens(
            _make_args(),
            tokens=[],
            trainable=True,
            meta_info={
                "finish_reason": {"type": "stop"},
                "prompt_tokens": prompt_tokens,
                "cached_tokens": cached_tokens,
            },
        )
    assert sample.prefix_cache_info.cached_tokens == 50
    assert sample.prefix_cache_info.total_prompt_tokens == 300


def test_spec_info_only_updated_when_speculative_enabled():
    meta_info = {
        "finish_reason": {"type": "stop"},
        "spec_accept_token_num": 7,
        "spec_draft_token_num": 10,
    }

    no_spec = Sample()
    no_spec.append_response_tokens(_make_args(speculative=False), tokens=[], trainable=True, meta_info=meta_info)
    assert no_spec.spec_info.spec_accept_token_num == 0

    with_spec = Sample()
    with_spec.append_response_tokens(_make_args(speculative=True), tokens=[], trainable=True, meta_info=meta_info)
    assert with_spec.spec_info.spec_accept_token_num == 7
    assert with_spec.spec_info.spec_draft_token_num == 10
