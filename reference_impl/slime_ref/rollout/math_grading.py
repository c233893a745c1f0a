"""Deciding whether a model's math answer equals the reference answer.

Used by the ``math``, ``deepscaler`` and ``boxed_*`` rewards. Three tests, cheapest first:

1. the normalised strings are equal (LaTeX noise, units, ``x =``, thousands commas, spaces removed);
2. both are exact rationals (``1/2``, ``0.5``, ``\\frac{1}{2}``, ``-3``, ``2.50``) with equal value;
3. both parse as small symbolic expressions (``\\sqrt{8}`` vs ``2\\sqrt{2}``) whose difference
   simplifies to 0. Only a whitelisted alphabet reaches the parser, so model output cannot run code.

Tuples and intervals (``(1, 2)``) compare element by element with the same brackets.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

# --------------------------------------------------------------------------------------------
# Extracting the answer
# --------------------------------------------------------------------------------------------


def last_boxed_answer(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``) in ``text``; None if absent."""
    if not isinstance(text, str):
        return None
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start:].removeprefix("\\boxed").removeprefix("\\fbox")
    if rest.startswith(" "):  # "\boxed 5": the answer runs to the next space or "$"
        return rest.split()[0].split("$")[0] if rest.strip() else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return rest[1:i]
    return None  # unbalanced braces: the box never closes


_ANSWER_PHRASE = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*(.+?)\s*\.?\s*$", re.IGNORECASE | re.DOTALL)


# --------------------------------------------------------------------------------------------
# Normalising
# --------------------------------------------------------------------------------------------

_DELETE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "~", "^{\\circ}", "^\\circ", "\\circ", "°",
           "\\%", "%", "\\$", "$", "{,}", "\\displaystyle", "<|im_end|>", "<|endoftext|>")
_UNIT_WORDS = ("degrees", "degree", "units", "unit", "cm", "meters", "meter", "inches", "feet", "hours", "minutes",
               "seconds", "dollars", "cents")


def _unwrap_command(text: str, command: str) -> str:
    """``\\text{abc}`` -> ``abc`` for every occurrence of ``command`` (braces balanced, innermost first)."""
    pattern = re.compile(re.escape(command) + r"\{([^{}]*)\}")
    while True:
        new = pattern.sub(r"\1", text)
        if new == text:
            return text
        text = new


@functools.lru_cache(maxsize=8192)  # pure, and a rollout grades the same labels and answers many times
def normalize_answer(answer: str) -> str:
    """A canonical string form of a short math answer (see the module docstring)."""
    s = str(answer).strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right) and len(s) > len(left) + len(right):
            s = s[len(left) : -len(right)].strip()
    # a trailing \text{...} after a number is a unit: "5 \text{ cm}" -> "5"
    s = re.sub(r"(\d)\s*\\(?:text|mbox|mathrm)\{[^{}]*\}\s*$", r"\1", s)
    for command in ("\\text", "\\textbf", "\\mathrm", "\\mbox", "\\mathbf", "\\boxed"):
        s = _unwrap_command(s, command)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for noise in _DELETE:
        s = s.replace(noise, "")
    s = s.strip().rstrip(".").strip()
    # "x = 5", "k=3" -> "5"
    s = re.sub(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*", "", s)
    s = re.sub(r"(?<=\d)\s*(?:" + "|".join(_UNIT_WORDS) + r")\b\.?$", "", s)
    # \frac12 -> \frac{1}{2}, \frac1{2} -> \frac{1}{2}, \sqrt2 -> \sqrt{2}
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\sqrt(\d+)", r"\\sqrt{\1}", s)
    # 1,000,000 -> 1000000 (only well-formed thousands groups, so tuples keep their commas)
    s = re.sub(r"(?<![\d.])(\d{1,3}(?:,\d{3})+)(?![\d,])", lambda m: m.group(1).replace(",", ""), s)
    s = re.sub(r"\s+", "", s)
    while s.startswith("{") and s.endswith("}") and _balanced(s[1:-1]):
        s = s[1:-1]
    if s.startswith("."):
        s = "0" + s
    return s.lower()


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


# --------------------------------------------------------------------------------------------
# Comparing
# --------------------------------------------------------------------------------------------

_INT_OR_DECIMAL = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)$")
_SLASH = re.compile(r"^([-+]?\d+)/([-+]?\d+)$")
_FRAC = re.compile(r"^([-+]?)\\frac\{([-+]?\d+)\}\{([-+]?\d+)\}$")


def to_rational(s: str) -> Fraction | None:
    """Exact value of a normalised integer, decimal or simple fraction; None for anything else."""
    try:
        if _INT_OR_DECIMAL.match(s):
            return Fraction(s)
        if m := _SLASH.match(s):
            return Fraction(int(m[1]), int(m[2]))
        if m := _FRAC.match(s):
            value = Fraction(int(m[2]), int(m[3]))
            return -value if m[1] == "-" else value
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _split_tuple(s: str) -> tuple[str, list[str]] | None:
    """``(1,2)`` -> ("()", ["1", "2"]) when s is a bracketed list with top-level commas."""
    if len(s) < 3 or s[0] not in "([" or s[-1] not in ")]":
        return None
    items, depth, current = [], 0, ""
    for ch in s[1:-1]:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    items.append(current)
    return (s[0] + s[-1], items) if len(items) > 1 else None


_SYMPY_FUNCTIONS = ("sqrt", "pi", "oo", "log", "ln", "sin", "cos", "tan", "exp")
_SAFE_SYMPY_TEXT = re.compile(r"^[0-9a-z+\-*/().,\s]*$")


def _latex_to_sympy_text(s: str) -> str | None:
    """Rewrite a normalised answer in sympy syntax; None if it uses anything else."""
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\pi", "pi").replace("\\infty", "oo")
    s = s.replace("\\ln", "ln").replace("\\log", "log")
    for _ in range(10):  # innermost first, so nested fractions and roots resolve
        new = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", s)
        new = re.sub(r"\\sqrt\[([^{}\[\]]*)\]\{([^{}]*)\}", r"((\2)**(1/(\1)))", new)
        new = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", new)
        if new == s:
            break
        s = new
    s = s.replace("^", "**").replace("{", "(").replace("}", ")")
    if "\\" in s or not _SAFE_SYMPY_TEXT.match(s) or len(s) > 100:
        return None
    words = set(re.findall(r"[a-z]+", s))
    if any(len(w) > 1 and w not in _SYMPY_FUNCTIONS for w in words):
        return None  # prose, not an expression
    if re.search(r"\*\*\s*\(?\s*\d{3,}", s) or s.count("**") > 3:
        return None  # huge powers can make sympy spin
    return s


def _sympy_equal(a: str, b: str) -> bool:
    ta, tb = _latex_to_sympy_text(a), _latex_to_sympy_text(b)
    if ta is None or tb is None:
        return False
    import sympy
    from sympy.parsing.sympy_parser import implicit_multiplication_application, parse_expr, standard_transformations

    names = {
        "sqrt": sympy.sqrt, "pi": sympy.pi, "oo": sympy.oo, "log": sympy.log, "ln": sympy.log,
        "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "exp": sympy.exp,
        "Integer": sympy.Integer, "Float": sympy.Float, "Rational": sympy.Rational, "Symbol": sympy.Symbol,
    }
    transformations = standard_transformations + (implicit_multiplication_application,)
    try:
        ea = parse_expr(ta, local_dict={}, global_dict={"__builtins__": {}, **names}, transformations=transformations)
        eb = parse_expr(tb, local_dict={}, global_dict={"__builtins__": {}, **names}, transformations=transformations)
        return bool(sympy.simplify(ea - eb) == 0)
    except Exception:  # unparsable or unsimplifiable: not shown equal
        return False


@functools.lru_cache(maxsize=8192)  # pure; spares repeated sympy work on the same pairs
def answers_equal(given: str, reference: str) -> bool:
    """True if ``given`` and ``reference`` are the same math answer."""
    a, b = normalize_answer(given), normalize_answer(reference)
    if not a or not b:
        return False
    if a == b:
        return True
    ta, tb = _split_tuple(a), _split_tuple(b)
    if ta or tb:
        return bool(ta and tb and ta[0] == tb[0] and len(ta[1]) == len(tb[1])
                    and all(answers_equal(x, y) for x, y in zip(ta[1], tb[1])))
    ra, rb = to_rational(a), to_rational(b)
    if ra is not None and rb is not None:
        return ra == rb
    return _sympy_equal(a, b)
