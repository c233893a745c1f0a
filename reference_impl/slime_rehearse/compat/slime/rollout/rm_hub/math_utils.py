"""slime compatibility module (slime.rollout.rm_hub.math_utils), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md.

slime's DeepScaleR math checker; slime-ref's is slime_ref.rollout.math_grading, which gives slime's
value for every input (tests/conformance). The functions keep slime's parameter names."""

from slime_ref.rollout import math_grading as _grading
from slime_rehearse.compat._exports import exports


def last_boxed_only_string(string):
    """The last ``\\boxed{...}`` (else ``\\fbox{...}``) span of ``string`` with its braces, or None."""
    return _grading.last_boxed_only_string(string)


def remove_boxed(s):
    """``\\boxed{x}`` -> ``x``; None for anything else."""
    return _grading.remove_boxed(s)


def extract_boxed_answer(solution: str) -> str:
    """The content of the last ``\\boxed{...}`` of ``solution``, or None."""
    return _grading.extract_boxed_answer(solution)


def extract_answer(passage: str) -> str:
    """The boxed answer of ``passage``; None when it has no ``\\boxed``."""
    return _grading.extract_answer(passage)


def grade_answer_verl(solution_str, ground_truth):
    """slime's ``math`` rule: True if the boxed answer of ``solution_str`` equals ``ground_truth``."""
    return _grading.grade_answer_verl(solution_str, ground_truth)


__all__, __getattr__ = exports(
    __name__, "extract_answer", "extract_boxed_answer", "grade_answer_verl", "last_boxed_only_string", "remove_boxed")
