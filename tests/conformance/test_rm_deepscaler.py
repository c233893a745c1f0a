"""Port of slime v0.3.1 ``tests/test_rm_deepscaler.py`` (THUDM/slime @ a6272da): the deepscaler reward.

slime's ``get_deepscaler_rule_based_reward(response, label)`` is slime-ref's
``deepscaler_reward(response, label)``. Every test is ported unchanged.
"""

from __future__ import annotations

from slime_ref.rollout.rewards import deepscaler_reward


def test_response_split_on_think_marker_grades_tail():
    response = r"Let me reconsider. \boxed{99}</think>Final: \boxed{42}"
    assert deepscaler_reward(response, "42") == 1


def test_response_split_on_response_marker_grades_tail():
    response = r"Scratch work \boxed{wrong}###Response\boxed{42}"
    assert deepscaler_reward(response, "42") == 1


def test_response_without_any_marker_returns_zero():
    assert deepscaler_reward(r"\boxed{42}", "42") == 0


def test_response_with_no_boxed_answer_returns_zero():
    assert deepscaler_reward("plain</think>no box here", "42") == 0


def test_empty_label_returns_zero():
    assert deepscaler_reward(r"</think>\boxed{42}", "") == 0


def test_label_as_int_is_coerced_to_string():
    assert deepscaler_reward(r"</think>\boxed{42}", 42) == 1


def test_label_as_float_is_coerced_to_string():
    # (slime's test of this name passes the int 42; kept as it is)
    assert deepscaler_reward(r"</think>\boxed{42}", 42) == 1


def test_label_with_boxed_marker_is_extracted_too():
    assert deepscaler_reward(r"</think>\boxed{42}", r"\boxed{42}") == 1


def test_wrong_answer_returns_zero():
    assert deepscaler_reward(r"</think>\boxed{43}", "42") == 0


def test_grader_uses_either_mathd_or_sympy_path():
    response = r"</think>\boxed{\frac{1}{2}}"
    assert deepscaler_reward(response, "0.5") == 1
