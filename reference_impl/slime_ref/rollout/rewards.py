"""Reward functions (slime's ``rm_hub``): rule-based rewards, a remote reward service, user hooks.

Which function scores a sample, in slime's order:

1. ``sample.custom_rm_path`` (set per sample, e.g. by an eval dataset config);
2. ``--custom-rm-path``: ``async def f(args, sample, **kwargs) -> float | dict``; with ``--group-rm``
   (or when a generate function returns several samples) it gets the list of samples and returns
   one reward per sample;
3. ``sample.metadata["rm_type"]`` or ``--rm-type``: a built-in rule below.

Built-in rules (``--rm-type``):

- ``math``: 1 if the last ``\\boxed{}`` of the response equals the label, else 0. As in slime, a
  response without a box scores 0, so this rule also teaches the answer format. Equivalent forms
  count: 1/2, 0.5, \\frac{1}{2}.
- ``deepscaler``: like math, but only the part after ``</think>`` (or ``###Response``) is read and
  the answer must be boxed; no such marker gives 0.
- ``dapo``: DAPO's Minerva-style check of the last "Answer: ..." line against an integer label;
  returns ``{"score": 1.0 or -1.0, "acc": bool, "pred": str}`` (train with ``--reward-key score``).
- ``f1``: SQuAD token F1 between the response and the label.
- ``remote_rm``: POST ``{"prompt", "response", "label"}`` to ``--rm-url`` and use the JSON reply.
- ``random``: 0 or 1 at random (a pipeline smoke test).

A ``boxed_`` prefix (``boxed_math``, ``boxed_f1``, ...) first takes the last ``\\boxed{...}`` of the
response and grades only that; a response without a box scores 0 (dapo: -1). slime v0.3.1 passes
the extracted text back into the full rule, which then looks for a box, ``</think>`` or "Answer:"
again, so its ``boxed_math``, ``boxed_deepscaler`` and ``boxed_dapo`` can never score; here they do.
For a launch script that must behave the same in slime and slime-ref, use ``math``: it already
requires the box.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import random
import re
import string
from collections import Counter
from collections.abc import Callable
from typing import Any

import aiohttp

from slime_ref.errors import UserError
from slime_ref.rollout.math_grading import answers_equal, last_boxed_answer
from slime_ref.types import Sample
from slime_ref.utils.hooks import load_function

logger = logging.getLogger(__name__)

REMOTE_RM_TIMEOUT_S = 120.0
REMOTE_RM_MAX_RETRIES = 10

# ---------------------------------------------------------------------------------------------
# Rule-based rewards
# ---------------------------------------------------------------------------------------------


def _label_answer(label: Any) -> str:
    """The reference answer as text; a boxed label (a full solution) contributes its box."""
    label = "" if label is None else str(label)
    return last_boxed_answer(label) or label


def math_reward(response: str, label: Any) -> int:
    answer = last_boxed_answer(response)
    if answer is None:
        return 0  # slime's math rule grades only a boxed answer
    return int(answers_equal(answer, _label_answer(label)))


def deepscaler_reward(response: str, label: Any) -> int:
    if "</think>" in response:
        solution = response.split("</think>")[-1]
    elif "###Response" in response:
        solution = response.split("###Response")[1]
    else:
        return 0  # no end of reasoning: no answer
    answer = last_boxed_answer(solution)
    if answer is None or label in (None, ""):
        return 0
    return int(answers_equal(answer, _label_answer(label)))


_DAPO_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_DAPO_UNITS = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "points", "feet",
               "minutes", "digits", "cents", "degrees", "cm", "pounds", "meters", "students")


def _dapo_normalize(answer: str) -> str:
    """DAPO's normalisation of a final answer: the last '=' side, LaTeX and unit words stripped."""
    s = str(answer).split("=")[-1]
    for command in ("\\text", "\\textbf", "\\overline", "\\boxed"):
        s = re.sub(re.escape(command) + r"\{(.*?)\}", r"\1", s)
    for noise in ("\\$", "$", "\\ ", " ", "\\!", "{,}", "\\,", "^\\circ", "^{\\circ}", "\\%", "<|im_end|>",
                  "<|endoftext|>"):
        s = s.replace(noise, "")
    for unit in _DAPO_UNITS:
        s = s.replace(unit, "")
    s = re.sub(r"frac([^{])(.)", r"frac{\1}{\2}", s)
    s = re.sub(r"sqrt([^{])", r"sqrt{\1}", s)
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip().rstrip(".")


def _dapo_score(pred: str, label: Any) -> dict:
    truth = _dapo_normalize(_label_answer(label))
    try:
        truth = str(int(float(truth)))  # DAPO's answers are integers: "34.0" -> "34"
    except ValueError:
        pass
    correct = pred == truth
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}


def dapo_reward(response: str, label: Any) -> dict:
    lines = _DAPO_ANSWER_LINE.findall(response[-300:])  # DAPO reads only the tail of the response
    return _dapo_score(_dapo_normalize(lines[-1]) if lines else "[INVALID]", label)


def _f1_normalize(text: str) -> list[str]:
    text = "".join(ch for ch in str(text).lower() if ch not in set(string.punctuation))
    return re.sub(r"\b(a|an|the)\b", " ", text).split()


def f1_reward(response: str, label: Any) -> float:
    """SQuAD token F1; a yes/no/noanswer answer on either side must match exactly."""
    pred, truth = _f1_normalize(response), _f1_normalize(label)
    special = {"yes", "no", "noanswer"}
    if (" ".join(pred) in special or " ".join(truth) in special) and pred != truth:
        return 0.0
    common = sum((Counter(pred) & Counter(truth)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(truth)
    return 2 * precision * recall / (precision + recall)


RULES: dict[str, Callable[[str, Any], Any]] = {
    "math": math_reward,
    "deepscaler": deepscaler_reward,
    "dapo": dapo_reward,
    "f1": f1_reward,
    "random": lambda response, label: random.randint(0, 1),
}

# How each rule grades an answer already taken out of its \boxed{} (the boxed_ prefix).
BOXED_RULES: dict[str, Callable[[str, Any], Any]] = {
    "math": lambda answer, label: int(answers_equal(answer, _label_answer(label))),
    "deepscaler": lambda answer, label: int(answers_equal(answer, _label_answer(label))),
    "dapo": lambda answer, label: _dapo_score(_dapo_normalize(answer), label),
    "f1": f1_reward,
    "random": RULES["random"],
}


def rule_based_reward(rm_type: str, response: str, label: Any) -> Any:
    """Score ``response`` against ``label`` with the built-in rule ``rm_type`` (``boxed_`` prefix allowed)."""
    rm_type = rm_type.strip()
    if rm_type.startswith("boxed_"):
        base = rm_type.removeprefix("boxed_")
        if base not in BOXED_RULES:
            raise UserError(f"--rm-type {rm_type}: unknown rule {base!r}; choose one of {', '.join(BOXED_RULES)}")
        answer = last_boxed_answer(response)
        if answer is None:  # the format the reward demands is missing
            return _dapo_score("[NO BOX]", label) if base == "dapo" else 0
        return BOXED_RULES[base](answer, label)
    if rm_type not in RULES:
        raise UserError(f"--rm-type {rm_type}: unknown rule; choose one of {', '.join(RULES)}, remote_rm, "
                        "a boxed_ form, or pass --custom-rm-path")
    return RULES[rm_type](response, label)


# ---------------------------------------------------------------------------------------------
# Remote reward service
# ---------------------------------------------------------------------------------------------


async def remote_rm(
    args,
    sample: Sample,
    *,
    timeout_s: float = REMOTE_RM_TIMEOUT_S,
    max_retries: int = REMOTE_RM_MAX_RETRIES,
    backoff_s: float = 1.0,
    max_backoff_s: float = 30.0,
) -> Any:
    """POST the sample to ``--rm-url`` and return the decoded JSON reply (a number or a dict).

    Each attempt has a total timeout of ``timeout_s``. Timeouts, connection errors, 5xx, 408 and 429
    are retried up to ``max_retries`` attempts in all, sleeping backoff_s * 2**(attempt-1) (capped at
    max_backoff_s) plus jitter between attempts. Any other 4xx means the request itself is wrong and
    fails at once.
    """
    url = args.rm_url
    if not url:
        raise UserError("--rm-type remote_rm needs --rm-url (the reward service, e.g. http://127.0.0.1:8000/score)")
    payload = {"prompt": sample.prompt, "response": sample.response, "label": sample.label}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        for attempt in range(1, max_retries + 1):
            try:
                async with session.post(url, json=payload) as reply:
                    if 400 <= reply.status < 500 and reply.status not in (408, 429):
                        body = (await reply.text())[:200]
                        raise UserError(f"--rm-url {url}: HTTP {reply.status} {body!r}; check the URL and payload")
                    reply.raise_for_status()
                    return await reply.json(content_type=None)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                problem = "timed out" if isinstance(e, asyncio.TimeoutError) else f"{type(e).__name__}: {e}"
                if attempt == max_retries:
                    raise RuntimeError(f"--rm-url {url}: {attempt} attempts failed; last one {problem}") from e
                delay = min(backoff_s * 2 ** (attempt - 1), max_backoff_s) + random.uniform(0, backoff_s)
                logger.warning("remote_rm attempt %d/%d %s; retrying in %.2fs", attempt, max_retries, problem, delay)
                await asyncio.sleep(delay)


# ---------------------------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------------------------


async def _call(hook: Callable, *args, **kwargs) -> Any:
    result = hook(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result


async def async_rm(args, sample: Sample, **kwargs) -> Any:
    """The reward of one sample (slime's ``async_rm``). A reward hook that raises or returns None or
    NaN is an error naming the hook, the sample and its prompt: one bad reward would otherwise
    poison the whole group's advantages without a trace."""
    if sample.custom_rm_path:
        hook, name = load_function(sample.custom_rm_path, "Sample.custom_rm_path"), sample.custom_rm_path
    elif args.custom_rm_path:
        hook, name = load_function(args.custom_rm_path, "--custom-rm-path"), f"--custom-rm-path {args.custom_rm_path}"
    else:
        hook, name = None, None
    if hook is not None:
        reward = await _checked_call(hook, name, [sample], args, sample, **kwargs)
        return _checked_reward(args, reward, name, sample)

    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    rm_type = (metadata.get("rm_type") or args.rm_type or "").strip()
    if not rm_type:
        raise UserError("no reward function: set --rm-type, --custom-rm-path, or metadata.rm_type in the data")
    if rm_type.removeprefix("boxed_") == "remote_rm":
        return _checked_reward(args, await remote_rm(args, sample), f"--rm-url {args.rm_url}", sample)
    return rule_based_reward(rm_type, sample.response, sample.label)


async def batched_async_rm(args, samples: list[Sample], **kwargs) -> list[Any]:
    """Rewards of several samples: a ``--custom-rm-path`` hook gets the whole list (``--group-rm``)."""
    if args.custom_rm_path:
        hook = load_function(args.custom_rm_path, "--custom-rm-path")
        name = f"--custom-rm-path {args.custom_rm_path}"
        rewards = await _checked_call(hook, name, samples, args, samples, **kwargs)
        if not isinstance(rewards, (list, tuple)) or len(rewards) != len(samples):
            raise UserError(f"--custom-rm-path {args.custom_rm_path}: with a list of {len(samples)} samples "
                            "it must return a list of as many rewards")
        return [_checked_reward(args, r, name, s) for r, s in zip(rewards, samples)]
    return list(await asyncio.gather(*(async_rm(args, sample, **kwargs) for sample in samples)))


def _describe(sample: Sample) -> str:
    prompt = sample.prompt if isinstance(sample.prompt, str) else json.dumps(sample.prompt, ensure_ascii=False)
    prompt = " ".join(str(prompt).split())
    return f"sample {sample.index} (prompt {prompt[:120] + ('...' if len(prompt) > 120 else '')!r})"


async def _checked_call(hook: Callable, name: str, samples: list[Sample], *args, **kwargs) -> Any:
    try:
        return await _call(hook, *args, **kwargs)
    except UserError:
        raise
    except Exception as e:
        what = _describe(samples[0]) if len(samples) == 1 else f"a group of {len(samples)} samples, the first " \
            f"{_describe(samples[0])}"
        detail = " ".join(str(e).split())[:300]
        raise UserError(f"{name} raised {type(e).__name__} ({detail}) on {what}; fix the reward function") from e


def _checked_reward(args, reward: Any, name: str, sample: Sample) -> Any:
    if isinstance(reward, dict):  # the number sits under --reward-key / --eval-reward-key
        keys = {getattr(args, "reward_key", None), getattr(args, "eval_reward_key", None)} - {None}
        values = [reward[k] for k in keys if k in reward]
    else:
        values = [reward]
    for value in values:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            raise UserError(f"{name} returned {reward!r} for {_describe(sample)}; a reward must be a number "
                            "(or a dict holding one under --reward-key)")
    return reward


__all__ = [
    "async_rm",
    "batched_async_rm",
    "deepscaler_reward",
    "dapo_reward",
    "f1_reward",
    "math_reward",
    "remote_rm",
    "rule_based_reward",
]
