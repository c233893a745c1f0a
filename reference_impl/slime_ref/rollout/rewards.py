"""Reward functions (slime's ``rm_hub``): rule-based rewards, a remote reward service, user hooks.

Which function scores a sample, in slime's order:

1. ``sample.custom_rm_path`` (set per sample, e.g. by an eval dataset config);
2. ``--custom-rm-path``: ``async def f(args, sample, **kwargs) -> float | dict``; with ``--group-rm``
   (or when a generate function returns several samples) it gets the list of samples and returns
   one reward per sample;
3. ``sample.metadata["rm_type"]`` or ``--rm-type``: a built-in rule below.

Built-in rules (``--rm-type``) give slime v0.3.1's value for every input slime scores (checked by
``tests/conformance``); where slime itself raises (a None response, a None label for deepscaler, a
non-integer dapo label) they give the failure score instead and never raise:

- ``math``: 1 if the last ``\\boxed{}`` of the response is the label, else 0 (see
  :mod:`slime_ref.rollout.math_grading`). A response without a box scores 0, so this rule also
  teaches the answer format. ``1/2``, ``0.5`` and ``\\frac{1}{2}`` count as equal; ``2/4`` does not.
- ``deepscaler``: like math, but only the part after ``</think>`` (or ``###Response``) is read;
  no such marker gives 0.
- ``dapo``: DAPO's Minerva-style check of the last "Answer: ..." line in the last 300 characters
  against an integer label; returns ``{"score": 1.0 or -1.0, "acc": bool, "pred": str}`` (train with
  ``--reward-key score``).
- ``f1``: SQuAD token F1 between the response and the label.
- ``gpqa``: multiple choice; the chosen letter (or the answer text) against the label, a letter,
  an index or the text of a choice; ``metadata`` may give ``choices``, ``correct_letter``,
  ``valid_letters``.
- ``remote_rm``: POST ``{"prompt", "response", "label"}`` to ``--rm-url`` and use the JSON reply.
- ``random``: 0 or 1 at random (a pipeline smoke test).

A ``boxed_`` prefix (``boxed_math``, ``boxed_f1``, ...) first takes the last ``\\boxed{...}`` of the
response and grades only that; a response without a box scores 0 (dapo: -1). slime v0.3.1 passes
the extracted text back into the full rule, which then looks for a box, ``</think>`` or "Answer:"
again, so its ``boxed_math``, ``boxed_deepscaler`` and ``boxed_dapo`` can never score; here they do
(listed in reference_impl/ARCHITECTURE.md, "Where slime-ref differs from slime"). For a launch
script that must behave the same in slime and slime-ref, use ``math``: it already requires the box.
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
from slime_ref.rollout.math_grading import answers_equal, extract_answer, grade_answer_verl, reference_answer
from slime_ref.types import Sample
from slime_ref.utils.hooks import load_function

logger = logging.getLogger(__name__)

REMOTE_RM_TIMEOUT_S = 120.0
REMOTE_RM_MAX_RETRIES = 10

# ---------------------------------------------------------------------------------------------
# Rule-based rewards
# ---------------------------------------------------------------------------------------------


def math_reward(response: str, label: Any) -> int:
    if not isinstance(response, str):
        return 0  # no response (a failed custom generate): slime raises here
    return 1 if grade_answer_verl(response, label) else 0


def _grade_boxed_answer(answer: str, label: Any) -> int:
    """1 if ``answer`` (already out of its box) is the label; a boxed label contributes its box."""
    truth = reference_answer(label)
    return int(truth is not None and answers_equal(answer, truth))


def deepscaler_reward(response: str, label: Any) -> int:
    if not isinstance(response, str):
        return 0
    if "</think>" in response:
        solution = response.split("</think>")[-1]
    elif "###Response" in response:
        solution = response.split("###Response")[1]
    else:
        return 0  # no end of reasoning: no answer
    answer = extract_answer(solution)
    if answer is None or label == "":
        return 0
    if not isinstance(label, (str, float, int)):
        return 0  # None or a list: slime's assert fails
    return _grade_boxed_answer(answer, label)


_DAPO_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
# DAPO's normaliser (Minerva, lm-evaluation-harness hendrycks_math): replacements, then removals, in order
_DAPO_REPLACE = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
                 (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_DAPO_REMOVE = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
                "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
                "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
                "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
                r",\!", "{,}", '"', "\\dots", "<|im_end|>", "<|endoftext|>")
_DAPO_FIRST_MATH = re.compile(r"(.*?)(\$)(.*?)(\$)(.*)")  # keeps only the first $...$ of the answer
_DAPO_UNWRAP = [re.compile(r"(\\" + command + r"\{)(.*?)(\})") for command in ("text", "textbf", "overline")]
_DAPO_BOXED = re.compile(r"(\\boxed\{)(.*)(\})")


def normalize_final_answer(answer: Any) -> str:
    """DAPO's normal form of a final answer: the last ``=`` side, articles, spaces, units, LaTeX stripped."""
    s = str(answer).split("=")[-1]
    for old, new in _DAPO_REPLACE:
        s = s.replace(old, new)
    for noise in _DAPO_REMOVE:
        s = s.replace(noise, "")
    s = _DAPO_FIRST_MATH.sub(lambda m: "$" + m.group(3) + "$", s)
    for pattern in _DAPO_UNWRAP:
        s = pattern.sub(lambda m: m.group(2), s)
    s = _DAPO_BOXED.sub(lambda m: m.group(2), s)
    s = re.sub(r"(frac)([^{])(.)", lambda m: "frac{" + m.group(2) + "}{" + m.group(3) + "}", s)
    s = re.sub(r"(sqrt)([^{])", lambda m: "sqrt{" + m.group(2) + "}", s)
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def _dapo_score(pred: str, label: Any) -> dict:
    try:
        truth = str(int(float(normalize_final_answer(label))))  # DAPO's answers are integers: "34.0" -> "34"
    except (ValueError, OverflowError):
        truth = None  # not an integer label: slime raises; nothing matches
    correct = pred == truth
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}


def dapo_reward(response: str, label: Any) -> dict:
    if not isinstance(response, str):
        return _dapo_score("[INVALID]", None)
    lines = _DAPO_ANSWER_LINE.findall(response[-300:])  # DAPO reads only the tail of the response
    return _dapo_score(normalize_final_answer(lines[-1] if lines else "[INVALID]"), label)


def normalize_f1_answer(text: str) -> str:
    """SQuAD's normal form: lower case, punctuation dropped, articles dropped, whitespace collapsed."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def f1_score(prediction: str | None, ground_truth: str) -> tuple[float, float, float]:
    """(f1, precision, recall) of the tokens; a yes/no/noanswer answer on either side must match exactly."""
    if not isinstance(prediction, str) or not isinstance(ground_truth, str):
        return 0, 0, 0
    pred, truth = normalize_f1_answer(prediction), normalize_f1_answer(ground_truth)
    special = ("yes", "no", "noanswer")
    if (pred in special or truth in special) and pred != truth:
        return 0, 0, 0
    common = sum((Counter(pred.split()) & Counter(truth.split())).values())
    if common == 0:
        return 0, 0, 0
    precision, recall = common / len(pred.split()), common / len(truth.split())
    return 2 * precision * recall / (precision + recall), precision, recall


def f1_reward(response: str, label: Any) -> float:
    return f1_score(response, label)[0]


GPQA_DEFAULT_LETTERS = tuple(string.ascii_uppercase[:10])
# tried in order; the first hit whose letter is valid wins
_GPQA_LETTER_PATTERNS = (
    re.compile(r"(?:answer|option|choice)\s*(?:is|:)?\s*([A-Z])", re.IGNORECASE),
    re.compile(r"([A-Z])\s*(?:is\s*(?:the)?\s*correct)", re.IGNORECASE),
    re.compile(r"final\s*(?:answer|option)\s*(?:is|:)?\s*([A-Z])", re.IGNORECASE),
)


def _after_reasoning(text: str) -> str:
    return text.rsplit("</think>", 1)[-1] if text else ""


def _gpqa_text(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def gpqa_letter(response: str | None, valid_letters) -> str | None:
    """The option letter a response chose: a phrase like "answer is B", else its last standalone valid letter."""
    if not response:
        return None
    text = _after_reasoning(response)
    valid = {letter.upper() for letter in valid_letters}
    for pattern in _GPQA_LETTER_PATTERNS:
        m = pattern.search(text)
        if m and m.group(1).upper() in valid:
            return m.group(1).upper()
    for letter in reversed(re.findall(r"\b([A-Z])\b", text)):
        if letter in valid:
            return letter
    return None


def gpqa_reward(response: str | None, label: Any, metadata: dict | None = None) -> float:
    """slime's GPQA scorer: 1.0 if the response picks the right option, else 0.0.

    The right option comes from ``metadata["correct_letter"]``, else a one-letter label, an integer
    label (an index), or a label equal to the text of one of ``metadata["choices"]``. Without a
    letter on both sides, a response that contains the right answer's text scores 1.0.
    """
    if not isinstance(response, str):
        return 0.0
    metadata = metadata if isinstance(metadata, dict) else {}
    choices = metadata.get("choices")
    try:
        if isinstance(choices, dict):
            choices = list(choices.values())
        elif choices is not None:
            choices = list(choices)
        valid_letters = [str(letter).upper() for letter in metadata.get("valid_letters") or ()]
    except TypeError:
        return 0.0  # choices or valid_letters that are not lists: slime raises
    if not valid_letters:
        valid_letters = list(string.ascii_uppercase[: len(choices)] if choices else GPQA_DEFAULT_LETTERS)

    correct = metadata.get("correct_letter")
    correct = correct.strip().upper() if isinstance(correct, str) else None
    label_text = None
    if isinstance(label, str):
        label_text = label.strip()
        if len(label_text) == 1 and label_text.upper() in valid_letters and not correct:
            correct = label_text.upper()
    elif isinstance(label, (int, float)):
        if not math.isfinite(label):
            return 0.0  # nan or inf: slime raises
        index = int(label)
        if 0 <= index < len(valid_letters):
            correct = valid_letters[index]
    if not correct and choices and label_text:
        for index, choice in enumerate(choices):
            if _gpqa_text(str(choice)) == _gpqa_text(label_text):
                correct = valid_letters[index] if index < len(valid_letters) else None
                if correct is None:
                    return 0.0  # more choices than letters: slime raises
                metadata.setdefault("correct_answer", choice)  # as slime: the caller's metadata learns the answer
                break

    chosen = gpqa_letter(response, valid_letters)
    if chosen and correct:
        return 1.0 if chosen == correct else 0.0

    targets = []
    if correct and choices and correct in valid_letters:
        index = valid_letters.index(correct)
        if index < len(choices):
            targets.append(str(choices[index]))
    targets += [str(metadata[key]) for key in ("correct_answer", "answer_text") if metadata.get(key)]
    if label_text:
        targets.append(label_text)
    said = _gpqa_text(_after_reasoning(response))
    if any(target and target in said for target in {_gpqa_text(t) for t in targets if t}):
        return 1.0
    if chosen and not correct and label_text:
        return 1.0 if chosen == label_text.upper() else 0.0
    return 0.0


RULES: dict[str, Callable[..., Any]] = {
    "math": math_reward,
    "deepscaler": deepscaler_reward,
    "dapo": dapo_reward,
    "f1": f1_reward,
    "gpqa": gpqa_reward,
    "random": lambda response, label: random.randint(0, 1),
}

# How each rule grades an answer already taken out of its \boxed{} (the boxed_ prefix).
BOXED_RULES: dict[str, Callable[..., Any]] = {
    "math": _grade_boxed_answer,
    "deepscaler": lambda answer, label: _grade_boxed_answer(answer, label) if isinstance(label, (str, float, int))
    and label != "" else 0,
    "dapo": lambda answer, label: _dapo_score(normalize_final_answer(answer), label),
    "f1": f1_reward,
    "gpqa": gpqa_reward,
    "random": RULES["random"],
}


def rule_based_reward(rm_type: str, response: str, label: Any, metadata: dict | None = None) -> Any:
    """Score ``response`` against ``label`` with the built-in rule ``rm_type`` (``boxed_`` prefix allowed).

    ``metadata`` is the sample's; only ``gpqa`` reads it.
    """
    rm_type = rm_type.strip()
    boxed = rm_type.startswith("boxed_")
    base = rm_type.removeprefix("boxed_")
    rules = BOXED_RULES if boxed else RULES
    if base not in rules:
        raise UserError(f"--rm-type {rm_type}: unknown rule; choose one of {', '.join(RULES)}, remote_rm, "
                        "a boxed_ form, or pass --custom-rm-path")
    extra = {"metadata": metadata} if base == "gpqa" else {}
    if not boxed:
        return rules[base](response, label, **extra)
    answer = extract_answer(response) if isinstance(response, str) else None
    if answer is None:  # the format the reward demands is missing
        return _dapo_score("[INVALID]", label) if base == "dapo" else 0
    return rules[base](answer, label, **extra)


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
    return rule_based_reward(rm_type, sample.response, sample.label, metadata)


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
    "dapo_reward",
    "deepscaler_reward",
    "f1_reward",
    "f1_score",
    "gpqa_reward",
    "math_reward",
    "remote_rm",
    "rule_based_reward",
]
