"""Port of slime v0.3.1 ``tests/test_rm_f1.py`` (THUDM/slime @ a6272da): the token-F1 reward.

slime's ``f1.normalize_answer`` is slime-ref's ``normalize_f1_answer``; ``f1_score`` keeps its name
and its (f1, precision, recall) result. Every test is ported unchanged.
"""

from __future__ import annotations

import pytest

from slime_ref.rollout.rewards import f1_reward, f1_score, normalize_f1_answer


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("The Quick Brown Fox.", "quick brown fox"),
        ("An apple, a day", "apple day"),
        ("HELLO   WORLD", "hello world"),
        ("a.b,c!", "abc"),
        ("", ""),
        ("the", ""),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_f1_answer(raw) == expected


def test_f1_exact_match_is_perfect():
    f1, p, r = f1_score("Paris is the capital", "Paris is the capital")
    assert (f1, p, r) == (1.0, 1.0, 1.0)


def test_f1_partial_overlap_hand_derived():
    # pred [brown, fox], truth [quick, brown, fox]: P = 1, R = 2/3, F1 = 0.8
    f1, p, r = f1_score("the brown fox", "a quick brown fox")
    assert p == pytest.approx(1.0)
    assert r == pytest.approx(2 / 3)
    assert f1 == pytest.approx(0.8)


def test_f1_no_token_overlap_returns_zero_metric():
    assert f1_score("apple banana", "carrot date") == (0, 0, 0)


def test_f1_none_prediction_returns_zero_metric():
    assert f1_score(None, "anything") == (0, 0, 0)


@pytest.mark.parametrize("special", ["yes", "no", "noanswer"])
def test_f1_special_token_pred_mismatch_returns_zero(special):
    assert f1_score(special, "some other phrase") == (0, 0, 0)


@pytest.mark.parametrize("special", ["yes", "no", "noanswer"])
def test_f1_special_token_gt_mismatch_returns_zero(special):
    assert f1_score("some other phrase", special) == (0, 0, 0)


def test_f1_special_token_exact_match_uses_token_path():
    f1, p, r = f1_score("yes", "yes")
    assert (f1, p, r) == (1.0, 1.0, 1.0)


def test_the_f1_reward_is_the_first_element():
    assert f1_reward("the brown fox", "a quick brown fox") == pytest.approx(0.8)
    assert f1_reward(None, None) == 0
