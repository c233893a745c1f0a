"""``slime-check config``: lint a slime launch command before it costs a run.

The argv comes from a launch script (see :mod:`slime_check.launch_script`) or is given directly.
It is parsed against the flag registry the way slime's parsers would take it, then checked
against the rules of slime's ``slime_validate_args``, Megatron's checks slime relies on, and the
FAQ: unknown flags (slime drops them silently), flags given twice (the last wins silently), the
batch identity, KL settings, GPU arithmetic, HF config against MODEL_ARGS, hook paths and the
data file's keys.

Values that a script leaves symbolic (``${NUM_GPUS}`` from the environment) are unknown: rules
that need them are skipped, never guessed.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from slime_check.findings import CUSTOMIZATION, FAQ, QUICK_START, USAGE, Finding, Status, slime_doc
from slime_check.launch_script import Origin, Word
from slime_common.registry import KNOWN_SLIMES, Flag, Registry, load_registry

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


class Unknown:
    """The value of a flag whose command-line word is symbolic."""

    def __repr__(self):
        return "<unknown>"


UNKNOWN = Unknown()


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


def known(*values) -> bool:
    return all(v is not None and v is not UNKNOWN for v in values)


# ---------------------------------------------------------------------------------------------
# Flag-level findings
# ---------------------------------------------------------------------------------------------


def _other_slimes_with(cfg: Config, name: str) -> list[str]:
    """The other known slimes whose shipped registry has the flag ``name``."""
    found = []
    for target in KNOWN_SLIMES:
        if target == cfg.reg.label:
            continue
        try:
            if load_registry(target).lookup(name) is not None:
                found.append(target)
        except ValueError:
            continue
    return found


def check_flags(cfg: Config) -> list[Finding]:
    findings: list[Finding] = []
    reg = cfg.reg
    unknown = [g for g in cfg.parsed.given if g.flag is None]
    for g in unknown:
        hints = reg.suggest(g.name)
        others = f" (or {', '.join(hints[1:])})" if len(hints) > 1 else ""
        hint = f" Did you mean {hints[0]}{others}?" if hints else ""
        elsewhere = _other_slimes_with(cfg, g.name)
        if elsewhere:
            hint = f" It is a flag of slime {' and '.join(elsewhere)}.{hint}"
        fix = (f"Use {hints[0]}." if hints else "Remove it, or check the flag's spelling in slime's docs.")
        if elsewhere:
            fix = (f"Run the slime that has it (slime {elsewhere[0]}) and check with --slime-dir or "
                   f"--slime-version; on slime {reg.label}: {fix[0].lower()}{fix[1:]}")
        findings.append(Finding("config.unknown_flag", Status.FAIL,
                                f"{g.name} ({g.where}) is not a flag of slime {reg.label}: slime ignores it without "
                                f"a word.{hint}", fix, ARGS_DOC))
    if not unknown:
        findings.append(Finding("config.unknown_flag", Status.PASS,
                                f"All {len(cfg.parsed.given)} flags are slime {reg.label} flags."))
    for g in cfg.parsed.given:
        if g.abbreviation:
            findings.append(Finding("config.abbreviation", Status.WARN,
                                    f"{g.name} ({g.where}) is taken as an abbreviation of {g.flag.name}.",
                                    f"Write {g.flag.name} in full.", ARGS_DOC))
        if g.flag is not None and g.flag.deprecated:
            findings.append(Finding("config.deprecated_flag", Status.WARN,
                                    f"{g.name} ({g.where}) is deprecated in SGLang 0.5.15.post1.",
                                    "Use its replacement (see `python -m sglang.launch_server --help`).", ARGS_DOC))
        findings += check_value(g)
    findings += cfg.parsed.problems
    for occurrences in cfg.by_dest.values():
        if len(occurrences) < 2 or occurrences[0].flag.repeatable:
            continue
        texts = [" ".join(w.text for w in g.values) for g in occurrences]
        same = len(set(texts)) == 1
        where = ", ".join(g.where for g in occurrences)
        last = f"{occurrences[-1].name} {texts[-1]}".strip()
        dropped = (
            " The earlier value list is dropped entirely (pass all datasets to one flag)."
            if occurrences[-1].flag.nargs in ("+", "*")
            else ""
        )
        findings.append(
            Finding(
                "config.duplicate_flag",
                Status.WARN,
                f"{occurrences[0].name} is given {len(occurrences)} times ({where})"
                + (" with the same value." if same else f"; argparse keeps the last: {last}.")
                + dropped,
                "Give it once.",
                ARGS_DOC,
            )
        )
    for word in cfg.parsed.stray:
        findings.append(Finding("config.value", Status.WARN,
                                f"'{word.text}' ({word.origin}) follows no flag that takes a value: slime ignores it.",
                                "Remove it, or give the flag it belongs to (a switch takes no value).", ARGS_DOC))
    for word in cfg.parsed.unresolved:
        findings.append(Finding("config.unresolved", Status.WARN,
                                f"{word.text} ({word.origin}) cannot be expanded here; any flags it holds are not "
                                f"checked.",
                                "Pass the variable with --env NAME=VALUE to check it.", ARGS_DOC))
    for flag in cfg.reg.flags:
        if flag.required and not cfg.by_dest.get(flag.dest):
            findings.append(Finding("config.required", Status.FAIL, f"{flag.name} is required and missing.",
                                    f"Add {flag.name}.", BATCH_DOC))
    return findings


def check_value(g: Given) -> list[Finding]:
    flag = g.flag
    if flag is None:
        return []
    out = []
    for word in g.values:
        if not word.known:
            continue
        text = word.text
        if flag.type in ("int", "float"):
            converted = flag.convert(text)
            if isinstance(converted, str):
                out.append(
                    Finding(
                        "config.value",
                        Status.FAIL,
                        f"{g.name} ({g.where}) expects {flag.type}, got '{text}': argparse stops slime at start-up.",
                        f"Give {g.name} a number.",
                        ARGS_DOC,
                    )
                )
                continue
        if (
            flag.choices is not None
            and flag.type not in ("enum",)
            and flag.convert(text) not in flag.choices
            or flag.type == "enum"
            and flag.choices is not None
            and text not in flag.choices
        ):
            out.append(Finding("config.value", Status.FAIL, f"{g.name} ({g.where}) got '{text}', not one of "
                               f"{', '.join(map(str, flag.choices))}.", "Pick one of the choices.", ARGS_DOC))
    return out


# ---------------------------------------------------------------------------------------------
# Batch, GPUs, parallelism
# ---------------------------------------------------------------------------------------------


def check_batch(cfg: Config) -> list[Finding]:
    id_ = "config.batch_identity"
    rbs, n = cfg.number("--rollout-batch-size"), cfg.number("--n-samples-per-prompt")
    gbs, steps = cfg.number("--global-batch-size"), cfg.number("--num-steps-per-rollout")
    if rbs is None:
        return []  # reported as missing by config.required
    if not known(rbs, n) or gbs is UNKNOWN or steps is UNKNOWN:
        return [Finding(id_, Status.SKIP, "The batch sizes are not all known (symbolic values).")]
    samples = rbs * n
    fix = ("Make rollout_batch_size x n_samples_per_prompt = global_batch_size x num_steps_per_rollout, "
           "e.g. set only --num-steps-per-rollout and let slime compute --global-batch-size.")
    if steps is not None:
        computed = samples // steps
        if gbs is not None and gbs != computed:
            return [Finding(id_, Status.FAIL, f"--global-batch-size {gbs}{cfg.where('--global-batch-size')} but "
                            f"rollout_batch_size {rbs} x n_samples_per_prompt {n} // num_steps_per_rollout {steps} = "
                            f"{computed}: slime's argument check stops the run.", fix, BATCH_DOC)]
        if samples % steps:
            return [
                Finding(
                    id_,
                    Status.WARN,
                    f"{rbs} x {n} = {samples} samples do not split into {steps} equal steps: "
                    f"each step takes {computed} and {samples - computed * steps} samples per rollout are dropped.",
                    fix,
                    BATCH_DOC,
                )
            ]
        gbs = computed
    if gbs is None:
        return [Finding(id_, Status.FAIL, "Neither --global-batch-size nor --num-steps-per-rollout is set: Megatron "
                        "then sets the global batch to micro_batch_size x data-parallel size, rarely what you want.",
                        fix, BATCH_DOC)]
    if gbs > samples:
        return [
            Finding(
                id_,
                Status.FAIL,
                f"--global-batch-size {gbs} is larger than the {samples} samples a rollout "
                f"makes ({rbs} x {n}): training stops with 'num_rollouts < global_batch_size'.",
                fix,
                BATCH_DOC,
            )
        ]
    if samples % gbs:
        return [Finding(id_, Status.FAIL, f"rollout_batch_size {rbs} x n_samples_per_prompt {n} = {samples} is not a "
                        f"multiple of global_batch_size {gbs}: the last {samples % gbs} samples of every rollout are "
                        "silently dropped.", fix, BATCH_DOC)]
    return [Finding(id_, Status.PASS, f"rollout_batch_size {rbs} x n_samples_per_prompt {n} = {samples} = "
                    f"global_batch_size {gbs} x {samples // gbs} step{'s' if samples // gbs > 1 else ''}.")]


def check_gpus(cfg: Config) -> list[Finding]:
    """Placement-group arithmetic (slime/ray/placement_group.py) and engine layout."""
    findings = []
    nodes, per_node = cfg.number("--actor-num-nodes"), cfg.number("--actor-num-gpus-per-node")
    colocate = cfg.get("--colocate") is True
    rollout, per_engine = cfg.number("--rollout-num-gpus"), cfg.number("--rollout-num-gpus-per-engine")
    gpus_per_node = cfg.number("--num-gpus-per-node")
    debug_train = cfg.get("--debug-train-only") is True or cfg.get("--load-debug-rollout-data") not in (None,)
    external = cfg.has("--rollout-external-engine-addrs")
    if cfg.entry == "train_async.py" and colocate:
        findings.append(Finding("config.gpus", Status.FAIL, "train_async.py cannot colocate: it asserts --colocate is "
                                                            "off.",
                                "Drop --colocate and give rollout its own GPUs (--rollout-num-gpus), or use train.py.",
                                COLOCATE_DOC))
    if not colocate and rollout is None and not debug_train and not external:
        findings.append(Finding("config.gpus", Status.FAIL, "--rollout-num-gpus is not set without --colocate: slime "
                                "cannot size the rollout GPUs and fails while placing them.",
                                "Set --rollout-num-gpus, or pass --colocate.", COLOCATE_DOC))
        return findings
    if not known(nodes, per_node):
        findings.append(Finding("config.gpus", Status.SKIP, "The actor GPU count is not known (symbolic values)."))
        return findings
    actor = nodes * per_node
    if colocate and rollout is None:
        rollout = actor
    if rollout is UNKNOWN or per_engine is UNKNOWN:
        findings.append(Finding("config.gpus", Status.SKIP, "The rollout GPU count is not known (symbolic values)."))
        return findings
    if known(rollout, per_engine) and rollout and per_engine and rollout % per_engine:
        findings.append(Finding("config.gpus", Status.FAIL, f"--rollout-num-gpus {rollout} is not a multiple of "
                                f"--rollout-num-gpus-per-engine {per_engine}: the last engine would get a partial set.",
                                "Make the rollout GPUs a multiple of GPUs per engine.", COLOCATE_DOC))
    if known(per_engine, gpus_per_node) and per_engine > gpus_per_node and per_engine % gpus_per_node:
        findings.append(Finding("config.gpus", Status.FAIL, f"An engine spans {per_engine} GPUs, not a whole number of "
                                f"{gpus_per_node}-GPU nodes (--num-gpus-per-node).",
                                "Use a multiple of --num-gpus-per-node GPUs per engine.", COLOCATE_DOC))
    if nodes > 1 and known(gpus_per_node) and per_node < gpus_per_node:
        findings.append(Finding("config.gpus", Status.WARN, f"{nodes} nodes with {per_node} actor GPUs each, but "
                                f"--num-gpus-per-node is {gpus_per_node}: slime maps ranks and engines to local GPUs "
                                "modulo that number, so they land on GPUs a node does not have.",
                                f"Add --num-gpus-per-node {per_node} (slime's help asks for it under 8 GPUs per node).",
                                COLOCATE_DOC))
    if any(f.status is Status.FAIL for f in findings):
        return findings
    if debug_train:
        text = f"Training only (no rollout engines): actor {nodes}x{per_node} = {actor} GPUs."
    elif colocate:
        total = max(actor, rollout)
        text = f"Colocated: actor {nodes}x{per_node} GPUs, rollout {rollout} GPUs on the same devices: {total} GPUs."
        if rollout and rollout != actor:
            findings.append(uneven_colocation(actor, rollout, cfg.where("--rollout-num-gpus")))
    elif external:
        text = f"Actor {nodes}x{per_node} = {actor} GPUs; rollout on external engines."
    else:
        total = actor + (rollout or 0)
        text = f"Actor {nodes}x{per_node} GPUs + rollout {rollout} GPUs: {total} GPUs."
    engines = (
        f" {rollout // per_engine} engine(s) of {per_engine} GPU(s)."
        if rollout and per_engine and not debug_train
        else ""
    )
    findings.append(Finding("config.gpus", Status.PASS, text + engines))
    return findings


def uneven_colocation(actor: int, rollout: int, where: str) -> Finding:
    """slime colocates in one placement group of max(actor, rollout) GPUs, the actor's ranks and the
    engines both counted from its first bundle (slime/ray/placement_group.py
    ``_get_placement_group_layout``), so unequal counts leave GPUs that only one side uses."""
    if rollout < actor:
        what = (f"the engines take the first {rollout} of the {actor} actor GPUs: during rollout the other "
                f"{actor - rollout} sit idle, and generation runs on {rollout} GPUs while training uses {actor}")
    else:
        what = (f"the actor trains on the first {actor} of {rollout} GPUs: the other {rollout - actor} hold only "
                "engines and sit idle while training")
    return Finding("config.gpus", Status.WARN,
                   f"--colocate with --rollout-num-gpus {rollout}{where} and {actor} actor GPUs: slime accepts it, "
                   f"but {what}.",
                   "Drop --rollout-num-gpus under --colocate (slime then sets it to the actor's GPU count), or give "
                   "rollout GPUs of its own without --colocate.", COLOCATE_DOC)


def check_parallelism(cfg: Config) -> list[Finding]:
    id_ = "config.parallelism"
    nodes, per_node = cfg.number("--actor-num-nodes"), cfg.number("--actor-num-gpus-per-node")
    tp, pp, cp = (cfg.number(f) for f in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                                          "--context-parallel-size"))
    ep, etp = cfg.number("--expert-model-parallel-size"), cfg.number("--expert-tensor-parallel-size")
    if not known(nodes, per_node, tp, pp, cp):
        return [Finding(id_, Status.SKIP, "The actor GPU count or the parallel sizes are not known.")]
    world = nodes * per_node
    model = tp * pp * cp
    if world % model:
        return [
            Finding(
                id_,
                Status.FAIL,
                f"TP {tp} x PP {pp} x CP {cp} = {model} does not divide the {world} actor GPUs: "
                "Megatron stops at start-up.",
                "Choose sizes whose product divides actor_num_nodes x actor_num_gpus_per_node.",
                PERF_DOC,
            )
        ]
    dp = world // model
    etp = tp if etp is None else etp
    if known(ep, etp) and world % (ep * etp * pp):
        return [
            Finding(
                id_,
                Status.FAIL,
                f"EP {ep} x expert-TP {etp} x PP {pp} = {ep * etp * pp} does not divide the {world} actor GPUs.",
                "Choose expert sizes whose product with PP divides the actor GPUs.",
                PERF_DOC,
            )
        ]
    findings = [Finding(id_, Status.PASS, f"{world} actor GPUs = TP {tp} x PP {pp} x CP {cp} x DP {dp}.")]
    gbs, mbs = cfg.number("--global-batch-size"), cfg.number("--micro-batch-size")
    steps, rbs, n = (
        cfg.number("--num-steps-per-rollout"),
        cfg.number("--rollout-batch-size"),
        cfg.number("--n-samples-per-prompt"),
    )
    if gbs is None and known(steps, rbs, n):
        gbs = rbs * n // steps
    if cfg.get("--use-dynamic-batch-size") is not True and known(gbs, mbs) and gbs % (dp * mbs):
        findings = [
            Finding(
                id_,
                Status.FAIL,
                f"global_batch_size {gbs} is not a multiple of DP {dp} x micro_batch_size "
                f"{mbs}: slime's static batching stops at the first step.",
                "Adjust the batch sizes, or use --use-dynamic-batch-size with --max-tokens-per-gpu.",
                PERF_DOC,
            )
        ]
    return findings


# ---------------------------------------------------------------------------------------------
# slime_validate_args and FAQ rules
# ---------------------------------------------------------------------------------------------


def check_kl(cfg: Config) -> list[Finding]:
    id_ = "config.kl"
    kl_coef, kl_loss_coef = cfg.number("--kl-coef"), cfg.number("--kl-loss-coef")
    use_kl_loss = cfg.get("--use-kl-loss") is True
    out = []
    if known(kl_coef, kl_loss_coef) and kl_coef != 0 and kl_loss_coef != 0:
        out.append(
            Finding(
                id_,
                Status.FAIL,
                f"--kl-coef {kl_coef} and --kl-loss-coef {kl_loss_coef} are both non-zero: "
                "slime allows only one KL (reward penalty or loss).",
                "Set one of them to 0.",
                GRPO_DOC,
            )
        )
    needs_ref = use_kl_loss or (kl_coef is not UNKNOWN and kl_coef not in (None, 0))
    if needs_ref and not cfg.has("--ref-load"):
        why = "--use-kl-loss" if use_kl_loss else f"--kl-coef {kl_coef}"
        out.append(
            Finding(
                id_,
                Status.FAIL,
                f"{why} without --ref-load: slime loads the reference model from --ref-load "
                "and stops when it is missing.",
                "Add --ref-load (the Megatron checkpoint of the initial model), or drop the KL flags.",
                GRPO_DOC,
            )
        )
    if not use_kl_loss and known(kl_loss_coef) and kl_loss_coef != 0:
        out.append(Finding(id_, Status.WARN, f"--kl-loss-coef {kl_loss_coef} has no effect without --use-kl-loss.",
                           "Add --use-kl-loss, or drop --kl-loss-coef.", GRPO_DOC))
    if not out:
        state = "KL loss on" if use_kl_loss else ("KL reward penalty on" if needs_ref else "no KL term")
        out.append(Finding(id_, Status.PASS, f"KL settings are consistent ({state})."))
    return out


def _rule(cfg: Config, id_: str, broken: bool, finding: str, fix: str, doc: str = ARGS_DOC) -> Finding | None:
    return Finding(id_, Status.FAIL, finding, fix, doc) if broken else None


def check_validate_args(cfg: Config) -> list[Finding]:
    """The remaining assertions of slime_validate_args (and slime's SGLang checks), one finding each
    when broken, one PASS line otherwise."""
    g, has, num = cfg.get, cfg.has, cfg.number
    estimator = g("--advantage-estimator")
    rbs, over = num("--rollout-batch-size"), num("--over-sampling-batch-size")
    ctx, prompt = num("--rollout-max-context-len"), num("--rollout-max-prompt-len")
    pp, per_engine, dp = num("--sglang-pp-size"), num("--rollout-num-gpus-per-engine"), num("--sglang-dp-size")
    transport, mode = g("--update-weight-transport"), g("--update-weight-mode")
    opd_type = g("--opd-type")
    checks = [
        _rule(
            cfg,
            "config.save",
            has("--save-interval") and not has("--save"),
            f"--save-interval{cfg.where('--save-interval')} without --save: slime stops at start-up.",
            "Add --save DIR, or drop --save-interval.",
            ARGS_DOC,
        ),
        _rule(
            cfg,
            "config.eval",
            has("--eval-interval") and not (has("--eval-prompt-data") or has("--eval-config")),
            f"--eval-interval{cfg.where('--eval-interval')} without --eval-prompt-data or --eval-config: slime stops "
            "at start-up.",
            "Add --eval-prompt-data NAME PATH, or drop --eval-interval.",
            BATCH_DOC,
        ),
        _rule(
            cfg,
            "config.eval",
            isinstance(g("--eval-prompt-data"), list)
            and len(g("--eval-prompt-data")) > 1
            and len(g("--eval-prompt-data")) % 2 == 1,
            "--eval-prompt-data needs NAME PATH pairs; it has an odd number of words.",
            "Give one flag with NAME PATH [NAME PATH ...].",
            BATCH_DOC,
        ),
        _rule(
            cfg,
            "config.dynamic_batch",
            g("--use-dynamic-batch-size") is True and not has("--max-tokens-per-gpu"),
            "--use-dynamic-batch-size without --max-tokens-per-gpu: slime stops at start-up.",
            "Add --max-tokens-per-gpu (start at rollout_max_response_len / context_parallel_size, FAQ 3).",
            FAQ_DOC,
        ),
        _rule(
            cfg,
            "config.dynamic_batch",
            g("--balance-by-flops") is True and g("--use-dynamic-batch-size") is not True,
            "--balance-by-flops needs --use-dynamic-batch-size.",
            "Add --use-dynamic-batch-size.",
            PERF_DOC,
        ),
        _rule(
            cfg,
            "config.advantage",
            estimator in ("reinforce_plus_plus", "reinforce_plus_plus_baseline")
            and g("--normalize-advantages") is not True,
            f"--advantage-estimator {estimator} needs --normalize-advantages.",
            "Add --normalize-advantages.",
            GRPO_DOC,
        ),
        _rule(
            cfg,
            "config.rollout_logprobs",
            g("--use-rollout-logprobs") is True and g("--use-tis") is True,
            "--use-rollout-logprobs and --use-tis cannot be combined.",
            "Drop one of them.",
            GRPO_DOC,
        ),
        _rule(
            cfg,
            "config.mismatch_metrics",
            g("--get-mismatch-metrics") is True and not has("--custom-tis-function-path"),
            "--get-mismatch-metrics needs --custom-tis-function-path.",
            "Add --custom-tis-function-path.",
            GRPO_DOC,
        ),
        _rule(
            cfg,
            "config.debug_modes",
            g("--debug-rollout-only") is True and g("--debug-train-only") is True,
            "--debug-rollout-only and --debug-train-only cannot both be set.",
            "Keep one.",
            ARGS_DOC,
        ),
        _rule(
            cfg,
            "config.over_sampling",
            known(rbs, over) and over < rbs,
            f"--over-sampling-batch-size {over} is below --rollout-batch-size {rbs}.",
            "Make it at least the rollout batch size.",
            BATCH_DOC,
        ),
        _rule(
            cfg,
            "config.num_rollout",
            not has("--num-rollout") and not has("--num-epoch"),
            "Neither --num-rollout nor --num-epoch is set: slime stops at start-up.",
            "Add --num-rollout N.",
            BATCH_DOC,
        ),
        _rule(
            cfg,
            "config.prompt_len",
            known(ctx, prompt) and prompt > ctx - 1,
            f"--rollout-max-prompt-len {prompt} leaves no room for a response in --rollout-max-context-len {ctx}.",
            "Keep the prompt length below the context length.",
            BATCH_DOC,
        ),
        _rule(
            cfg,
            "config.param_filters",
            has("--only-train-params-name-list") and has("--freeze-params-name-list"),
            "--only-train-params-name-list and --freeze-params-name-list exclude each other.",
            "Keep one.",
            ARGS_DOC,
        ),
        _rule(
            cfg,
            "config.weight_sync",
            transport == "disk" and not has("--update-weight-disk-dir"),
            "--update-weight-transport disk needs --update-weight-disk-dir (a directory trainer and engines share).",
            "Add --update-weight-disk-dir.",
            ARGS_DOC,
        ),
        _rule(
            cfg,
            "config.weight_sync",
            mode == "delta"
            and (transport != "disk" or g("--colocate") is True or not has("--update-weight-local-checkpoint-dir")),
            "--update-weight-mode delta needs --update-weight-transport disk, no --colocate, and "
            "--update-weight-local-checkpoint-dir.",
            "Fix the delta-sync flags or use the full mode.",
            slime_doc("docs/en/advanced/delta-weight-sync.md"),
        ),
        _rule(
            cfg,
            "config.release_train",
            g("--release-train") is True and (not has("--save") or transport != "disk" or mode != "full"),
            "--release-train needs --save and full weight sync over disk.",
            "Add --save and --update-weight-transport disk, or drop --release-train.",
            ARGS_DOC,
        ),
        _rule(
            cfg,
            "config.mtp",
            g("--enable-mtp-training") is True and not has("--mtp-num-layers"),
            "--enable-mtp-training needs --mtp-num-layers.",
            "Add --mtp-num-layers.",
            ARGS_DOC,
        ),
        _rule(
            cfg,
            "config.opd",
            g("--use-opd") is True and opd_type is None,
            "--use-opd needs --opd-type sglang or megatron.",
            "Add --opd-type.",
            slime_doc("docs/en/advanced/on-policy-distillation.md"),
        ),
        _rule(
            cfg,
            "config.opd",
            g("--use-opd") is True and opd_type == "megatron" and not has("--opd-teacher-load"),
            "--opd-type megatron needs --opd-teacher-load.",
            "Add --opd-teacher-load.",
            slime_doc("docs/en/advanced/on-policy-distillation.md"),
        ),
        _rule(
            cfg,
            "config.opd",
            has("--opd-teacher-load") and (g("--use-opd") is not True or opd_type == "sglang"),
            "--opd-teacher-load is set but unused (it needs --use-opd with --opd-type megatron).",
            "Drop --opd-teacher-load or enable Megatron OPD.",
            slime_doc("docs/en/advanced/on-policy-distillation.md"),
        ),
        _rule(
            cfg,
            "config.sglang_parallel",
            known(pp, per_engine) and pp > 1 and per_engine % pp,
            f"--rollout-num-gpus-per-engine {per_engine} is not divisible by --sglang-pp-size {pp}.",
            "Make GPUs per engine a multiple of the SGLang pipeline size.",
            ARGS_DOC,
        ),
        _rule(
            cfg,
            "config.sglang_parallel",
            known(dp) and dp > 1 and g("--sglang-enable-dp-attention") is not True,
            f"--sglang-dp-size {dp} needs --sglang-enable-dp-attention.",
            "Add --sglang-enable-dp-attention.",
            ARGS_DOC,
        ),
        _rule(
            cfg,
            "config.sglang_parallel",
            has("--prefill-num-servers") and has("--sglang-config"),
            "--prefill-num-servers and --sglang-config exclude each other.",
            "Use server_groups in the YAML config.",
            slime_doc("docs/en/advanced/pd-disaggregation.md"),
        ),
    ]
    broken = [c for c in checks if c is not None]
    if broken:
        return broken
    return [Finding("config.validate_args", Status.PASS, f"The other {len(checks)} rules of slime's argument checks "
                                                         f"hold.")]


def check_hooks(cfg: Config) -> list[Finding]:
    out = []
    for name in cfg.reg.hook_flags():  # values slime loads with load_function: module.attribute
        for g in cfg.given(name):
            for word in g.values:
                if not word.known:
                    continue
                value = word.text
                # "my_rm.py" parses as module.attribute, but nobody names a function "py".
                if not DOTTED.fullmatch(value) or value.endswith(".py"):
                    module = re.sub(r"\.py$", "", value).replace("/", ".").lstrip(".")
                    fix = (f"Give a dotted import path such as {module}.<function>, with the module's folder on "
                           "PYTHONPATH." if value.endswith(".py") or "/" in value
                           else "Give module.function (a dotted import path).")
                    out.append(
                        Finding(
                            "config.hooks",
                            Status.FAIL,
                            f"{g.name} {value} ({g.where}) is not a dotted import "
                            "path: slime loads hooks with importlib (module.function), not from files.",
                            fix,
                            HOOK_DOC,
                        )
                    )
    return out


# ---------------------------------------------------------------------------------------------
# Files the config points at: HF config.json, prompt data
# ---------------------------------------------------------------------------------------------


def _path(cfg: Config, name: str) -> Path | None:
    value = cfg.get(name)
    if not isinstance(value, str) or not value:
        return None
    path = Path(value).expanduser()
    return path if path.exists() else None


def _close(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


def check_hf_config(cfg: Config) -> list[Finding]:
    id_ = "config.hf_config"
    if not cfg.has("--hf-checkpoint"):
        return []
    folder = _path(cfg, "--hf-checkpoint")
    if folder is None or not (folder / "config.json").is_file():
        written = " ".join(w.text for w in cfg.given("--hf-checkpoint")[-1].values)
        return [Finding(id_, Status.SKIP, f"--hf-checkpoint {written} is not reachable here; "
                        "MODEL_ARGS not compared with its config.json.")]
    try:
        hf = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        return [Finding(id_, Status.WARN, f"{folder}/config.json cannot be read: {e}.", "Check the file.", MODEL_DOC)]
    hf = hf.get("text_config", hf) if isinstance(hf.get("text_config"), dict) else hf
    rope = hf.get("rope_parameters") if isinstance(hf.get("rope_parameters"), dict) else {}
    moe = any(k in hf for k in ("moe_intermediate_size", "num_experts", "n_routed_experts", "num_local_experts"))
    freq = cfg.get("--moe-layer-freq")
    dense_layers = not moe or freq is None or (isinstance(freq, str) and "0" in freq)
    gqa = cfg.get("--group-query-attention") is True
    pairs = [
        ("num_hidden_layers", "--num-layers", hf.get("num_hidden_layers")),
        ("hidden_size", "--hidden-size", hf.get("hidden_size")),
        ("num_attention_heads", "--num-attention-heads", hf.get("num_attention_heads")),
        ("intermediate_size", "--ffn-hidden-size", hf.get("intermediate_size") if dense_layers else None),
        ("moe_intermediate_size", "--moe-ffn-hidden-size", hf.get("moe_intermediate_size")),
        (
            "shared_expert_intermediate_size",
            "--moe-shared-expert-intermediate-size",
            hf.get("shared_expert_intermediate_size"),
        ),
        ("vocab_size", "--vocab-size", hf.get("vocab_size") if cfg.has("--vocab-size") else None),
        ("rope_theta", "--rotary-base", rope.get("rope_theta", hf.get("rope_theta"))),
        ("rms_norm_eps", "--norm-epsilon", hf.get("rms_norm_eps")),
    ]
    mismatches, compared = [], 0
    for hf_key, flag, expected in pairs:
        if expected is None:
            continue
        value = cfg.number(flag)
        if value is UNKNOWN:
            continue
        compared += 1
        if value is None or not _close(value, expected):
            mismatches.append(f"{hf_key} {expected} vs {flag} {value}{cfg.where(flag)}")
    kv = hf.get("num_key_value_heads")
    heads = hf.get("num_attention_heads")
    if kv is not None and heads is not None:
        groups = cfg.number("--num-query-groups") if gqa else heads
        if groups is not UNKNOWN:
            compared += 1
            if groups != kv:
                what = f"--num-query-groups {groups}" if gqa else "no --group-query-attention"
                mismatches.append(f"num_key_value_heads {kv} vs {what}")
    head_dim = hf.get("head_dim")
    if head_dim is not None and cfg.get("--multi-latent-attention") is not True:
        # Megatron's --kv-channels defaults to hidden_size / heads; MLA sizes heads differently.
        channels = cfg.number("--kv-channels")
        hidden, n_heads = cfg.number("--hidden-size"), cfg.number("--num-attention-heads")
        if channels is None and known(hidden, n_heads) and n_heads:
            channels = hidden // n_heads
        if known(channels):
            compared += 1
            if channels != head_dim:
                mismatches.append(f"head_dim {head_dim} vs --kv-channels {channels}")
    tie = hf.get("tie_word_embeddings")  # absent: the model class decides, so it is not compared
    untie = cfg.get("--untie-embeddings-and-output-weights") is True
    compared += tie is not None
    if tie is not None and tie == untie:
        untie_text = ("--untie-embeddings-and-output-weights" if untie
                      else "tied embeddings (no --untie-embeddings-and-output-weights)")
        mismatches.append(f"tie_word_embeddings {str(tie).lower()} vs {untie_text}")
    if mismatches:
        return [Finding(id_, Status.FAIL, f"MODEL_ARGS disagree with {folder}/config.json: {'; '.join(mismatches)}.",
                        "Source the scripts/models/*.sh that matches the checkpoint, or fix the flags (slime checks "
                        "several of these at start-up; the rest corrupt weight conversion).", MODEL_DOC)]
    return [Finding(id_, Status.PASS, f"MODEL_ARGS match {folder}/config.json ({compared} fields compared).")]


def first_rows(path: Path, n: int = DATA_ROWS) -> list:
    """The first rows of a .jsonl or .parquet prompt file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        batch = next(pq.ParquetFile(path).iter_batches(batch_size=n), None)
        return batch.to_pylist() if batch is not None else []
    rows = []
    with path.open(errors="replace") as fh:
        for line in fh:
            if line.strip():
                rows.append(json.loads(line))
                if len(rows) >= n:
                    break
    return rows


def check_data(cfg: Config) -> list[Finding]:
    out = []
    input_key, label_key = cfg.get("--input-key"), cfg.get("--label-key")
    sets = [("--prompt-data", cfg.get("--prompt-data"), input_key, label_key)]
    eval_data = cfg.get("--eval-prompt-data")
    if isinstance(eval_data, list):
        paths = eval_data[1::2] if len(eval_data) > 1 else eval_data
        eval_input = cfg.get("--eval-input-key") or input_key
        eval_label = cfg.get("--eval-label-key") or label_key
        sets += [("--eval-prompt-data", p, eval_input, eval_label) for p in paths]
    for flag, value, in_key, lab_key in sets:
        if not isinstance(value, str) or in_key is UNKNOWN or lab_key is UNKNOWN:
            continue
        path = Path(value).expanduser()
        if not path.is_file():
            out.append(Finding("config.data", Status.SKIP, f"{flag} {value} is not reachable here; its keys are not "
                                                           f"checked."))
            continue
        try:
            rows = first_rows(path)
        except (OSError, ValueError) as e:  # bad JSON, bad parquet (ArrowInvalid is a ValueError)
            out.append(Finding("config.data", Status.FAIL, f"{flag} {value} cannot be read as "
                               f"{'parquet' if path.suffix == '.parquet' else 'JSON lines'}: {e}.",
                               "Use .jsonl (one JSON object per line) or .parquet.", DATA_DOC))
            continue
        missing = [k for k in (in_key, lab_key) if k and any(not isinstance(r, dict) or k not in r for r in rows)]
        if not rows:
            out.append(Finding("config.data", Status.WARN, f"{flag} {value} has no rows.", "Check the file.", DATA_DOC))
        elif missing:
            keys = sorted({k for r in rows if isinstance(r, dict) for k in r})
            out.append(Finding("config.data", Status.FAIL, f"{flag} {value}: the first {len(rows)} rows lack "
                               f"{', '.join(repr(k) for k in missing)} (their keys: {', '.join(keys)}).",
                               "Set --input-key / --label-key to the file's keys (slime's default --input-key is "
                               "'input').", DATA_DOC))
        else:  # a plain-text prompt is fine with --apply-chat-template: slime makes it one user message
            out.append(Finding("config.data", Status.PASS, f"{flag} {value}: the first {len(rows)} rows have "
                               f"{', '.join(repr(k) for k in (in_key, lab_key) if k)}."))
    return out


def check_eval_config(cfg: Config) -> list[Finding]:
    """The datasets of ``--eval-config`` (see :mod:`slime_check.eval_config`)."""
    from slime_check.eval_config import FLAG_FALLBACKS, eval_config_findings

    value = cfg.get("--eval-config")
    if value is None:
        return []
    if value is UNKNOWN:
        return [Finding("config.eval_config", Status.SKIP, f"--eval-config{cfg.where('--eval-config')} is symbolic "
                                                           "here; its datasets are not checked.")]
    out = []
    if cfg.has("--eval-prompt-data"):
        out.append(Finding("config.eval_config", Status.WARN, "--eval-prompt-data and --eval-config are both given: "
                           "slime evaluates the datasets of --eval-config and ignores --eval-prompt-data.",
                           "Drop --eval-prompt-data, or add its datasets to the YAML.", BATCH_DOC))
    flags = {f: cfg.get(f) for fallbacks in FLAG_FALLBACKS.values() for f in fallbacks}
    found = eval_config_findings(value, flags=flags)
    if cfg.target != "v0.3.1":  # main reads eval.defaults otherwise (#2242): the drift rows say how
        found = [f for f in found if not (f.status is Status.WARN and " defaults." in f.finding
                                          and "is ignored by slime" in f.finding)]
    return out + found


def check_drift(cfg: Config) -> list[Finding]:
    """Behaviours that differ between slime v0.3.1 and main the job relies on (see :mod:`slime_check.drift`)."""
    from slime_check.drift import drift_findings

    return drift_findings(cfg, cfg.target)


CRITIC_DOC = GRPO_DOC  # algorithm flags; the skill explains the critic in references/algorithms.md


def check_critic(cfg: Config) -> list[Finding]:
    """slime's critic rules: ``use_critic`` follows from ``--advantage-estimator ppo``; the critic takes
    the actor's GPUs, forces ``offload_train``, reads its own flags from ``--megatron-config-path``'s
    ``role: critic`` entry, and cannot run with ``--release-train``."""
    id_ = "config.critic"
    ppo = cfg.get("--advantage-estimator") == "ppo"
    critic_only = cfg.number("--num-critic-only-steps")
    out = []
    if ppo and cfg.get("--release-train") is True:
        out.append(Finding(id_, Status.FAIL, "--release-train with --advantage-estimator ppo: slime stops at start-up "
                                             "(release-train does not support critic training).",
                           "Drop --release-train, or use a critic-free estimator (grpo, gspo, ...).", ARGS_DOC))
    if not ppo and known(critic_only) and critic_only:
        out.append(Finding(id_, Status.WARN, f"--num-critic-only-steps {critic_only} has no effect without a critic.",
                           "Add --advantage-estimator ppo, or drop --num-critic-only-steps.", CRITIC_DOC))
    if not ppo and cfg.has("--megatron-config-path"):
        out.append(Finding(id_, Status.WARN, "--megatron-config-path is read only for the critic "
                                             "(--advantage-estimator ppo); this run ignores it.",
                           "Add --advantage-estimator ppo, or drop --megatron-config-path.", CRITIC_DOC))
    if ppo and cfg.get("--offload-train") is False:
        out.append(Finding(id_, Status.WARN, "--no-offload-train with a critic: slime turns --offload-train on "
                                             "anyway (actor and critic take turns on the same GPUs).",
                           "Drop --no-offload-train.", CRITIC_DOC))
    if ppo and not out:
        num_rollout = cfg.number("--num-rollout")
        only = known(critic_only, num_rollout) and critic_only and critic_only >= num_rollout
        out.append(Finding(id_, Status.PASS, "PPO critic on the actor's GPUs, --offload-train on"
                                             + (" (critic-only run: the actor never trains)." if only else ".")))
    return out


def check_transformer_impl(cfg: Config) -> list[Finding]:
    """``--transformer-impl local`` builds Megatron's local layer spec, whose layer norms are separate
    modules (``input_layernorm``, ``pre_mlp_layernorm``). slime v0.3.1's weight converters for Qwen2/3,
    Qwen3-MoE, Llama and GLM-4 know only TransformerEngine's names for them (the norm fused into
    ``linear_qkv`` / ``linear_fc1``): ``hf_to_megatron/qwen.py`` raises KeyError on the HF load, and
    ``megatron_to_hf/qwen2.py`` ValueError on the weight update. DeepSeek-V3's converters take both."""
    id_ = "config.transformer_impl"
    if cfg.get("--transformer-impl") != "local" or cfg.has("--spec"):
        return []
    folder = _path(cfg, "--hf-checkpoint")
    model_type = None
    if folder is not None and (folder / "config.json").is_file():
        try:
            hf = json.loads((folder / "config.json").read_text())
            model_type = str(hf.get("text_config", {}).get("model_type") or hf.get("model_type") or "") or None
        except (OSError, ValueError, AttributeError):
            model_type = None
    if model_type is not None and "deepseek" in model_type:
        return [Finding(id_, Status.PASS, f"--transformer-impl local with a {model_type} checkpoint: slime's "
                                          "DeepSeek-V3 converters know the local layer names.")]
    what = f"a {model_type} checkpoint" if model_type else "a Qwen, Llama or GLM-4 checkpoint"
    finding = (f"--transformer-impl local{cfg.where('--transformer-impl')} with {what}: slime v0.3.1's weight "
               "converters know only TransformerEngine's layer names, so loading the HF weights stops with "
               "KeyError: \"Unsupported Qwen/Llama Megatron parameter 'decoder.layers.0.input_layernorm.weight'\", "
               "and the weight update to SGLang with ValueError: Unknown parameter name.")
    fix = ("Install TransformerEngine (slime's image has 2.16.1) and drop --transformer-impl local; without it, "
           "only a --spec whose layers carry TransformerEngine's parameter names loads.")
    return [Finding(id_, Status.FAIL if model_type else Status.WARN, finding, fix, slime_doc("docker/Dockerfile"))]


def check_cuda_graphs(cfg: Config) -> list[Finding]:
    """Megatron-LM's training CUDA-graph flags as slime v0.3.1 sees them. With ``--cuda-graph-impl local
    --cuda-graph-scope full_iteration``, Megatron-LM's ``validate_args`` (which slime runs) asserts
    ``--no-check-for-nan-in-loss-and-grad``. And the full-iteration graph is Megatron-LM's
    ``FullCudaGraphWrapper``, applied only in its own training loop (``megatron/training/training.py``);
    slime's actor calls megatron-core's schedule itself, and that scope graphs no layer, so slime's
    training steps run eagerly with these flags."""
    id_ = "config.cuda_graphs"
    scope = cfg.get("--cuda-graph-scope")
    scopes = [str(s) for s in scope] if isinstance(scope, list) else [str(scope)] if scope else []
    if cfg.get("--cuda-graph-impl") != "local" or not any(s.endswith("full_iteration") for s in scopes):
        return []
    where = cfg.where("--cuda-graph-scope")
    if not cfg.has("--no-check-for-nan-in-loss-and-grad"):
        return [Finding(id_, Status.FAIL,
                        f"--cuda-graph-scope full_iteration{where} without --no-check-for-nan-in-loss-and-grad: "
                        "Megatron-LM's argument check stops slime at start-up (AssertionError: "
                        "--no-check-for-nan-in-loss-and-grad should be set with full_iteration CUDA graph).",
                        "Add --no-check-for-nan-in-loss-and-grad, or drop the CUDA graph flags.", ARGS_DOC)]
    return [Finding(id_, Status.WARN,
                    f"--cuda-graph-impl local --cuda-graph-scope full_iteration{where}: slime v0.3.1 runs its "
                    "training steps eagerly with these flags; Megatron-LM's full-iteration graph wraps only "
                    "Megatron-LM's own training loop, which slime's actor does not use.",
                    "Drop the flags on slime (they change nothing there but turn off the NaN checks); slime-ref "
                    "replays each repeated step shape from a CUDA graph with them.", ARGS_DOC)]


def check_top_p_replay(cfg: Config) -> list[Finding]:
    """slime v0.3.1 turns on top-p replay at a rollout top-p below 1: GenerateState asks SGLang for each
    step's nucleus, ray/rollout.py asserts that every sample carries it, and the loss renormalises the
    log-probs over it. Only SGLang with slime's patch (sglang-top_p.patch) returns the nucleus."""
    top_p = cfg.number("--rollout-top-p")
    if not known(top_p) or top_p == 1.0:
        return []
    hook = (" A --custom-generate-function-path must keep them on each sample too: pass SGLang's meta_info to "
            "sample.append_response_tokens." if cfg.has("--custom-generate-function-path") else "")
    return [Finding("config.top_p_replay", Status.WARN,
                    f"--rollout-top-p {top_p}{cfg.where('--rollout-top-p')} is below 1, which turns on slime's "
                    "top-p replay: every sample must carry the nucleus token ids that only SGLang with slime's "
                    "patch returns (slime's image). With a stock SGLang the run stops on an assertion as the "
                    f"first rollout becomes training data.{hook}",
                    "Run on slime's image (its patched SGLang), or set --rollout-top-p 1.0.", BATCH_DOC)]


RULES = [check_flags, check_batch, check_gpus, check_parallelism, check_kl, check_validate_args, check_critic,
         check_transformer_impl, check_cuda_graphs, check_top_p_replay, check_hooks, check_hf_config, check_data,
         check_eval_config, check_drift]


def lint_argv(argv: list[Word], entry: str = "train.py", reg: Registry | None = None,
              target: str | None = None) -> list[Finding]:
    """``config``'s findings on one train argv, against ``reg`` (default: the shipped flags of ``target``,
    else of v0.3.1) and the behaviour of ``target`` (default: the registry's slime)."""
    reg = reg or load_registry(target or "v0.3.1")
    cfg = Config(parse_argv(argv, reg), reg, entry, target)
    findings: list[Finding] = []
    for rule in RULES:
        findings += rule(cfg)
    return findings


@dataclass
class Report:
    """Findings for one train invocation (or one script that has none)."""

    title: str
    findings: list[Finding]


def script_findings(reading) -> list[Finding]:
    out = []
    for note in reading.notes:
        out.append(Finding("config.script", Status.WARN, note, "Fix the path or pass --slime-dir (a sourced file); "
                           "give a variable the script cannot show with --env NAME=VALUE.", ARGS_DOC))
    if reading.substituted:
        out.append(
            Finding("config.script", Status.PASS, "Read from --slime-dir: " + "; ".join(reading.substituted) + ".")
        )
    for orphan in reading.orphans:
        flags = [w.text for w in orphan.words if w.known and w.text.startswith("--")]
        out.append(
            Finding(
                "config.script",
                Status.FAIL,
                f"{orphan.origin}: a command starts with {orphan.words[0].text}: "
                f"the line before lacks its trailing backslash, so {len(flags)} flags never reach train.py.",
                "End every continued line of the train command with a backslash.",
                ARGS_DOC,
            )
        )
    return out


def hook_values(argv: list[Word], reg: Registry) -> list[tuple[str, str]]:
    """[(flag, module.attribute)] of the hook flags given with a known dotted value."""
    out, hook_flags = [], set(reg.hook_flags())
    for g in parse_argv(argv, reg).given:
        if g.flag is not None and g.flag.name in hook_flags:
            out += [(g.name, w.text) for w in g.values if w.known and DOTTED.fullmatch(w.text)
                    and not w.text.endswith(".py")]
    return out


def lint_script(path: str | Path, slime_dir: str | Path | None = None, env: dict[str, str] | None = None,
                reg: Registry | None = None, target: str | None = None, hooks: bool = True) -> list[Report]:
    """``config``'s reports on a launch script, one per train command. ``hooks``: also look at the hook
    modules the command names (layout, and an import where the module is on this machine;
    :mod:`slime_check.hook_check`); smoke leaves that to its own preflight."""
    from slime_check.launch_script import read_script

    reading = read_script(path, slime_dir, env)
    common = script_findings(reading)
    if not reading.invocations:
        return [Report(str(path), common + [Finding("config.script", Status.FAIL, "No `python train.py` or "
                                                    "`python train_async.py` command found.",
                                                    "Check the script launches slime's train.py.", ARGS_DOC)])]
    reports = []
    for inv in reading.invocations:
        title = f"{path} ({inv.entry} at {inv.origin}{', in a branch' if inv.conditional else ''})"
        findings = common + lint_argv(inv.argv, inv.entry, reg, target)
        judged = reg or load_registry(target or "v0.3.1")
        if hooks and (given := hook_values(inv.argv, judged)):
            from slime_check.hook_check import check_hook_modules, search_roots

            job_env = {**inv.env, **(env or {})}
            roots = search_roots(Path(path), Path(slime_dir) if slime_dir else None, job_env)
            findings += check_hook_modules(given, roots, judged_target(judged, target), job_env)
        reports.append(Report(title, findings))
    return reports
