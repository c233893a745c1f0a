"""What runs inside a ``slime-check smoke`` run: the user's hooks, counted, and the label probe.

The rehearsal points every hook flag at ``slime_smoke_hooks.<hook id>``, a three-line module it writes
under OUT/hooks that hands its globals to :func:`install`. The first lookup of a hook id loads the
user's function (slime-ref's counterparts stand in for slime's built-ins) and wraps it: each call is
counted into a file per process, a raise is recorded with its cause, and the coverage data of the
process is saved soon after: coverage.py measures the user's hook files in every process that imports
them, from that import on.

``python -m slime_rehearse.smoke_runtime preflight CONFIG`` runs before the run, with the run's
PYTHONPATH: it imports every hook, names the files they live in (coverage measures those), and
probes the reward with the reference answer written in common answer shapes, to learn the shape the
reward wants; the stand-in model then answers in it (``OUT/engine-script.json``).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import importlib
import importlib.util
import inspect
import json
import os
import sys
import threading
import time
from pathlib import Path

from slime_check.outside_services import explain_missing
from slime_rehearse.smoke_job import GENERATE_FLAG

COVERAGE_SAVE_DELAY_S = 1.0  # after a hook call, the process's coverage data is saved this much later

# The shapes a reward may want a final answer in ({a} is the reference answer).
ANSWER_SHAPES = {
    "boxed": "\\boxed{{{a}}}",
    "think_boxed": "<think>\n</think>\n\n\\boxed{{{a}}}",  # deepscaler wants the answer after </think>
    "answer_tags": "<answer>{a}</answer>",
    "answer_colon": "Answer: {a}",
    "hashes": "#### {a}",
    "the_answer_is": "The answer is {a}.",
    "bare": "{a}",
}
# Where a structured label keeps its answer (slime's examples: {"ground_truth": {"target": [...]}}).
ANSWER_KEYS = ("ground_truth", "target", "answer", "answers", "label", "solution", "gold", "reference")


def load_config(path: str) -> dict:
    with open(path) as fh:
        return json.load(fh)


# ---------------------------------------------------------------------------------------------
# the hook module


def install(module_globals: dict, config_path: str):
    """(HOOKS, __getattr__) for the generated ``slime_smoke_hooks`` module."""
    config = load_config(config_path)
    hooks = {hook_id: tuple(flag_path) for hook_id, flag_path in config["hooks"].items()}
    start_coverage()

    def __getattr__(name):
        if name in hooks:
            fn = wrap(name, hooks[name], config)
            module_globals[name] = fn
            return fn
        raise AttributeError(name)

    return hooks, __getattr__


def load_function(path: str, flag: str, real_slime: bool):
    if not real_slime:
        from slime_ref.utils.hooks import load_function as load

        return load(path, flag)
    module, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except Exception as e:
        raise ImportError(f"{flag} {path!r}: {describe(e)}") from e


def describe(e: BaseException) -> str:
    """The exception and the causes it was raised from, on one line."""
    parts, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        parts.append(f"{type(e).__name__}: {' '.join(str(e).split())}")
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return " (from ".join(parts) + ")" * (len(parts) - 1)


class Counter:
    """Call, error and first-error files of one hook in one process (one byte per call)."""

    def __init__(self, calls_dir: str, hook_id: str):
        self.calls_dir, self.hook_id = calls_dir, hook_id

    def note(self, kind: str) -> None:
        fd = os.open(os.path.join(self.calls_dir, f"{self.hook_id}.{kind}.{os.getpid()}"),
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)

    def error(self, e: BaseException) -> None:
        self.note("err")
        path = os.path.join(self.calls_dir, f"{self.hook_id}.first_error")
        if not os.path.exists(path):
            with open(path, "w") as fh:
                fh.write(describe(e)[:600])


_save_timer: threading.Timer | None = None
_save_lock = threading.Lock()


def start_coverage() -> None:
    """Measure this process from now on (the hooks' first import in it), when the run measures hooks
    (COVERAGE_PROCESS_START names the config: only the user's hook files) and nothing measures it yet.
    Starting here, not at interpreter start, spares the imports of torch and Megatron the tracer."""
    if not os.environ.get("COVERAGE_PROCESS_START"):
        return
    try:
        import coverage

        if coverage.Coverage.current() is None:
            coverage.process_startup()
    except Exception as e:  # measuring must never stop the rehearsal
        print(f"slime-check smoke: coverage of the hooks is off in this process: {e}", file=sys.stderr)


def trace_this_thread() -> None:
    """coverage.py traces the thread that started it and the threads started after; a hook called on a
    thread that was already running (an event loop started before the hooks were imported) is traced
    from this call on."""
    if sys.gettrace() is not None:
        return
    try:
        import coverage

        cov = coverage.Coverage.current()
        start_tracer = getattr(getattr(cov, "_collector", None), "_start_tracer", None)
        if start_tracer is not None:
            start_tracer()
    except Exception:  # measuring must never stop the rehearsal
        pass


def save_coverage_soon() -> None:
    """Save this process's coverage data shortly after the last hook call: Ray may end a worker without
    running its exit handlers, and a save after every call would cost more than the hook."""
    global _save_timer
    try:
        import coverage
    except ImportError:
        return
    if coverage.Coverage.current() is None:
        return
    with _save_lock:
        if _save_timer is not None:
            return
        _save_timer = threading.Timer(COVERAGE_SAVE_DELAY_S, _save_coverage)
        _save_timer.daemon = True
        _save_timer.start()


def _save_coverage() -> None:
    global _save_timer
    import coverage

    with _save_lock:
        _save_timer = None
    cov = coverage.Coverage.current()
    if cov is not None:
        try:
            cov.save()
        except Exception as e:  # measuring must never stop the rehearsal
            print(f"slime-check smoke: coverage not saved: {e}", file=sys.stderr)


def force_full_length(a: tuple, k: dict) -> tuple[tuple, dict]:
    """generate(args, sample, sampling_params) with ``ignore_eos`` set: the answer runs to
    max_new_tokens (--rollout-max-response-len), the length that sets the job's memory peak."""
    if "sampling_params" in k:
        return a, {**k, "sampling_params": {**(k["sampling_params"] or {}), "ignore_eos": True}}
    if len(a) >= 3 and isinstance(a[2], dict):
        return (*a[:2], {**a[2], "ignore_eos": True}, *a[3:]), k
    return a, k


def mark_generate(marks_dir: str, started: float) -> None:
    """One generate call's start and end, for the phase windows (slime_rehearse.gpu_memory)."""
    with open(os.path.join(marks_dir, f"generate.{os.getpid()}"), "a") as fh:
        fh.write(f"{started:.3f} {time.time():.3f}\n")


def wrap(hook_id: str, flag_path: tuple[str, str], config: dict):
    flag, path = flag_path
    start_coverage()
    target = load_function(path, flag, config.get("real_slime", False))
    counter = Counter(config["calls"], hook_id)
    if inspect.isclass(target):
        if not hasattr(target, "get_samples"):
            return target

        def get_samples(self, *a, **k):
            trace_this_thread()
            counter.note("calls")
            try:
                return target.get_samples(self, *a, **k)
            except Exception as e:
                counter.error(e)
                raise
            finally:
                save_coverage_soon()

        return type(target.__name__, (target,), {"get_samples": get_samples})
    full_length = config.get("full_length") and flag == GENERATE_FLAG
    if inspect.iscoroutinefunction(target):
        @functools.wraps(target)
        async def wrapper(*a, **k):
            trace_this_thread()
            counter.note("calls")
            if full_length:
                a, k = force_full_length(a, k)
                started = time.time()
            try:
                return await target(*a, **k)
            except Exception as e:
                counter.error(e)
                raise
            finally:
                if full_length:
                    mark_generate(config["marks"], started)
                save_coverage_soon()
    else:
        @functools.wraps(target)
        def wrapper(*a, **k):
            trace_this_thread()
            counter.note("calls")
            try:
                return target(*a, **k)
            except Exception as e:
                counter.error(e)
                raise
            finally:
                save_coverage_soon()
    return wrapper


# ---------------------------------------------------------------------------------------------
# the preflight: imports, hook files, the label probe


def answer_text(label) -> str | None:
    """The reference answer inside a label: the label itself, or the first answer a dict or list holds."""
    if label is None:
        return None
    if isinstance(label, (str, int, float)) and not isinstance(label, bool):
        return str(label)
    if isinstance(label, (list, tuple)):
        return next((a for a in (answer_text(x) for x in label) if a), None)
    if isinstance(label, dict):
        for key in ANSWER_KEYS:
            if key in label:
                found = answer_text(label[key])
                if found:
                    return found
        return next((a for a in (answer_text(v) for v in label.values()) if a), None)
    return None


def reward_value(value, reward_key: str | None):
    """A reward's number: a dict reward is read at --reward-key (or "score"), a group reward's first."""
    if isinstance(value, list):
        value = value[0] if value else None
    if isinstance(value, dict):
        value = value.get(reward_key or "score")
    return float(value)


def parse_args(argv: list[str]):
    """The run's args as slime-ref's parser reads them (no validation: nothing starts)."""
    from slime_ref.arguments import build_parser

    args, _ = build_parser().parse_known_args(argv)
    return args


def prompt_text(prompt) -> str | None:
    """The text the stand-in engine recognises a prompt by: its last user message, or the string."""
    if isinstance(prompt, str):
        return prompt.strip() or None
    if isinstance(prompt, list):
        for message in reversed(prompt):
            if isinstance(message, dict) and message.get("role") == "user" and isinstance(message.get("content"), str):
                return message["content"].strip() or None
    return None


def reward_caller(args, hooks: dict, real_slime: bool):
    """(what is probed, a function (sample) -> reward), or (None, None) when there is no reward to call."""
    rm = next(((flag, path) for flag, path in hooks.values() if flag == "--custom-rm-path"), None)
    group = bool(getattr(args, "group_rm", False))
    if rm is not None:
        fn = load_function(rm[1], rm[0], real_slime)
        name = f"--custom-rm-path {rm[1]}"
    elif getattr(args, "rm_type", None) and not real_slime:
        from slime_ref.rollout.rewards import async_rm, batched_async_rm

        fn = batched_async_rm if group else async_rm
        name = f"--rm-type {args.rm_type}"
    else:
        return None, None

    def call(sample):
        result = fn(args, [sample] if group else sample)
        if inspect.isawaitable(result):
            result = asyncio.run(result)
        return result

    return name, call


def prompt_renderer(args):
    """The prompt as the run's Samples hold it: with --apply-chat-template, the rendered chat (a plain
    string is one user message, as slime's data loader makes it)."""
    if not getattr(args, "apply_chat_template", False):
        return lambda prompt: prompt
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint)

    def render(prompt):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        try:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception:  # a prompt the template cannot render: the reward sees it as the data holds it
            return prompt

    return render


def probe_reward(args, hooks: dict, rows: list[dict], responses: list[dict], real_slime: bool) -> dict:
    """Score each row's reference answer in every answer shape, and each response the user marked correct.
    A shape that scores above 0 on some row is one the reward takes."""
    if real_slime:
        from slime.utils.types import Sample
    else:
        from slime_ref.types import Sample

    name, call = reward_caller(args, hooks, real_slime)
    result = {"reward": name, "calls": 0, "shapes": {}, "errors": {}, "answers": [], "responses": []}
    if call is None:
        return result
    input_key, label_key = getattr(args, "input_key", "input"), getattr(args, "label_key", None)
    reward_key = getattr(args, "reward_key", None)
    render = prompt_renderer(args)

    def score(prompt, label, response):
        sample = Sample(prompt=render(prompt), label=copy.deepcopy(label), response=response,
                        status=Sample.Status.COMPLETED)
        result["calls"] += 1
        return reward_value(call(sample), reward_key)

    for row in rows:
        label = row.get(label_key) if label_key else None
        answer = answer_text(label)
        result["answers"].append(answer)
        if answer is None:
            continue
        for shape, template in ANSWER_SHAPES.items():
            try:
                value = score(row.get(input_key), label, template.format(a=answer))
            except Exception as e:
                result["errors"].setdefault(shape, describe(e)[:300])
                continue
            result["shapes"][shape] = max(result["shapes"].get(shape, value), value)
    for given in responses:
        if not given.get("correct") or not isinstance(given.get("response"), str):
            continue
        row = next((r for r in rows if given.get("prompt") is None
                    or given["prompt"] in (prompt_text(r.get(input_key)) or "")), None)
        if row is None:
            continue
        try:
            value = score(row.get(input_key), row.get(label_key) if label_key else None, given["response"])
        except Exception as e:
            value, given = None, {**given, "error": describe(e)[:300]}
        result["responses"].append({**given, "score": value})
    return result


def hook_source(path: str) -> Path | None:
    """The file of a hook's module (``pkg.mod.fn`` -> pkg/mod.py), found without running it."""
    module = path.rpartition(".")[0]
    try:
        spec = importlib.util.find_spec(module) if module else None
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def preflight(config_path: str) -> dict:
    """Import every hook; name their files; probe the reward. Never raises for a hook's fault."""
    config = load_config(config_path)
    real_slime = config.get("real_slime", False)
    hooks = {hook_id: tuple(fp) for hook_id, fp in config["hooks"].items()}
    report: dict = {"errors": {}, "files": {}, "probe": None}
    for hook_id, (flag, path) in hooks.items():
        try:
            fn = load_function(path, flag, real_slime)
        except BaseException as e:
            report["errors"][hook_id] = describe(e)
            if (needs := explain_missing(report["errors"][hook_id], hook_source(path))) is not None:
                report["errors"][hook_id] += f" [{needs}]"
            continue
        try:
            report["files"][hook_id] = os.path.abspath(inspect.getsourcefile(inspect.unwrap(fn)))
        except (TypeError, OSError):
            pass
    probe = config.get("probe")
    if probe and not any(flag == "--custom-rm-path" for hook_id, (flag, _) in hooks.items()
                         if hook_id in report["errors"]):
        try:
            args = parse_args(probe["argv"])
            from slime_check.config_lint import first_rows

            report["probe"] = probe_reward(args, hooks, first_rows(Path(probe["data"]), probe["rows"]),
                                           probe.get("responses", []), real_slime)
        except Exception as e:
            report["probe"] = {"failed": describe(e)[:400]}
    return report


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "preflight":
        print("usage: python -m slime_rehearse.smoke_runtime preflight CONFIG", file=sys.stderr)
        return 2
    print("SMOKE-PREFLIGHT " + json.dumps(preflight(argv[1])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
