"""``slime-check smoke``, reading and shrinking the job: the launch script's train argv and exported
environment (:func:`read_job`), and the same job at toy size with every writing path under OUT
(:func:`shrink`). The rehearsal itself is :mod:`slime_rehearse.rehearsal`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from slime_check.findings import CUSTOMIZATION, Finding, Status, slime_doc

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
# A memory-faithful smoke (--memory) also keeps what sets the peak: recompute and the pipeline's split.
KEPT_FOR_MEMORY = KEPT_FOR_SLIME | {"--recompute-granularity", "--recompute-method", "--recompute-num-layers",
                                    "--sequence-parallel", "--decoder-last-pipeline-num-layers"}
DEFAULT_GENERATE = "slime.rollout.sglang_rollout.generate"
GENERATE_FLAG = "--custom-generate-function-path"
# the smoke's own hook (a memory-faithful job whose generate is slime's): slime's generate, wrapped to force
# every answer to full length. Not the user's code: no coverage of it, and no verdict that it went uncalled
FULL_LENGTH_HOOK = "h_full_length_generate"

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
# Flags whose names look like output places but are not (tests/slime_rehearse/test_smoke.py checks the two lists
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


def rehearsal_replaces(flag: str, engine: str, memory: bool = False) -> bool:
    """True when the rehearsal drops the job's value of ``flag`` or sets its own. A memory-faithful
    rehearsal runs the job's own model and layout on either engine."""
    if flag in REPLACED or flag in WRITES:
        return True
    if memory:
        return flag in DROPPED and flag not in KEPT_FOR_MEMORY
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
    memory: bool = False  # memory-faithful: the job's model, layout, lengths and micro-batches (memory_sizes)
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
             engine: str = "slime-ref", target: str | None = None, reg=None,
             memory: bool = False) -> tuple[Job, list[Finding]]:
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
        elif rehearsal_replaces(given.name, engine, memory) and given.name not in READ_BY_REHEARSAL:
            argv += [given.name, *[w.text for w in given.values]]  # never read: the rehearsal sets its own
        elif engine == "slime-ref" and not memory and given.name.startswith("--sglang-"):
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
    from slime_check.launch_script import read_script
    from slime_check.shell_expansion import Sym

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


def as_int(values, default=None):
    try:
        return int(values[0]) if values else default
    except (TypeError, ValueError):
        return default


def memory_sizes(items, full: dict) -> tuple[int, int, str]:
    """(prompts, samples per prompt, why) for a memory-faithful rehearsal: one whole group of the job,
    and enough samples at full length to fill the job's largest micro-batch on every data-parallel rank
    (``--max-tokens-per-gpu`` // the longest sample with dynamic batching, else ``--micro-batch-size``).
    Fewer prompts than the job's, never more."""
    gpus = (as_int(last(items, "--actor-num-nodes"), 1) or 1) * (as_int(last(items, "--actor-num-gpus-per-node"), 1)
                                                                 or 1)
    model = 1
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size"):
        model *= as_int(last(items, flag), 1) or 1
    dp = max(1, gpus // model)
    n = max(1, full["n_samples_per_prompt"] or 1)
    longest = (as_int(last(items, "--rollout-max-prompt-len"), 0) or 0) + (full["max_response_len"] or 1)
    cp = as_int(last(items, "--context-parallel-size"), 1) or 1
    max_tokens = as_int(last(items, "--max-tokens-per-gpu"))
    if last(items, "--use-dynamic-batch-size") is not None and max_tokens:
        per_micro = max(1, max_tokens * cp // longest)
        why = f"--max-tokens-per-gpu {max_tokens} holds {per_micro} sample(s) of {longest} tokens"
    else:
        per_micro = as_int(last(items, "--micro-batch-size"), 1) or 1
        why = f"--micro-batch-size {per_micro}"
    samples = max(n, per_micro * dp)
    most = max(1, full["rollout_batch_size"] or 1)
    prompts = min(-(-samples // n), most)
    while prompts * n % dp and prompts < most:  # every data-parallel rank gets the same number of samples
        prompts += 1
    return prompts, n, f"{why}, x {dp} data-parallel rank(s)"


def shrink(job: Job, opts: SmokeOptions, model_dir: Path, data: dict[str, Path]) -> Shrunk:
    """The same job at toy size. ``data`` maps "prompt" and eval names to the small files under OUT."""
    from slime_common.registry import load_registry

    hook_flags = set(load_registry().hook_flags())
    items = split_flags(job.argv)
    out = opts.out
    full = {
        "rollout_batch_size": as_int(last(items, "--rollout-batch-size"), 1),
        "n_samples_per_prompt": as_int(last(items, "--n-samples-per-prompt"), 1),
        "max_response_len": as_int(last(items, "--rollout-max-response-len")),
        "num_rollout": as_int(last(items, "--num-rollout")),
        "num_steps_per_rollout": as_int(last(items, "--num-steps-per-rollout"), 1),
    }
    user_len = full["max_response_len"]
    if opts.memory:
        batch, n, why = memory_sizes(items, full)
        steps = 1
        cap = user_len or opts.response_cap
        changes = [f"--num-rollout {opts.rollouts}", f"--rollout-batch-size {batch}", f"--n-samples-per-prompt {n}"
                   f" (one whole group; {why})", f"--global-batch-size {batch * n} (one step)",
                   f"every answer forced to --rollout-max-response-len {cap} (ignore_eos)",
                   f"outputs under {out}", "no eval, no --check-weight-update-equal (its snapshot is extra memory)",
                   "the job's model, layout, --max-tokens-per-gpu, recompute and SGLang settings kept"]
    else:
        batch = max(1, min(opts.rollout_batch, full["rollout_batch_size"] or opts.rollout_batch))
        n = max(1, min(opts.max_samples, full["n_samples_per_prompt"] or 1))
        steps = full["num_steps_per_rollout"] if (batch * n) % max(1, full["num_steps_per_rollout"]) == 0 else 1
        cap = min(user_len, opts.response_cap) if user_len else opts.response_cap
        changes = [f"--num-rollout {opts.rollouts}", f"--rollout-batch-size {batch}", f"--n-samples-per-prompt {n}",
                   f"--global-batch-size {batch * n // steps} (rollout_batch_size*n_samples_per_prompt == "
                   f"global_batch_size*num_steps_per_rollout)", f"--rollout-max-response-len {cap}",
                   f"outputs under {out}", "--check-weight-update-equal"]
    if opts.engine != "slime" and not opts.memory:
        changes += [f"--hf-checkpoint {model_dir} (tiny model)", "MODEL_ARGS dropped (config.json of the tiny model)",
                    "parallelism 1, one engine"]
    keep: list[str] = []
    hooks: dict[str, tuple[str, str]] = {}
    has_eval = not opts.memory and (last(items, "--eval-prompt-data") is not None
                                    or last(items, "--eval-config") is not None)
    own_model = opts.engine == "slime" or opts.memory  # the job's own model and layout, not the tiny one
    writes: dict[str, str] = {}
    for flag, values in items:
        if flag in WRITES:
            if values:
                writes[flag] = redirected(flag, values[-1], out)
            continue
        if rehearsal_replaces(flag, opts.engine, opts.memory):
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
        "--rollout-max-response-len", str(cap), *([] if opts.memory else ["--check-weight-update-equal"]),
        *([] if own_model else [x for k, v in LAYOUT.items() if last(items, k) is not None for x in (k, v)]),
        *([] if opts.engine == "slime" else ["--output-dir", str(out / "run")]),  # slime-ref's; not slime's
    ]
    if opts.memory and not any(flag == GENERATE_FLAG for flag, _ in hooks.values()):
        # slime's own generate, wrapped: the smoke's wrapper forces every answer to full length
        hooks[FULL_LENGTH_HOOK] = (GENERATE_FLAG, DEFAULT_GENERATE)
        argv += [GENERATE_FLAG, f"{HOOK_MODULE}.{FULL_LENGTH_HOOK}"]
    for flag, path in writes.items():
        argv += [flag, path]
    if writes:
        changes.append("written under " + str(out) + ": " + ", ".join(writes))
    if "--save" in writes:
        argv += ["--save-interval", str(opts.rollouts)]
    if last(items, "--use-wandb") is not None:
        argv += ["--use-wandb", "--wandb-mode", "offline"]
        changes.append("W&B offline")
    if opts.engine != "slime" and not opts.memory and last(items, "--rollout-num-gpus") is not None \
            and last(items, "--colocate") is None:
        argv += ["--rollout-num-gpus", "1"]
    if has_eval and data.get("eval"):
        argv += ["--eval-prompt-data", *[x for name, p in data["eval"] for x in (name, str(p))],
                 "--eval-interval", str(opts.rollouts), "--n-samples-per-eval-prompt", "1",
                 "--eval-max-response-len", str(cap)]
        changes.append(f"eval once, on {EVAL_ROWS} prompts per set")
    over = as_int(last(items, "--over-sampling-batch-size"))
    if over is not None:
        # the job's over-sampling ratio, at the rehearsal's batch size: over-sampling itself is rehearsed
        over = max(batch, -(-over * batch // max(1, full["rollout_batch_size"])))
        argv += ["--over-sampling-batch-size", str(over)]
        changes.append(f"--over-sampling-batch-size {over} (the job's ratio to the rollout batch)")
    if opts.engine != "slime" and last(items, "--dynamic-sampling-filter-path"):
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
