"""Port of slime v0.3.1 ``tests/test_rm_gpqa.py`` (THUDM/slime @ a6272da): the GPQA multiple-choice reward.

slime's ``compute_gpqa_reward(response, label, metadata)`` is slime-ref's ``gpqa_reward`` (the same
arguments), its private ``_extract_letter_from_response`` is ``gpqa_letter`` and
``DEFAULT_VALID_LETTERS`` is ``GPQA_DEFAULT_LETTERS``. Every test is ported unchanged.
"""

from __future__ import annotations

import pytest

from slime_ref.rollout.rewards import GPQA_DEFAULT_LETTERS, gpqa_letter, gpqa_reward, rule_based_reward

# ---------------------------------------------------------------------------
# the chosen letter


@pytest.mark.parametrize(
    "response,expected",
    [
        ("The answer is B.", "B"),
        ("Answer: C", "C"),
        ("My choice is D", "D"),
        ("A is correct here", "A"),
        ("E is the correct option", "E"),
        ("Final answer: B", "B"),
        ("the final option is C", "C"),
        ("we ruled out A, then B, settled on C", "C"),
    ],
)
def test_extract_letter_named_patterns_and_fallback(response, expected):
    assert gpqa_letter(response, GPQA_DEFAULT_LETTERS) == expected


def test_extract_letter_strips_chain_of_thought_before_matching():
    response = "Let me think… Answer: A is wrong.</think>The answer is B."
    assert gpqa_letter(response, GPQA_DEFAULT_LETTERS) == "B"


def test_extract_letter_returns_none_on_no_match():
    assert gpqa_letter("no idea, sorry", GPQA_DEFAULT_LETTERS) is None


def test_extract_letter_returns_none_on_empty():
    assert gpqa_letter("", GPQA_DEFAULT_LETTERS) is None
    assert gpqa_letter(None, GPQA_DEFAULT_LETTERS) is None


def test_extract_letter_respects_valid_letters_restriction():
    response = "Answer: C, but actually A was right, no wait B."
    assert gpqa_letter(response, ["A", "B"]) == "B"


# ---------------------------------------------------------------------------
# the reward


def test_reward_letter_label_match():
    assert gpqa_reward("The answer is C.", label="C") == 1.0


def test_reward_letter_label_mismatch_returns_zero():
    assert gpqa_reward("The answer is C.", label="D") == 0.0


def test_reward_int_label_maps_via_choices_length():
    reward = gpqa_reward("Answer: C", label=2, metadata={"choices": ["alpha", "beta", "gamma", "delta"]})
    assert reward == 1.0


def test_reward_choices_as_dict_is_accepted():
    reward = gpqa_reward("Answer: B", label=1, metadata={"choices": {"a": "first", "b": "second", "c": "third"}})
    assert reward == 1.0


def test_reward_full_text_label_resolves_to_letter_via_choices():
    reward = gpqa_reward(
        "I think the answer is B.",
        label="capital of france",
        metadata={"choices": ["London", "Capital of France", "Berlin"]},
    )
    assert reward == 1.0


def test_reward_text_match_fallback_when_no_letter_extracted():
    reward = gpqa_reward("Definitely paris.", label="Paris", metadata={"choices": ["London", "Paris", "Berlin"]})
    assert reward == 1.0


def test_reward_correct_letter_metadata_overrides_label():
    reward = gpqa_reward("Answer: A", label="anything", metadata={"correct_letter": "a"})
    assert reward == 1.0


def test_reward_none_response_is_zero():
    assert gpqa_reward(None, label="A") == 0.0


def test_reward_no_correct_letter_and_no_match_is_zero():
    assert gpqa_reward("random text", label="some answer") == 0.0


def test_rm_type_gpqa_reads_the_sample_metadata():
    # --rm-type gpqa passes the sample's metadata, as slime's async_rm does
    metadata = {"choices": ["alpha", "beta", "gamma", "delta"]}
    assert rule_based_reward("gpqa", "Answer: C", 2, metadata) == 1.0
    assert rule_based_reward("gpqa", "Answer: C", 2) == 1.0  # 10 default letters: index 2 is C too
    assert rule_based_reward("gpqa", "Answer: C", 1, metadata) == 0.0
