"""A rollout's and an eval's metrics, named as slime names them: ``rollout/*``, ``perf/*``,
``multi_turn/*`` (--log-multi-turn), ``passrate/pass@k`` (--log-passrate) and ``eval/<name>*``."""

from __future__ import annotations

import math


def rollout_metrics(args, samples, raw_rewards, rollout_time: float) -> dict:
    n = len(samples)
    lengths = [s.effective_response_length for s in samples]
    group = args.n_samples_per_prompt
    groups = _reward_groups(samples, raw_rewards, group)
    metrics = {
        "rollout/raw_reward": sum(raw_rewards) / n,
        "rollout/response_length": sum(lengths) / n,
        "rollout/response_len/max": max(lengths),
        "rollout/truncated_ratio": sum(s.status.name == "TRUNCATED" for s in samples) / n,
        "rollout/zero_std_ratio": sum(max(g) == min(g) for g in groups) / len(groups),
        "perf/rollout_time": rollout_time,
    }
    if args.log_multi_turn:
        metrics.update(multi_turn_metrics(args, samples))
    if args.log_passrate:
        metrics.update({f"passrate/{k}": v for k, v in pass_rates(list(raw_rewards), group).items()})
    if args.rollout_num_gpus:
        metrics["perf/tokens_per_gpu_per_sec"] = sum(lengths) / rollout_time / args.rollout_num_gpus
    return metrics


def _reward_groups(samples, raw_rewards, group_size: int) -> list[list[float]]:
    """The rewards of each prompt's group, grouped as the rewards are normalised: by
    ``Sample.group_index``, or consecutive chunks of ``group_size`` when a sample has none."""
    if not all(s.group_index is not None for s in samples):
        return [list(raw_rewards[i:i + group_size]) for i in range(0, len(samples), group_size)]
    groups: dict = {}
    for s, r in zip(samples, raw_rewards):
        groups.setdefault(s.group_index, []).append(r)
    return list(groups.values())


def multi_turn_metrics(args, samples) -> dict:
    """--log-multi-turn: response lengths with and without tool/environment tokens, and rounds.

    ``raw_response_length``: every response token; ``wo_obs_response_length``: those the loss mask
    keeps (the model's own); ``round_number`` from ``sample.metadata["round_number"]`` when set.
    """
    raw = [s.response_length for s in samples]
    own = [sum(s.loss_mask) if s.loss_mask is not None else s.response_length for s in samples]
    out = {
        "multi_turn/raw_response_length/response_length_mean": sum(raw) / len(raw),
        "multi_turn/raw_response_length/response_length_max": max(raw),
        "multi_turn/raw_response_length/response_length_min": min(raw),
        "multi_turn/raw_response_length/response_length_clip_ratio":
            sum(n >= args.rollout_max_response_len for n in raw) / len(raw),
        "multi_turn/wo_obs_response_length/response_length_mean": sum(own) / len(own),
        "multi_turn/wo_obs_response_length/response_length_max": max(own),
        "multi_turn/wo_obs_response_length/response_length_min": min(own),
    }
    rounds = [s.metadata["round_number"] for s in samples if "round_number" in (s.metadata or {})]
    if rounds:
        out["multi_turn/multi_turn_metric/round_number_mean"] = sum(rounds) / len(rounds)
        out["multi_turn/multi_turn_metric/round_number_max"] = max(rounds)
        out["multi_turn/multi_turn_metric/round_number_min"] = min(rounds)
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021, arXiv 2107.03374, eq. 1)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def pass_rates(rewards: list[float], group_size: int) -> dict[str, float]:
    """{"pass@k": mean over groups of unbiased pass@k} for k = 1, 2, 4, ... <= group_size.

    ``rewards`` holds consecutive groups of ``group_size`` responses to one prompt; a response
    with reward > 0 counts as correct. Empty for group_size 1, as in slime's compute_pass_rate.
    """
    if group_size <= 1:
        return {}
    groups = [rewards[i:i + group_size] for i in range(0, len(rewards), group_size)]
    out = {}
    k = 1
    while k <= group_size:
        scores = [pass_at_k(group_size, sum(r > 0 for r in g), k) for g in groups]
        out[f"pass@{k}"] = sum(scores) / len(scores)
        k *= 2
    return out


def eval_metrics(args, data: dict) -> dict:
    """eval/<name> (mean reward: pass@1 for 0/1 rewards), eval/<name>-pass@k, eval/<name>-truncated_ratio."""
    out = {}
    for name, result in data.items():
        rewards = [float(r) for r in result["rewards"]]
        out[f"eval/{name}"] = sum(rewards) / len(rewards)
        out[f"eval/{name}-truncated_ratio"] = sum(result["truncated"]) / len(result["truncated"])
        for key, value in pass_rates(rewards, args.n_samples_per_eval_prompt).items():
            out[f"eval/{name}-{key}"] = value
    return out
