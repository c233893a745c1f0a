"""``slime-check smoke``: rehearse a launch script at toy size before the long run.

1. checks   ``config`` on the script, and the ``prereqs`` groups the chosen engine needs
2. shrink   the same job, smaller: a few rollouts of a few prompts, short responses, one eval,
            saves under --out, W&B offline, --check-weight-update-equal on (``OUT/smoke-command.sh``)
3. run      ``--with slime-ref`` (CPU): a tiny model of the script's family, the first rows of its
            data, its hooks unchanged (a ``slime`` compatibility namespace when slime is missing),
            every hook call counted. ``--with slime``: the real train.py with the same argv.
4. verdict  findings from the log and the run's metrics: hook call counts, rewards, truncation,
            the weight-update check, seconds per phase, peak memory, and an estimate per rollout.

Safety: everything is written under --out; the user's --save/--load directories are never touched;
the run has its own session (process group), and exactly the processes it started are stopped on
success, failure, timeout or Ctrl-C. A Ray cluster it did not start is never stopped.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import time
from dataclasses import replace
from pathlib import Path

from slime_check.findings import Finding, Status
from slime_check.hook_check import preflight_hooks, write_hooks
from slime_rehearse.gpu_memory import MARKS_DIR, start_sampler
from slime_rehearse.smoke_assets import (
    build_model,
    hook_counts,
    read_responses,
    scripted_tokens,
    users_files,
    write_coverage_config,
    write_data,
    write_engine_script,
)
from slime_rehearse.smoke_job import (
    DATA_ROWS,
    Job,
    Shrunk,
    SmokeOptions,
    as_int,
    last,
    leave_out_unimplemented,
    read_job,
    shrink,
    split_flags,
)
from slime_rehearse.smoke_launch import (
    Launched,
    remove_ray_temp_dir,
    run_env,
    slime_cmd,
    slime_importable,
    slime_ref_cmd,
    start_ray_head,
)
from slime_rehearse.smoke_memory import memory_verdict
from slime_rehearse.smoke_verdict import filter_counts, flat, hook_coverage, stand_in_counts, verdict

# ---------------------------------------------------------------------------------------------
# the verdict


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def slime_log_metrics(log: str, groups: int | None = None) -> list[dict]:
    """Real slime writes no metrics file: its per-rollout metrics are the ``rollout N: {...}`` and
    ``perf N: {...}`` lines of its log, read here with the skill's log summariser. slime's
    ``rollout/response_len/mean`` (the rollout manager's) or else ``rollout/response_lengths`` (the
    trainer's mean over its samples: all a --load-debug-rollout-data job logs) is also given as
    ``rollout/response_length``, slime-ref's name.
    slime counts the groups whose rewards are all equal (``rollout/zero_std/count_<reward>``, logged
    only for the rewards that had such groups); given ``groups`` (--rollout-batch-size), that becomes
    ``rollout/zero_std_ratio``, slime-ref's name."""

    from slime_check.skill_install import bundle_root

    path = bundle_root() / "skill" / "scripts" / "slime_log_summary.py"
    spec = importlib.util.spec_from_file_location("slime_log_summary", path)
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    records = []
    for rollout_id, metrics in sorted(summary.read_log(log.splitlines()).items()):
        length = metrics.get("rollout/response_len/mean", metrics.get("rollout/response_lengths"))
        if length is not None:
            metrics.setdefault("rollout/response_length", length)
        if groups and "rollout/response_len/mean" in metrics:  # the rollout manager's line: its group counts
            equal = sum(v for k, v in metrics.items() if k.startswith("rollout/zero_std/count_"))
            metrics.setdefault("rollout/zero_std_ratio", equal / groups)
        records.append({"rollout_id": rollout_id, **metrics})
    return records




def estimate(summary: dict, shrunk: Shrunk, opts: SmokeOptions) -> dict:
    """A rough scale-up per rollout: the measured seconds per sample and per token, times the full sizes.
    A memory-faithful run already has the job's model and lengths: only its sample count is scaled."""
    phase = summary.get("phase_s", {})
    per_rollout = {k: v / max(1, opts.rollouts) for k, v in phase.items()
                   if k in ("rollout", "train", "update_weights")}
    big = (shrunk.full["rollout_batch_size"] or 1) * (shrunk.full["n_samples_per_prompt"] or 1)
    if opts.memory:
        items = split_flags(shrunk.argv)
        small = (as_int(last(items, "--rollout-batch-size"), 1) or 1) * (
            as_int(last(items, "--n-samples-per-prompt"), 1) or 1)
        scale = big / small
        label = "ESTIMATE with your model on this machine, scaled by samples"
    else:
        small = opts.rollout_batch * min(opts.max_samples, shrunk.full["n_samples_per_prompt"] or 1)
        tokens = (shrunk.full["max_response_len"] or opts.response_cap) / opts.response_cap
        scale = (big / max(1, small)) * tokens
        label = ("ESTIMATE on this machine with the tiny model, scaled by samples x response length; "
                 "not a prediction of GPU time for your model")
    return {"label": label, "measured_per_rollout_s": per_rollout, "scale": scale,
            "estimated_per_rollout_s": sum(per_rollout.values()) * scale}


# ---------------------------------------------------------------------------------------------
# the command


def check_findings(job: Job, config_findings: list[Finding], opts: SmokeOptions) -> list[Finding]:
    """``config`` on the job, plus the prereqs groups this engine needs (packages/system on CPU)."""
    from slime_check.prereqs import run_prereqs
    from slime_check.probes import LiveProbe
    from slime_rehearse.smoke_verdict import drift_rehearsal

    findings = [f for f in config_findings if f.status is not Status.PASS or f.id.startswith("config.")]
    if opts.engine == "slime-ref":  # slime-ref keeps v0.3.1's behaviour: say where the target's differs
        findings += drift_rehearsal(job, opts.target, opts.registry)
    groups = ["packages", "system"] if opts.engine == "slime-ref" else ["gpu", "container", "packages", "system"]
    # the job's processes import Megatron-LM from the PYTHONPATH the job gives them, not the smoke's own
    pre = run_prereqs(LiveProbe(pythonpath={**job.env, **opts.env}.get("PYTHONPATH", "")), only=groups)
    if opts.engine == "slime" and job_has_own_layer_spec(job.argv):
        pre = [own_spec_needs_no_te(f) if f.id == "packages.transformer_engine" and f.status is Status.FAIL else f
               for f in pre]
    if opts.engine == "slime-ref":
        # the CPU rehearsal needs slime-ref's stack, not slime's GPU packages: their FAILs are reported, not fatal
        pre = [Finding(f.id, Status.WARN if f.status is Status.FAIL else f.status, f.finding + " (needed by "
                       "slime, not by this CPU rehearsal)" if f.status is Status.FAIL else f.finding, f.fix, f.doc)
               for f in pre]
    return findings + pre


def job_has_own_layer_spec(argv: list[str]) -> bool:
    """``--transformer-impl local`` with a ``--spec`` of the job's own: TransformerEngine is not imported,
    and the spec decides whether slime's converters find the layer names they know."""
    flags = split_flags(argv)
    return (last(flags, "--transformer-impl") or [None])[-1] == "local" and bool(last(flags, "--spec"))


def own_spec_needs_no_te(f: Finding) -> Finding:
    return Finding(f.id, Status.WARN, f.finding + " This job runs Megatron's local layers with its own --spec, "
                   "which needs no TransformerEngine if it gives TransformerEngine's parameter names (the smoke "
                   "run shows whether the weights load).", f.fix, f.doc)


def run_smoke(script_or_args: list[str], opts: SmokeOptions, console, echo=None) -> tuple[list[Finding], dict]:
    from slime_common.errors import UserError

    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    wall = time.perf_counter()
    phase: dict[str, float] = {}

    t = time.perf_counter()
    job, config_findings = read_job(script_or_args, opts.slime_dir, opts.env, opts.engine, opts.target,
                                    opts.registry, opts.memory)
    if not job.argv:
        return config_findings, {"stopped": "no train command found"}
    checks = check_findings(job, config_findings, opts) + job.notes
    phase["checks"] = time.perf_counter() - t
    failed = [f for f in checks if f.status is Status.FAIL]
    report: dict = {"out": str(out), "engine": opts.engine}
    if failed and not opts.force:
        report["stopped"] = "a check failed; nothing was run (pass --force to run anyway)"
        return checks, report

    items = split_flags(job.argv)
    t = time.perf_counter()
    findings = list(checks)
    data, data_findings = write_data(items, out)
    findings += data_findings
    if any(f.status is Status.FAIL for f in data_findings):
        report["stopped"] = "the prompt data is not here"
        return findings, report
    responses = read_responses(opts.responses) if opts.responses else []
    if opts.engine == "slime-ref" and not opts.memory:
        model_dir, model_findings = build_model(items, out, responses)
        longest = scripted_tokens(model_dir, responses)
        if longest > opts.response_cap:  # a scripted answer cut short would never reach the tool
            opts = replace(opts, response_cap=longest)
    else:
        hf = last(items, "--hf-checkpoint")
        model_dir, model_findings = Path(hf[0]) if hf else out, []
    findings += model_findings
    phase["assets"] = time.perf_counter() - t

    shrunk = shrink(job, opts, model_dir, data)
    if opts.engine == "slime-ref":
        left_out = leave_out_unimplemented(shrunk)
        if left_out:
            findings.append(left_out)
    real = opts.engine == "slime"
    probe = {"argv": shrunk.argv, "data": str(data["prompt"]), "rows": DATA_ROWS, "responses": responses}
    marks = out / MARKS_DIR if opts.memory else None
    hooks_config = write_hooks(shrunk.hooks, out, real_slime=real, probe=probe, marks=marks)
    compat = opts.engine == "slime-ref" and not slime_importable()
    env = run_env(opts, job, hooks_config, compat)
    imports, preflight = preflight_hooks(shrunk.hooks, env, hooks_config)
    findings += imports
    hook_files = users_files(preflight.get("files", {}))
    if hook_files:
        env["COVERAGE_PROCESS_START"] = str(write_coverage_config(out, hook_files))
    script = None
    if not real and not opts.memory:
        script = write_engine_script(out, items, preflight.get("probe"), responses)
        if script:
            env.update({"SLIME_REF_ENGINE_SCRIPT": str(script), "SLIME_REF_ENGINE_SCRIPT_STATS":
                        str(out / "engine-stats.jsonl")})
            shrunk.changes.append(f"the stand-in model answers part of each group from {script}")
    if opts.engine == "slime-ref":
        cmd = slime_ref_cmd(job.entry, shrunk.argv)
        shown = ["slime-ref", cmd[3], *shrunk.argv]
    else:
        if not opts.slime_dir or not (opts.slime_dir / job.entry).is_file():
            raise UserError(f"--with slime needs --slime-dir with {job.entry} in it")
        cmd = slime_cmd(opts.slime_dir, job.entry, shrunk.argv)
        shown = ["python3", str(opts.slime_dir / job.entry), *shrunk.argv]
    exported = ("PYTHONPATH", "WANDB_MODE", "WANDB_DIR", "RAY_TMPDIR", "SLIME_SMOKE_HOOKS_CONFIG",
                "COVERAGE_PROCESS_START", "SLIME_REF_ENGINE_SCRIPT", "SLIME_REF_ENGINE_SCRIPT_STATS",
                "SLIME_CHECK_SLIME_TARGET")
    exports = {k: env[k] for k in exported if k in env}
    lines = [" ".join(shlex.quote(w) for w in shown[:len(shown) - len(shrunk.argv)])]
    lines += [" ".join(shlex.quote(w) for w in (flag, *values)) for flag, values in split_flags(shrunk.argv)]
    command_text = "#!/bin/bash\n# written by slime-check smoke: the rehearsal of " + job.source + "\n" + "".join(
        f"export {k}={shlex.quote(v)}\n" for k, v in {**job.env, **opts.env, **exports}.items()) + " \\\n   ".join(
        lines) + "\n"
    (out / "smoke-command.sh").write_text(command_text)
    report.update({"command": shown, "command_file": str(out / "smoke-command.sh"), "changes": shrunk.changes,
                   "compat_slime": compat})
    if console is not None:
        console.print("[bold]rewritten command[/bold] (" + str(out / "smoke-command.sh") + "):")
        console.print(" ".join(shlex.quote(w) for w in shown), soft_wrap=True, markup=False, highlight=False)

    if any(f.status is Status.FAIL for f in imports) and not opts.force:
        report["stopped"] = "a hook cannot be imported; nothing was run (pass --force to run anyway)"
        return findings, report

    t = time.perf_counter()
    ray_head = None
    if opts.engine == "slime" and not env.get("RAY_ADDRESS"):
        ray_head = start_ray_head(out, env)
        env.update(ray_head.client_env)
    sampler = start_sampler() if opts.memory else None
    launched = Launched(cmd, env, out / "smoke.log", cwd=str(opts.slime_dir) if opts.engine == "slime" else None,
                        echo=echo)
    try:
        rc, timed_out = launched.wait(opts.timeout_s)
    except KeyboardInterrupt:
        launched.stop()
        if sampler:
            sampler.stop()
        if ray_head:
            ray_head.stop()
        remove_ray_temp_dir(env, out)
        raise
    finally:
        launched.stop()
    trace = sampler.stop() if sampler else None
    if ray_head:
        ray_head.stop()
    remove_ray_temp_dir(env, out)
    phase["run"] = time.perf_counter() - t

    run_dir = out / "run"
    summary = {}
    if (run_dir / "summary.json").is_file():
        summary = json.loads((run_dir / "summary.json").read_text())
    log = (out / "smoke.log").read_text(errors="replace")
    metrics = read_metrics(run_dir) if opts.engine == "slime-ref" else slime_log_metrics(
        log, as_int(last(split_flags(shrunk.argv), "--rollout-batch-size")))
    result = {"returncode": rc, "timed_out": timed_out, "log": log, "metrics": metrics,
              "hooks": hook_counts(shrunk.hooks, out), "wall_s": phase["run"], "probe": preflight.get("probe"),
              "stand_in": stand_in_counts(out / "engine-stats.jsonl"),
              "coverage": hook_coverage(out / "coverage", out / "hooks" / "coverage.ini", hook_files)
              if hook_files else None}
    findings += verdict(result, shrunk, opts)
    if opts.memory:
        memory, memory_notes = memory_verdict(job, opts, out, trace, log, result["metrics"], shrunk)
        findings += memory_notes
        report["memory"] = memory
    phase["total"] = time.perf_counter() - wall
    report.update({
        "returncode": rc, "timed_out": timed_out, "log": str(out / "smoke.log"),
        "hooks": {h["path"]: {"flag": h["flag"], "calls": h["calls"], "errors": h["errors"],
                              "first_error": h["first_error"]} for h in result["hooks"].values()},
        "rewards": [flat(r)["rollout/raw_reward"] for r in result["metrics"] if "rollout/raw_reward" in flat(r)],
        "truncated_ratio": [flat(r).get("rollout/truncated_ratio") for r in result["metrics"]
                            if "rollout/raw_reward" in flat(r)],
        "response_length": [flat(r)["rollout/response_length"] for r in result["metrics"]
                            if "rollout/response_length" in flat(r)],
        "weight_check_max_abs_diff": [flat(r)["perf/weight_check_max_abs_diff"] for r in result["metrics"]
                                      if "perf/weight_check_max_abs_diff" in flat(r)],
        "phase_s": {**phase, **{f"run/{k}": v for k, v in summary.get("phase_s", {}).items()}},
        "peak_rss_gib": launched.peak_rss / 2**30,
        "label_probe": result["probe"], "stand_in": result["stand_in"], "coverage": result["coverage"],
        "filter": filter_counts(metrics),
        "estimate": estimate(summary, shrunk, opts) if summary else None,
    })
    return findings, report


def render_report(findings: list[Finding], report: dict, console) -> None:
    from rich.table import Table

    from slime_check.findings import render

    # prereqs' passing rows are in --json; the table keeps what needs reading
    shown = [f for f in findings if not (f.status is Status.PASS and f.group in ("packages", "system"))]
    render(shown, "slime-check smoke", console)
    if "stopped" in report:
        console.print(f"[bold]not run:[/bold] {report['stopped']}")
        return
    table = Table(title="smoke run", show_header=False)
    for path, h in report.get("hooks", {}).items():
        table.add_row(f"hook {h['flag']}", f"{path}: {h['calls']} calls" + (f", {h['errors']} errors"
                                                                              if h["errors"] else ""))
    if report.get("rewards"):
        table.add_row("reward per rollout", ", ".join(f"{r:.3f}" for r in report["rewards"]))
        table.add_row("truncated share", ", ".join(f"{r:.0%}" for r in report["truncated_ratio"]))
        table.add_row("response length", ", ".join(f"{r:.1f}" for r in report["response_length"]))
    if report.get("weight_check_max_abs_diff"):
        table.add_row("weight-update check", f"max |diff| {max(report['weight_check_max_abs_diff']):.2g}")
    stand_in, probe, filtered = report.get("stand_in"), report.get("label_probe"), report.get("filter")
    if stand_in:
        table.add_row("stand-in answers", f"{stand_in['scripted']} scripted, {stand_in['sampled']} sampled "
                      "(OUT/engine-script.json)")
    if probe and probe.get("reward"):
        taken = [shape for shape, score in probe.get("shapes", {}).items() if score > 0]
        table.add_row("label probe", f"{probe['reward']}: {', '.join(taken) or 'no shape scored'} "
                      f"({probe['calls']} calls before the run)")
    if filtered:
        table.add_row("dynamic filter", f"kept {filtered['groups_seen'] - filtered['groups_dropped']} of "
                      f"{filtered['groups_seen']} groups" + (f"; batch filled from the best dropped in "
                                                              f"{filtered['starved_rollouts']} rollouts"
                                                              if filtered["starved"] else ""))
    for k, v in report.get("phase_s", {}).items():
        table.add_row(f"seconds {k}", f"{v:.1f}")
    table.add_row("peak memory", f"{report.get('peak_rss_gib', 0):.2f} GiB (the run's process tree)")
    for row in (report.get("memory") or {}).get("compared", []):
        want = row["predicted_bytes"]
        table.add_row(f"GPU {row['gpu']} {row['what']}", f"{row['measured_bytes'] / 2**30:.2f} GiB measured"
                      + (f", plan {want / 2**30:.2f} GiB ({row['error']:+.0%})" if want else ""))
    est = report.get("estimate")
    if est:
        table.add_row("ESTIMATE per rollout", f"{est['estimated_per_rollout_s']:.0f} s ({est['label']})")
    table.add_row("log", str(report.get("log")))
    table.add_row("command", str(report.get("command_file")))
    console.print(table)
    if report.get("coverage"):
        console.print(coverage_table(report["coverage"]))


def coverage_table(coverage: list[dict]):
    """Lines of each hook file the rehearsal ran, and the ranges it never ran with their function."""
    from rich.table import Table

    table = Table(title="your hook files: lines the rehearsal ran")
    for column in ("file", "ran", "never ran (function)"):
        table.add_column(column, overflow="fold")
    for entry in coverage:
        gaps = "; ".join((f"{g['lines'][0]}" if g["lines"][0] == g["lines"][1] else f"{g['lines'][0]}-{g['lines'][1]}")
                         + f" ({g['function'] or 'module'})" for g in entry["missing"])
        table.add_row(entry["file"], f"{entry['run']}/{entry['statements']}", gaps or "-")
    return table
