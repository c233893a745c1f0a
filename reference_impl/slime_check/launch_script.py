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

The grammar is :mod:`slime_check.shell_syntax` and word expansion :mod:`slime_check.shell_expansion`;
this module follows the commands: assignments, ``source``, tests, branches, and the train invocation.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from slime_check.shell_expansion import UNKNOWN, Expander, Origin, Word, merge
from slime_check.shell_syntax import (
    ASSIGN,
    NAME,
    FuncDef,
    Group,
    If,
    Lexer,
    Loop,
    Opaque,
    Parser,
    ScriptError,
    Simple,
    Token,
)

ENTRY_POINTS = ("train.py", "train_async.py")
# slime-ref's commands take the same flags as slime's entry points
SLIME_REF_ENTRY_POINTS = {"train": "train.py", "train-async": "train_async.py"}


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


class Reader(Expander):
    """Executes the safe subset of one script and the files it sources."""

    def __init__(self, slime_dir: Path | None, env: dict[str, str]):
        super().__init__(env)
        self.slime_dir = slime_dir
        self.functions: dict[str, list] = {}
        self.exported: list[str] = []
        self.result = ScriptReading()
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


def read_script(
    path: str | Path, slime_dir: str | Path | None = None, env: dict[str, str] | None = None
) -> ScriptReading:
    """The ``train.py`` / ``train_async.py`` invocations of a launch script, with notes on what
    could not be followed. Raises :class:`ScriptError` when the file cannot be read or parsed."""
    reader = Reader(Path(slime_dir) if slime_dir else None, env or {})
    reader.read_file(Path(path).resolve())
    return reader.result
