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
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from slime_check.findings import CUSTOMIZATION, USAGE, Finding, Status, slime_doc
from slime_check.hook_check import preflight_hooks, write_hooks
from slime_rehearse.smoke_verdict import filter_counts, flat, hook_coverage, stand_in_counts, verdict

DOC = "skill/references/smoke.md"
HOOK_DOC = slime_doc(CUSTOMIZATION)
HOOK_MODULE = "slime_smoke_hooks"
DATA_ROWS = 8
# what slime-ref's Megatron backend builds (slime_ref.backends.megatron.model.SUPPORTED_MODEL_TYPES; not
# imported here: that would load megatron-core into the CLI)
SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")
EVAL_ROWS = 2
FILTER_BUDGET_ROUNDS = 4  # draws of --over-sampling-batch-size a rehearsal's dynamic filter may see per rollout

# MODEL_ARGS: the tiny model is not the user's size, so its config.json speaks for it.
MODEL_FLAGS = {
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
    "--kv-channels", "--vocab-size", "--make-vocab-size-divisible-by", "--norm-epsilon", "--rotary-base",
    "--max-position-embeddings", "--seq-length", "--swiglu", "--group-query-attention", "--qk-layernorm",
    "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--add-qkv-bias", "--normalization",
    "--position-embedding-type", "--use-rotary-position-embeddings", "--use-rope-scaling", "--rotary-percent",
    "--num-experts", "--moe-ffn-hidden-size", "--moe-router-topk", "--moe-shared-expert-intermediate-size",
    "--attention-backend",
}
# Parallelism and placement: one rank, one engine on a CPU.
LAYOUT = {
    "--tensor-model-parallel-size": "1", "--pipeline-model-parallel-size": "1", "--context-parallel-size": "1",
    "--actor-num-nodes": "1", "--actor-num-gpus-per-node": "1", "--rollout-num-gpus-per-engine": "1",
}
EXPERT_FLAGS = {"--expert-model-parallel-size", "--expert-tensor-parallel-size", "--moe-token-dispatcher-type",
                "--moe-grouped-gemm", "--moe-router-load-balancing-type", "--moe-aux-loss-coeff"}
DROPPED = {"--num-epoch", "--load", "--ref-load", "--save-hf", "--save-interval", "--sequence-parallel",
           "--critic-load", "--critic-save", "--over-sampling-batch-size", "--rollout-num-gpus",
           "--num-gpus-per-node", "--sglang-mem-fraction-static", "--wandb-key", "--wandb-host",
           "--eval-interval", "--n-samples-per-eval-prompt", "--eval-prompt-data", "--eval-max-response-len",
           "--micro-batch-size", "--decoder-last-pipeline-num-layers", "--recompute-granularity",
           "--recompute-method", "--recompute-num-layers", "--critic-num-nodes", "--critic-num-gpus-per-node",
           "--use-wandb", "--wandb-mode"} | MODEL_FLAGS | set(LAYOUT) | EXPERT_FLAGS
# What the rehearsal sets itself, whatever the job says.
REPLACED = {"--num-rollout", "--rollout-batch-size", "--n-samples-per-prompt", "--global-batch-size",
            "--rollout-max-response-len", "--hf-checkpoint", "--prompt-data", "--output-dir",
            "--num-steps-per-rollout", "--check-weight-update-equal", "--dynamic-sampling-max-groups",
            "--eval-config"}  # its datasets become --eval-prompt-data (write_data)
# What the rehearsal reads from the job to size its own values (so it must be known).
READ_BY_REHEARSAL = {"--rollout-batch-size", "--n-samples-per-prompt", "--rollout-max-response-len",
                     "--num-steps-per-rollout", "--over-sampling-batch-size", "--hf-checkpoint", "--prompt-data",
                     "--eval-prompt-data", "--eval-config"}
# The real run (--with slime) keeps the model, its MODEL_ARGS, layout and checkpoints to read.
KEPT_FOR_SLIME = MODEL_FLAGS | set(LAYOUT) | EXPERT_FLAGS | {
    "--load", "--ref-load", "--rollout-num-gpus", "--num-gpus-per-node", "--sglang-mem-fraction-static",
    "--micro-batch-size"}

# Every flag that names a place slime, Megatron-LM, SGLang or the router writes to: the rehearsal points
# each under OUT/writes/, so a rehearsal next to a live run never touches its files. "dir": a folder;
# "file": a file (its name is kept); "template": a file name with {rollout_id}-style fields (kept).
WRITES = {
    "--save": "dir", "--save-hf": "dir", "--save-debug-rollout-data": "template",
    "--save-debug-train-data": "template", "--dump-details": "dir", "--tensorboard-dir": "dir",
    "--wandb-dir": "dir", "--wandb-save-dir": "dir", "--memory-snapshot-dir": "dir",
    "--memory-snapshot-path": "file", "--config-logger-dir": "dir", "--ckpt-convert-save": "dir",
    "--non-persistent-global-ckpt-dir": "dir", "--non-persistent-local-ckpt-dir": "dir",
    "--update-weight-disk-dir": "dir", "--update-weight-local-checkpoint-dir": "dir",
    "--result-rejected-tracker-filename": "file", "--dump-param-to-param-group-map": "file",
    "--ci-save-grad-norm": "template", "--router-log-dir": "dir", "--sglang-crash-dump-folder": "dir",
    "--sglang-debug-tensor-dump-output-folder": "dir", "--sglang-export-metrics-to-file-dir": "dir",
    "--sglang-file-storage-path": "dir", "--sglang-modelopt-checkpoint-save-path": "dir",
    "--sglang-modelopt-export-path": "dir", "--sglang-spec-trace-dir": "dir", "--sglang-download-dir": "dir",
    "--object-storage-cache-path": "dir",
}
# Flags whose names look like output places but are not (tests/test_smoke.py checks the two lists
# cover every such flag of the registry).
NOT_WRITTEN = {
    "--sglang-deepep-dispatcher-output-dtype": "a dtype",
    "--sglang-debug-tensor-dump-input-file": "read", "--sglang-msprobe-dump-config": "read",
    "--sglang-hicache-storage-backend": "a backend's name", "--sglang-hicache-storage-backend-extra-config": "JSON",
    "--sglang-hicache-storage-prefetch-policy": "a policy's name",
    "--sglang-debug-tensor-dump-layers": "layer numbers",
    "--sglang-load-snapshot-publish-interval": "seconds",
    "--save-interval": "a count", "--save-retain-interval": "a count", "--non-persistent-save-interval": "a count",
    "--persistent-save-interval": "a count", "--save-dgrads-interval": "a count",
    "--save-wgrads-interval": "a count", "--memory-snapshot-num-steps": "a count",
}


def redirected(flag: str, value: str, out: Path) -> str:
    """Where the rehearsal writes what the job would write at ``value`` for ``flag``."""
    if flag == "--save":
        return str(out / "save")
    folder = out / "writes" / flag.lstrip("-")
    return str(folder if WRITES[flag] == "dir" else folder / Path(value).name)


def rehearsal_replaces(flag: str, engine: str) -> bool:
    """True when the rehearsal drops the job's value of ``flag`` or sets its own."""
    if flag in REPLACED or flag in WRITES:
        return True
    if engine != "slime" and flag.startswith("--moe-"):  # MoE architecture: the tiny model is dense
        return True
    return flag in DROPPED and not (engine == "slime" and flag in KEPT_FOR_SLIME)


@dataclass
class SmokeOptions:
    out: Path
    engine: str = "slime-ref"  # or "slime"
    rollouts: int = 2
    rollout_batch: int = 2
    max_samples: int = 4
    response_cap: int = 32
    timeout_s: float = 900.0
    force: bool = False
    slime_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    responses: Path | None = None  # JSONL of answers the stand-in model gives (read_responses)
    target: str | None = None  # the known slime the job is judged against (slime_identity); None: v0.3.1
    registry: object = None  # the flags to read the job with (slime_identity.registry_for); None: target's


# ---------------------------------------------------------------------------------------------
# reading the job


@dataclass
class Job:
    entry: str  # train.py or train_async.py
    argv: list[str]
    source: str
    env: dict[str, str]
    notes: list[Finding] = field(default_factory=list)  # what reading the script left out, and why


def read_job(script_or_args: list[str], slime_dir, env: dict[str, str],
             engine: str = "slime-ref", target: str | None = None, reg=None) -> tuple[Job, list[Finding]]:
    """The job's argv, and ``config``'s findings on it. A word that cannot be known without running the
    script (``$(date ...)``, ``printf -v``) is kept as its text when the rehearsal drops or replaces its
    flag anyway; where the rehearsal needs it, the job is refused with the variables to give."""
    from slime_check.config_lint import lint_argv, lint_script, parse_argv
    from slime_check.launch_script import Origin, ScriptError, Word, read_script
    from slime_common.errors import UserError
    from slime_common.registry import load_registry

    if script_or_args[0].startswith("-"):
        argv = [Word([a], Origin("argv", i + 1)) for i, a in enumerate(script_or_args)]
        return (Job("train.py", list(script_or_args), "command-line arguments", dict(env)),
                lint_argv(argv, reg=reg, target=target))
    if len(script_or_args) != 1:
        raise UserError("smoke rehearses one launch script at a time")
    path = script_or_args[0]
    if Path(path).is_dir():
        raise UserError(f"{path} is a directory; give the launch script in it (e.g. {path}/run.sh)")
    if not Path(path).is_file():
        raise UserError(f"{path}: no such script (give a launch script, or `--` and train.py arguments)")
    try:
        reading = read_script(path, slime_dir, env)
        reports = lint_script(path, slime_dir, env, reg=reg, target=target, hooks=False)  # preflight imports them
    except ScriptError as e:
        raise UserError(f"{e} (the script could not be parsed)") from e
    if not reading.invocations:
        return Job("train.py", [], path, dict(env)), [f for r in reports for f in r.findings]
    if len(reading.invocations) > 1:
        raise UserError(f"{path} starts {len(reading.invocations)} train commands; smoke rehearses one "
                        "(give its flags after `--`)")
    inv = reading.invocations[0]
    parsed = parse_argv(inv.argv, reg or load_registry(target or "v0.3.1"))
    needed = [w.text for w in parsed.unresolved]  # a symbolic word where a flag could be
    unknown_words = list(parsed.unresolved)
    argv: list[str] = []
    left_out: list[str] = []
    for given in parsed.given:
        values_known = all(w.known for w in given.values)
        if values_known:
            argv += [given.name, *[w.text for w in given.values]]
        elif rehearsal_replaces(given.name, engine) and given.name not in READ_BY_REHEARSAL:
            argv += [given.name, *[w.text for w in given.values]]  # never read: the rehearsal sets its own
        elif engine == "slime-ref" and given.name.startswith("--sglang-"):
            left_out.append(f"{given.name} {' '.join(w.text for w in given.values)}")  # GPU engine settings
        else:
            needed += [f"{given.name} {w.text}" for w in given.values if not w.known]
            unknown_words += [w for w in given.values if not w.known]
    argv += [w.text for w in parsed.stray]
    if needed:
        raise UserError(f"{path}: {', '.join(needed[:3])} cannot be known without running the script, and the "
                        f"rehearsal needs it; {how_to_give(path, slime_dir, env, unknown_words)}")
    notes = []
    if left_out:
        notes.append(Finding("smoke.unknown_values", Status.PASS, f"left out of the CPU rehearsal (their values "
                             f"come from running commands, and the built-in engine has no such setting): "
                             f"{'; '.join(left_out)}"))
    if inv.env_unknown:
        notes.append(Finding("smoke.runtime_env", Status.WARN, f"--runtime-env-json: {', '.join(inv.env_unknown)} "
                             "cannot be known without running the script (a command's output); the rehearsal "
                             "runs without it and keeps the other env_vars.",
                             "Give it with --env NAME=VALUE if your hooks read it.", DOC))
    return Job(inv.entry, argv, path, {**inv.env, **env}, notes), reports[0].findings


def how_to_give(path, slime_dir, env: dict[str, str], words: list) -> str:
    """The fix for words the reading could not know: ``--env`` for the variables that decide them
    (found by reading the script again with each one set), else train.py's arguments after ``--``,
    since a value the script computes with a command, or assigns itself, ignores ``--env``."""
    from slime_check.launch_script import Sym, read_script

    symbols = {p.text for w in words for p in w.parts if isinstance(p, Sym)}
    names = {m.group(1) for t in symbols if (m := re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", t))}
    settable = []
    for name in sorted(names):
        probe = read_script(path, slime_dir, {**env, name: "probe"})
        after = {p.text for inv in probe.invocations for w in inv.argv for p in w.parts if isinstance(p, Sym)}
        if f"${{{name}}}" not in after and f"${name}" not in after:
            settable.append(name)
    computed = sorted(symbols - {f"${{{n}}}" for n in settable} - {f"${n}" for n in settable})
    if not computed:
        return "give " + " ".join(f"--env {n}=VALUE" for n in settable)
    hint = f"give {' '.join(f'--env {n}=VALUE' for n in settable)}; " if settable else ""
    return (f"{hint}the script computes {', '.join(computed[:3])} itself (a command's output, or a value set "
            "where --env cannot reach it), so give the rehearsal train.py's arguments instead: "
            "`slime-check smoke [options] -- --flag value ...`, or have the script read it from a variable "
            "(`X=${X:-...}`) and give that with --env")


def split_flags(argv: list[str]) -> list[tuple[str, list[str]]]:
    """[(flag, values)] in order, as slime's parser would split them (values of unknown flags too)."""
    from slime_check.config_lint import is_option
    from slime_check.launch_script import Origin, Word
    from slime_common.registry import load_registry

    reg = load_registry()
    words = [Word([a], Origin("argv", i)) for i, a in enumerate(argv)]
    items: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(argv):
        name = argv[i]
        i += 1
        if not is_option(words[i - 1]):
            if items:
                items[-1][1].append(name)
            continue
        name, eq, inline = name.partition("=")
        flag = reg.lookup(name)
        values: list[str] = [inline] if eq else []
        if not eq:
            nargs = flag.nargs if flag is not None else "*"
            if flag is not None and flag.action in ("store_true", "store_false", "boolean_optional", "store_const"):
                nargs = 0
            want = 1 if nargs is None else nargs
            while i < len(argv) and not is_option(words[i]) and (want in ("*", "+") or len(values) < (
                    1 if want == "?" else want)):
                values.append(argv[i])
                i += 1
        items.append((name, values))
    return items


def last(items, name: str):
    for flag, values in reversed(items):
        if flag == name:
            return values
    return None


# ---------------------------------------------------------------------------------------------
# shrinking


@dataclass
class Shrunk:
    argv: list[str]
    changes: list[str]
    hooks: dict[str, tuple[str, str]]  # hook id -> (flag, user's path)
    notes: list[Finding]
    user_max_len: int | None
    full: dict  # the full run's sizes, for the estimate


def _int(values, default=None):
    try:
        return int(values[0]) if values else default
    except (TypeError, ValueError):
        return default


def shrink(job: Job, opts: SmokeOptions, model_dir: Path, data: dict[str, Path]) -> Shrunk:
    """The same job at toy size. ``data`` maps "prompt" and eval names to the small files under OUT."""
    from slime_common.registry import load_registry

    hook_flags = set(load_registry().hook_flags())
    items = split_flags(job.argv)
    out = opts.out
    full = {
        "rollout_batch_size": _int(last(items, "--rollout-batch-size"), 1),
        "n_samples_per_prompt": _int(last(items, "--n-samples-per-prompt"), 1),
        "max_response_len": _int(last(items, "--rollout-max-response-len")),
        "num_rollout": _int(last(items, "--num-rollout")),
        "num_steps_per_rollout": _int(last(items, "--num-steps-per-rollout"), 1),
    }
    batch = max(1, min(opts.rollout_batch, full["rollout_batch_size"] or opts.rollout_batch))
    n = max(1, min(opts.max_samples, full["n_samples_per_prompt"] or 1))
    steps = full["num_steps_per_rollout"] if (batch * n) % max(1, full["num_steps_per_rollout"]) == 0 else 1
    user_len = full["max_response_len"]
    cap = min(user_len, opts.response_cap) if user_len else opts.response_cap
    changes = [f"--num-rollout {opts.rollouts}", f"--rollout-batch-size {batch}", f"--n-samples-per-prompt {n}",
               f"--global-batch-size {batch * n // steps} (rollout_batch_size*n_samples_per_prompt == "
               f"global_batch_size*num_steps_per_rollout)", f"--rollout-max-response-len {cap}",
               f"outputs under {out}", "--check-weight-update-equal"]
    if opts.engine != "slime":
        changes += [f"--hf-checkpoint {model_dir} (tiny model)", "MODEL_ARGS dropped (config.json of the tiny model)",
                    "parallelism 1, one engine"]
    keep: list[str] = []
    hooks: dict[str, tuple[str, str]] = {}
    has_eval = last(items, "--eval-prompt-data") is not None or last(items, "--eval-config") is not None
    real = opts.engine == "slime"
    writes: dict[str, str] = {}
    for flag, values in items:
        if flag in WRITES:
            if values:
                writes[flag] = redirected(flag, values[-1], out)
            continue
        if rehearsal_replaces(flag, opts.engine):
            continue
        if flag in hook_flags and values:
            wrapped = []
            for v in values:
                hook_id = f"h{len(hooks)}_{flag.lstrip('-').replace('-', '_')}"
                hooks[hook_id] = (flag, v)
                wrapped.append(f"{HOOK_MODULE}.{hook_id}")
            keep += [flag, *wrapped]
            continue
        keep += [flag, *values]
    argv = keep + [
        "--hf-checkpoint", str(model_dir), "--prompt-data", str(data["prompt"]),
        "--num-rollout", str(opts.rollouts), "--rollout-batch-size", str(batch), "--n-samples-per-prompt", str(n),
        "--global-batch-size", str(batch * n // steps), "--num-steps-per-rollout", str(steps),
        "--rollout-max-response-len", str(cap), "--check-weight-update-equal",
        *([] if real else [x for k, v in LAYOUT.items() if last(items, k) is not None for x in (k, v)]),
        *([] if real else ["--output-dir", str(out / "run")]),  # slime-ref's; slime has no such flag
    ]
    for flag, path in writes.items():
        argv += [flag, path]
    if writes:
        changes.append("written under " + str(out) + ": " + ", ".join(writes))
    if "--save" in writes:
        argv += ["--save-interval", str(opts.rollouts)]
    if last(items, "--use-wandb") is not None:
        argv += ["--use-wandb", "--wandb-mode", "offline"]
        changes.append("W&B offline")
    if not real and last(items, "--rollout-num-gpus") is not None and last(items, "--colocate") is None:
        argv += ["--rollout-num-gpus", "1"]
    if has_eval and data.get("eval"):
        argv += ["--eval-prompt-data", *[x for name, p in data["eval"] for x in (name, str(p))],
                 "--eval-interval", str(opts.rollouts), "--n-samples-per-eval-prompt", "1",
                 "--eval-max-response-len", str(cap)]
        changes.append(f"eval once, on {EVAL_ROWS} prompts per set")
    over = _int(last(items, "--over-sampling-batch-size"))
    if over is not None:
        # the job's over-sampling ratio, at the rehearsal's batch size: over-sampling itself is rehearsed
        over = max(batch, -(-over * batch // max(1, full["rollout_batch_size"])))
        argv += ["--over-sampling-batch-size", str(over)]
        changes.append(f"--over-sampling-batch-size {over} (the job's ratio to the rollout batch)")
    if not real and last(items, "--dynamic-sampling-filter-path"):
        # a random model gives equal rewards in most groups: a filter that wants spread would draw forever
        budget = FILTER_BUDGET_ROUNDS * (over or batch)
        argv += ["--dynamic-sampling-max-groups", str(budget)]
        changes.append(f"the dynamic filter sees at most {budget} groups per rollout; then the best groups "
                       "drawn fill the batch")
    return Shrunk(argv, changes, hooks, [], user_len, full)


def drop_unimplemented(argv: list[str]) -> tuple[list[str], list[str]]:
    """slime's flags slime-ref's parser does not declare (nor passes to SGLang or the router) are left out
    of the rehearsal, and named; slime-ref would refuse them. So is a top-p below 1, which turns on
    slime's top-p replay (the rehearsal samples with top-p 1)."""
    from slime_common.registry import KNOWN_SLIMES, load_registry
    from slime_ref.arguments import build_parser

    known = set(build_parser()._option_string_actions)
    regs = [load_registry(target) for target in KNOWN_SLIMES]  # a flag of main is not slime-ref's either
    kept, dropped = [], []
    for flag, values in split_flags(argv):
        spec = next((r.lookup(flag) for r in regs if r.lookup(flag) is not None), None)
        if flag not in known and spec is not None and spec.source not in ("sglang", "sglang-patch", "router"):
            dropped.append(flag)
            continue
        # convert gives the word back when it is not a number, which slime-ref's parser then names
        if flag == "--rollout-top-p" and values and spec.convert(values[-1]) not in (values[-1], 1.0):
            dropped.append(f"--rollout-top-p {values[-1]} (top-p replay)")
            continue
        kept += [flag, *values]
    return kept, dropped


def leave_out_unimplemented(shrunk: Shrunk) -> Finding | None:
    """Take what slime-ref does not implement out of ``shrunk`` (argv, and the hooks those flags name, so
    a left-out hook is not later reported as never called); one finding names them all."""
    shrunk.argv, dropped = drop_unimplemented(shrunk.argv)
    if not dropped:
        return None
    flags = {d.split()[0] for d in dropped}
    hook_path = {}
    for hook_id, (flag, path) in list(shrunk.hooks.items()):
        if flag in flags:
            del shrunk.hooks[hook_id]
            hook_path[flag] = path
    names = [f"{d} {hook_path[d]}" if d in hook_path else d for d in dropped]
    shrunk.changes.append("left out (slime-ref does not implement them): " + ", ".join(dropped))
    return Finding("smoke.not_rehearsed", Status.WARN, f"slime-ref does not implement {', '.join(names)}: left "
                   "out of this rehearsal.", "--with slime on a GPU node runs them in slime's own train.py "
                   "(hooks included).", DOC)


# ---------------------------------------------------------------------------------------------
# assets: the tiny model, the first rows of the data, the hook wrappers


def build_model(job_items, out: Path, responses: list[dict] = ()) -> tuple[Path, list[Finding]]:
    """A tiny model of the user's family from their config.json, or ours, with a finding saying which.
    Its context covers the job's (a multi-turn job's prompt, observations and answers), and a tokenizer
    that is not the user's is byte-level, so any text a hook or the stand-in engine writes is spelled."""
    hf = last(job_items, "--hf-checkpoint")
    src = Path(hf[0]).expanduser() if hf else None
    config_path = src / "config.json" if src else None
    context = stand_in_context(job_items)
    if not config_path or not config_path.is_file():
        why = f"--hf-checkpoint {hf[0] if hf else '(none)'} is not on this machine"
        return _family_tiny(out, None, {}, "qwen3", context, [], why, responses)
    try:
        user_cfg = json.loads(config_path.read_text())
    except (OSError, ValueError) as e:
        return _family_tiny(out, None, {}, "qwen3", context, [], f"{config_path} cannot be read ({e})", responses)
    user_cfg = user_cfg.get("text_config", user_cfg)
    family = user_cfg.get("model_type")
    findings = []
    if family not in SUPPORTED_MODEL_TYPES:
        findings.append(Finding("smoke.model", Status.WARN,
                                f"slime-ref builds {', '.join(SUPPORTED_MODEL_TYPES)} models, not {family!r}: the "
                                "rehearsal uses the nearest dense shape (qwen3) with your GQA ratio, tied embeddings "
                                "and rope base; MoE, MLA, sliding windows and custom layers are not rehearsed.",
                                "Rehearse with --with slime on one GPU node for the real architecture.", DOC))
        family = "qwen3"
    tok_local = any((src / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json"))
    return _family_tiny(out, src if tok_local else None, user_cfg, family, context, findings, None, responses)


STAND_IN_CONTEXT = 4096  # tokens: a search loop's second turn (prompt + observation) is about 620


def stand_in_context(job_items) -> int:
    """The stand-in model's context: the job's --rollout-max-context-len, or prompt + response limits,
    and at least :data:`STAND_IN_CONTEXT`."""
    lengths = [_int(last(job_items, "--rollout-max-context-len"), 0),
               _int(last(job_items, "--rollout-max-prompt-len"), 0) + _int(last(job_items,
                                                                              "--rollout-max-response-len"), 0)]
    return max(STAND_IN_CONTEXT, *lengths)


def stand_in_tokenizer(texts: list[str]):
    """A byte-level BPE tokenizer with a ChatML template: every text round-trips, whatever its script."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from slime_ref.assets import CHAT_TEMPLATE, IM_END, IM_START, PAD_TOKEN

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=[PAD_TOKEN, IM_START, IM_END], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts or [""], trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD_TOKEN,
                                     additional_special_tokens=[IM_START])
    hf_tok.chat_template = CHAT_TEMPLATE
    return hf_tok


def _family_tiny(out: Path, tokenizer_src: Path | None, user_cfg: dict, family: str, context: int, findings,
                 missing: str | None = None, responses: list[dict] = ()):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from slime_ref.assets import padded_vocab_size

    model_dir = out / "model"
    tokenizer = None
    if tokenizer_src is not None:
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_src))
        except Exception as e:  # a broken or exotic tokenizer: ours stands in
            findings.append(Finding("smoke.tokenizer", Status.WARN, f"{tokenizer_src}'s tokenizer does not load "
                                    f"({e}); a byte-level tokenizer stands in.", "Check the tokenizer files.", DOC))
    elif missing is None:
        findings.append(Finding("smoke.tokenizer", Status.WARN, "the checkpoint has no tokenizer files here; a "
                                "byte-level tokenizer with a ChatML template stands in (your chat template and "
                                "special tokens differ).", "Copy tokenizer.json / tokenizer_config.json next to "
                                "config.json.", DOC))
    if tokenizer is None:
        tokenizer = stand_in_tokenizer(sample_texts(out, responses))
    heads = int(user_cfg.get("num_attention_heads", 4))
    kv = int(user_cfg.get("num_key_value_heads") or heads)
    ratio = max(1, heads // max(1, kv))
    tiny_heads = 4 if ratio <= 4 else ratio
    tiny_kv = max(1, tiny_heads // ratio)
    cfg = AutoConfig.for_model(
        family, vocab_size=padded_vocab_size(len(tokenizer), 64), hidden_size=tiny_heads * 32,
        intermediate_size=tiny_heads * 96, num_hidden_layers=2, num_attention_heads=tiny_heads,
        num_key_value_heads=tiny_kv, head_dim=32, max_position_embeddings=context,
        rms_norm_eps=user_cfg.get("rms_norm_eps", 1e-6), rope_theta=user_cfg.get("rope_theta", 10000.0),
        tie_word_embeddings=bool(user_cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(user_cfg.get("attention_bias", False)) if family != "qwen3" else False,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.float32)
    model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    whose = "your" if tokenizer_src is not None and not findings_about_tokenizer(findings) else "a byte-level"
    findings.append(Finding("smoke.model", Status.WARN if missing else Status.PASS,
                            (f"{missing}: the rehearsal uses a stand-in: " if missing else "")
                            + f"tiny {family} (2 layers, {tiny_heads} heads, GQA {ratio}:1, tied embeddings "
                            f"{cfg.tie_word_embeddings}, rope base {user_cfg.get('rope_theta', 10000.0):g}, "
                            f"context {context}), random weights, {whose} tokenizer: {model_dir}",
                            "Copy the checkpoint's config.json and tokenizer files here to rehearse your model's "
                            "family and tokenizer." if missing else "", DOC if missing else ""))
    return model_dir, findings


def findings_about_tokenizer(findings) -> bool:
    return any(f.id == "smoke.tokenizer" for f in findings)


def sample_texts(out: Path, responses: list[dict] = ()) -> list[str]:
    """The texts the stand-in tokenizer's merges are learned from: the rehearsal's data rows, and the
    answer shapes the stand-in engine may give."""
    from slime_rehearse.smoke_runtime import ANSWER_SHAPES

    texts = [template.format(a="42") for template in ANSWER_SHAPES.values()]
    for path in sorted((out / "data").glob("*.jsonl")):
        texts += path.read_text().splitlines()
    return texts + [turn for r in responses for turn in response_turns(r)]


def response_turns(given: dict) -> list[str]:
    response = given["response"]
    return response if isinstance(response, list) else [response]


def scripted_tokens(model_dir: Path, responses: list[dict]) -> int:
    """Tokens the longest ``--responses`` answer needs (its turns, each ended by eos): the rehearsal's
    response cap must not cut a scripted tool call short."""
    if not responses:
        return 0
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return max(sum(len(tokenizer(turn, add_special_tokens=False)["input_ids"]) + 1 for turn in response_turns(r))
               for r in responses)


def write_data(items, out: Path) -> tuple[dict, list[Finding]]:
    from slime_check.config_lint import first_rows

    data_dir = out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"eval": []}
    findings = []
    prompt = last(items, "--prompt-data")
    if not prompt:
        from slime_common.errors import UserError

        raise UserError("the job has no --prompt-data; smoke rehearses a run on the first rows of its data")
    path = Path(prompt[0]).expanduser()
    if not path.is_file():
        findings.append(Finding("smoke.data", Status.FAIL, f"--prompt-data {prompt[0]} is not on this machine.",
                                "Copy the data file here (smoke uses its first rows).", slime_doc(USAGE)))
        return result, findings
    rows = first_rows(path, DATA_ROWS)
    result["prompt"] = data_dir / "prompt.jsonl"
    result["prompt"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    findings.append(Finding("smoke.data", Status.PASS, f"first {len(rows)} rows of {path} with their keys: "
                            f"{result['prompt']}"))
    ev = last(items, "--eval-prompt-data") or []
    pairs = list(zip(ev[0::2], ev[1::2], strict=False)) if len(ev) > 1 else []
    eval_config = last(items, "--eval-config")
    if eval_config:  # slime reads the datasets from the YAML and ignores --eval-prompt-data then
        from slime_check.eval_config import eval_config_as_prompt_data, read_eval_config
        from slime_common.errors import UserError

        try:
            pairs = eval_config_as_prompt_data(read_eval_config(Path(eval_config[0]).expanduser()))
        except UserError as e:
            findings.append(Finding("smoke.eval_config", Status.WARN, f"{e}; no eval is rehearsed.",
                                    "Fix the file (slime-check config reports what is wrong).", DOC))
            pairs = []
        else:
            findings.append(Finding("smoke.eval_config", Status.PASS, f"--eval-config {eval_config[0]}: its "
                                    f"datasets ({', '.join(name for name, _ in pairs)}) are rehearsed as "
                                    "--eval-prompt-data on their first rows; per-dataset settings are not"))
    for name, p in pairs:
        p = Path(p).expanduser()
        if p.is_file():
            target = data_dir / f"eval-{name}.jsonl"
            target.write_text("".join(json.dumps(r) + "\n" for r in first_rows(p, EVAL_ROWS)))
            result["eval"].append((name, target))
    return result, findings


SMOKE_SITE = Path(__file__).resolve().parent / "smoke_site"  # holds slime_smoke_hooks, first on the run's path


def hook_counts(hooks: dict[str, tuple[str, str]], out: Path) -> dict[str, dict]:
    calls = out / "hooks" / "calls"
    result = {}
    for hook_id, (flag, path) in hooks.items():
        c = sum(p.stat().st_size for p in calls.glob(f"{hook_id}.calls.*"))
        e = sum(p.stat().st_size for p in calls.glob(f"{hook_id}.err.*"))
        first = calls / f"{hook_id}.first_error"
        result[hook_id] = {"flag": flag, "path": path, "calls": c, "errors": e,
                           "first_error": first.read_text() if first.is_file() else None}
    return result


def read_responses(path: Path) -> list[dict]:
    """``--responses`` FILE: one JSON object a line, ``{"prompt"?: str, "response": str | [str, ...],
    "correct"?: bool}``; a usage error names the line that is not."""
    from slime_common.errors import UserError

    try:
        text = Path(path).read_text()
    except OSError as e:
        raise UserError(f"--responses {path}: cannot be read ({e.strerror or e})") from e
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise UserError(f"--responses {path}:{n}: not JSON ({e})") from e
        response = row.get("response") if isinstance(row, dict) else None
        turns = response if isinstance(response, list) else [response]
        if not turns or not all(isinstance(t, str) and t for t in turns):
            raise UserError(f"--responses {path}:{n}: \"response\" must be a non-empty string or a list of them "
                            "(the turns of a multi-turn answer)")
        if not isinstance(row.get("prompt", ""), str) or not isinstance(row.get("correct", False), bool):
            raise UserError(f"--responses {path}:{n}: \"prompt\" must be a string and \"correct\" true or false")
        found.append(row)
    if not found:
        raise UserError(f"--responses {path}: no responses in it (one JSON object a line)")
    return found


def write_engine_script(out: Path, items, probe: dict | None, responses: list[dict]) -> Path | None:
    """OUT/engine-script.json for the stand-in engine (slime_ref/engine/script.py): for each prompt row,
    the user's --responses for it, then its label in each answer shape the reward scored. The engine
    gives every second answer of a prompt from this list and samples the others, so groups have spread."""
    from slime_rehearse.smoke_runtime import ANSWER_SHAPES, answer_text, prompt_text

    input_key = (last(items, "--input-key") or ["input"])[0]
    label_key = (last(items, "--label-key") or [None])[0]
    taken = [shape for shape, score in (probe or {}).get("shapes", {}).items() if score > 0]
    entries: dict[str, list] = {}
    for line in (out / "data" / "prompt.jsonl").read_text().splitlines():
        row = json.loads(line)
        match = prompt_text(row.get(input_key))
        if not match or match in entries:
            continue
        answer = answer_text(row.get(label_key)) if label_key else None
        given = [r["response"] for r in responses if r.get("prompt") is None or r["prompt"] in match]
        answers = [ANSWER_SHAPES[shape].format(a=answer) for shape in taken] if answer else []
        if given or answers:
            entries[match] = given + answers
    if not entries:
        return None
    path = out / "engine-script.json"
    path.write_text(json.dumps({"entries": [{"match": m, "responses": r} for m, r in entries.items()],
                                "every": 2}, indent=1))
    return path


def write_coverage_config(out: Path, files: list[str]) -> Path:
    """OUT/hooks/coverage.ini: measure only the user's hook files, one data file per process."""
    data = out / "coverage"
    data.mkdir(parents=True, exist_ok=True)
    path = out / "hooks" / "coverage.ini"
    path.write_text(f"[run]\ndata_file = {data / '.coverage'}\nparallel = True\ninclude =\n"
                    + "".join(f"    {f}\n" for f in files))
    return path


def users_files(files: dict[str, str]) -> list[str]:
    """The user's hook files and the Python modules beside them (what the hooks load: an agent system, a
    tool sandbox); not slime-ref's, the compatibility layer's or slime-check's."""
    ours = Path(__file__).resolve().parent.parent  # reference_impl
    hook_files = {Path(f).resolve() for f in files.values()}
    beside = {p.resolve() for f in hook_files for p in f.parent.glob("*.py") if p.name != "__init__.py"}
    return sorted(str(f) for f in hook_files | beside if not f.is_relative_to(ours))


# ---------------------------------------------------------------------------------------------
# running and stopping


def slime_importable() -> bool:
    return importlib.util.find_spec("slime") is not None


class Launched:
    """A command in its own session; output streamed to a file and a callback; every process of its tree
    remembered, so that exactly those are stopped."""

    def __init__(self, cmd: list[str], env: dict, log_path: Path, cwd: str | None = None, echo=None):
        self.log_path = log_path
        self.echo = echo
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, cwd=cwd, start_new_session=True)
        self.seen: dict[int, float] = {}
        self.peak_rss = 0
        self.lines: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        with open(self.log_path, "wb") as log:
            for raw in iter(self.proc.stdout.readline, b""):
                log.write(raw)
                log.flush()
                self.lines.put(raw.decode(errors="replace").rstrip("\n"))
        self.lines.put(None)

    def snapshot(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        rss = 0
        for p in procs:
            try:
                self.seen.setdefault(p.pid, p.create_time())
                rss += p.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        self.peak_rss = max(self.peak_rss, rss)

    def wait(self, timeout_s: float) -> tuple[int | None, bool]:
        """(exit status, timed out). Streams lines to ``echo`` while waiting."""
        deadline = time.monotonic() + timeout_s
        last_snap = 0.0
        done_reading = False
        while True:
            if time.monotonic() - last_snap > 0.5:
                self.snapshot()
                last_snap = time.monotonic()
            try:
                line = self.lines.get(timeout=0.2)
                if line is None:
                    done_reading = True
                elif self.echo:
                    self.echo(line)
            except queue.Empty:
                pass
            if done_reading and self.proc.poll() is not None:
                return self.proc.returncode, False
            if time.monotonic() > deadline:
                self.stop()
                return self.proc.returncode, True

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGINT to its group (it tears down what it started), then SIGKILL to whatever of its tree is left."""

        self.snapshot()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        from slime_ref.utils.reaper import reap

        reap(self.seen)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self._reader.join(timeout=5)


def run_env(opts: SmokeOptions, job: Job, hooks_config: Path | None, compat: bool) -> dict:
    """The run's environment: the job's, with the counted hooks (and the coverage start-up) first on
    PYTHONPATH, the slime compatibility layer when slime is missing, and every cache under OUT."""
    env = {**os.environ, **job.env, **opts.env}
    paths = [str(SMOKE_SITE)] if hooks_config else []
    if hooks_config:
        env["SLIME_SMOKE_HOOKS_CONFIG"] = str(hooks_config)
    if compat:
        from slime_rehearse.compat import ROOT

        paths.append(str(ROOT))
    if opts.target:  # the compat layer serves that slime's module names (compat/layouts.py)
        from slime_rehearse.compat import TARGET_ENV

        env[TARGET_ENV] = opts.target
    import slime_ref

    paths.append(str(Path(slime_ref.__file__).resolve().parent.parent))
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update({
        "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1", "COLUMNS": "200",
        "WANDB_MODE": "offline", "WANDB_DIR": str(opts.out / "wandb"),
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "PYTHONPYCACHEPREFIX": str(opts.out / "pycache"),  # no __pycache__ next to the user's hooks
        "MPLCONFIGDIR": str(opts.out / "cache" / "matplotlib"),  # the run's plots: font cache under OUT
        "XDG_CACHE_HOME": str(opts.out / "cache"),
    })
    (opts.out / "wandb").mkdir(parents=True, exist_ok=True)
    env["RAY_TMPDIR"] = str(ray_temp_dir(opts.out))
    return env


# Ray puts its sockets at RAY_TMPDIR/ray/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store: 68
# characters after RAY_TMPDIR with a 7-digit pid, and a Unix socket path holds at most 107.
RAY_SOCKET_SUFFIX = len("/ray/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store")
UNIX_PATH_MAX = 107


def ray_temp_dir(out: Path) -> Path:
    """OUT/ray where Ray's socket paths fit under it; else a short private folder in /tmp, which
    :func:`remove_ray_temp_dir` removes after the run."""
    ray_tmp = out / "ray"
    if len(str(ray_tmp.resolve())) + RAY_SOCKET_SUFFIX > UNIX_PATH_MAX:
        import tempfile

        ray_tmp = Path(tempfile.mkdtemp(prefix="slime-smoke-ray-", dir="/tmp"))
    ray_tmp.mkdir(parents=True, exist_ok=True)
    return ray_tmp


def remove_ray_temp_dir(env: dict, out: Path) -> None:
    path = Path(env.get("RAY_TMPDIR", ""))
    if path.name.startswith("slime-smoke-ray-") and path.parent == Path("/tmp"):
        import shutil

        shutil.rmtree(path, ignore_errors=True)


def slime_ref_cmd(entry: str, argv: list[str]) -> list[str]:
    command = "train-async" if entry == "train_async.py" else "train"
    return [sys.executable, "-c", "from slime_ref.cli import main; main()", command, *argv]


def slime_cmd(slime_dir: Path, entry: str, argv: list[str]) -> list[str]:
    return [sys.executable, str(slime_dir / entry), *argv]


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
    ``rollout/response_len/mean`` is also given as ``rollout/response_length``, slime-ref's name.
    slime counts the groups whose rewards are all equal (``rollout/zero_std/count_<reward>``, logged
    only for the rewards that had such groups); given ``groups`` (--rollout-batch-size), that becomes
    ``rollout/zero_std_ratio``, slime-ref's name."""
    import importlib.util

    from slime_check.skill_install import bundle_root

    path = bundle_root() / "skill" / "scripts" / "slime_log_summary.py"
    spec = importlib.util.spec_from_file_location("slime_log_summary", path)
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    records = []
    for rollout_id, metrics in sorted(summary.read_log(log.splitlines()).items()):
        if "rollout/response_len/mean" in metrics:
            metrics.setdefault("rollout/response_length", metrics["rollout/response_len/mean"])
            if groups:
                equal = sum(v for k, v in metrics.items() if k.startswith("rollout/zero_std/count_"))
                metrics.setdefault("rollout/zero_std_ratio", equal / groups)
        records.append({"rollout_id": rollout_id, **metrics})
    return records




def estimate(summary: dict, shrunk: Shrunk, opts: SmokeOptions) -> dict:
    """A rough scale-up per rollout: the measured seconds per sample and per token, times the full sizes."""
    phase = summary.get("phase_s", {})
    per_rollout = {k: v / max(1, opts.rollouts) for k, v in phase.items()
                   if k in ("rollout", "train", "update_weights")}
    small = opts.rollout_batch * min(opts.max_samples, shrunk.full["n_samples_per_prompt"] or 1)
    big = (shrunk.full["rollout_batch_size"] or 1) * (shrunk.full["n_samples_per_prompt"] or 1)
    tokens = (shrunk.full["max_response_len"] or opts.response_cap) / opts.response_cap
    scale = (big / max(1, small)) * tokens
    return {"label": "ESTIMATE on this machine with the tiny model, scaled by samples x response length; "
                     "not a prediction of GPU time for your model",
            "measured_per_rollout_s": per_rollout, "scale": scale,
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
    pre = run_prereqs(LiveProbe(), only=groups)
    if opts.engine == "slime-ref":
        # the CPU rehearsal needs slime-ref's stack, not slime's GPU packages: their FAILs are reported, not fatal
        pre = [Finding(f.id, Status.WARN if f.status is Status.FAIL else f.status, f.finding + " (needed by "
                       "slime, not by this CPU rehearsal)" if f.status is Status.FAIL else f.finding, f.fix, f.doc)
               for f in pre]
    return findings + pre


def run_smoke(script_or_args: list[str], opts: SmokeOptions, console, echo=None) -> tuple[list[Finding], dict]:
    from slime_common.errors import UserError

    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    wall = time.perf_counter()
    phase: dict[str, float] = {}

    t = time.perf_counter()
    job, config_findings = read_job(script_or_args, opts.slime_dir, opts.env, opts.engine, opts.target,
                                    opts.registry)
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
    if opts.engine == "slime-ref":
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
    hooks_config = write_hooks(shrunk.hooks, out, real_slime=real, probe=probe)
    compat = opts.engine == "slime-ref" and not slime_importable()
    env = run_env(opts, job, hooks_config, compat)
    imports, preflight = preflight_hooks(shrunk.hooks, env, hooks_config)
    findings += imports
    hook_files = users_files(preflight.get("files", {}))
    if hook_files:
        env["COVERAGE_PROCESS_START"] = str(write_coverage_config(out, hook_files))
    script = None
    if not real:
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
    launched = Launched(cmd, env, out / "smoke.log", cwd=str(opts.slime_dir) if opts.engine == "slime" else None,
                        echo=echo)
    try:
        rc, timed_out = launched.wait(opts.timeout_s)
    except KeyboardInterrupt:
        launched.stop()
        if ray_head:
            ray_head.stop()
        remove_ray_temp_dir(env, out)
        raise
    finally:
        launched.stop()
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
        log, _int(last(split_flags(shrunk.argv), "--rollout-batch-size")))
    result = {"returncode": rc, "timed_out": timed_out, "log": log, "metrics": metrics,
              "hooks": hook_counts(shrunk.hooks, out), "wall_s": phase["run"], "probe": preflight.get("probe"),
              "stand_in": stand_in_counts(out / "engine-stats.jsonl"),
              "coverage": hook_coverage(out / "coverage", out / "hooks" / "coverage.ini", hook_files)
              if hook_files else None}
    findings += verdict(result, shrunk, opts)
    phase["total"] = time.perf_counter() - wall
    report.update({
        "returncode": rc, "timed_out": timed_out, "log": str(out / "smoke.log"),
        "hooks": {h["path"]: {"flag": h["flag"], "calls": h["calls"], "errors": h["errors"],
                              "first_error": h["first_error"]} for h in result["hooks"].values()},
        "rewards": [flat(r)["rollout/raw_reward"] for r in result["metrics"] if "rollout/raw_reward" in flat(r)],
        "truncated_ratio": [flat(r).get("rollout/truncated_ratio") for r in result["metrics"]
                            if "rollout/raw_reward" in flat(r)],
        "response_length": [flat(r).get("rollout/response_length") for r in result["metrics"]
                            if "rollout/raw_reward" in flat(r)],
        "weight_check_max_abs_diff": [flat(r)["perf/weight_check_max_abs_diff"] for r in result["metrics"]
                                      if "perf/weight_check_max_abs_diff" in flat(r)],
        "phase_s": {**phase, **{f"run/{k}": v for k, v in summary.get("phase_s", {}).items()}},
        "peak_rss_gib": launched.peak_rss / 2**30,
        "label_probe": result["probe"], "stand_in": result["stand_in"], "coverage": result["coverage"],
        "filter": filter_counts(metrics),
        "estimate": estimate(summary, shrunk, opts) if summary else None,
    })
    return findings, report


class RayHead:
    """A Ray head of our own on free loopback ports, for the real slime run; stopped by its PIDs only.
    ``client_env`` is what a process needs to join it: RAY_ADDRESS, and RAY_AUTH_MODE when it has one."""

    def __init__(self, launched: Launched, address: str, auth: dict):
        self.launched, self.address = launched, address
        self.client_env = {"RAY_ADDRESS": address, **auth}

    def stop(self):
        self.launched.stop(grace_s=10)


def _free_port() -> int:
    """A free loopback port outside Ray's default worker range (10002-19999)."""
    import socket

    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if not 10000 <= port < 20000:
            return port


def ray_auth_env(env: dict) -> dict:
    """The RAY_AUTH_MODE that our head and slime's train.py, joining it by RAY_ADDRESS, must share."""
    from slime_common.ray_auth import ray_auth_mode

    mode = ray_auth_mode(env)
    return {"RAY_AUTH_MODE": mode} if mode else {}


def start_ray_head(out: Path, env: dict) -> RayHead:
    import socket

    from slime_common.errors import RunError

    port = _free_port()
    cmd = [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
           "--port", str(port), "--dashboard-port", str(_free_port()), "--include-dashboard", "false",
           "--ray-client-server-port", str(_free_port()), "--dashboard-agent-listen-port", str(_free_port()),
           "--disable-usage-stats"]
    if "RAY_TMPDIR" in env:
        cmd += ["--temp-dir", env["RAY_TMPDIR"]]
    auth = ray_auth_env(env)
    launched = Launched(cmd, {**env, **auth}, out / "ray-head.log")
    deadline = time.monotonic() + 90
    up = False
    while not up and time.monotonic() < deadline and launched.proc.poll() is None:  # GCS listening: the head is up
        launched.snapshot()
        with socket.socket() as sock:
            sock.settimeout(1)
            up = sock.connect_ex(("127.0.0.1", port)) == 0
        if not up:
            time.sleep(0.5)
    if not up:
        launched.stop(grace_s=10)
        raise RunError(f"the Ray head for the smoke run did not start; see {out / 'ray-head.log'} "
                       "(or set RAY_ADDRESS to a cluster of yours)")
    return RayHead(launched, f"127.0.0.1:{port}", auth)


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
