"""The rules between slime's flags that both tools enforce, written once.

``slime-check config`` renders each broken rule as a FAIL finding on a launch script, where a value
may be symbolic (:data:`UNKNOWN`); ``slime-ref`` raises a UserError on its parsed flags. Each rule
reads flag values through a :class:`FlagValues` accessor, so the same predicate, message and fix
serve both: a predicate that compares numbers only fires when they are known, so a rule whose
values a script leaves symbolic is skipped, never guessed.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class Unknown:
    """The value of a flag whose command-line word is symbolic."""

    def __repr__(self):
        return "<unknown>"


UNKNOWN = Unknown()


def known(*values) -> bool:
    return all(v is not None and v is not UNKNOWN for v in values)


class FlagValues(Protocol):
    """A job's flag values by flag name: the value the trainer sees, ``None`` when unset, or
    :data:`UNKNOWN`; ``where`` names the place a flag was given (empty where that is not known)."""

    def __getitem__(self, flag: str): ...

    def where(self, flag: str) -> str: ...


class NamespaceValues:
    """:class:`FlagValues` over an argparse Namespace (a flag it lacks reads as ``None``)."""

    def __init__(self, args: argparse.Namespace):
        self.args = args

    def __getitem__(self, flag: str):
        return getattr(self.args, flag.lstrip("-").replace("-", "_"), None)

    def where(self, flag: str) -> str:
        return ""


Text = Callable[[FlagValues], str]

# A job every rule accepts; each rule's example changes it just enough to break that rule.
VALID_JOB = ("--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--global-batch-size", "8",
             "--num-rollout", "1")


def _job(*extra: str, drop: tuple[str, ...] = ()) -> tuple[str, ...]:
    """VALID_JOB without the flags in ``drop`` (each with its one value), plus ``extra``."""
    out, words = [], list(VALID_JOB)
    while words:
        flag, value = words.pop(0), words.pop(0)
        if flag not in drop:
            out += [flag, value]
    return (*out, *extra)


@dataclass(frozen=True)
class ArgRule:
    """One rule: ``broken(values)`` is True when the job breaks it."""

    id: str  # the finding id of slime-check config
    flags: tuple[str, ...]  # the flags it reads
    broken: Callable[[FlagValues], bool]
    message: Text
    fix: Text
    doc: str  # which slime doc page explains it: "args", "batch", "faq", "grpo"
    example: tuple[str, ...]  # a job (train argv) that breaks it


def _samples(v: FlagValues):
    return v["--rollout-batch-size"] * v["--n-samples-per-prompt"]


def _batch_known(v: FlagValues) -> bool:
    return known(v["--rollout-batch-size"], v["--n-samples-per-prompt"]) \
        and UNKNOWN not in (v["--global-batch-size"], v["--num-steps-per-rollout"])


BATCH_FIX = ("Make rollout_batch_size x n_samples_per_prompt = global_batch_size x num_steps_per_rollout, "
             "e.g. set only --num-steps-per-rollout and let slime compute --global-batch-size.")
REINFORCE = ("reinforce_plus_plus", "reinforce_plus_plus_baseline")


def _eval_words(v: FlagValues) -> list:
    value = v["--eval-prompt-data"]
    return value if isinstance(value, list) else []


RULES: tuple[ArgRule, ...] = (
    ArgRule(
        "config.batch_identity", ("--global-batch-size", "--num-steps-per-rollout"),
        lambda v: _batch_known(v) and v["--global-batch-size"] is None and v["--num-steps-per-rollout"] is None,
        lambda v: ("Neither --global-batch-size nor --num-steps-per-rollout is set: Megatron then sets the global "
                   "batch to micro_batch_size x data-parallel size, rarely what you want."),
        lambda v: BATCH_FIX, "batch", _job(drop=("--global-batch-size",))),
    ArgRule(
        "config.batch_identity",
        ("--rollout-batch-size", "--n-samples-per-prompt", "--global-batch-size", "--num-steps-per-rollout"),
        lambda v: _batch_known(v) and known(v["--global-batch-size"], v["--num-steps-per-rollout"])
        and v["--global-batch-size"] != _samples(v) // v["--num-steps-per-rollout"],
        lambda v: (f"--global-batch-size {v['--global-batch-size']}{v.where('--global-batch-size')} but "
                   f"rollout_batch_size {v['--rollout-batch-size']} x n_samples_per_prompt "
                   f"{v['--n-samples-per-prompt']} // num_steps_per_rollout {v['--num-steps-per-rollout']} = "
                   f"{_samples(v) // v['--num-steps-per-rollout']}: slime's argument check stops the run."),
        lambda v: BATCH_FIX, "batch", _job("--num-steps-per-rollout", "2")),
    ArgRule(
        "config.batch_identity", ("--rollout-batch-size", "--n-samples-per-prompt", "--global-batch-size"),
        lambda v: _batch_known(v) and v["--num-steps-per-rollout"] is None and known(v["--global-batch-size"])
        and v["--global-batch-size"] > _samples(v),
        lambda v: (f"--global-batch-size {v['--global-batch-size']} is larger than the {_samples(v)} samples a "
                   f"rollout makes ({v['--rollout-batch-size']} x {v['--n-samples-per-prompt']}): training stops "
                   "with 'num_rollouts < global_batch_size'."),
        lambda v: BATCH_FIX, "batch", _job("--global-batch-size", "16")),
    ArgRule(
        "config.batch_identity", ("--rollout-batch-size", "--n-samples-per-prompt", "--global-batch-size"),
        lambda v: _batch_known(v) and v["--num-steps-per-rollout"] is None and known(v["--global-batch-size"])
        and _samples(v) % v["--global-batch-size"] != 0,
        lambda v: (f"rollout_batch_size {v['--rollout-batch-size']} x n_samples_per_prompt "
                   f"{v['--n-samples-per-prompt']} = {_samples(v)} is not a multiple of global_batch_size "
                   f"{v['--global-batch-size']}: the last {_samples(v) % v['--global-batch-size']} samples of "
                   "every rollout are silently dropped."),
        lambda v: BATCH_FIX, "batch", _job("--global-batch-size", "3")),
    ArgRule(
        "config.save", ("--save-interval", "--save"),
        lambda v: v["--save-interval"] is not None and v["--save"] is None,
        lambda v: f"--save-interval{v.where('--save-interval')} without --save: slime stops at start-up.",
        lambda v: "Add --save DIR, or drop --save-interval.", "args", _job("--save-interval", "5")),
    ArgRule(
        "config.eval", ("--eval-interval", "--eval-prompt-data", "--eval-config"),
        lambda v: v["--eval-interval"] is not None and v["--eval-prompt-data"] is None and v["--eval-config"] is None,
        lambda v: (f"--eval-interval{v.where('--eval-interval')} without --eval-prompt-data or --eval-config: "
                   "slime stops at start-up."),
        lambda v: "Add --eval-prompt-data NAME PATH, or drop --eval-interval.", "batch", _job("--eval-interval", "5")),
    ArgRule(
        "config.eval", ("--eval-prompt-data",),
        lambda v: len(_eval_words(v)) > 1 and len(_eval_words(v)) % 2 == 1,
        lambda v: (f"--eval-prompt-data needs NAME PATH pairs; it has an odd number of words "
                   f"({len(_eval_words(v))}: {' '.join(map(str, _eval_words(v)))})."),
        lambda v: "Give one flag with NAME PATH [NAME PATH ...].", "batch",
        _job("--eval-prompt-data", "aime", "aime.jsonl", "gsm8k")),
    ArgRule(
        "config.dynamic_batch", ("--use-dynamic-batch-size", "--max-tokens-per-gpu"),
        lambda v: v["--use-dynamic-batch-size"] is True and v["--max-tokens-per-gpu"] is None,
        lambda v: "--use-dynamic-batch-size without --max-tokens-per-gpu: slime stops at start-up.",
        lambda v: "Add --max-tokens-per-gpu (start at rollout_max_response_len / context_parallel_size, FAQ 3).",
        "faq", _job("--use-dynamic-batch-size")),
    ArgRule(
        "config.kl", ("--kl-coef", "--kl-loss-coef"),
        lambda v: known(v["--kl-coef"], v["--kl-loss-coef"]) and v["--kl-coef"] != 0 and v["--kl-loss-coef"] != 0,
        lambda v: (f"--kl-coef {v['--kl-coef']} and --kl-loss-coef {v['--kl-loss-coef']} are both non-zero: "
                   "slime allows only one KL (reward penalty or loss)."),
        lambda v: "Set one of them to 0.", "grpo", _job("--kl-coef", "0.1", "--kl-loss-coef", "0.1")),
    ArgRule(
        "config.advantage", ("--advantage-estimator", "--normalize-advantages"),
        lambda v: v["--advantage-estimator"] in REINFORCE and v["--normalize-advantages"] is not True,
        lambda v: f"--advantage-estimator {v['--advantage-estimator']} needs --normalize-advantages.",
        lambda v: "Add --normalize-advantages.", "grpo", _job("--advantage-estimator", "reinforce_plus_plus")),
    ArgRule(
        "config.rollout_logprobs", ("--use-rollout-logprobs", "--use-tis"),
        lambda v: v["--use-rollout-logprobs"] is True and v["--use-tis"] is True,
        lambda v: "--use-rollout-logprobs and --use-tis cannot be combined.",
        lambda v: "Drop one of them.", "grpo", _job("--use-rollout-logprobs", "--use-tis")),
    ArgRule(
        "config.debug_modes", ("--debug-rollout-only", "--debug-train-only"),
        lambda v: v["--debug-rollout-only"] is True and v["--debug-train-only"] is True,
        lambda v: "--debug-rollout-only and --debug-train-only cannot both be set.",
        lambda v: "Keep one.", "args", _job("--debug-rollout-only", "--debug-train-only")),
    ArgRule(
        "config.over_sampling", ("--rollout-batch-size", "--over-sampling-batch-size"),
        lambda v: known(v["--rollout-batch-size"], v["--over-sampling-batch-size"])
        and v["--over-sampling-batch-size"] < v["--rollout-batch-size"],
        lambda v: (f"--over-sampling-batch-size {v['--over-sampling-batch-size']} is below --rollout-batch-size "
                   f"{v['--rollout-batch-size']}."),
        lambda v: "Make it at least the rollout batch size.", "batch", _job("--over-sampling-batch-size", "2")),
    ArgRule(
        "config.num_rollout", ("--num-rollout", "--num-epoch"),
        lambda v: v["--num-rollout"] is None and v["--num-epoch"] is None,
        lambda v: "Neither --num-rollout nor --num-epoch is set: slime stops at start-up.",
        lambda v: "Add --num-rollout N.", "batch", _job(drop=("--num-rollout",))),
    ArgRule(
        "config.prompt_len", ("--rollout-max-context-len", "--rollout-max-prompt-len"),
        lambda v: known(v["--rollout-max-context-len"], v["--rollout-max-prompt-len"])
        and v["--rollout-max-prompt-len"] > v["--rollout-max-context-len"] - 1,
        lambda v: (f"--rollout-max-prompt-len {v['--rollout-max-prompt-len']} leaves no room for a response in "
                   f"--rollout-max-context-len {v['--rollout-max-context-len']}."),
        lambda v: "Keep the prompt length below the context length.", "batch",
        _job("--rollout-max-context-len", "100", "--rollout-max-prompt-len", "100")),
    ArgRule(
        "config.weight_sync", ("--update-weight-transport", "--update-weight-disk-dir"),
        lambda v: v["--update-weight-transport"] == "disk" and v["--update-weight-disk-dir"] is None,
        lambda v: ("--update-weight-transport disk needs --update-weight-disk-dir (a directory trainer and "
                   "engines share)."),
        lambda v: "Add --update-weight-disk-dir.", "args", _job("--update-weight-transport", "disk")),
)


def broken_rules(values: FlagValues, rules: tuple[ArgRule, ...] = RULES) -> list[ArgRule]:
    """The rules ``values`` break, in table order."""
    return [rule for rule in rules if rule.broken(values)]


def user_message(rule: ArgRule, values: FlagValues) -> str:
    """The one line a tool that stops on a broken rule prints: what is wrong, then the fix."""
    return f"{rule.message(values)} {rule.fix(values)}"
