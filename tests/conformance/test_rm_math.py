"""Port of slime v0.3.1 ``tests/test_rm_math.py`` (THUDM/slime @ a6272da): the math answer checker.

slime's functions and slime-ref's share names (``slime_ref.rollout.math_grading``), so the calls
are the same. Rewritten: ``test_strip_string_canonical_substitutions`` pinned the string that slime's
private ``_strip_string`` returns; here each pair is graded against each other with the mathd check
(the behaviour that string exists for), e.g. "0.5" is graded equal to "\\frac{1}{2}".
"""

from __future__ import annotations

import pytest

from slime_ref.rollout.math_grading import (
    extract_answer,
    extract_boxed_answer,
    grade_answer_mathd,
    grade_answer_sympy,
    grade_answer_verl,
    last_boxed_only_string,
    mathd_normalize_answer,
    remove_boxed,
)

# ---------------------------------------------------------------------------
# last_boxed_only_string


def test_last_boxed_returns_last_when_multiple():
    s = r"first attempt \boxed{wrong}, final \boxed{42}"
    assert last_boxed_only_string(s) == r"\boxed{42}"


def test_last_boxed_handles_nested_braces():
    s = r"answer: \boxed{\frac{1}{2}}"
    assert last_boxed_only_string(s) == r"\boxed{\frac{1}{2}}"


def test_last_boxed_falls_back_to_fbox():
    s = r"answer: \fbox{7}"
    assert last_boxed_only_string(s) == r"\fbox{7}"


def test_last_boxed_returns_none_when_missing():
    assert last_boxed_only_string("plain text, no box") is None


def test_last_boxed_returns_none_on_unterminated_box():
    assert last_boxed_only_string(r"start \boxed{never closes") is None


# ---------------------------------------------------------------------------
# remove_boxed


def test_remove_boxed_strips_wrapper():
    assert remove_boxed(r"\boxed{x+1}") == "x+1"


def test_remove_boxed_preserves_inner_braces():
    assert remove_boxed(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"


def test_remove_boxed_returns_none_on_malformed_input():
    assert remove_boxed("not boxed at all") is None
    assert remove_boxed(None) is None


# ---------------------------------------------------------------------------
# extract_boxed_answer / extract_answer


def test_extract_boxed_answer_end_to_end():
    assert extract_boxed_answer(r"Solution: \boxed{42}") == "42"


def test_extract_answer_returns_none_when_no_boxed_marker():
    assert extract_answer("just 42") is None


# ---------------------------------------------------------------------------
# mathd normalisation (slime pinned _strip_string's output; here: the pair grades equal)


@pytest.mark.parametrize(
    "raw,expected",
    [
        (r"\frac12", r"\frac{1}{2}"),  # \frac shorthand
        (r"\tfrac{1}{2}", r"\frac{1}{2}"),  # tfrac/dfrac -> frac
        (r"\left(1\right)", "(1)"),  # \left/\right removed
        (r"45^{\circ}", "45"),  # degrees, both spellings
        (r"45^\circ", "45"),
        (".7", "0.7"),  # leading zero
        ("0.5", r"\frac{1}{2}"),  # the 0.5 special case
        (".5", r"\frac{1}{2}"),  # leading zero, then the 0.5 special case
        ("3/4", r"\frac{3}{4}"),  # a/b -> \frac{a}{b}
        ("1 + 1", "1+1"),  # spaces removed
    ],
)
def test_strip_string_canonical_substitutions(raw, expected):
    assert raw != expected
    assert grade_answer_mathd(raw, expected) is True
    assert mathd_normalize_answer(raw) == mathd_normalize_answer(expected)


def test_mathd_normalize_strips_text_wrapper():
    assert mathd_normalize_answer(r"\text{42}") == "42"


def test_mathd_normalize_none_passthrough():
    assert mathd_normalize_answer(None) is None


# ---------------------------------------------------------------------------
# grade_answer_mathd


@pytest.mark.parametrize(
    "given,gt",
    [
        (r"\frac{1}{2}", "0.5"),
        (r"\frac12", r"\frac{1}{2}"),
        (r"45^\circ", "45"),
        ("3/4", r"\frac{3}{4}"),
    ],
)
def test_grade_answer_mathd_canonical_equivalences(given, gt):
    assert grade_answer_mathd(given, gt) is True


def test_grade_answer_mathd_rejects_different():
    assert grade_answer_mathd("42", "43") is False


# ---------------------------------------------------------------------------
# grade_answer_sympy / grade_answer_verl


def test_grade_answer_sympy_equivalent_expressions():
    assert grade_answer_sympy("x+1", "1+x") is True


def test_grade_answer_sympy_fraction_must_match_exactly():
    assert grade_answer_sympy(r"\frac{2}{4}", r"\frac{1}{2}") is False


def test_grade_answer_verl_extracts_both_sides_from_boxed():
    assert grade_answer_verl(r"answer: \boxed{42}", r"\boxed{42}") is True


def test_grade_answer_verl_returns_false_on_missing_extraction():
    assert grade_answer_verl("just 42", "42") is False


def test_grade_answer_verl_returns_false_on_empty_ground_truth():
    assert grade_answer_verl(r"\boxed{42}", "") is False
