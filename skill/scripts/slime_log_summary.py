#!/usr/bin/env python3
"""Summarise a slime training log: one row per rollout, plus warnings on known bad signs.

slime (v0.3.1) prints its metrics as Python dicts, one line per phase and id:

    rollout 3: {'rollout/raw_reward': 0.41, 'rollout/ref_log_probs': -0.52, ...}
    perf 3: {'rollout/response_len/mean': 812.0, 'rollout/truncated_ratio': 0.02, ...}
    step 3: {'train/pg_loss': 0.01, 'train/ppo_kl': 0.0, 'train/grad_norm': 0.31, ...}
    eval 3: {'eval/aime': 0.27, ...}

Usage:
    ray job logs <job id> | python3 slime_log_summary.py -
    python3 slime_log_summary.py job.log [--json]

Standard library only, so it runs anywhere the log is.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import re
import sys

LINE = re.compile(r"\b(rollout|perf|eval|step) (\d+): (\{.*\})\s*$")
NUMBER_ITEM = re.compile(r"'([^']+)': \(?(-?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))")

COLUMNS = {
    "reward": "rollout/raw_reward",
    "resp_len": "rollout/response_len/mean",
    "truncated": "rollout/truncated_ratio",
    "pg_loss": "train/pg_loss",
    "ppo_kl": "train/ppo_kl",
    "clipfrac": "train/pg_clipfrac",
    "kl_loss": "train/kl_loss",
    "grad_norm": "train/grad_norm",
    "logp_diff": "train/train_rollout_logprob_abs_diff",
}

# slime's own CI bound on |trainer - engine| log-prob difference (slime/backends/megatron_utils/model.py)
LOGPROB_DIFF_LIMIT = 0.1
TRUNCATED_LIMIT = 0.5
# before a rollout's first optimizer step the policy equals the old policy, so its ppo_kl is 0
FIRST_STEP_PPO_KL = "train/ppo_kl@first_step"
# at the run's first step the actor is the reference, so train/kl_loss is 0 (slime's CI: below 1e-8)
STEP0_KL_LOSS = "train/kl_loss@step0"


def parse_metrics(text: str) -> dict[str, float]:
    """The numeric entries of one logged dict; tolerant of values Python's literal parser rejects."""
    try:
        raw = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return {key: float(value) for key, value in NUMBER_ITEM.findall(text)}
    metrics = {}
    for key, value in raw.items():
        if isinstance(value, (tuple, list)) and value:  # some slime versions log (sum, count)
            value = value[0]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics[str(key)] = float(value)
    return metrics


def read_log(lines) -> dict[int, dict[str, float]]:
    """Metrics by rollout id. Train steps are folded into their rollout by order of appearance."""
    by_rollout: dict[int, dict[str, float]] = {}
    last_rollout = 0
    for line in lines:
        match = LINE.search(line)
        if not match:
            continue
        phase, index, body = match.group(1), int(match.group(2)), match.group(3)
        metrics = parse_metrics(body)
        if phase == "step":
            # a step id counts optimizer steps; attach it to the rollout logged last
            rollout = by_rollout.setdefault(last_rollout, {})
            if "train/ppo_kl" in metrics and FIRST_STEP_PPO_KL not in rollout:
                rollout[FIRST_STEP_PPO_KL] = metrics["train/ppo_kl"]
            if index == 0 and "train/kl_loss" in metrics:
                rollout[STEP0_KL_LOSS] = metrics["train/kl_loss"]
            metrics["train/step"] = float(index)
            rollout.update(metrics)
        else:
            last_rollout = index
            by_rollout.setdefault(index, {}).update(metrics)
    return by_rollout


def warnings_for(by_rollout: dict[int, dict[str, float]]) -> list[str]:
    """Known bad signs, each with what to do about it."""
    found = []
    if not by_rollout:
        return ["no slime metric lines found: is this the job's log (ray job logs <id>)?"]
    first_id = min(by_rollout)
    first = by_rollout[first_id]
    if "rollout/log_probs" in first and "rollout/ref_log_probs" in first and first_id == 0:
        gap = abs(first["rollout/log_probs"] - first["rollout/ref_log_probs"])
        if gap > 1e-6:
            found.append(
                f"rollout 0: log_probs and ref_log_probs differ by {gap:.3g}; on a fresh run they must be "
                "equal (weights not loaded as expected, or nondeterministic kernels: see debug.md)"
            )
    kl_loss = first.get(STEP0_KL_LOSS)
    if kl_loss is not None and abs(kl_loss) > 1e-6:
        found.append(
            f"step 0: train/kl_loss = {kl_loss:.3g}; on a fresh run the actor starts as the reference and it "
            "must be 0 (--load, --ref-load and --hf-checkpoint not the same model?)"
        )
    for rollout_id, metrics in sorted(by_rollout.items()):
        ppo_kl = metrics.get(FIRST_STEP_PPO_KL)
        if rollout_id == first_id and ppo_kl is not None and abs(ppo_kl) > 1e-6:
            found.append(
                f"rollout {rollout_id}: train/ppo_kl = {ppo_kl:.3g} at its first step; it must be 0 "
                "(unless --use-rollout-logprobs)"
            )
        diff = metrics.get("train/train_rollout_logprob_abs_diff")
        if diff is not None and diff > LOGPROB_DIFF_LIMIT:
            found.append(
                f"rollout {rollout_id}: trainer and engine log-probs differ by {diff:.3g} (> {LOGPROB_DIFF_LIMIT}); "
                "check versions and MODEL_ARGS, consider --use-tis"
            )
        truncated = metrics.get("rollout/truncated_ratio")
        if truncated is not None and truncated > TRUNCATED_LIMIT:
            found.append(
                f"rollout {rollout_id}: {truncated:.0%} of responses hit the length limit; check stop tokens "
                "(--rollout-stop-token-ids) or raise --rollout-max-response-len"
            )
        grad_norm = metrics.get("train/grad_norm")
        if grad_norm is not None and not math.isfinite(grad_norm):
            found.append(f"rollout {rollout_id}: train/grad_norm is {grad_norm}")
    rewards = [m["rollout/raw_reward"] for _, m in sorted(by_rollout.items()) if "rollout/raw_reward" in m]
    if len(rewards) >= 5 and max(rewards) - min(rewards) < 1e-9:
        found.append(f"rollout/raw_reward stayed at {rewards[0]:.3g} for {len(rewards)} rollouts: check the reward")
    return found


def render(by_rollout: dict[int, dict[str, float]]) -> str:
    header = ["rollout", *COLUMNS]
    rows = [header]
    for rollout_id, metrics in sorted(by_rollout.items()):
        row = [str(rollout_id)]
        for key in COLUMNS.values():
            value = metrics.get(key)
            row.append("-" if value is None else f"{value:.4g}")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", help="a slime job log, or - for standard input")
    parser.add_argument("--json", action="store_true", help="print {rollouts, warnings} as JSON")
    options = parser.parse_args(argv)
    if options.log == "-":
        by_rollout = read_log(sys.stdin)
    else:
        try:
            with open(options.log, encoding="utf-8", errors="replace") as f:
                by_rollout = read_log(f)
        except OSError as error:
            print(f"slime_log_summary: cannot read {options.log}: {error.strerror}", file=sys.stderr)
            return 2
    found = warnings_for(by_rollout)
    if options.json:
        print(json.dumps({"rollouts": {str(k): v for k, v in sorted(by_rollout.items())}, "warnings": found}))
    else:
        print(render(by_rollout))
        for warning in found:
            print(f"WARN {warning}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
