"""Read a slime launch script the way bash would, far enough to recover the ``train.py`` argv.

slime's scripts (``scripts/run-*.sh``) build the command line from bash arrays
(``MODEL_ARGS=( ... )`` in a sourced ``scripts/models/*.sh``, ``CKPT_ARGS=( ... )``...) and expand
them into ``ray job submit ... -- python3 train.py ${MODEL_ARGS[@]} ...``. This module is a small,
safe interpreter for that subset of bash. It never runs a command:

* assignments (scalars, arrays, ``+=``, ``export``), ``source``/``.`` (relative to the script, then
  to the slime checkout), ``unset``;
* quoting, escapes, line continuations, comments and heredocs;
* ``$VAR``, ``${VAR}``, ``${VAR:-default}`` and friends, ``"${ARR[@]}"``, ``$(( arithmetic ))``,
  and the ``SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)`` idiom;
* ``if`` with simple ``[ ... ]`` tests. When a test cannot be decided, every branch is read and a
  variable the branches disagree on becomes unknown; loops work the same way.

What cannot be known (other command substitutions, variables the script expects from the
environment) stays symbolic: a :class:`Word` keeps such parts as :class:`Sym` and reports
``known == False``. Variables come only from the script and from ``env`` given by the caller.
"""

from __future__ import annotations

import ast
import json
import operator
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

ENTRY_POINTS = ("train.py", "train_async.py")
# slime-ref's commands take the same flags as slime's entry points
SLIME_REF_ENTRY_POINTS = {"train": "train.py", "train-async": "train_async.py"}
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
OPERATORS = ("&&", "||", ";;", ";", "|", "&", "(", ")")
REDIRECT = re.compile(r"(\d*)(<<<|<<-|<<|&>>|&>|>>|>&|<&|>\||>|<)")
KEYWORDS_END = {"then", "fi", "else", "elif", "do", "done", "esac", "}", ")"}


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


@dataclass
class Invocation:
    entry: str  # "train.py" or "train_async.py"
    argv: list[Word]
    origin: Origin
    conditional: bool  # found inside an undecided branch or a loop
    env: dict[str, str] = field(default_factory=dict)  # variables the script exported, where known
    env_unknown: list[str] = field(default_factory=list)  # runtime-env variables whose values cannot be known


@dataclass
class Orphan:
    """A command that starts with a flag after a train invocation: almost always a line whose
    predecessor lost its trailing backslash, so its flags never reach train.py."""

    words: list[Word]
    origin: Origin


@dataclass
class ScriptReading:
    invocations: list[Invocation] = field(default_factory=list)
    orphans: list[Orphan] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # things the reader could not follow
    sourced: list[str] = field(default_factory=list)
    substituted: list[str] = field(default_factory=list)  # another machine's path read from --slime-dir


class ScriptError(Exception):
    """The script cannot be read at all (missing file, unbalanced quotes)."""


# ---------------------------------------------------------------------------------------------
# Lexing: source text -> tokens (word boundaries only; words are interpreted when expanded)
# ---------------------------------------------------------------------------------------------


@dataclass
class Token:
    kind: str  # "word", "nl", "op", "array", "arith"
    text: str
    line: int
    elements: list[Token] = field(default_factory=list)  # for "array"


class Lexer:
    def __init__(self, text: str, file: str):
        self.s = text
        self.i = 0
        self.line = 1
        self.file = file
        self.pending_heredocs: list[tuple[str, bool]] = []

    def error(self, message: str):
        raise ScriptError(f"{self.file}:{self.line}: {message}")

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def advance(self, n: int = 1) -> str:
        chunk = self.s[self.i : self.i + n]
        self.line += chunk.count("\n")
        self.i += n
        return chunk

    def skip_filler(self, newlines: bool) -> bool:
        """Skip a blank, a line continuation or a comment (and a newline if asked); False if none."""
        c = self.peek()
        if c in " \t" or (newlines and c == "\n"):
            self.advance()
        elif c == "\\" and self.peek(1) == "\n":
            self.advance(2)
        elif c == "#":
            while self.i < len(self.s) and self.peek() != "\n":
                self.advance()
        else:
            return False
        return True

    def tokens(self) -> list[Token]:
        out: list[Token] = []
        while self.i < len(self.s):
            c = self.peek()
            if self.skip_filler(newlines=False):
                continue
            if c == "\n":
                out.append(Token("nl", "\n", self.line))
                self.advance()
                self.read_heredoc_bodies()
            elif (
                c == "("
                and self.peek(1) == "("
                and (not out or out[-1].kind in ("nl", "op") or out[-1].text in ("for", "if", "while", "!"))
            ):
                start = self.line
                out.append(Token("arith", self.read_balanced("((", "))"), start))
            elif REDIRECT.match(self.s, self.i):
                self.read_redirect()
            elif any(self.s.startswith(op, self.i) for op in OPERATORS):
                op = next(op for op in OPERATORS if self.s.startswith(op, self.i))
                out.append(Token("op", op, self.line))
                self.advance(len(op))
            else:
                start = self.line
                word = self.read_word()
                if ASSIGN.match(word) and word.endswith("=") and self.peek() == "(":
                    out.append(self.read_array(word, start))
                else:
                    out.append(Token("word", word, start))
        out.append(Token("nl", "\n", self.line))
        return out

    def read_redirect(self):
        match = REDIRECT.match(self.s, self.i)
        self.advance(len(match.group(0)))
        op = match.group(2)
        while self.peek() in " \t":
            self.advance()
        if op in ("<<", "<<-"):
            raw = self.read_word()
            delimiter = re.sub(r"""['"\\]""", "", raw)
            self.pending_heredocs.append((delimiter, op == "<<-"))
        elif self.i < len(self.s) and self.peek() not in "\n;&|":
            self.read_word()  # the redirection target: not part of the command

    def read_heredoc_bodies(self):
        for delimiter, strip_tabs in self.pending_heredocs:
            while self.i < len(self.s):
                end = self.s.find("\n", self.i)
                end = len(self.s) if end < 0 else end
                line = self.s[self.i : end]
                self.advance(end - self.i + 1)
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    break
        self.pending_heredocs = []

    def read_balanced(self, opener: str, closer: str) -> str:
        """From ``opener`` to its matching ``closer`` (quotes and nesting respected)."""
        start = self.i
        self.advance(len(opener))
        depth = 1
        while depth:
            if self.i >= len(self.s):
                self.error(f"unterminated {opener}")
            c = self.peek()
            if self.s.startswith(closer, self.i):
                depth -= 1
                self.advance(len(closer))
                continue
            if self.s.startswith(opener, self.i):
                depth += 1
                self.advance(len(opener))
            elif self.skip_quoted():
                pass
            elif c == "<" and self.peek(1) == "<" and opener == "$(":
                self.read_redirect()
            elif c == "\n":
                self.advance()
                self.read_heredoc_bodies()
            elif c == "#" and opener == "$(" and (self.i == 0 or self.s[self.i - 1] in " \t\n"):
                while self.i < len(self.s) and self.peek() != "\n":
                    self.advance()
            else:
                self.advance()
        return self.s[start : self.i]

    def skip_quoted(self) -> bool:
        """Skip an escape, a quoted string or a $( ) / ${ } / backquote expansion; False if none."""
        c = self.peek()
        if c == "\\":
            self.advance(2)
        elif c == "'":
            self.skip_single_quoted()
        elif c == '"':
            self.skip_double_quoted()
        elif c == "`":
            self.skip_backquoted()
        elif c == "$" and self.peek(1) in "({":
            self.skip_dollar()
        else:
            return False
        return True

    def skip_single_quoted(self):
        end = self.s.find("'", self.i + 1)
        if end < 0:
            self.error("unterminated single quote")
        self.advance(end + 1 - self.i)

    def skip_double_quoted(self):
        self.advance()
        while True:
            if self.i >= len(self.s):
                self.error("unterminated double quote")
            c = self.peek()
            if c == "\\":
                self.advance(2)
            elif c == '"':
                self.advance()
                return
            elif c == "$" and self.peek(1) in "({":
                self.skip_dollar()
            elif c == "`":
                self.skip_backquoted()
            else:
                self.advance()

    def skip_backquoted(self):
        self.advance()
        while self.i < len(self.s) and self.peek() != "`":
            self.advance(2 if self.peek() == "\\" else 1)
        self.advance()

    def skip_dollar(self):
        if self.s.startswith("$((", self.i):
            self.read_balanced("$((", "))")
        elif self.s.startswith("$(", self.i):
            self.read_balanced("$(", ")")
        else:
            self.read_balanced("${", "}")

    def read_word(self) -> str:
        start = self.i
        while self.i < len(self.s):
            c = self.peek()
            if c in " \t\n;&|()<>":
                if c == "(" and self.i > start and self.s[start : self.i].endswith("="):
                    break  # NAME=( array
                if c in "<>" and self.i == start:
                    self.advance()
                    continue
                break
            if not self.skip_quoted():
                self.advance()
        return self.s[start : self.i]

    def read_array(self, head: str, line: int) -> Token:
        self.advance()  # "("
        elements = []
        while True:
            if self.i >= len(self.s):
                self.error(f"unterminated array {head}(")
            if self.skip_filler(newlines=True):
                continue
            if self.peek() == ")":
                self.advance()
                return Token("array", head, line, elements)
            else:
                start = self.line
                elements.append(Token("word", self.read_word(), start))
                if self.i < len(self.s) and self.peek() in ";&|(<>":
                    self.advance()  # stray operator inside an array: not valid bash, skip it


# ---------------------------------------------------------------------------------------------
# Parsing: tokens -> a tree of commands
# ---------------------------------------------------------------------------------------------


@dataclass
class Simple:
    tokens: list[Token]  # words and array assignments, in order
    line: int


@dataclass
class If:
    clauses: list[tuple[list, list]]  # (condition nodes, body nodes)
    orelse: list | None
    line: int


@dataclass
class Loop:
    body: list
    line: int


@dataclass
class Group:
    body: list
    line: int


@dataclass
class Opaque:
    """A construct the reader does not follow (``case``)."""

    what: str
    line: int
    assigned: list[str]  # variables assigned inside: unknown after it


@dataclass
class FuncDef:
    name: str
    body: list


class Parser:
    def __init__(self, tokens: list[Token], file: str):
        self.t = tokens
        self.i = 0
        self.file = file

    def peek(self) -> Token | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def at_word(self, *texts: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind == "word" and tok.text in texts

    def expect_word(self, text: str):
        self.skip_separators()
        if not self.at_word(text):
            tok = self.peek()
            where = tok.line if tok else "end"
            raise ScriptError(f"{self.file}:{where}: expected '{text}'")
        self.i += 1

    def skip_separators(self):
        while self.peek() is not None and (self.peek().kind == "nl" or self.peek().text in (";", "&", "&&", "||", "|")):
            self.i += 1

    def parse_list(self, stop: set[str]) -> list:
        nodes = []
        while True:
            self.skip_separators()
            tok = self.peek()
            if tok is None or (tok.kind == "word" and tok.text in stop) or (tok.kind == "op" and tok.text in stop):
                return nodes
            start = self.i
            node = self.parse_command()
            if node is not None:
                nodes.append(node)
            elif self.i == start:
                raise ScriptError(f"{self.file}:{tok.line}: unexpected '{tok.text}'")

    def parse_command(self):
        tok = self.peek()
        if tok.kind == "word" and tok.text == "if":
            return self.parse_if()
        if tok.kind == "word" and tok.text in ("for", "while", "until", "select"):
            line = tok.line
            self.i += 1
            while not self.at_word("do"):
                if self.peek() is None:
                    raise ScriptError(f"{self.file}:{line}: 'do' missing")
                self.i += 1
            self.i += 1
            body = self.parse_list({"done"})
            self.expect_word("done")
            return Loop(body, line)
        if tok.kind == "word" and tok.text == "case":
            line = tok.line
            depth = 0
            assigned = []
            while True:  # skipped whole: the reader notes it and forgets what the block assigns
                cur = self.peek()
                if cur is None:
                    raise ScriptError(f"{self.file}:{line}: 'esac' missing")
                if cur.kind == "word" and cur.text == "case":
                    depth += 1
                if cur.kind == "word" and cur.text == "esac":
                    depth -= 1
                    if depth == 0:
                        self.i += 1
                        return Opaque("case", line, assigned)
                if cur.kind in ("word", "array") and ASSIGN.match(cur.text):
                    assigned.append(ASSIGN.match(cur.text).group(1))
                self.i += 1
        if tok.kind == "word" and tok.text == "{":
            self.i += 1
            body = self.parse_list({"}"})
            self.expect_word("}")
            return Group(body, tok.line)
        if tok.kind == "op" and tok.text == "(":
            self.i += 1
            body = self.parse_list({")"})
            self.i += 1
            return Group(body, tok.line)
        if tok.kind == "word" and tok.text == "function":
            self.i += 1
        return self.parse_simple()

    def parse_if(self) -> If:
        line = self.peek().line
        self.i += 1
        clauses = []
        cond = self.parse_list({"then"})
        self.expect_word("then")
        body = self.parse_list({"elif", "else", "fi"})
        clauses.append((cond, body))
        orelse = None
        while True:
            self.skip_separators()
            if self.at_word("elif"):
                self.i += 1
                cond = self.parse_list({"then"})
                self.expect_word("then")
                clauses.append((cond, self.parse_list({"elif", "else", "fi"})))
            elif self.at_word("else"):
                self.i += 1
                orelse = self.parse_list({"fi"})
            else:
                self.expect_word("fi")
                return If(clauses, orelse, line)

    def parse_simple(self):
        tokens = []
        line = self.peek().line
        while True:
            tok = self.peek()
            if tok is None or tok.kind == "nl" or (tok.kind == "op" and tok.text not in ("(",)):
                break
            if tok.kind == "op" and tok.text == "(":
                if tokens and len(tokens) == 1 and tokens[0].kind == "word":  # name() { ... }
                    self.i += 1
                    if self.peek() is not None and self.peek().text == ")":
                        self.i += 1
                    self.skip_separators()
                    body = self.parse_command()
                    return FuncDef(tokens[0].text, [body] if body else [])
                break
            if tok.kind == "word" and tok.text in KEYWORDS_END and not tokens:
                break
            tokens.append(tok)
            self.i += 1
        if tokens and tokens[0].kind == "word" and tokens[0].text in ("function",):
            tokens = tokens[1:]
        return Simple(tokens, line) if tokens else None


# ---------------------------------------------------------------------------------------------
# Expansion and execution
# ---------------------------------------------------------------------------------------------

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


class Reader:
    """Executes the safe subset of one script and the files it sources."""

    def __init__(self, slime_dir: Path | None, env: dict[str, str]):
        self.slime_dir = slime_dir
        self.vars: dict[str, object] = {k: [v] for k, v in env.items()}
        self.functions: dict[str, list] = {}
        self.exported: list[str] = []
        self.result = ScriptReading()
        self.files: list[Path] = []  # the file being read, innermost last
        self.depth = 0  # > 0 inside an undecided branch or a loop
        self.in_if = 0  # > 0 inside any if body: an `exit` there is a guard, not the script's end
        self.stopped = False

    # -- files ------------------------------------------------------------------------------

    def read_file(self, path: Path):
        try:
            text = path.read_text(errors="replace")
        except OSError as e:
            raise ScriptError(f"{path}: {e.strerror or e}") from e
        nodes = Parser(Lexer(text, str(path)).tokens(), str(path)).parse_list(set())
        self.files.append(path)
        try:
            self.run_nodes(nodes)
        finally:
            self.files.pop()
            self.stopped = False if self.files else self.stopped

    @property
    def here(self) -> Path:
        return self.files[-1]

    # -- expansion --------------------------------------------------------------------------

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

    # -- execution --------------------------------------------------------------------------

    def run_nodes(self, nodes: list):
        for node in nodes:
            if self.stopped:
                return
            if isinstance(node, Simple):
                self.run_simple(node)
            elif isinstance(node, If):
                self.run_if(node)
            elif isinstance(node, Loop):
                self.undecided([node.body, []])  # zero, one or many passes
            elif isinstance(node, Group):
                self.run_nodes(node.body)
            elif isinstance(node, FuncDef):
                self.functions[node.name] = node.body
            elif isinstance(node, Opaque):
                self.vars.update(dict.fromkeys(node.assigned, UNKNOWN))
                if node.assigned:  # a block that sets nothing (a guard that exits) changes no flag
                    self.result.notes.append(f"{Origin(str(self.here), node.line)}: a {node.what} block is not "
                                             f"followed; {', '.join(sorted(set(node.assigned)))} (set in it) unknown "
                                             "here")

    def run_if(self, node: If):
        for cond, body in node.clauses:
            verdict = self.test(cond)
            if verdict is None:
                rest = [b for _, b in node.clauses[node.clauses.index((cond, body)):]]
                self.undecided(rest + [node.orelse or []])
                return
            if verdict:
                self.run_branch(body)
                return
        if node.orelse:
            self.run_branch(node.orelse)

    def run_branch(self, body: list):
        self.in_if += 1
        try:
            self.run_nodes(body)
        finally:
            self.in_if -= 1

    def undecided(self, branches: list[list]):
        """Read each branch on a copy of the variables; keep what all branches agree on."""
        base = dict(self.vars)
        outcomes = []
        for body in branches:
            self.vars = dict(base)
            self.depth += 1
            try:
                self.run_nodes(body)
            finally:
                self.depth -= 1
                self.stopped = False
            outcomes.append(self.vars)
        merged = dict(base)
        for name in set().union(*outcomes) if outcomes else set():
            values = [o.get(name) for o in outcomes]
            first = values[0]
            merged[name] = first if all(v == first for v in values) else UNKNOWN
            if merged[name] is None:
                del merged[name]
        self.vars = merged

    def test(self, cond: list) -> bool | None:
        """Value of an ``if`` condition made of one ``[ ... ]`` / ``[[ ... ]]`` / ``test`` command."""
        if len(cond) != 1 or not isinstance(cond[0], Simple):
            return None
        tokens = cond[0].tokens
        if any(t.kind != "word" for t in tokens):
            return None
        words = []
        for t in tokens:
            expanded = self.expand_word(t.text, Origin(str(self.here), t.line))
            if not all(w.known for w in expanded):
                return None
            words += [w.text for w in expanded] if expanded else [""]
        if words and words[0] in ("[", "[["):
            words = words[1:-1] if words[-1] in ("]", "]]") else None
        elif words and words[0] == "test":
            words = words[1:]
        else:
            return None
        if words is None:
            return None
        negate = bool(words) and words[0] == "!"
        words = words[1:] if negate else words
        result = None
        if len(words) == 2 and words[0] in ("-z", "-n"):
            result = (words[1] == "") == (words[0] == "-z")
        elif len(words) == 1:
            result = words[0] != ""
        elif len(words) == 3 and words[1] in ("=", "==", "!="):
            result = (words[0] == words[2]) == (words[1] != "!=")
        elif len(words) == 3 and words[1] in ("-eq", "-ne", "-lt", "-le", "-gt", "-ge"):
            try:
                a, b = int(words[0]), int(words[2])
            except ValueError:
                return None
            result = {"-eq": a == b, "-ne": a != b, "-lt": a < b, "-le": a <= b, "-gt": a > b, "-ge": a >= b}[words[1]]
        if result is None:
            return None
        return not result if negate else result

    def assign(self, name: str, append: bool, value):
        if append:
            old = self.vars.get(name)
            if old is UNKNOWN or value is UNKNOWN:
                self.vars[name] = UNKNOWN
                return
            if isinstance(value, list) and value and isinstance(value[0], Word):  # array +=
                base = old if isinstance(old, list) and old and isinstance(old[0], Word) else (
                    [Word(list(old), value[0].origin)] if old else [])
                self.vars[name] = base + value
            else:
                self.vars[name] = (
                    list(old) if isinstance(old, list) and not (old and isinstance(old[0], Word)) else []
                ) + value
        else:
            self.vars[name] = value

    def run_simple(self, node: Simple):
        tokens = list(node.tokens)

        def origin(tok):
            return Origin(str(self.here), tok.line)

        # Leading assignments; with no command after them they set shell variables.
        assigns = []
        while tokens and (tokens[0].kind == "array" or (tokens[0].kind == "word" and ASSIGN.match(tokens[0].text))):
            assigns.append(tokens.pop(0))
        if not tokens:
            for tok in assigns:
                self.run_assignment(tok, origin(tok))
            return
        words: list[Word] = []
        for tok in tokens:
            if tok.kind == "array":
                continue
            words += self.expand_word(tok.text, origin(tok)) if tok.kind == "word" else []
        if not words:
            return
        head = words[0].text if words[0].known else None
        if head in ("export", "declare", "typeset", "local", "readonly"):
            for tok in tokens[1:]:
                if tok.kind == "array" or ASSIGN.match(tok.text):
                    self.run_assignment(tok, origin(tok))
                if head == "export" and tok.kind == "word":
                    name = ASSIGN.match(tok.text).group(1) if ASSIGN.match(tok.text) else tok.text
                    if NAME.fullmatch(name) and name not in self.exported:
                        self.exported.append(name)
            return
        if head in ("source", "."):
            if len(words) > 1:
                self.source(words[1])
            return
        if head == "unset":
            for w in words[1:]:
                self.vars.pop(w.text, None)
            return
        if head == "printf" and len(words) > 2 and words[1].text == "-v":
            self.vars[words[2].text] = UNKNOWN
            return
        if head in ("read", "mapfile", "readarray"):
            for w in words[1:]:
                if NAME.fullmatch(w.text):
                    self.vars[w.text] = UNKNOWN
            return
        if head in ("exit", "return") and self.depth == 0 and self.in_if == 0:
            self.stopped = True
            return
        if head in self.functions:
            self.run_nodes(self.functions[head])
            return
        if head is not None and head.startswith("--") and self.result.invocations:
            self.result.orphans.append(Orphan(words, Origin(str(self.here), node.line)))
            return
        self.find_invocation(words)

    def run_assignment(self, tok: Token, origin: Origin):
        if tok.kind == "array":
            match = ASSIGN.match(tok.text)
            elements: list[Word] = []
            for element in tok.elements:
                elements += self.expand_word(element.text, Origin(str(self.here), element.line))
            self.assign(match.group(1), bool(match.group(2)), elements)
            return
        match = ASSIGN.match(tok.text)
        raw = tok.text[match.end():]
        parts = self.expand_text(raw, origin, quoted=False) if raw else []
        self.assign(match.group(1), bool(match.group(2)), merge(parts))

    def source(self, word: Word):
        if not word.known:
            self.result.notes.append(f"{Origin(str(self.here), word.origin.line)}: cannot follow `source {word.text}` "
                                     "(its path is not known); flags it defines are missing")
            return
        path = Path(word.text).expanduser()
        # Relative paths resolve against the working directory: slime's scripts run from the checkout.
        if path.is_absolute():
            candidates = [path]
        else:
            candidates = ([self.slime_dir / path] if self.slime_dir else []) + [self.here.parent / path]
        fallback = (
            self.slime_dir / "scripts" / "models" / path.name if self.slime_dir and "models" in path.parts else None
        )
        found = next((c for c in candidates if c.is_file()), None)
        if found is None and fallback is not None and fallback.is_file():
            found = fallback
            inside = self.slime_dir.resolve() in Path(os.path.normpath(path)).parents or not path.is_absolute()
            if inside:  # the script's own path is wrong wherever it runs
                self.result.notes.append(f"{word.origin}: sourced file {word.text} does not exist; "
                                         f"read {found} instead")
            else:  # a path on the machine the script was written for, e.g. /root/slime/...
                self.result.substituted.append(f"{word.text} -> {found}")
        if found is None:
            hint = "" if self.slime_dir else " (pass --slime-dir to read slime's scripts/models/)"
            self.result.notes.append(f"{word.origin}: sourced file {word.text} not found{hint}")
            return
        self.result.sourced.append(str(found))
        if len(self.files) > 20:
            raise ScriptError(f"{found}: sourced too deeply")
        self.read_file(found)

    def find_invocation(self, words: list[Word]):
        runner = False
        for k, w in enumerate(words):
            text = w.text if w.known else ""
            base = Path(text).name if text else ""
            if base.startswith(("python", "torchrun", "deepspeed")):
                runner = True
            elif runner and base in ENTRY_POINTS:
                known, unknown = runtime_env(words[:k])
                env = {**self.exported_env(), **known}
                self.result.invocations.append(Invocation(base, words[k + 1:], w.origin, self.depth > 0, env,
                                                          unknown))
                return
            elif base == "slime-ref" and k + 1 < len(words) and words[k + 1].known \
                    and words[k + 1].text in SLIME_REF_ENTRY_POINTS:
                entry = SLIME_REF_ENTRY_POINTS[words[k + 1].text]
                self.result.invocations.append(Invocation(entry, words[k + 2:], w.origin, self.depth > 0,
                                                          self.exported_env()))
                return

    def exported_env(self) -> dict[str, str]:
        """The exported variables whose values are known (what the train command inherits)."""
        env = {}
        for name in self.exported:
            value = self.lookup(name)
            if isinstance(value, list) and all(isinstance(p, str) for p in value):
                env[name] = "".join(value)
        return env


UNKNOWN_MARK = "\u0000unknown\u0000"  # stands for a symbolic part while a runtime-env JSON is read


def runtime_env_vars(words: list[Word]) -> dict[str, str]:
    """``env_vars`` of ``ray job submit --runtime-env-json`` among ``words``, where known: Ray sets them for
    the job's driver and every worker, over what the shell exported (slime's scripts put Megatron-LM and
    the user's hook folders on PYTHONPATH there). A value that cannot be known (slime's scripts set
    ``NCCL_NVLS_ENABLE`` from ``$(nvidia-smi ...)``) is left out; the others are kept
    (:func:`runtime_env` names the left-out ones)."""
    return runtime_env(words)[0]


def runtime_env(words: list[Word]) -> tuple[dict[str, str], list[str]]:
    """(the known ``env_vars`` of ``--runtime-env-json``, the names of those that cannot be known)."""
    for k, w in enumerate(words):
        head = w.literal_prefix
        if head.startswith("--runtime-env-json="):
            raw = _marked(w).split("=", 1)[1]
        elif w.known and w.text == "--runtime-env-json" and k + 1 < len(words):
            raw = _marked(words[k + 1])
        else:
            continue
        try:
            env_vars = json.loads(raw, strict=False).get("env_vars") or {}
        except (ValueError, AttributeError):
            return {}, []
        known = {n: v for n, v in env_vars.items() if isinstance(v, str) and UNKNOWN_MARK not in v}
        unknown = [n for n, v in env_vars.items() if isinstance(v, str) and UNKNOWN_MARK in v]
        return known, unknown
    return {}, []


def _marked(word: Word) -> str:
    """The word's text with every symbolic part replaced by :data:`UNKNOWN_MARK`."""
    return "".join(p if isinstance(p, str) else UNKNOWN_MARK for p in word.parts)


def matching(raw: str, j: int, opener: str, closer: str) -> int:
    """Index after the ``closer`` matching the ``opener`` at ``raw[j]`` (quotes respected)."""
    depth = 0
    k = j
    while k < len(raw):
        if raw.startswith(opener, k):
            depth += 1
            k += len(opener)
            continue
        if raw.startswith(closer, k):
            depth -= 1
            k += len(closer)
            if depth == 0:
                return k
            continue
        c = raw[k]
        if c == "\\":
            k += 2
        elif c == "'" and opener != "{":
            end = raw.find("'", k + 1)
            k = len(raw) if end < 0 else end + 1
        elif c == '"':
            k += 1
            while k < len(raw) and raw[k] != '"':
                k += 2 if raw[k] == "\\" else 1
            k += 1
        else:
            k += 1
    return len(raw)


def merge(parts: list) -> list:
    """Join neighbouring literal parts."""
    out: list = []
    for p in parts:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
        elif p != "":
            out.append(p)
    return out


def read_script(
    path: str | Path, slime_dir: str | Path | None = None, env: dict[str, str] | None = None
) -> ScriptReading:
    """The ``train.py`` / ``train_async.py`` invocations of a launch script, with notes on what
    could not be followed. Raises :class:`ScriptError` when the file cannot be read or parsed."""
    reader = Reader(Path(slime_dir) if slime_dir else None, env or {})
    reader.read_file(Path(path).resolve())
    return reader.result
