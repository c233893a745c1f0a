"""Sample: slime's fields, JSON round trip, and appending generated or tool tokens."""

from __future__ import annotations

import json

import pytest

from slime_ref.types import Sample, status_from_finish_reason


def test_statuses_are_slimes():
    assert [s.value for s in Sample.Status] == ["pending", "completed", "truncated", "aborted", "failed"]


def test_json_round_trip_keeps_every_field_and_extras():
    sample = Sample(group_index=1, index=5, prompt=[{"role": "user", "content": "3+5="}], tokens=[1, 2, 3],
                    response="8", response_length=1, label="8", reward={"score": 1.0}, loss_mask=[1],
                    rollout_log_probs=[-0.5], status=Sample.Status.TRUNCATED, metadata={"rm_type": "math"})
    sample.custom_attribute = "kept"
    restored = Sample.from_dict(json.loads(json.dumps(sample.to_dict())))
    assert restored == sample and restored.status is Sample.Status.TRUNCATED
    assert restored.custom_attribute == "kept"


def test_append_generated_then_tool_then_generated_tokens():
    sample = Sample(tokens=[10, 11])  # the prompt
    sample.append_response_tokens(tokens=[1, 2], log_probs=[-0.1, -0.2], text="ab")
    sample.append_response_tokens(tokens=[3], trainable=False, text="<tool>")
    sample.append_response_tokens(tokens=[4], log_probs=[-0.4], meta_info={"finish_reason": {"type": "length"},
                                                                          "weight_version": "7"})
    assert sample.tokens == [10, 11, 1, 2, 3, 4] and sample.response == "ab<tool>"
    assert sample.response_length == 4 and sample.loss_mask == [1, 1, 0, 1]
    assert sample.rollout_log_probs == [-0.1, -0.2, 0.0, -0.4]
    assert sample.status is Sample.Status.TRUNCATED and sample.weight_versions == ["7"]
    assert sample.effective_response_length == 3
    with pytest.raises(ValueError, match="log-probs"):
        sample.append_response_tokens(tokens=[5])


def test_finish_reasons_map_to_statuses():
    assert status_from_finish_reason({"type": "stop", "matched": 2}) is Sample.Status.COMPLETED
    assert status_from_finish_reason({"type": "length", "length": 16}) is Sample.Status.TRUNCATED
    assert status_from_finish_reason({"type": "abort"}) is Sample.Status.ABORTED
    # any other reason maps to nothing: append_response_tokens then keeps the status (slime's match has no default)
    assert status_from_finish_reason(None) is None
    assert status_from_finish_reason({"type": "something_new"}) is None


def test_reward_value_with_and_without_reward_key():
    class Args:
        reward_key = "score"

    assert Sample(reward={"score": 0.5}).get_reward_value(Args()) == 0.5
    Args.reward_key = None
    assert Sample(reward=1.0).get_reward_value(Args()) == 1.0
