"""``slime-check config``'s checks of the flags themselves, the batch sizes, GPUs and parallelism."""

from __future__ import annotations

from slime_check.config_argv import (
    ARGS_DOC,
    BATCH_DOC,
    COLOCATE_DOC,
    PERF_DOC,
    UNKNOWN,
    Config,
    Given,
    known,
    rule_findings,
)
from slime_check.findings import Finding, Status
from slime_common.arg_rules import BATCH_FIX
from slime_common.registry import KNOWN_SLIMES, load_registry

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
    broken = rule_findings(cfg, ids=(id_,))  # the rules slime-ref enforces too (slime_common.arg_rules)
    if broken:
        return broken[:1]
    if steps is not None:
        computed = samples // steps
        if samples % steps:
            return [
                Finding(
                    id_,
                    Status.WARN,
                    f"{rbs} x {n} = {samples} samples do not split into {steps} equal steps: "
                    f"each step takes {computed} and {samples - computed * steps} samples per rollout are dropped.",
                    BATCH_FIX,
                    BATCH_DOC,
                )
            ]
        gbs = computed
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

