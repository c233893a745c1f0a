"""Turning argparse actions into flag-registry records.

Each record names the flags, ``dest``, parser, source (slime, megatron, sglang, router, or a patch),
action, type, default, ``nargs`` and choices of one argparse action, with every value made
JSON-safe, so the registry in ``slime_common/data`` can be compared and diffed line by line.
"""

from __future__ import annotations

import argparse
import enum
import json
import math

from slime_check.tools.upstream_sources import Stub

ACTION_NAMES = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_StoreConstAction": "store_const",
    "_AppendAction": "append",
    "_AppendConstAction": "append_const",
    "_CountAction": "count",
    "_ExtendAction": "extend",
    "BooleanOptionalAction": "boolean_optional",
}


def to_json(value):
    """JSON for plain values; ``{"py": repr}`` for anything else (enums, stubs, callables)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"py": repr(value)}
    if isinstance(value, enum.Enum):
        return {"py": f"{type(value).__name__}.{value.name}"}
    if isinstance(value, (list, tuple)):
        items = [to_json(v) for v in value]
        return items
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: to_json(v) for k, v in value.items()}}
    return {"py": repr(value)}


def type_name(t) -> str | None:
    if t is None:
        return None
    if isinstance(t, Stub):
        return f"unresolved:{t!r}"
    if t in (int, float, str, bool):
        return t.__name__
    if t is json.loads:
        return "json"
    qual = getattr(t, "__qualname__", None) or type(t).__qualname__
    if "enum_type_handler" in qual:
        return "enum"
    return qual


def choices_json(choices):
    if choices is None:
        return None
    try:
        # A set's order changes from run to run; sort it so the registry regenerates identically.
        items = sorted(choices, key=str) if isinstance(choices, (set, frozenset)) else list(choices)
    except TypeError:
        return None
    if not items or any(isinstance(c, Stub) for c in items):
        return None  # empty, or computed from a stubbed module: unknown
    return [c.name if isinstance(c, enum.Enum) else to_json(c) for c in items]


def action_record(action: argparse.Action, parser: str, source: str) -> dict:
    kind = ACTION_NAMES.get(type(action).__name__, type(action).__name__)
    record = {
        "flags": list(action.option_strings),
        "dest": action.dest,
        "parser": parser,
        "source": source,
        "action": kind,
        "type": type_name(action.type),
        "default": to_json(action.default),
        "nargs": action.nargs,  # None: one value; 0: a switch; "?", "*", "+" or a count
        "choices": choices_json(action.choices),
    }
    if action.required:
        record["required"] = True
    if action.const is not None and kind not in ("store_true", "store_false"):
        record["const"] = to_json(action.const)
    return record


def option_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
