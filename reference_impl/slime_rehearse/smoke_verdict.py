"""The verdict of a ``slime-check smoke`` run: findings from its log, metrics, hook counts, the label
probe, the dynamic filter's counts and the line coverage of the user's hooks.

Each part is a function of what the run left behind (no process is started here), so each is tested
on made-up results as well as on real runs.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from slime_check.findings import CUSTOMIZATION, FAQ, Finding, Status, slime_doc

DOC = "skill/references/smoke.md"
HOOK_DOC = slime_doc(CUSTOMIZATION)
RESPONSES_HINT = ('give --responses FILE, JSONL lines like {"prompt": "<text of a prompt>", "response": '
                  '"<an answer your reward scores>", "correct": true}; a list of turns scripts a tool call')
# Ray prefixes a worker's lines with "(RolloutManager pid=123) " or "(pid=123, ip=...) ".
RAY_PREFIX = re.compile(r"^\((?:[\w.]+ )?pid=\d+(?:, ip=[\d.]+)?\)\s?")
EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Failure)|"
                            r"[A-Za-z_][\w.]*\.[A-Z]\w*)(?::\s?(.*))?$")
FRAME_LINE = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')
# The built-in engine's refusal of an input longer than the model's context (engine/scheduler.py).
CONTEXT_REFUSAL = re.compile(r"longer than the model's context|max_position_embeddings|context length", re.I)


def flat(record: dict) -> dict:
    return record.get("metrics", record) if isinstance(record.get("metrics"), dict) else record


# ---------------------------------------------------------------------------------------------
# the run as a whole


def last_traceback(log: str) -> dict | None:
    """The last Python traceback of the log: its exception line and the frame that raised it."""
    lines = [RAY_PREFIX.sub("", ln) for ln in log.splitlines()]
    starts = [i for i, ln in enumerate(lines) if ln.strip() == "Traceback (most recent call last):"]
    if not starts:
        return None
    frame = None
    for ln in lines[starts[-1] + 1:]:
        m = FRAME_LINE.match(ln)
        if m:
            frame = {"file": m.group(1), "line": int(m.group(2)), "function": m.group(3).strip()}
            continue
        if ln.startswith((" ", "\t")) or not ln.strip():
            continue
        if EXCEPTION_LINE.match(ln.strip()):
            return {"exception": ln.strip()[:400], "frame": frame}
    return None


def run_findings(result: dict, opts) -> list[Finding]:
    log = result.get("log", "")
    rc, timed_out = result.get("returncode"), result.get("timed_out")
    if timed_out:
        return [Finding("smoke.run", Status.FAIL, f"the run did not finish within {opts.timeout_s:.0f} s; it was "
                        "stopped.", "Look at the last phase in OUT/smoke.log; raise --timeout if it was still "
                        "progressing.", DOC)]
    if rc == 0:
        return [Finding("smoke.run", Status.PASS, f"{opts.rollouts} rollouts finished in "
                        f"{result.get('wall_s', 0):.0f} s")]
    if rc is None:
        return []
    error_lines = [ln for ln in log.splitlines() if ln.startswith("slime-ref: ")]
    crash = last_traceback(log)
    if error_lines:
        what = error_lines[-1]
    elif crash:
        where = crash["frame"]
        what = crash["exception"] + (f" (raised in {where['function']} at {where['file']}:{where['line']})"
                                     if where else "")
    else:
        what = f"exit status {rc}"
    return [Finding("smoke.run", Status.FAIL, f"the run failed: {what}", "See the findings below and "
                    "OUT/smoke.log.", DOC)]


def hook_findings(hooks: dict, rc) -> list[Finding]:
    from slime_rehearse.smoke_job import FULL_LENGTH_HOOK

    findings = []
    for hook_id, h in hooks.items():
        label = f"{h['flag']} {h['path']}"
        if hook_id == FULL_LENGTH_HOOK and not h["errors"]:  # the smoke's wrapper, not a hook of the job's
            if h["calls"]:
                findings.append(Finding("smoke.hook_calls", Status.PASS, f"{label} (slime's, wrapped by the smoke to "
                                        f"force full-length answers): {h['calls']} calls"))
            continue
        if h["errors"] and CONTEXT_REFUSAL.search(h["first_error"] or ""):
            findings.append(Finding("smoke.stand_in_context", Status.WARN, f"{label}: the stand-in model's engine "
                                    f"refused a request longer than its context ({h['first_error']}); this is the "
                                    "rehearsal's limit, not your hook's fault.", "Copy your checkpoint's config.json "
                                    "and tokenizer here, or set --rollout-max-context-len.", DOC))
        elif h["errors"]:
            findings.append(Finding("smoke.hook_error", Status.FAIL, f"{label} raised on {h['errors']} of "
                                    f"{h['calls']} calls: {h['first_error']}",
                                    "Fix the hook (the smoke run's samples are in OUT/run).", HOOK_DOC))
        elif h["calls"] == 0 and rc == 0:
            findings.append(Finding("smoke.hook_calls", Status.WARN, f"{label} was never called.",
                                    "Check the flag is the one slime calls for this hook.", HOOK_DOC))
        elif h["calls"] == 0:
            findings.append(Finding("smoke.hook_calls", Status.SKIP, f"{label}: not reached (the run stopped first)"))
        else:
            findings.append(Finding("smoke.hook_calls", Status.PASS, f"{label}: {h['calls']} calls"))
    return findings


# ---------------------------------------------------------------------------------------------
# rewards: the label probe, and what the run logged


def probe_findings(probe: dict | None) -> list[Finding]:
    """What the label probe learned of the reward's answer format (``smoke_runtime.probe_reward``)."""
    if not probe:
        return []
    if probe.get("failed"):
        return [Finding("smoke.reward_format", Status.WARN, f"the label probe could not run: {probe['failed']}",
                        RESPONSES_HINT, DOC)]
    if not probe.get("reward"):
        return []
    calls = f"{probe['calls']} extra call{'s' if probe['calls'] != 1 else ''} to {probe['reward']} before the run"
    findings = []
    wrong = [r for r in probe.get("responses", []) if r.get("score") is not None and r["score"] <= 0]
    for r in wrong:
        findings.append(Finding("smoke.reward", Status.FAIL, f"{probe['reward']} gives {r['score']:g} to a "
                                f"response --responses marks correct: {r['response'][:120]!r}.",
                                "Fix the reward (answer format, --label-key, --reward-key), or the response.",
                                slime_doc(FAQ)))
    taken = sorted(shape for shape, score in probe.get("shapes", {}).items() if score > 0)
    tried = ", ".join(probe.get("shapes", {}) or probe.get("errors", {}))
    if not any(probe.get("answers", [])):
        findings.append(Finding("smoke.reward_format", Status.WARN, "the prompt rows have no label the probe can "
                                f"read an answer from ({calls}).", RESPONSES_HINT, DOC))
    elif taken:
        findings.append(Finding("smoke.reward_format", Status.PASS, f"{probe['reward']} scores the reference answer "
                                f"written as {', '.join(taken)}; the stand-in model answers so in part of each group "
                                f"({calls})."))
    else:
        errors = "; ".join(f"{k}: {v}" for k, v in list(probe.get("errors", {}).items())[:2])
        findings.append(Finding("smoke.reward_format", Status.WARN, f"{probe['reward']} gave 0 to the reference "
                                f"answer in every shape tried ({tried}){'; raised: ' + errors if errors else ''}: "
                                f"no rehearsed answer earns a reward ({calls}).", RESPONSES_HINT, DOC))
    return findings


def is_sft(argv_items) -> bool:
    flags = {flag: values for flag, values in argv_items}
    return ((flags.get("--loss-type") or [None])[-1] == "sft_loss" or "--debug-train-only" in flags
            or "--disable-compute-advantages-and-returns" in flags)


def reward_findings(rollouts: list[dict], shrunk, opts, sft: bool, scripted: bool) -> list[Finding]:
    if sft:
        return [Finding("smoke.reward", Status.PASS, "not applicable: an SFT job (--loss-type sft_loss) trains on "
                        "its data's responses; no reward, advantage or truncation is judged")]
    rewards = [flat(r)["rollout/raw_reward"] for r in rollouts]
    zero_std = [flat(r).get("rollout/zero_std_ratio") for r in rollouts]  # None: not logged
    findings = []
    if all(z == 1.0 for z in zero_std):
        why = ("" if scripted else " (expected with random weights and no answer the reward scores; "
               + RESPONSES_HINT + ")")
        findings.append(Finding("smoke.reward", Status.WARN, f"rewards were equal within every group (mean "
                                f"{sum(rewards) / len(rewards):.3f}): zero advantages in this rehearsal{why}.",
                                "Watch rollout/zero_std_ratio in the real run; check the reward on known answers.",
                                slime_doc(FAQ)))
    else:
        vary = "rewards vary within groups" if None not in zero_std else "rewards logged"
        findings.append(Finding("smoke.reward", Status.PASS, f"{vary}: mean per rollout "
                                + ", ".join(f"{r:.3f}" for r in rewards)))
    trunc = [flat(r).get("rollout/truncated_ratio", 0.0) for r in rollouts]
    lengths = [flat(r).get("rollout/response_length", 0.0) for r in rollouts]
    share = sum(trunc) / len(trunc)
    cap = shrunk.user_max_len
    capped_by_smoke = cap is None or cap > opts.response_cap
    if share >= 1.0 and not capped_by_smoke:
        findings.append(Finding("smoke.truncation", Status.FAIL, f"every response was cut at "
                                f"--rollout-max-response-len {cap}: rewards see unfinished answers.",
                                "Raise --rollout-max-response-len, or set --rollout-stop / "
                                "--rollout-stop-token-ids for your model.", slime_doc(FAQ)))
    else:
        shown = min(cap or opts.response_cap, opts.response_cap)
        findings.append(Finding("smoke.truncation", Status.PASS, f"{share:.0%} of responses truncated at {shown} "
                                f"tokens; mean length {sum(lengths) / len(lengths):.1f}"
                                + (" (the rehearsal's cap; random weights seldom stop)" if capped_by_smoke else "")))
    return findings


# ---------------------------------------------------------------------------------------------
# the dynamic filter


FILTER_KEYS = ("groups_seen", "groups_dropped", "dropped_with_spread", "starved", "filled")


def filter_counts(metrics: list[dict]) -> dict | None:
    """The dynamic filter's counts over the run's rollouts, or None when no filter ran."""
    rollouts = [flat(r) for r in metrics if "rollout/dynamic_filter/groups_seen" in flat(r)]
    if not rollouts:
        return None
    counts = {k: sum(int(r.get(f"rollout/dynamic_filter/{k}", 0)) for r in rollouts) for k in FILTER_KEYS}
    reasons: dict[str, int] = {}
    for r in rollouts:
        for key, value in r.items():
            if key.startswith("rollout/dynamic_filter/drop_"):
                reason = key.removeprefix("rollout/dynamic_filter/drop_")
                reasons[reason] = reasons.get(reason, 0) + int(value)
    return {**counts, "starved_rollouts": sum(1 for r in rollouts if r.get("rollout/dynamic_filter/starved")),
            "rollouts": len(rollouts), "reasons": reasons}


def filter_findings(counts: dict | None) -> list[Finding]:
    if counts is None:
        return []
    seen, dropped, spread = counts["groups_seen"], counts["groups_dropped"], counts["dropped_with_spread"]
    reasons = ", ".join(f"{k} x{v}" for k, v in sorted(counts["reasons"].items(), key=lambda kv: -kv[1])) or "none"
    share = f"{dropped} of {seen} groups ({dropped / max(1, seen):.0%}; reasons: {reasons})"
    if dropped == seen and spread > 0:
        return [Finding("smoke.filter", Status.FAIL, f"the dynamic filter dropped every group it saw, {share}, even "
                        f"the {spread} whose rewards differed: it would starve the real run too.",
                        "Fix the filter (--dynamic-sampling-filter-path): it must keep groups with reward spread.",
                        HOOK_DOC)]
    if counts["starved"]:
        cause = ("every dropped group had equal rewards, which the stand-in model's answers explain; "
                 if spread == 0 else f"{spread} dropped groups had reward spread: the filter itself dropped them; ")
        return [Finding("smoke.filter_starved", Status.WARN, f"the dynamic filter dropped {share}; in "
                        f"{counts['starved_rollouts']} of {counts['rollouts']} rollouts the rehearsal stopped "
                        f"drawing and filled the batch with the {counts['filled']} best dropped groups, so training "
                        f"went on. {cause}in the real run watch rollout/dynamic_filter/*.",
                        RESPONSES_HINT[0].upper() + RESPONSES_HINT[1:] + ", so that groups have reward spread.", DOC)]
    return [Finding("smoke.filter", Status.PASS, f"the dynamic filter kept {seen - dropped} of {seen} groups "
                    f"(dropped {dropped}; reasons: {reasons})")]


# ---------------------------------------------------------------------------------------------
# line coverage of the user's hooks


def functions_by_line(path: str) -> dict[int, str]:
    """Each line of a file -> the innermost function (qualified name) it belongs to."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return {}
    owner: dict[int, str] = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef) and child.body:
                    # the body only: the def line runs at import, whether or not the function is called
                    for line in range(child.body[0].lineno, (child.end_lineno or child.lineno) + 1):
                        owner[line] = name
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return owner


def line_ranges(lines: list[int], statements: list[int]) -> list[tuple[int, int]]:
    """Missed lines as ranges, joining lines that only non-statements (blank, comments) separate."""
    if not lines:
        return []
    order = sorted(statements)
    position = {line: i for i, line in enumerate(order)}
    ranges = [[lines[0], lines[0]]]
    for line in lines[1:]:
        if position.get(line, -2) == position.get(ranges[-1][1], -9) + 1:
            ranges[-1][1] = line
        else:
            ranges.append([line, line])
    return [(a, b) for a, b in ranges]


def hook_coverage(data_dir: Path, config_file: Path, files: list[str]) -> list[dict]:
    """Per hook file: statements, lines run, and the missed ranges with the function each belongs to."""
    import coverage

    data_files = [str(p) for p in data_dir.glob(".coverage.*")]
    cov = coverage.Coverage(data_file=str(data_dir / ".coverage"), config_file=str(config_file))
    if data_files:
        cov.combine(data_files, keep=True)
    cov.load()
    measured = set(cov.get_data().measured_files())
    report = []
    for path in sorted(set(files)):
        try:
            _, statements, _, missing, _ = cov.analysis2(path)
        except Exception:  # not Python source coverage can read
            continue
        if path not in measured:
            missing = list(statements)
        owner = functions_by_line(path)
        ran_functions = {owner.get(line) for line in statements if line not in set(missing)}
        ranges = [{"lines": [a, b], "function": owner.get(a)} for a, b in line_ranges(sorted(missing), statements)]
        report.append({"file": path, "statements": len(statements), "run": len(statements) - len(missing),
                       "missing": ranges, "functions_run": sorted(f for f in ran_functions if f)})
    return report


def coverage_findings(report: list[dict] | None) -> list[Finding]:
    findings = []
    for entry in report or []:
        name = Path(entry["file"]).name
        findings.append(Finding("smoke.coverage", Status.PASS, f"{entry['file']}: {entry['run']} of "
                                f"{entry['statements']} lines ran"))
        partial: dict[str, list[str]] = {}
        for gap in entry["missing"]:
            function = gap["function"]
            if function and function in entry["functions_run"]:  # a branch of a function that ran
                a, b = gap["lines"]
                partial.setdefault(function, []).append(f"{a}" if a == b else f"{a}-{b}")
        for function, spans in partial.items():
            lines = ("line " if len(spans) == 1 and "-" not in spans[0] else "lines ") + ", ".join(spans)
            findings.append(Finding("smoke.coverage", Status.WARN, f"{function} ({name}) ran, but {lines} never "
                                    "did: the rehearsal did not reach that branch.",
                                    f"To reach {lines}, {RESPONSES_HINT}.", DOC))
    return findings


def stand_in_counts(stats_file: Path) -> dict | None:
    """How many answers the stand-in engine scripted and how many it sampled (its stats file)."""
    if not stats_file.is_file():
        return None
    scripted = sampled = 0
    for line in stats_file.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        scripted += bool(entry.get("scripted"))
        sampled += not entry.get("scripted")
    return {"scripted": scripted, "sampled": sampled}


# ---------------------------------------------------------------------------------------------
# all of it


def verdict(result: dict, shrunk, opts) -> list[Finding]:
    from slime_check.log_signatures import scan
    from slime_rehearse.smoke_job import last, split_flags

    rc = result.get("returncode")
    findings = run_findings(result, opts) + scan(result.get("log", ""))
    findings += hook_findings(result.get("hooks", {}), rc)
    findings += probe_findings(result.get("probe"))
    findings += filter_findings(filter_counts(result.get("metrics", [])))
    items = split_flags(shrunk.argv)
    sft = is_sft(items)
    rollouts = [r for r in result.get("metrics", []) if "rollout/raw_reward" in flat(r)]
    stand_in = result.get("stand_in") or {}
    if rollouts and getattr(opts, "memory", False):  # forced full-length answers: rewards say nothing
        findings += weight_findings(result, rc)
    elif rollouts:
        findings += reward_findings(rollouts, shrunk, opts, sft, bool(stand_in.get("scripted")))
        findings += weight_findings(result, rc)
    elif last(items, "--debug-rollout-only") is not None:
        findings.append(Finding("smoke.reward", Status.SKIP, "not judged: slime logs a rollout's rewards from its "
                                "trainer, which --debug-rollout-only does not run"))
    elif rc == 0 and not sft:
        findings.append(Finding("smoke.reward", Status.WARN, "no rollout metrics were logged.",
                                "Check OUT/run/metrics.jsonl (slime-ref) or the `rollout N: {...}` lines of "
                                "OUT/smoke.log (slime).", DOC))
    findings += coverage_findings(result.get("coverage"))
    return findings


def weight_findings(result: dict, rc) -> list[Finding]:
    diffs = [flat(r)["perf/weight_check_max_abs_diff"] for r in result.get("metrics", [])
             if "perf/weight_check_max_abs_diff" in flat(r)]
    compared = result.get("log", "").count("[WeightChecker] handle action=compare")  # real slime: SGLang's checker
    if diffs:
        return [Finding("smoke.weight_update", Status.PASS, f"--check-weight-update-equal: engines match the trainer "
                        f"after {len(diffs)} syncs (max |diff| {max(diffs):.2g})")]
    if compared and rc == 0:
        return [Finding("smoke.weight_update", Status.PASS, f"--check-weight-update-equal: SGLang's weight checker "
                        f"compared the engines with the trainer {compared} time(s), after the first sync; slime "
                        "stops the run on a mismatch")]
    return []


def drift_rehearsal(job, target: str | None, reg=None) -> list[Finding]:
    """slime-ref keeps slime v0.3.1's behaviour. For a job that targets another slime, a WARN for each
    behaviour that differs there and the job relies on (see slime_check.drift); the rest is rehearsed."""
    from slime_check.config_lint import Config, parse_argv
    from slime_check.drift import V031, rehearsal_findings
    from slime_check.launch_script import Origin, Word
    from slime_common.registry import load_registry

    if target is None or target == V031 or not job.argv:
        return []
    class JobOrigin(Origin):  # the job's words after reading the script: named by the script alone
        def __str__(self):
            return Path(self.file).name

    reg = reg or load_registry(target)
    words = [Word([a], JobOrigin(job.source, 0)) for a in job.argv]
    return rehearsal_findings(Config(parse_argv(words, reg), reg, job.entry, target), target)
