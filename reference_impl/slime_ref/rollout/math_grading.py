"""Deciding whether a model's math answer equals the reference answer, exactly as slime v0.3.1 does.

slime grades ``math`` and ``deepscaler`` with DeepScaleR's checker (``slime/rollout/rm_hub/math_utils.py``,
itself Hendrycks' MATH normaliser plus a sympy check). The names of the public functions are slime's,
so a reader can put the two side by side. Two tests, either one suffices:

1. **mathd** (:func:`grade_answer_mathd`): both answers go through Hendrycks' string normaliser
   (:func:`mathd_normalize_answer`) and must then be identical. It knows ``\\frac12``, ``\\dfrac``,
   ``0.5 == \\frac{1}{2}``, ``3/4 == \\frac{3}{4}``, degrees, ``\\$``, ``\\%``, ``k = 5``.
2. **sympy** (:func:`grade_answer_sympy`): a second normaliser (units, ``$``, ``%``, LaTeX to text
   via ``pylatexenc``, thousands commas, case) and then, element by element for tuples:
   fractions ``a/b`` must match as written (so ``2/4`` is not ``1/2``); an integer only matches an
   integer; anything else is equal if sympy simplifies the difference to 0. Expressions with more
   than two distinct letters or big powers never reach sympy, so model output cannot run code or hang.

The answer is the content of the ``\\boxed{...}`` that :func:`last_boxed_only_string` picks: the last
``\\boxed`` in the text, which must be followed by braces (``\\boxed 5`` and ``\\fbox{5}`` give no answer).
"""

from __future__ import annotations

import functools
import re

# --------------------------------------------------------------------------------------------
# Extracting the answer
# --------------------------------------------------------------------------------------------


def last_boxed_only_string(text: str) -> str | None:
    """The last ``\\boxed...{...}`` span (with its balanced braces), else the last ``\\fbox`` one; None if none.

    The span starts at the LAST ``\\boxed``; if no brace group closes after it, there is no answer,
    even when an earlier box was complete.
    """
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for end in range(start, len(text)):
        if text[end] == "{":
            depth += 1
        elif text[end] == "}":
            depth -= 1
            if depth == 0:
                return text[start : end + 1]
    return None


def remove_boxed(span: str | None) -> str | None:
    """``\\boxed{x}`` -> ``x``; None for anything else (``\\fbox{x}``, ``\\boxed x``, None)."""
    if isinstance(span, str) and span.startswith("\\boxed{") and span.endswith("}"):
        return span[len("\\boxed{") : -1]
    return None


def extract_boxed_answer(text: str) -> str | None:
    return remove_boxed(last_boxed_only_string(text))


def extract_answer(text: str) -> str | None:
    """The boxed answer of ``text``, or None when it has no ``\\boxed`` at all."""
    return extract_boxed_answer(text) if "\\boxed" in text else None


# --------------------------------------------------------------------------------------------
# Test 1: Hendrycks' string normaliser (mathd)
# --------------------------------------------------------------------------------------------

_WHOLE_TEXT = re.compile(r"^\\text\{(?P<text>.+?)\}$")


class _Unchanged(Exception):
    """A malformed answer: the mathd normaliser gives it back as it was."""


def _expand_frac_shorthand(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{2}`` -> ``\\frac{1}{2}``; braces already there are kept."""
    head, *pieces = s.split("\\frac")
    out = head
    for piece in pieces:
        out += "\\frac"
        if not piece:
            raise _Unchanged  # "\frac" at the very end
        if piece[0] == "{":
            out += piece
        elif len(piece) < 2:
            return s  # "\frac1": too short to expand; the whole string stays
        elif piece[1] != "{":
            out += "{" + piece[0] + "}{" + piece[1] + "}" + piece[2:]
        else:
            out += "{" + piece[0] + "}" + piece[1:]
    return out


def _expand_sqrt_shorthand(s: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}`` (one character)."""
    head, *pieces = s.split("\\sqrt")
    out = head
    for piece in pieces:
        if not piece:
            raise _Unchanged  # "\sqrt" at the very end
        out += "\\sqrt" + (piece if piece[0] == "{" else "{" + piece[0] + "}" + piece[1:])
    return out


def _slash_to_frac(s: str) -> str:
    """``3/4`` -> ``\\frac{3}{4}`` when both sides are plain integers written canonically."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    return "\\frac{" + str(a) + "}{" + str(b) + "}" if s == f"{a}/{b}" else s


def _hendrycks_strip(s: str) -> str:
    """Hendrycks' MATH ``_strip_string``: a fixed sequence of LaTeX clean-ups; order matters."""
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "")
    if "\\text{ " in s:  # "\text{ cm}" style units on the right
        parts = s.split("\\text{ ")
        if len(parts) != 2:
            raise _Unchanged
        s = parts[0]
    s = s.replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "k = 5" -> " 5"
        s = sides[1]
    s = _expand_sqrt_shorthand(s)
    s = s.replace(" ", "")
    s = _expand_frac_shorthand(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_to_frac(s)


def mathd_normalize_answer(answer: str | None) -> str | None:
    """Hendrycks' normal form of an answer; None stays None, a malformed answer comes back stripped."""
    if answer is None:
        return None
    answer = answer.strip()
    m = _WHOLE_TEXT.search(answer)
    if m is not None:
        answer = m.group("text").strip()
    try:
        return _hendrycks_strip(answer)
    except _Unchanged:
        return answer


def grade_answer_mathd(given_answer: str | None, ground_truth: str | None) -> bool:
    return mathd_normalize_answer(ground_truth) == mathd_normalize_answer(given_answer)


# --------------------------------------------------------------------------------------------
# Test 2: the sympy normaliser and comparison
# --------------------------------------------------------------------------------------------

_UNIT_WORDS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month",
               "year", "foot", "feet", "inch", "yard")
_UNITS = [re.compile(unit + r"(es)?(s)? *(\^[0-9]+)?") for unit in _UNIT_WORDS]
_THOUSANDS_COMMA = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_MIXED_NUMBER = re.compile("([0-9]) +([0-9])")  # "7 3/4" -> "7+3/4"
_FRACTION = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_TUPLE_BRACKETS = "()[]"
_TOO_HARD_FOR_SYMPY = ("^{", "^(")
_BIG_POWERS = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))


def _strip_thousands_commas(expr: str) -> str:
    """``1,000,000`` -> ``1000000``; commas between tuple items stay."""
    while True:
        new = _THOUSANDS_COMMA.sub(r"\1\3\4", expr)
        if new == expr:
            return expr
        expr = new


def _as_float(s: str) -> float | None:
    try:
        return float(s)
    except (ValueError, TypeError):
        return None


def _is_whole(x: float) -> bool:
    try:
        return abs(x - round(x)) <= 1e-7
    except (ValueError, OverflowError):  # nan, inf
        return False


def _str_is_int(s: str) -> bool:
    x = _as_float(_strip_thousands_commas(s))
    return x is not None and _is_whole(x)


@functools.lru_cache(maxsize=1)
def _latex_to_text_converter():
    from pylatexenc import latex2text

    return latex2text.LatexNodes2Text()


def _latex_to_text(expr: str) -> str:
    """LaTeX -> plain text sympy can read (``\\frac{1}{2}`` -> ``1/2``, ``\\sqrt{2}`` -> ``sqrt(2)``)."""
    expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac")
    expr = expr.replace("\\frac", " \\frac")  # keeps a mixed number "1\frac{1}{2}" apart
    expr = _latex_to_text_converter().latex_to_text(expr)
    for symbol, name in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*")):
        expr = expr.replace(symbol, name)
    return expr.strip()


def sympy_normalize(expr: str | None) -> str | None:
    """The sympy path's normal form: lower-case text without units, ``$``, ``%``, braces or spaces."""
    if expr is None:
        return None
    m = _WHOLE_TEXT.search(expr)
    if m is not None:
        expr = m.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    expr = expr.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12")
    for unit in _UNITS:
        expr = unit.sub("", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    value = _as_float(expr)
    if value is not None and _is_whole(value):
        expr = str(round(value))
    if "\\" in expr:
        try:
            expr = _latex_to_text(expr)
        except Exception:  # noqa: BLE001,S110 - pylatexenc gives up on malformed LaTeX: keep the text as it is
            pass
    expr = re.sub("- *", "-", expr)
    expr = _MIXED_NUMBER.sub(r"\1+\2", expr)
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _str_is_int(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _split_tuple(expr: str) -> list[str]:
    """``(1,2)`` -> ["1", "2"]; anything that is not one flat bracketed list is a single element."""
    expr = _strip_thousands_commas(expr)
    if not expr:
        return []
    inner = expr[1:-1]
    if (len(expr) > 2 and expr[0] in _TUPLE_BRACKETS and expr[-1] in _TUPLE_BRACKETS
            and not any(ch in inner for ch in _TUPLE_BRACKETS)):
        return [item.strip() for item in inner.split(",")]
    return [expr]


def _safe_for_sympy(expr: str) -> bool:
    """At most two distinct letters (besides sqrt/frac) and no big or nested powers: no prose, no hangs."""
    letters = {ch for ch in expr.replace("sqrt", "").replace("frac", "") if ch.isalpha()}
    if len(letters) > 2:
        return False
    if any(bad in expr for bad in _TOO_HARD_FOR_SYMPY):
        return False
    return not any(p.search(expr) for p in _BIG_POWERS)


@functools.lru_cache(maxsize=1)
def _sympy_namespace() -> dict:
    import sympy

    # sympy's public names and no builtins: names like Integer that the parser emits still resolve
    return {"__builtins__": {}, **{k: v for k, v in vars(sympy).items() if not k.startswith("_")}}


def _equal_under_sympy(ground_truth: str, given: str) -> bool:
    expr = f"({ground_truth})-({given})"
    if not _safe_for_sympy(expr):
        return False
    try:
        import sympy
        from sympy.parsing import sympy_parser

        difference = sympy_parser.parse_expr(
            expr.replace("^", "**"),
            local_dict={},
            global_dict=_sympy_namespace(),
            transformations=sympy_parser.standard_transformations
            + (sympy_parser.implicit_multiplication_application,),
        )
        return sympy.simplify(difference) == 0
    except Exception:  # noqa: BLE001 - unparsable or unsimplifiable (sympy raises many kinds): not equal
        return False


def grade_answer_sympy(given_answer: str, ground_truth: str | None) -> bool:
    truth, given = sympy_normalize(ground_truth), sympy_normalize(given_answer)
    if truth is None or given is None:
        return False
    if truth == given:
        return True
    if not given:
        return False
    truth_items, given_items = _split_tuple(truth), _split_tuple(given)
    if len(truth_items) > 1 and (truth[0] != given[0] or truth[-1] != given[-1]):
        return False  # (1,2) is not [1,2]
    if len(truth_items) != len(given_items):
        return False
    for t, g in zip(truth_items, given_items):
        if _FRACTION.search(t) and _FRACTION.search(g):
            ok = t == g  # an unreduced fraction is a wrong answer: no simplification here
        elif _str_is_int(t) != _str_is_int(g):
            ok = False  # an integer answer must be given as an integer
        else:
            ok = _equal_under_sympy(t, g)
        if not ok:
            return False
    return True


# --------------------------------------------------------------------------------------------
# The whole check
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8192)  # pure; a rollout grades the same labels and answers many times
def answers_equal(given: str, ground_truth: str | None) -> bool:
    """mathd or sympy: True if ``given`` (already out of its box) is the reference answer."""
    return grade_answer_mathd(given, ground_truth) or grade_answer_sympy(given, ground_truth)


def reference_answer(label) -> str | None:
    """The label as text; a label with a ``\\boxed`` (a full solution) is reduced to its box (maybe None)."""
    label = str(label)
    return extract_answer(label) if "\\boxed" in label else label


def grade_answer_verl(solution: str, ground_truth) -> bool:
    """slime's ``math`` rule: the boxed answer of ``solution`` against ``ground_truth``.

    A falsy label (None, "", and also the integer 0, as in slime) never matches.
    """
    if not ground_truth:
        return False
    given = extract_answer(solution)
    if given is None:
        return False
    return answers_equal(given, reference_answer(ground_truth))
