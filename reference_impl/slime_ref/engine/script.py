"""Scripted answers: the built-in engine answers chosen prompts with given text instead of sampling.

A model with random weights never writes a correct answer or a tool call, so a rehearsal run on one
(``slime-check smoke``) would never reach a user's reward or tool branches. A script makes the engine
answer some requests with given text, teacher-forced through the model: the answer's tokens get the
model's own log-probs, as if the model had sampled them, so everything downstream (rewards, log-prob
checks, training) sees ordinary samples.

The engine reads the script from the JSON file named by ``SLIME_REF_ENGINE_SCRIPT`` (or
``python -m slime_ref.engine --script PATH``)::

    {"entries": [{"match": "3+5=",
                  "responses": ["\\\\boxed{8}",
                                ["<tool_call>calc 3+5</tool_call>", "The answer is \\\\boxed{8}"]]}],
     "every": 2}

Which request gets what:

- The request's prompt (its input ids decoded with the engine's tokenizer, special tokens kept) is
  matched against every entry's ``match``; an entry applies when ``match`` occurs in the prompt, and
  the longest ``match`` wins (the earlier entry on a tie). No entry applies: the model samples.
- A response is a string (one turn) or a list of strings (the turns of a multi-turn exchange).
- Continuations: when the prompt holds turns 1..k-1 of a list response (in that order, the first
  one after the first occurrence of ``match``) and that response has a turn k, the request gets
  turn k. If several responses qualify, the one with the most turns already in the prompt wins
  (the earlier response on a tie). Continuations are always scripted and do not count. A turn is
  recognised as written or as the engine served it (its tokens decoded, which differs where the
  tokenizer cannot spell the text; the engine logs a warning at start-up for such turns).
- Every other request of the entry is a first-turn request, counted per entry from 0: request
  number ``count`` is scripted when ``count % every == 0`` and gets
  ``responses[(count // every) % len(responses)]`` (its first turn, for a list); the others sample.
  ``every`` (a positive integer) defaults to 2, so the samples of one prompt mix scripted and
  sampled answers; ``every: 1`` scripts every first turn.

The served turn is encoded without special tokens and the eos token is appended; the engine then
forces these tokens one by one through its ordinary decode steps, so the request's sampling
parameters apply as to a sampled answer (``max_new_tokens``, ``stop``, ``stop_token_ids``; under
``ignore_eos`` the answer still ends at its eos) and the response carries the same fields.

With ``SLIME_REF_ENGINE_SCRIPT_STATS`` set to a file path, the engine appends one JSON line per
finished request (health checks aside), ``{"scripted": bool, "entry": index of the entry whose
match the prompt holds or null, "turn": 1-based served turn or null}``.

Give both paths absolute: slime_ref's launcher hands its environment to every engine it starts (in a
Ray run, the environment the local cluster was started with), and each engine resolves them itself.

This module holds the format and the choice only (pure, no model, no tokenizer).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slime_ref.errors import UserError

SCRIPT_ENV = "SLIME_REF_ENGINE_SCRIPT"
STATS_ENV = "SLIME_REF_ENGINE_SCRIPT_STATS"
DEFAULT_EVERY = 2


@dataclass(frozen=True)
class Entry:
    match: str
    responses: tuple[tuple[str, ...], ...]  # each response as its turns; a string response is one turn


@dataclass(frozen=True)
class Pick:
    """What a request gets. ``text`` None: the model samples. ``entry``: the matched entry's index
    (also for a sampled request), None when no entry matched. ``turn``: 1-based, None when sampled."""

    text: str | None = None
    entry: int | None = None
    turn: int | None = None

    @property
    def scripted(self) -> bool:
        return self.text is not None

    def stats(self) -> dict[str, Any]:
        return {"scripted": self.scripted, "entry": self.entry, "turn": self.turn}


@dataclass
class Script:
    """The parsed file, and how many first-turn requests each entry has seen.

    ``served_as``: a turn's text as a prompt holds it after the engine served it (its tokens decoded;
    differs from the turn where the tokenizer cannot spell it). A continuation is recognised by
    either form."""

    entries: list[Entry]
    every: int = DEFAULT_EVERY
    counts: list[int] = field(default_factory=list)  # first-turn requests seen, per entry
    served_as: Callable[[str], str] | None = None

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * len(self.entries)

    def pick(self, prompt_text: str) -> Pick:
        """Choose the answer for a request whose decoded prompt is ``prompt_text``; counts it if it
        is a first-turn request of an entry."""
        index = match_entry(self.entries, prompt_text)
        if index is None:
            return Pick()
        entry = self.entries[index]
        cont = continuation(entry, prompt_text, self.served_as)
        if cont is not None:
            response, turn = cont
            return Pick(entry.responses[response][turn - 1], index, turn)
        count = self.counts[index]
        self.counts[index] += 1
        if count % self.every:
            return Pick(entry=index)
        return Pick(entry.responses[(count // self.every) % len(entry.responses)][0], index, 1)


def match_entry(entries: list[Entry], text: str) -> int | None:
    """Index of the entry with the longest ``match`` that ``text`` contains (the first on a tie)."""
    best = None
    for i, entry in enumerate(entries):
        if entry.match in text and (best is None or len(entry.match) > len(entries[best].match)):
            best = i
    return best


def turns_held(turns: tuple[str, ...], text: str, start: int, served_as: Callable[[str], str] | None = None) -> int:
    """How many of ``turns`` occur in ``text`` in order, the first at or after ``start`` (each as
    written or, with ``served_as``, as served)."""
    pos, held = start, 0
    for turn in turns:
        forms = {turn, served_as(turn)} if served_as is not None else {turn}
        found = [(at, len(form)) for form in forms if form and (at := text.find(form, pos)) >= 0]
        if not found:
            break
        at, length = min(found)
        pos, held = at + length, held + 1
    return held


def continuation(entry: Entry, text: str, served_as: Callable[[str], str] | None = None) -> tuple[int, int] | None:
    """(response index, 1-based turn to serve) when ``text`` holds turns 1..k-1 of a multi-turn
    response of ``entry`` after its match and the response has a turn k; else None."""
    start = text.find(entry.match)
    if start < 0:
        return None
    start += len(entry.match)
    best = None
    for i, turns in enumerate(entry.responses):
        held = turns_held(turns, text, start, served_as)
        if 1 <= held < len(turns) and (best is None or held > best[1] - 1):
            best = (i, held + 1)
    return best


# ------------------------------------------------------------------------------------------------
# the file


def parse_script(data: Any, source: str = "the script") -> Script:
    """A :class:`Script` from the file's JSON value; UserError naming ``source`` and the problem."""

    def bad(problem: str) -> UserError:
        return UserError(f"{source}: {problem} (format: {{\"entries\": [{{\"match\": TEXT, \"responses\": "
                         f"[TEXT or [TURN, ...], ...]}}], \"every\": N}})")

    if not isinstance(data, dict):
        raise bad("the top level must be a JSON object")
    unknown = sorted(set(data) - {"entries", "every"})
    if unknown:
        raise bad(f"unknown key(s) {unknown}")
    every = data.get("every", DEFAULT_EVERY)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise bad(f"\"every\" must be a positive integer, got {every!r}")
    raw_entries = data.get("entries")
    if not isinstance(raw_entries, list) or not raw_entries:
        raise bad("\"entries\" must be a non-empty list")
    entries: list[Entry] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(raw_entries):
        where = f"entries[{i}]"
        if not isinstance(raw, dict):
            raise bad(f"{where} must be an object")
        unknown = sorted(set(raw) - {"match", "responses"})
        if unknown:
            raise bad(f"{where}: unknown key(s) {unknown}")
        match = raw.get("match")
        if not isinstance(match, str) or not match:
            raise bad(f"{where}.match must be a non-empty string")
        if match in seen:
            raise bad(f"{where}.match {match!r} is also entries[{seen[match]}].match")
        seen[match] = i
        responses = raw.get("responses")
        if not isinstance(responses, list) or not responses:
            raise bad(f"{where}.responses must be a non-empty list")
        turns_list = []
        for j, response in enumerate(responses):
            turns = [response] if isinstance(response, str) else response
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
                raise bad(f"{where}.responses[{j}] must be a non-empty string or a non-empty list of "
                          "non-empty strings")
            turns_list.append(tuple(turns))
        entries.append(Entry(match, tuple(turns_list)))
    return Script(entries, every)


def load_script(path: str | os.PathLike) -> Script:
    """Read and check the script file; UserError naming the file and the problem."""
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"script file {path}: cannot read it: {e.strerror or e}") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise UserError(f"script file {path}: not valid JSON: {e}") from None
    return parse_script(data, f"script file {path}")


def append_stats(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append one JSON line with a single O_APPEND write, so several engines can share the file."""
    line = (json.dumps(record) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
