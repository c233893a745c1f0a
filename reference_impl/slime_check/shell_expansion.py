"""Word expansion in a launch script: what bash would make of one word, without running anything.

A word's value is kept as parts: literal text, and :class:`Sym` for what cannot be known without
running a command (``$(nvidia-smi ...)``, a variable the script expects from the environment). The
:class:`Expander` holds the script's variables and performs quote removal, parameter expansion
(``$VAR``, ``${VAR:-default}``, ``"${ARR[@]}"``), integer arithmetic, the few command substitutions
scripts use to find their own folder, and field splitting. :mod:`slime_check.launch_script` builds
its reader on it.
"""

from __future__ import annotations

import ast
import operator
import os
import re
from dataclasses import dataclass
from pathlib import Path

from slime_check.shell_syntax import NAME, matching


@dataclass(frozen=True)
class Origin:
    file: str
    line: int

    def __str__(self):
        return f"{Path(self.file).name}:{self.line}"


@dataclass(frozen=True)
class Sym:
    """A piece of a word whose value cannot be known without running something."""

    text: str


@dataclass
class Word:
    parts: list  # str and Sym
    origin: Origin

    @property
    def known(self) -> bool:
        return all(isinstance(p, str) for p in self.parts)

    @property
    def text(self) -> str:
        return "".join(p if isinstance(p, str) else p.text for p in self.parts)

    @property
    def literal_prefix(self) -> str:
        """The literal text before the first symbolic part."""
        out = []
        for p in self.parts:
            if not isinstance(p, str):
                break
            out.append(p)
        return "".join(out)


UNKNOWN = object()  # a variable the script sets to something that cannot be known

ARITH_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
             ast.Div: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.LShift: operator.lshift,
             ast.RShift: operator.rshift}


def arithmetic(expr: str) -> int | None:
    """Integer value of a bash arithmetic expression made of numbers and + - * / % ** << >>."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        return None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = ev(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in ARITH_OPS:
            return ARITH_OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(node)

    try:
        return ev(tree)
    except (ValueError, ZeroDivisionError, TypeError, OverflowError):
        return None


def merge(parts: list) -> list:
    """Join neighbouring literal parts."""
    out: list = []
    for p in parts:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
        elif p != "":
            out.append(p)
    return out


class Expander:
    """The variables of a script being read, and the expansion of words against them."""

    def __init__(self, env: dict[str, str]):
        self.vars: dict[str, object] = {k: [v] for k, v in env.items()}
        self.files: list[Path] = []  # the file being read, innermost last

    @property
    def here(self) -> Path:
        return self.files[-1]

    def lookup(self, name: str):
        """A variable's value: a list of parts, a list of Words (array), UNKNOWN, or None if unset."""
        if name in self.vars:
            return self.vars[name]
        if name == "BASH_SOURCE":
            return [str(self.here)]
        return None

    def scalar_parts(self, name: str, origin: Origin) -> list:
        value = self.lookup(name)
        if value is None or value is UNKNOWN:
            return [Sym(f"${{{name}}}")]
        if value and isinstance(value[0], Word):
            return list(value[0].parts) if value else []
        return list(value)

    def expand_param(self, body: str, quoted: bool, origin: Origin):
        """``${body}``: parts, or ("array", [Word]) for ``${A[@]}``."""
        match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[([@*])\]", body)
        if match:
            value = self.lookup(match.group(1))
            if value is UNKNOWN:
                return [Sym(f"${{{body}}}")]
            if value is None:
                return ("array", [])  # an unset array expands to nothing (the environment holds no arrays)
            words = value if value and isinstance(value[0], Word) else [Word(list(value), origin)]
            if match.group(2) == "*" and quoted:
                joined: list = []
                for k, w in enumerate(words):
                    joined += ([" "] if k else []) + list(w.parts)
                return joined
            return ("array", words)
        match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[(\d+)\]", body)
        if match:
            value = self.lookup(match.group(1))
            index = int(match.group(2))
            if isinstance(value, list) and value and isinstance(value[0], Word):
                return list(value[index].parts) if index < len(value) else []
            if match.group(1) == "BASH_SOURCE" and index == 0:
                return [str(self.here)]
            return [Sym(f"${{{body}}}")] if index else self.scalar_parts(match.group(1), origin)
        match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(:?[-=+?])(.*)", body, re.DOTALL)
        if match:
            name, op, word = match.groups()
            value = self.lookup(name)
            if value is UNKNOWN:
                return [Sym(f"${{{body}}}")]
            parts = None if value is None else self.scalar_parts(name, origin)
            empty = parts is not None and all(isinstance(p, str) for p in parts) and "".join(parts) == ""
            unset = parts is None or (op.startswith(":") and empty)
            if op.endswith(("-", "?")):
                return self.expand_text(word, origin, quoted=True) if unset and op.endswith("-") else (parts or [])
            if op.endswith("="):
                if unset:
                    new = self.expand_text(word, origin, quoted=True)
                    self.vars[name] = new
                    return new
                return parts
            return self.expand_text(word, origin, quoted=True) if not unset else []  # :+
        if NAME.fullmatch(body):
            return self.scalar_parts(body, origin)
        return [Sym(f"${{{body}}}")]

    def command_substitution(self, inner: str) -> list:
        """``$(dirname X)`` and ``$(cd X && pwd)`` (how scripts find their own folder), ``$(basename X)``
        of a known word (how scripts name a dataset's local folder); else symbolic."""
        origin = Origin(str(self.here), 0)
        basename = re.fullmatch(r"\s*basename\s+(?:--\s+)?(\S+?)(?:\s+(\S+))?\s*", inner, re.DOTALL)
        if basename:
            words = self.expand_word(basename.group(1), origin)
            suffixes = self.expand_word(basename.group(2), origin) if basename.group(2) else []
            if len(words) == 1 and words[0].known and all(w.known for w in suffixes) and len(suffixes) <= 1:
                # POSIX basename: trailing slashes go, then the last component, then the suffix
                name = words[0].text.rstrip("/").rsplit("/", 1)[-1] or ("/" if words[0].text else "")
                if suffixes and name.endswith(suffixes[0].text) and name != suffixes[0].text:
                    name = name[: -len(suffixes[0].text)]
                return [name]
        dirname = re.fullmatch(r"\s*dirname\s+(?:--\s+)?(.+?)\s*", inner, re.DOTALL)
        cd_pwd = re.fullmatch(r"\s*cd\s+(?:--\s+)?(.+?)\s*(?:(?:&>|2?>)\s*/dev/null\s*(?:2>&1\s*)?)?&&\s*pwd\s*",
                              inner, re.DOTALL)
        match = dirname or cd_pwd
        if match:
            words = self.expand_word(match.group(1), origin)
            if len(words) == 1 and words[0].known and words[0].text.startswith("/"):
                path = Path(words[0].text)
                return [str(path.parent) if dirname else str(Path(os.path.normpath(path)))]
        return [Sym(f"$({inner.strip()[:60]})")]

    def arithmetic_expansion(self, inner: str, origin: Origin) -> list:
        expanded = []
        for part in self.expand_text(inner, origin, quoted=True):
            if not isinstance(part, str):
                return [Sym(f"$(({inner}))")]
            expanded.append(part)
        text = re.sub(r"\b[A-Za-z_][A-Za-z0-9_]*\b", lambda m: self.arith_var(m.group(0)), "".join(expanded))
        value = arithmetic(text) if "?" not in text else None
        return [str(value)] if value is not None else [Sym(f"$(({inner}))")]

    def arith_var(self, name: str) -> str:
        parts = self.scalar_parts(name, Origin("", 0))
        text = "".join(p for p in parts if isinstance(p, str)) if all(isinstance(p, str) for p in parts) else "?"
        return text if re.fullmatch(r"-?\d+", text) else "?"

    def expand_text(self, text: str, origin: Origin, quoted: bool = True) -> list:
        """Parts of ``text`` expanded without field splitting (assignments, defaults, tests)."""
        words = self.expand_word(text, origin, split=False)
        parts: list = []
        for k, w in enumerate(words):
            parts += ([" "] if k else []) + list(w.parts)
        return parts

    def expand_word(self, raw: str, origin: Origin, split: bool = True) -> list[Word]:
        """Expand one raw word into zero or more words: quote removal, parameter and arithmetic
        expansion, arrays, and (when ``split``) field splitting of unquoted expansions."""
        words: list[tuple[list, Origin]] = []
        cur: list = []
        cur_origin: Origin | None = None  # where an array element was written, for its words
        has_content = False  # a quoted "" still makes a word
        i, n = 0, len(raw)

        def flush():
            nonlocal cur, has_content, cur_origin
            if cur or has_content:
                words.append((cur, cur_origin or origin))
            cur, has_content, cur_origin = [], False, None

        def add(parts: list, quoted: bool, source: Origin | None = None):
            """Add expanded parts; unquoted literal text is split into fields."""
            nonlocal cur_origin
            for p in parts:
                if isinstance(p, str) and split and not quoted:
                    for k, piece in enumerate(re.split(r"[ \t\n]+", p)):
                        if k:
                            flush()
                        if piece:
                            cur_origin = cur_origin if cur else source
                            cur.append(piece)
                else:
                    cur_origin = cur_origin if cur else source
                    cur.append(p)

        def add_array(items: list[Word], quoted: bool):
            nonlocal has_content
            for k, w in enumerate(items):
                if k:
                    if split:
                        flush()
                        has_content = quoted
                    else:
                        cur.append(" ")
                add(list(w.parts), quoted, w.origin)
                has_content = has_content or (quoted and not w.parts)

        def dollar(j: int, quoted: bool) -> int:
            """Expand the $-construct at raw[j]; return the index after it."""
            if raw.startswith("$((", j):
                end = matching(raw, j + 1, "((", "))")
                add(self.arithmetic_expansion(raw[j + 3 : end - 2], origin), quoted)
                return end
            if raw.startswith("$(", j):
                end = matching(raw, j + 1, "(", ")")
                cur.extend(self.command_substitution(raw[j + 2 : end - 1]))
                return end
            if raw.startswith("${", j):
                end = matching(raw, j + 1, "{", "}")
                result = self.expand_param(raw[j + 2 : end - 1], quoted, origin)
                if isinstance(result, tuple):
                    add_array(result[1], quoted)
                else:
                    add(result, quoted)
                return end
            m = re.match(r"\$([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-])", raw[j:])
            if not m:
                cur.append("$")
                return j + 1
            name = m.group(1)
            add(self.scalar_parts(name, origin) if NAME.fullmatch(name) else [Sym(f"${name}")], quoted)
            return j + len(m.group(0))

        while i < n:
            c = raw[i]
            if c == "'":
                end = raw.find("'", i + 1)
                end = n if end < 0 else end
                cur.append(raw[i + 1 : end])
                has_content = True
                i = end + 1
            elif c == '"':
                # "${EMPTY[@]}" gives no word at all; any other quoted text gives one, even "".
                before, only_arrays = has_content, True
                has_content = True
                i += 1
                while i < n and raw[i] != '"':
                    if raw[i] == "\\" and i + 1 < n and raw[i + 1] in '$`"\\\n':
                        cur.append(raw[i + 1] if raw[i + 1] != "\n" else "")
                        i += 2
                    elif raw[i] == "$":
                        only_arrays &= bool(re.match(r"\$\{[A-Za-z_][A-Za-z0-9_]*\[@\]\}", raw[i:]))
                        i = dollar(i, True)
                    elif raw[i] == "`":
                        end = raw.find("`", i + 1)
                        cur.append(Sym(raw[i : end + 1]))
                        i = end + 1 if end > 0 else n
                        only_arrays = False
                    else:
                        cur.append(raw[i])
                        i += 1
                        only_arrays = False
                i += 1
                if only_arrays and not cur:
                    has_content = before
            elif c == "\\" and i + 1 < n:
                cur.append(raw[i + 1] if raw[i + 1] != "\n" else "")
                i += 2
            elif c == "$":
                i = dollar(i, False)
            elif c == "`":
                end = raw.find("`", i + 1)
                cur.append(Sym(raw[i : end + 1]))
                i = end + 1 if end > 0 else n
            else:
                cur.append(c)
                i += 1
        flush()
        return [Word(merge(parts), where) for parts, where in words]

