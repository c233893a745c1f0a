"""``slime-check config``'s reading of a train argv: flags and values as slime's parsers take them.

:func:`parse_argv` splits a launch command into flags and their words against the flag registry;
:class:`Config` answers what value slime would see for a flag (the last occurrence wins, a symbolic
word reads as :data:`UNKNOWN`, an unset flag as the registry default).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slime_check.findings import CUSTOMIZATION, FAQ, QUICK_START, USAGE, Finding, Status, slime_doc
from slime_check.launch_script import Origin, Word
from slime_common.arg_rules import UNKNOWN, Unknown, broken_rules, known  # noqa: F401  (config's names)
from slime_common.registry import KNOWN_SLIMES, Flag, Registry

ARGS_DOC = slime_doc(QUICK_START, "training-script-and-parameter-overview")
MODEL_DOC = slime_doc(QUICK_START, "model_args-model-configuration-parameters")
BATCH_DOC = slime_doc(QUICK_START, "rollout_args-data-generation-rollout-parameters")
PERF_DOC = slime_doc(QUICK_START, "perf_args-performance-and-parallelism-parameters")
GRPO_DOC = slime_doc(QUICK_START, "grpo_args-grpo-algorithm-parameters")
COLOCATE_DOC = slime_doc(QUICK_START, "colocated-actor-and-rollout")
HOOK_DOC = slime_doc(CUSTOMIZATION)
DATA_DOC = slime_doc(USAGE)
FAQ_DOC = slime_doc(FAQ)

DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")
NEGATIVE_NUMBER = re.compile(r"-\d+(\.\d*)?([eE][-+]?\d+)?|-\.\d+")
DATA_ROWS = 5

@dataclass
class Given:
    """One flag as written on the command line, with the words argparse would give it."""

    name: str
    flag: Flag | None
    values: list[Word]
    origin: Origin
    abbreviation: bool = False

    @property
    def where(self) -> str:
        return str(self.origin)


def is_option(word: Word) -> bool:
    text = word.literal_prefix
    return text.startswith("-") and len(text) > 1 and not NEGATIVE_NUMBER.fullmatch(word.text if word.known else text)


@dataclass
class ParsedArgv:
    given: list[Given]
    stray: list[Word]  # words no flag takes (argparse leaves them in its extras)
    unresolved: list[Word]  # symbolic words where a flag could be: they might hide flags
    problems: list[Finding]  # malformed values, ambiguous abbreviations


def parse_argv(argv: list[Word], reg: Registry) -> ParsedArgv:
    """Split argv into flags and their values, as slime's parsers would."""
    parsed = ParsedArgv([], [], [], [])
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if not is_option(word):
            (parsed.unresolved if not word.known and not word.literal_prefix else parsed.stray).append(word)
            continue
        text = word.literal_prefix if not word.known else word.text
        name, eq, _ = text.partition("=")
        inline = None
        if eq:
            value_parts = list(word.parts)
            value_parts[0] = value_parts[0].split("=", 1)[1]
            inline = Word([p for p in value_parts if p != ""], word.origin)
        flag = reg.lookup(name)
        abbreviation = False
        if flag is None:
            matches = reg.abbreviation_of(name)
            if len(matches) == 1:
                flag, abbreviation = matches[0], True
            elif len(matches) > 1:
                parsed.problems.append(Finding(
                    "config.abbreviation", Status.FAIL,
                    f"{name} ({word.origin}) is an ambiguous abbreviation of {', '.join(m.name for m in matches[:4])}: "
                    "SGLang's argument parser stops slime at start-up.", "Spell the flag out in full.", ARGS_DOC))
        values: list[Word] = [inline] if inline is not None else []
        nargs = flag.nargs if flag is not None else "*"
        if inline is None:
            if nargs is None or (isinstance(nargs, int) and nargs > 0):
                want = 1 if nargs is None else nargs
                while len(values) < want and i < len(argv) and not is_option(argv[i]):
                    values.append(argv[i])
                    i += 1
                if len(values) < want:
                    parsed.problems.append(Finding(
                        "config.value", Status.FAIL,
                        f"{name} ({word.origin}) expects {want} value{'s' if want > 1 else ''} but got {len(values)}: "
                        "argparse stops slime at start-up.", f"Give {name} its value.", ARGS_DOC))
            elif nargs in ("?", "*", "+"):
                while i < len(argv) and not is_option(argv[i]):
                    values.append(argv[i])
                    i += 1
                    if nargs == "?":
                        break
                if nargs == "+" and not values:
                    parsed.problems.append(Finding(
                        "config.value", Status.FAIL, f"{name} ({word.origin}) expects at least one value.",
                        f"Give {name} its values.", ARGS_DOC))
        parsed.given.append(Given(name, flag, values, word.origin, abbreviation))
    return parsed


def judged_target(reg: Registry, target: str | None) -> str:
    """The known slime whose behaviour a job is judged by: ``target``, else the registry's slime."""
    return target or (reg.label if reg.label in KNOWN_SLIMES else "v0.3.1")


class Config:
    """Flag values after parsing: the last occurrence wins, as in argparse."""

    def __init__(self, parsed: ParsedArgv, reg: Registry, entry: str = "train.py", target: str | None = None):
        self.parsed = parsed
        self.reg = reg
        self.entry = entry
        # the known slime whose behaviour the job is judged by (the registry's, unless told)
        self.target = judged_target(reg, target)
        self.by_dest: dict[str, list[Given]] = {}
        for g in parsed.given:
            if g.flag is not None:
                self.by_dest.setdefault(g.flag.dest, []).append(g)

    def given(self, name: str) -> list[Given]:
        flag = self.reg.lookup(name)
        return self.by_dest.get(flag.dest, []) if flag else []

    def has(self, name: str) -> bool:
        return bool(self.given(name))

    def get(self, name: str):
        """The value slime would see: a Python value, ``UNKNOWN``, or the registry default."""
        flag = self.reg.lookup(name)
        occurrences = self.given(name)
        if not occurrences:
            default = flag.default
            return None if isinstance(default, dict) else default
        last = occurrences[-1]
        spec = last.flag
        if spec.action in ("store_true", "store_false", "boolean_optional", "store_const"):
            if spec.action == "boolean_optional":
                return not last.name.startswith("--no-")
            return spec.action != "store_false"
        words = last.values
        if any(not w.known for w in words):
            return UNKNOWN
        converted = [spec.convert(w.text) for w in words]
        if spec.nargs in ("+", "*") or isinstance(spec.nargs, int):
            return converted
        return converted[0] if converted else None

    def number(self, name: str) -> float | int | None | Unknown:
        value = self.get(name)
        return value if value is None or value is UNKNOWN or isinstance(value, (int, float)) else UNKNOWN

    def where(self, name: str) -> str:
        occurrences = self.given(name)
        return f" ({occurrences[-1].where})" if occurrences else ""


class ConfigValues:
    """A :class:`Config` as :class:`slime_common.arg_rules.FlagValues`: a flag this registry lacks reads
    as unset."""

    def __init__(self, cfg: Config):
        self.cfg = cfg

    def __getitem__(self, flag: str):
        spec = self.cfg.reg.lookup(flag)
        if spec is None:
            return None
        # a number flag with a word that is no number reads as unknown (config.value reports the word)
        return self.cfg.number(flag) if spec.type in ("int", "float") and spec.nargs is None else self.cfg.get(flag)

    def where(self, flag: str) -> str:
        return self.cfg.where(flag)



RULE_DOCS = {"args": ARGS_DOC, "batch": BATCH_DOC, "faq": FAQ_DOC, "grpo": GRPO_DOC}


def rule_findings(cfg: Config, ids: tuple[str, ...] | None = None, skip: tuple[str, ...] = ()) -> list[Finding]:
    """A FAIL finding for each rule of :data:`slime_common.arg_rules.RULES` the job breaks (only those
    with an id in ``ids`` when given, none with an id in ``skip``)."""
    values = ConfigValues(cfg)
    return [Finding(rule.id, Status.FAIL, rule.message(values), rule.fix(values), RULE_DOCS[rule.doc])
            for rule in broken_rules(values)
            if (ids is None or rule.id in ids) and rule.id not in skip]
