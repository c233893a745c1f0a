"""Port of slime v0.3.1 ``tests/test_rm_math_dapo.py`` (THUDM/slime @ a6272da): the DAPO reward.

slime's ``normalize_final_answer`` keeps its name (``slime_ref.rollout.rewards``); its
``compute_score(response, label)``, the only entry ``--rm-type dapo`` calls, is ``dapo_reward``.

Rewritten (they called helpers of slime's module; the port checks the same behaviour through
``dapo_reward``, which is what a run sees):

- the ``is_correct_minerva`` and ``verify`` tests: through ``dapo_reward``'s ``acc`` and ``pred``;
- the ``compute_score(..., strict_box_verify=True)`` tests (dict shape, -1 for wrong, the 300-character
  tail): ``--rm-type dapo`` never turns strict-box mode on, so the same cases are written with an
  "Answer:" line, the form the reachable (Minerva) mode grades.

Left out (10 of slime's 19 tests): those of the dapo module's own ``last_boxed_only_string`` (4),
``remove_boxed`` (2), ``is_correct_strict_box`` (3) and ``verify``'s strict-box dispatch (1). They
serve only the strict-box mode, which no ``--rm-type`` reaches.
"""

from __future__ import annotations

import pytest

from slime_ref.rollout.rewards import dapo_reward, normalize_final_answer

# ---------------------------------------------------------------------------
# normalize_final_answer


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("x = 42", "42"),
        ("an answer", "answer"),
        ("42 square", "42"),
        ("100 dollars", "100"),
        (r"\text{hello}", "hello"),
        (r"\boxed{42}", "42"),
        ("1,234,567", "1234567"),
        ("a b c", "bc"),
    ],
)
def test_normalize_final_answer_canonical_substitutions(raw, expected):
    assert normalize_final_answer(raw) == expected


def test_normalize_final_answer_strips_end_tokens():
    assert normalize_final_answer("42<|endoftext|>") == "42"
    assert normalize_final_answer("42<|im_end|>") == "42"


# ---------------------------------------------------------------------------
# the Minerva check (slime: is_correct_minerva / verify)


def test_is_correct_minerva_matches_int_answer():
    out = dapo_reward("Long solution. Answer: 42", "42")
    assert out["acc"] is True
    assert out["pred"] == "42"


def test_is_correct_minerva_takes_last_answer_match():
    out = dapo_reward("Answer: 41 was a wrong guess.\nAnswer: 42", "42")
    assert out["acc"] is True


def test_is_correct_minerva_no_answer_marker_is_invalid():
    out = dapo_reward("just a number 42", "42")
    assert out["acc"] is False
    assert out["pred"] == "[INVALID]"


def test_verify_default_dispatches_to_minerva():
    assert dapo_reward("Answer: 42", "42")["acc"] is True


# ---------------------------------------------------------------------------
# compute_score (slime's cases used strict-box mode; here the reachable "Answer:" form)


def test_compute_score_correct_returns_dict_with_reward_one():
    assert dapo_reward("Answer: 42", "42") == {"score": 1.0, "acc": True, "pred": "42"}


def test_compute_score_incorrect_returns_minus_one():
    out = dapo_reward("Answer: 43", "42")
    assert out["score"] == -1.0
    assert out["acc"] is False


def test_compute_score_only_uses_last_300_chars():
    solution = "Answer: 42\n" + (" filler" * 60)  # the answer line is more than 300 chars from the end
    assert dapo_reward(solution, "42")["score"] == -1.0
    assert dapo_reward(solution[:200], "42")["score"] == 1.0
