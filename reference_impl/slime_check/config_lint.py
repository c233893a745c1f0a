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

from dataclasses import dataclass
from pathlib import Path

from slime_check.config_argv import (  # noqa: F401  (importable from here, where callers look)
    ARGS_DOC,
    DOTTED,
    UNKNOWN,
    Config,
    ConfigValues,
    Given,
    ParsedArgv,
    Unknown,
    is_option,
    judged_target,
    known,
    parse_argv,
)
from slime_check.config_checks import check_batch, check_flags, check_gpus, check_parallelism
from slime_check.config_files import check_data, check_drift, check_eval_config, check_hf_config, first_rows  # noqa: F401
from slime_check.config_rules import (
    check_critic,
    check_cuda_graphs,
    check_hooks,
    check_kl,
    check_top_p_replay,
    check_transformer_impl,
    check_validate_args,
)
from slime_check.findings import Finding, Status
from slime_check.launch_script import Word
from slime_common.registry import Registry, load_registry

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
