"""Every command-line flag slime v0.3.1 accepts, with its type, default and origin.

The data (``data/slime_v0.3.1_flags.json``) is generated from the pinned sources by
``slime_check/tools/gen_flag_registry.py``. slime reads its command line with three parsers:

* ``main``: Megatron-LM's flags plus slime's own. Exact names only; a flag no parser knows is
  dropped silently (Megatron runs ``parse_known_args``), so a typo costs a whole run.
* ``sglang``: SGLang's server flags as ``--sglang-*``, the router's as ``--router-*`` and a few
  slime ones. This parser accepts unambiguous prefixes, and fails on an ambiguous one.
* ``preparse``: ``--train-backend`` and the ``--debug-*`` mode switches.

Usage::

    from slime_common.registry import load_registry
    reg = load_registry()
    reg.lookup("--rollout-batch-size").default      # None (required)
    reg.suggest("--rollout-batchsize")              # ["--rollout-batch-size"]
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

REGISTRY_FILE = "slime_v0.3.1_flags.json"

# slime's own ``--*-path`` flags that name a YAML file; every other one names a Python object that
# slime loads with ``load_function`` (a hook).
CONFIG_FILE_FLAGS = frozenset({"--custom-config-path", "--megatron-config-path"})


@dataclass(frozen=True)
class Flag:
    """One argparse action: all its spellings, where it comes from and what it takes."""

    flags: tuple[str, ...]
    dest: str
    parser: str  # "main", "sglang" or "preparse"
    source: str  # "slime", "megatron", "megatron-patch", "sglang", "sglang-patch" or "router"
    action: str  # "store", "store_true", "append", "boolean_optional", ... (or SGLang's Deprecated*)
    type: str | None
    default: Any
    nargs: int | str | None
    choices: tuple | None
    required: bool = False
    megatron_default: Any = None  # set when slime resets a Megatron default
    upstream_flags: tuple[str, ...] = field(default=())  # SGLang's own spelling of --sglang-* flags

    @property
    def name(self) -> str:
        return self.flags[0]

    @property
    def deprecated(self) -> bool:
        return self.action.startswith("Deprecated")

    @property
    def repeatable(self) -> bool:
        """Given twice, both values count (argparse append/extend)."""
        return self.action in ("append", "extend", "append_const", "count")

    def convert(self, text: str) -> Any:
        """The value argparse would store for one command-line word, or the text if unsure."""
        try:
            if self.type == "int":
                return int(text)
            if self.type == "float":
                return float(text)
        except ValueError:
            return text
        return text


class Registry:
    def __init__(self, data: dict):
        self.meta = {k: v for k, v in data.items() if k != "flags"}
        self.flags: list[Flag] = []
        self._by_name: dict[str, Flag] = {}
        for record in data["flags"]:
            flag = Flag(
                flags=tuple(record["flags"]),
                dest=record["dest"],
                parser=record["parser"],
                source=record["source"],
                action=record["action"],
                type=record["type"],
                default=record["default"],
                nargs=record["nargs"],
                choices=tuple(record["choices"]) if record["choices"] is not None else None,
                required=record.get("required", False),
                megatron_default=record.get("megatron_default"),
                upstream_flags=tuple(record.get("upstream_flags", ())),
            )
            self.flags.append(flag)
            for name in flag.flags:
                self._by_name[name] = flag

    def __contains__(self, name: str) -> bool:
        return self.lookup(name) is not None

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def lookup(self, name: str) -> Flag | None:
        """The flag spelled exactly ``name`` (``--flag=value`` is accepted too), or None."""
        return self._by_name.get(name.split("=", 1)[0])

    def by_dest(self, dest: str) -> Flag | None:
        for flag in self.flags:
            if flag.dest == dest:
                return flag
        return None

    def hook_flags(self) -> tuple[str, ...]:
        """slime's hook flags: its own ``--*-path`` flags whose value is a dotted import path."""
        return tuple(sorted(
            name for flag in self.flags if flag.source == "slime"
            for name in flag.flags if name.endswith("-path") and name not in CONFIG_FILE_FLAGS
        ))

    def abbreviation_of(self, name: str) -> list[Flag]:
        """Flags the ``sglang`` parser would take ``name`` for (argparse prefix matching)."""
        name = name.split("=", 1)[0]
        if not name.startswith("--") or name in self._by_name:
            return []
        matches = {id(f): f for n, f in self._by_name.items() if f.parser == "sglang" and n.startswith(name)}
        return list(matches.values())

    def suggest(self, name: str, n: int = 3) -> list[str]:
        """Likely intended flags for an unknown ``name``, best first."""
        name = name.split("=", 1)[0]
        stem = "--" + name.lstrip("-").replace("_", "-").lower()
        found: list[str] = []
        for candidate in (stem, "--sglang-" + stem[2:], "--router-" + stem[2:]):
            if candidate != name and candidate in self._by_name:
                found.append(candidate)
        found += difflib.get_close_matches(stem, self._by_name.keys(), n=n, cutoff=0.8)
        if not found:
            found += difflib.get_close_matches(stem, self._by_name.keys(), n=n, cutoff=0.6)
        return list(dict.fromkeys(found))[:n]


@lru_cache(maxsize=1)
def load_registry() -> Registry:
    text = resources.files("slime_common").joinpath("data", REGISTRY_FILE).read_text()
    return Registry(json.loads(text))


def lookup(name: str) -> Flag | None:
    return load_registry().lookup(name)


def suggest(name: str, n: int = 3) -> list[str]:
    return load_registry().suggest(name, n)
