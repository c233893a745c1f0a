"""``slime-check``: verify a machine and a slime launch config before spending GPU hours."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click

from slime_check import __version__
from slime_check.skill_install import skill
from slime_common.errors import UserError, run_cli
from slime_rehearse.quickstart import quickstart

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="slime-check")
def cli() -> None:
    """slime-check: catch a broken slime job before it burns GPU hours.

    prereqs, capture, config and plan read, probe and report: they never install, stop or edit
    anything. smoke and quickstart run a small job, write only under --out and stop exactly what
    they started; skill install writes only the files skill uninstall removes.
    """


cli.add_command(skill)
cli.add_command(quickstart)


def _console():
    from rich.console import Console

    # Piped output keeps whole lines (doc links must not be cut), a terminal wraps to its width.
    return Console() if sys.stdout.isatty() else Console(width=200, soft_wrap=True)


SLIME_VERSION_HELP = ("Judge against this slime: v0.3.1, or main (main@624b824). Default: the slime --slime-dir "
                      "(else the importable slime package) is; with neither, main@624b824, the newest known.")


def _identify(slime_dir, version=None, importable: bool = True):
    """Which slime the job runs, for the head of a report (see slime_check.slime_identity)."""
    from slime_check.slime_identity import identify
    from slime_common.errors import UserError

    try:
        return identify(slime_dir, version=version, importable=importable)
    except ValueError as e:
        raise UserError(str(e)) from e


def _print_identity(console, identity) -> None:
    console.print(f"[bold]slime:[/bold] {identity.label}", highlight=False)


def _finish(findings, title: str, as_json: bool, **extra) -> None:
    from slime_check.findings import exit_code, render, to_json

    if as_json:
        click.echo(to_json(findings, **extra))
    else:
        render(findings, title, _console())
    sys.exit(exit_code(findings))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.option("--only", "only", multiple=True, type=click.Choice(["gpu", "container", "packages", "system"]),
              help="Run one group of checks (repeatable).")
@click.option("--gpus", type=click.IntRange(min=1), default=None, help="GPUs the run needs; fewer is a FAIL.")
@click.option("--fixture", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Check a captured machine (a `slime-check capture` file) instead of this one.")
@click.option("--ckpt-dir", default=".", show_default=True, help="Where checkpoints will be saved (free disk check).")
@click.option("--model-params", type=click.FloatRange(min=0, min_open=True), default=None, metavar="BILLIONS",
              help="Model size in billions of parameters, for the RAM and disk estimates.")
@click.option("--slime-dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Your slime checkout: its tag, commit and local changes head the report.")
def prereqs(as_json, only, gpus, fixture, ckpt_dir, model_params, slime_dir) -> None:
    """Check GPUs, container, packages and system against slime's needs.

    The report starts with the slime found (--slime-dir, the importable slime package, SLIME_IMAGE)
    and the known slime it is judged as (v0.3.1 or main@624b824).
    Exit status: 0 when nothing FAILs, 1 when something does, 2 on usage errors.
    """
    from slime_check.prereqs import Options, run_prereqs
    from slime_check.probes import CaptureProbe, LiveProbe

    probe = CaptureProbe(fixture) if fixture else LiveProbe()
    identity = _identify(slime_dir, importable=not fixture)  # a captured machine's slime is not this one's
    findings = identity.findings() + run_prereqs(probe, Options(gpus=gpus, ckpt_dir=ckpt_dir,
                                                                model_params_b=model_params), list(only))
    if not as_json:
        _print_identity(_console(), identity)
    _finish(findings, f"slime-check prereqs: {probe.origin}", as_json, origin=probe.origin,
            slime=identity.to_json())


@cli.command()
@click.option("--out", "out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the capture here (default: standard output).")
def capture(out) -> None:
    """Capture this machine (GPU, container, packages, system) in the capture format.

    Only reads: every section is a query command or a file read. Check the result anywhere with
    `slime-check prereqs --fixture FILE`. Values of variables named like tokens or keys are redacted.
    """
    from slime_check.probes import LiveProbe, write_capture
    from slime_common.errors import UserError
    from slime_common.fileio import atomic_write_text

    progress = (lambda name: click.echo(f"capturing {name}", err=True)) if out else None
    text = write_capture(LiveProbe(), progress=progress)
    if out:
        try:
            atomic_write_text(Path(out), text)
        except OSError as e:
            raise UserError(f"--out {out}: {e.strerror or e}; choose a writable path") from e
        click.echo(f"wrote {out}", err=True)
    else:
        click.echo(text, nl=False)


def script_options(json_help: str):
    """The options ``config`` and ``plan`` share: which slime, the script's variables, JSON, and the
    launch scripts (or a train.py argv after ``--``)."""
    def decorate(command):
        for option in reversed([
            click.option("--slime-dir", type=click.Path(exists=True, file_okay=False), default=None,
                         help="A slime checkout: sourced scripts/models/*.sh are read from it."),
            click.option("--slime-version", type=click.Choice(["v0.3.1", "main"]), default=None,
                         help=SLIME_VERSION_HELP),
            click.option("--env", "env", multiple=True, metavar="NAME=VALUE",
                         help="A variable the script reads from the environment (repeatable)."),
            click.option("--json", "as_json", is_flag=True, help=json_help),
            click.argument("script_or_args", nargs=-1, required=True, type=click.UNPROCESSED),
        ]):
            command = option(command)
        return command
    return decorate


def _env_pairs(values: tuple[str, ...]) -> dict[str, str]:
    from slime_common.errors import UserError

    env = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.replace("_", "a").isalnum():
            raise UserError(f"--env {item}: expected NAME=VALUE")
        env[key] = value
    return env


@cli.command(context_settings={"ignore_unknown_options": True})
@script_options("Print the findings as JSON.")
def config(slime_dir, slime_version, env, as_json, script_or_args) -> None:
    """Lint launch scripts (run-*.sh) or a train.py argument list.

    \b
      slime-check config --slime-dir ~/slime scripts/run-qwen3-4B.sh
      slime-check config -- --rollout-batch-size 32 --n-samples-per-prompt 8 ...

    Reports unknown flags (slime ignores them silently), flags given twice, the batch identity,
    slime's argument rules, GPU arithmetic, MODEL_ARGS against the HF config.json, hook paths,
    the data file's keys, and behaviours that differ between slime v0.3.1 and main the job relies on.
    Flags are read from --slime-dir's own source where given, else from the registry shipped for
    the slime judged against (the report's first line names it).
    Exit status: 0 when nothing FAILs, 1 when something does, 2 on usage errors.
    """
    from slime_check.config_lint import Report, lint_argv, lint_script
    from slime_check.findings import counts, exit_code, render, to_json
    from slime_check.launch_script import Origin, ScriptError, Word
    from slime_check.slime_identity import flags_finding, registry_for
    from slime_common.errors import UserError

    variables = _env_pairs(env)
    identity = _identify(slime_dir, slime_version)
    reg, notes = registry_for(identity, slime_dir)
    head = identity.findings() + [flags_finding(notes)]
    args = list(script_or_args)
    reports: list[Report] = []
    if args[0].startswith("-"):
        argv = [Word([a], Origin("argv", i + 1)) for i, a in enumerate(args)]
        reports.append(Report("command-line arguments", lint_argv(argv, reg=reg, target=identity.target)))
    else:
        for item in args:
            if Path(item).is_dir():
                scripts = sorted(p.name for p in Path(item).glob("*.sh"))[:3]
                raise UserError(f"{item} is a directory; give the launch script in it"
                                + (f" (e.g. {Path(item) / scripts[0]})" if scripts else ""))
            if not Path(item).is_file():
                raise UserError(f"{item}: no such script (give launch scripts, or `--` and train.py arguments)")
            try:
                reports += lint_script(item, slime_dir, variables, reg=reg, target=identity.target)
            except ScriptError as e:
                raise UserError(f"{e} (the script could not be parsed)") from e
    reports[0].findings[:0] = head  # the slime heads the first report; the summary counts it once
    findings = [f for r in reports for f in r.findings]
    if as_json:  # one report per train invocation, and the summary over all of them
        click.echo(json.dumps({"slime": identity.to_json(), "summary": counts(findings),
                               "reports": [json.loads(to_json(r.findings, title=r.title)) for r in reports]}, indent=2))
    else:
        console = _console()
        _print_identity(console, identity)
        for r in reports:
            render(r.findings, f"slime-check config: {r.title}", console)
    sys.exit(exit_code(findings))


@cli.command(context_settings={"ignore_unknown_options": True})
@click.option("--gpu", default=None, metavar="NAME|SIZE",
              help="The GPU the job runs on: H100-80GB, H200-141GB, A100-80GB, ... or a usable size such as 79.2GiB.")
@click.option("--fixture", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A `slime-check capture` of the GPU machine: its GPU memory and host RAM.")
@click.option("--host-ram", type=click.FloatRange(min=0, min_open=True), default=None, metavar="GIB",
              help="Host RAM per node in GiB (else the capture's).")
@click.option("--prompt-len", type=click.IntRange(min=1), default=None, metavar="TOKENS",
              help="Longest prompt in tokens (default: --rollout-max-prompt-len, else 1024, said in the report).")
@click.option("--adam-kernel", type=click.Choice(["fused", "torch"]), default="fused", show_default=True,
              help="Megatron's Adam on the machine: fused (TransformerEngine's or Apex's FusedAdam, as in slime's "
                   "image) or torch (torch's AdamW, Megatron's fallback without either, whose update needs 4 more "
                   "bytes per parameter of the optimizer shard). `smoke --memory` reads it from the machine.")
@script_options("Print the plan and the findings as JSON.")
def plan(gpu, fixture, host_ram, prompt_len, adam_kernel, slime_dir, slime_version, env, as_json,
         script_or_args) -> None:
    """Will it fit? Per-GPU peak memory of a launch script's job, before it runs.

    \b
      slime-check plan --gpu H100-80GB --env NUM_GPUS=8 scripts/run-qwen3-4B.sh
      slime-check plan --fixture capture.txt -- --hf-checkpoint DIR ...   (a train.py argv)

    Training (Megatron: weights, gradients, the distributed optimizer, activations, fp32 logits),
    the log-prob pass, rollout (SGLang: weights, the static KV pool, CUDA graphs) and the weight
    update, per GPU and together where colocated; host RAM per node. Model shapes come from the
    --hf-checkpoint config.json when it is here, else from MODEL_ARGS.

    \b
    Exact: parameter, gradient, optimizer and logit bytes, SGLang's pool and KV arithmetic, host copies.
    Estimate: activations (Korthikanti et al. 2022, https://arxiv.org/abs/2205.05198, without the
    attention-score term that flash attention never stores), CUDA contexts, NCCL, CUDA graphs.
    Each line of the table says which it is. No GPU and no torch are needed.

    A peak over the card is a FAIL, within 10% of it a WARN, each with the knob that fixes it and its cost.
    Exit status: 0 when nothing FAILs, 1 when something does, 2 on usage errors.
    """
    from slime_check.findings import counts, exit_code, render
    from slime_check.launch_script import Origin, ScriptError, Word, read_script
    from slime_check.plan_inputs import card_from, plan_argv
    from slime_check.plan_job import GIB
    from slime_check.plan_report import findings, to_dict
    from slime_check.plan_report import render as render_plan
    from slime_check.slime_identity import registry_for
    from slime_common.errors import UserError

    variables = _env_pairs(env)
    identity = _identify(slime_dir, slime_version)
    reg, _ = registry_for(identity, slime_dir)
    card, host = card_from(gpu, fixture)
    if host_ram is not None:
        host = int(host_ram * GIB)
    args = list(script_or_args)
    plans = []
    if args[0].startswith("-"):
        argv = [Word([a], Origin("argv", i + 1)) for i, a in enumerate(args)]
        plans.append(plan_argv(argv, reg, identity.target, "command-line arguments", card, host, prompt_len,
                               adam_kernel))
    else:
        for item in args:
            if not Path(item).is_file():
                raise UserError(f"{item}: no such script (give launch scripts, or `--` and train.py arguments)")
            try:
                reading = read_script(item, slime_dir, variables)
            except ScriptError as e:
                raise UserError(f"{e} (the script could not be parsed)") from e
            if not reading.invocations:
                raise UserError(f"{item}: no `python train.py` or `python train_async.py` command found")
            for orphan in reading.orphans:
                raise UserError(f"{orphan.origin}: a command starts with {orphan.words[0].text}: the line before "
                                "lacks its trailing backslash, so those flags never reach train.py; fix the script")
            for inv in reading.invocations:
                title = f"{item} ({inv.entry} at {inv.origin})"
                plans.append(plan_argv(inv.argv, reg, identity.target, title, card, host, prompt_len, adam_kernel))
    reports = [(p, findings(p)) for p in plans]
    every = [f for _, fs in reports for f in fs]
    if as_json:
        click.echo(json.dumps({"slime": identity.to_json(), "summary": counts(every),
                               "plans": [{**to_dict(p), "findings": [f.to_dict() for f in fs]} for p, fs in reports]},
                              indent=2))
    else:
        console = _console()
        for p, fs in reports:
            render_plan(p, console)
            render(fs, f"slime-check plan: {p.title}", console)
    sys.exit(exit_code(every))


@cli.command(context_settings={"ignore_unknown_options": True})
@click.option("--slime-dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="A slime checkout: sourced scripts are read from it; --with slime runs its train.py.")
@click.option("--with", "engine", type=click.Choice(["slime", "slime-ref"]), default=None,
              help="Run on the real slime (GPUs) or on slime-ref (CPU; the default without slime or a GPU).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("slime-smoke"),
              show_default=True, help="Everything the rehearsal writes goes under this directory.")
@click.option("--rollouts", type=click.IntRange(1), default=2, show_default=True, help="Rollouts to run.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=900, show_default=True,
              help="Seconds before the run is stopped.")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE",
              help="A variable the script reads from the environment (repeatable); also set for the run.")
@click.option("--responses", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="JSONL of answers the stand-in model gives (slime-ref): {\"prompt\": TEXT, \"response\": TEXT "
                   "or [TURN, ...], \"correct\": true}. A list of turns scripts a tool call, so your tool branch "
                   "runs; \"prompt\" (a part of the prompt's text) is optional.")
@click.option("--slime-version", type=click.Choice(["v0.3.1", "main"]), default=None, help=SLIME_VERSION_HELP)
@click.option("--force", is_flag=True, help="Run even if a check FAILs.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings and the run's figures as JSON.")
@click.option("--memory/--no-memory", default=None,
              help="Memory-faithful (the default with --with slime on a GPU machine): the job's model, layout, "
                   "--max-tokens-per-gpu, recompute and SGLang settings, every answer forced to "
                   "--rollout-max-response-len, enough samples to fill the largest micro-batch; each GPU's "
                   "peak per phase (NVML) beside `slime-check plan`'s prediction, and an OOM named by the "
                   "phase that ran out. Two rollouts at least: the second step is the first to train beside "
                   "Adam's moments. Needs the job's GPUs (colocated jobs on one GPU included).")
@click.argument("script_or_args", nargs=-1, required=True, type=click.UNPROCESSED)
def smoke(slime_dir, engine, out, rollouts, timeout_s, env, responses, slime_version, force, as_json, memory,
          script_or_args) -> None:
    """Rehearse a launch script at toy size: same hooks, data keys and settings, a few rollouts.

    \b
      slime-check smoke run-qwen3-4B.sh --out /tmp/smoke
      slime-check smoke --with slime --slime-dir ~/slime run-qwen3-4B.sh
      slime-check smoke -- --hf-checkpoint DIR --prompt-data FILE ...   (a train.py argv)

    Checks first (config, prereqs), then runs the shrunk job (OUT/smoke-command.sh) on slime-ref
    (CPU) or slime, counts each hook's calls, and reports rewards, truncation, the weight-update
    check, time per phase, peak memory and an estimate per rollout. Writes only under --out.

    A random tiny model never answers right or calls a tool, so on slime-ref the stand-in engine
    answers part of each group itself: the label in the shape your reward scores (learned by probing
    the reward before the run), and your --responses. The report gives the lines of your hook files
    that never ran, with the function they belong to. slime-ref behaves as slime v0.3.1: for a job
    that targets slime main, each behaviour main changed that the job relies on is a WARN.
    Exit status: 0 when nothing FAILs, 1 when something does, 2 on usage errors.
    """
    from slime_check.findings import exit_code
    from slime_check.slime_identity import flags_finding, registry_for
    from slime_rehearse.rehearsal import render_report, run_smoke
    from slime_rehearse.smoke_job import SmokeOptions
    from slime_rehearse.smoke_launch import slime_importable

    if engine is None:
        engine = "slime" if slime_dir and slime_importable() and _has_gpu() else "slime-ref"
    if memory is None:
        memory = engine == "slime" and _has_gpu()
    if memory and rollouts < 2:
        raise UserError("--memory needs --rollouts 2 or more: the first optimizer step makes Adam's moments (8 bytes "
                        "per parameter of the optimizer shard), so only the second step trains beside the whole "
                        "state; give --rollouts 2 (or --no-memory for a plain run)")
    if memory and not _has_gpu():
        raise UserError("--memory measures the job's GPU memory and needs its GPUs (none found: "
                        "nvidia-smi -L failed); drop --memory, or run on the GPU machine")
    identity = _identify(slime_dir, slime_version)
    reg, notes = registry_for(identity, slime_dir)
    opts = SmokeOptions(out=out.resolve(), engine=engine, rollouts=rollouts, timeout_s=timeout_s, force=force,
                        slime_dir=slime_dir.resolve() if slime_dir else None, env=_env_pairs(env),
                        responses=responses.resolve() if responses else None, target=identity.target,
                        registry=reg, memory=memory)
    console = _console()
    if not as_json:
        _print_identity(console, identity)
    echo = None if as_json else (lambda line: console.print(line, markup=False, highlight=False, style="dim"))
    findings, report = run_smoke(list(script_or_args), opts, None if as_json else console, echo)
    findings = identity.findings() + [flags_finding(notes)] + findings
    if as_json:
        from slime_check.findings import counts

        click.echo(json.dumps({"slime": identity.to_json(), "summary": counts(findings),
                               "findings": [f.to_dict() for f in findings], "run": report}, indent=2, default=str))
    else:
        render_report(findings, report, console)
    sys.exit(exit_code(findings))


@functools.cache
def _has_gpu() -> bool:
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def main() -> None:
    run_cli(cli, "slime-check")


if __name__ == "__main__":
    main()
