"""The shell grammar of slime's launch scripts: source text to tokens to a tree of commands.

The lexer finds word boundaries, operators, heredocs, array assignments and ``$(( ))`` without
interpreting a word; the parser turns the tokens into simple commands, ``if`` clauses, loops, groups
and function definitions, and keeps a ``case`` block as one opaque node that only names the variables
it assigns. Nothing here expands a word or runs a command: :mod:`slime_check.shell_expansion` gives
words their values and :mod:`slime_check.launch_script` follows the tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
OPERATORS = ("&&", "||", ";;", ";", "|", "&", "(", ")")
REDIRECT = re.compile(r"(\d*)(<<<|<<-|<<|&>>|&>|>>|>&|<&|>\||>|<)")
KEYWORDS_END = {"then", "fi", "else", "elif", "do", "done", "esac", "}", ")"}


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
