"""Rewards -> advantages and returns, for every ``--advantage-estimator`` slime v0.3.1 offers.

Two stages, as in slime:

1. :func:`post_process_rewards` runs in the rollout manager on scalar rewards, one per sample.
   Estimators that use a group baseline (grpo, gspo, cispo, reinforce_plus_plus_baseline) subtract
   the mean reward of the sample's group (the ``--n-samples-per-prompt`` responses to one prompt);
   grpo/gspo/cispo also divide by the group's std + 1e-6 unless ``--disable-grpo-std-normalization``
   (Dr.GRPO). ``--disable-rewards-normalization`` skips the whole step.
2. :func:`compute_advantages_and_returns` runs in the trainer on per-sample response tensors
   (lists of 1-D tensors, one per sample, each of the sample's response length) and turns the
   processed rewards into per-token advantages and returns, optionally whitened
   (``--normalize-advantages``) across the data-parallel group.

All tensors are per sample: ``list[Tensor]`` with entry i of shape [R_i] (R_i = response length of
sample i). Nothing here touches a model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from slime_ref.algo.choices import ADVANTAGE_ESTIMATORS
from slime_ref.algo.kl import compute_approx_kl
from slime_ref.errors import UserError
from slime_ref.utils.hooks import load_function

# Estimators whose rewards get the group mean subtracted before training (slime's _post_process_rewards).
GROUP_BASELINE_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
# ... and of those, the ones that also divide by the group std (GRPO, arXiv 2402.03300, eq. in sec. 4.1.2).
GROUP_STD_ESTIMATORS = ("grpo", "gspo", "cispo")
GROUP_STD_EPS = 1e-6


# ---------------------------------------------------------------------------------------------
# Stage 1: group reward normalisation (rollout side)
# ---------------------------------------------------------------------------------------------


def group_normalize(
    rewards: torch.Tensor, group_ids: torch.Tensor, *, divide_std: bool, eps: float = GROUP_STD_EPS
) -> torch.Tensor:
    """Subtract each group's mean reward and optionally divide by its std.

    GRPO (arXiv 2402.03300): A_i = (r_i - mean(r_group)) / std(r_group). Dr.GRPO (arXiv 2503.20783)
    drops the std division, which otherwise up-weights prompts that are nearly always right or wrong.
    The std is the unbiased (n - 1) one, as ``torch.std``; a group of one sample has std 0.

    Args:
        rewards: [N] scalar rewards.
        group_ids: [N] integer group id of each reward; groups may have different sizes and need
            not be contiguous.
        divide_std: divide by (std + eps) after centring.

    Returns:
        [N] float32 normalised rewards, in the input order.
    """
    rewards = rewards.float()
    _, group_of = torch.unique(group_ids, return_inverse=True)
    num_groups = int(group_of.max()) + 1 if group_of.numel() else 0
    counts = torch.bincount(group_of, minlength=num_groups).float()
    sums = rewards.new_zeros(num_groups).index_add_(0, group_of, rewards)
    centred = rewards - (sums / counts)[group_of]
    if not divide_std:
        return centred
    square_sums = rewards.new_zeros(num_groups).index_add_(0, group_of, centred.pow(2))
    std = torch.sqrt(square_sums / (counts - 1).clamp(min=1))
    return centred / (std[group_of] + eps)


def post_process_rewards(args, samples: Sequence) -> tuple[list[float], list[float]]:
    """slime's ``RolloutManager._post_process_rewards``: (raw rewards, rewards the trainer uses).

    ``samples`` is the flat list of Samples of one rollout. Groups are taken from
    ``sample.group_index`` (consecutive chunks of ``n_samples_per_prompt`` when it is unset).
    ``--custom-reward-post-process-path`` replaces the whole step: ``f(args, samples) -> (raw, rewards)``.
    """
    if getattr(args, "custom_reward_post_process_path", None):
        hook = load_function(args.custom_reward_post_process_path, "--custom-reward-post-process-path")
        return hook(args, samples)

    raw_rewards = [_scalar_reward(args, sample) for sample in samples]
    if args.advantage_estimator not in GROUP_BASELINE_ESTIMATORS or not args.rewards_normalization:
        return raw_rewards, list(raw_rewards)

    if all(sample.group_index is not None for sample in samples):
        group_ids = torch.tensor([sample.group_index for sample in samples])
    else:
        group_ids = torch.arange(len(samples)) // args.n_samples_per_prompt
    divide_std = args.advantage_estimator in GROUP_STD_ESTIMATORS and args.grpo_std_normalization
    rewards = group_normalize(torch.tensor(raw_rewards, dtype=torch.float32), group_ids, divide_std=divide_std)
    return raw_rewards, rewards.tolist()


def _scalar_reward(args, sample) -> float:
    value = sample.get_reward_value(args)
    if isinstance(value, dict):
        raise UserError(
            f"reward is a dict with keys {sorted(value)}; pass --reward-key to choose the scalar "
            "(e.g. --reward-key score for --rm-type dapo)"
        )
    if value is None:
        raise UserError(f"sample {sample.index} has no reward; check --rm-type / --custom-rm-path")
    return float(value)


# ---------------------------------------------------------------------------------------------
# Stage 2: per-token advantages and returns (trainer side)
# ---------------------------------------------------------------------------------------------


def get_grpo_returns(rewards: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """GRPO/GSPO/CISPO: every response token gets its sample's (group-normalised) reward.

    Args:
        rewards: [B] processed rewards.
        like: B tensors [R_i] giving each sample's response shape.

    Returns:
        B tensors [R_i]; the advantage equals the return.
    """
    return [torch.full_like(x, float(r), dtype=torch.float32) for x, r in zip(like, rewards.tolist())]


GAE_CHUNK_SIZE = 128  # slime's default chunk for the parallel GAE scan


def vanilla_gae(
    rewards: torch.Tensor, values: torch.Tensor, gamma: float, lambd: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al., arXiv 1506.02438), one step at a time.

    delta_t = r_t + gamma * V_{t+1} - V_t (V after the last step is 0),
    A_t = delta_t + gamma * lambd * A_{t+1},  return_t = A_t + V_t.

    Args:
        rewards: [B, T] per-step rewards.
        values: [B, T] the critic's values for the same steps.

    Returns:
        (advantages [B, T], returns [B, T]).
    """
    steps = rewards.shape[1]
    advantages = torch.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(steps)):
        next_value = values[:, t + 1] if t + 1 < steps else 0.0
        running = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lambd * running
        advantages[:, t] = running
    return advantages, advantages + values


def chunked_gae(
    rewards: torch.Tensor, values: torch.Tensor, gamma: float, lambd: float, chunk_size: int = GAE_CHUNK_SIZE
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same GAE as :func:`vanilla_gae`, as a parallel scan: T / chunk_size sequential steps instead of T.

    Read backwards in time, A is a first-order linear recurrence S_i = delta_i + w * S_{i-1} with
    w = gamma * lambd. Inside a chunk of C steps it is a matrix product with the decay matrix
    D[k, t] = w^(t-k) for t >= k (0 below), computed for all chunks at once; each chunk then adds
    w^(t+1) times the last value of the chunk before it. slime's default for long responses.

    Args:
        rewards: [B, T] per-step rewards.
        values: [B, T] the critic's values for the same steps.
        chunk_size: C, steps per chunk.

    Returns:
        (advantages [B, T], returns [B, T]); equal to :func:`vanilla_gae` up to float rounding.
    """
    if rewards.ndim != 2 or values.shape != rewards.shape:
        raise ValueError(f"rewards and values must both be [B, T]; got {tuple(rewards.shape)}, {tuple(values.shape)}")
    batch, steps = rewards.shape
    w = gamma * lambd
    next_values = torch.cat([values[:, 1:], values.new_zeros(batch, 1)], dim=1)
    deltas = (rewards + gamma * next_values - values).flip(1)  # backwards in time
    num_chunks = -(-steps // chunk_size)
    padded = deltas.new_zeros(batch, num_chunks * chunk_size)
    padded[:, :steps] = deltas  # zero deltas past the end change nothing before them

    offsets = torch.arange(chunk_size, device=rewards.device)
    lag = offsets[None, :] - offsets[:, None]  # lag[k, t] = t - k
    decay = torch.where(lag >= 0, torch.tensor(w, dtype=rewards.dtype, device=rewards.device) ** lag.clamp(min=0),
                        torch.zeros((), dtype=rewards.dtype, device=rewards.device))
    local = (padded.view(batch * num_chunks, chunk_size) @ decay).view(batch, num_chunks, chunk_size)
    carry_weight = w ** torch.arange(1, chunk_size + 1, device=rewards.device, dtype=rewards.dtype)

    scanned = torch.empty_like(local)
    carry = rewards.new_zeros(batch)
    for c in range(num_chunks):  # the only sequential part: one step per chunk
        scanned[:, c] = local[:, c] + carry[:, None] * carry_weight
        carry = scanned[:, c, -1]
    advantages = scanned.view(batch, -1)[:, :steps].flip(1)
    return advantages, advantages + values


def gae_advantages_and_returns(
    token_rewards: list[torch.Tensor],
    values: list[torch.Tensor],
    gamma: float,
    lambd: float,
    chunked: bool = True,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """GAE over a batch of responses of different lengths (slime's ``get_advantages_and_returns_batch``).

    The responses are right-padded to one [B, max R] batch; padding has r = V = 0, so it contributes
    delta = 0 and does not leak into the real steps. ``chunked`` (slime's default) uses
    :func:`chunked_gae`, else :func:`vanilla_gae`.

    Args:
        token_rewards: B tensors [R_i] of per-token rewards.
        values: B tensors [R_i] of the critic's values for the same tokens.

    Returns:
        (advantages, returns): B tensors [R_i] each, float32.
    """
    lengths = [len(r) for r in token_rewards]
    width = max(lengths, default=0)
    device = token_rewards[0].device if token_rewards else None
    padded_rewards = torch.zeros(len(lengths), width, device=device)
    padded_values = torch.zeros(len(lengths), width, device=device)
    for i, (r, v) in enumerate(zip(token_rewards, values)):
        padded_rewards[i, : lengths[i]] = r.float()
        padded_values[i, : lengths[i]] = v.detach().float()
    if width == 0:
        advantages = returns = padded_rewards
    elif chunked:
        advantages, returns = chunked_gae(padded_rewards, padded_values, gamma, lambd)
    else:
        advantages, returns = vanilla_gae(padded_rewards, padded_values, gamma, lambd)
    return (
        [advantages[i, :n] for i, n in enumerate(lengths)],
        [returns[i, :n] for i, n in enumerate(lengths)],
    )


def get_reinforce_plus_plus_returns(
    rewards: torch.Tensor, kl: list[torch.Tensor], loss_masks: list[torch.Tensor], kl_coef: float, gamma: float
) -> list[torch.Tensor]:
    """REINFORCE++ (arXiv 2501.03262): discounted return of KL-penalised token rewards.

    r_t = -kl_coef * kl_t * mask_t, plus the scalar reward on the last token with mask 1;
    G_t = r_t + gamma * G_{t+1}. That is GAE with V = 0 and lambda = 1.

    Args:
        rewards: [B] scalar rewards (not group-normalised).
        kl: B tensors [R_i] of per-token KL to the reference.
        loss_masks: B tensors [R_i] of 0/1.

    Returns:
        B tensors [R_i] of returns (used as advantages before whitening).
    """
    token_rewards = []
    for i, (k, mask) in enumerate(zip(kl, loss_masks)):
        mask = mask.float()
        kept = mask.nonzero(as_tuple=True)[0]
        if kept.numel() == 0:
            raise ValueError(f"sample {i} has an all-zero loss mask; REINFORCE++ needs at least one trained token")
        r = -kl_coef * k.float() * mask
        r[kept[-1]] += float(rewards[i])
        token_rewards.append(r)
    zeros = [torch.zeros_like(r) for r in token_rewards]
    # slime sums REINFORCE++ returns step by step, so the serial scan (no chunked rounding)
    returns, _ = gae_advantages_and_returns(token_rewards, zeros, gamma=gamma, lambd=1.0, chunked=False)
    return returns


def get_reinforce_plus_plus_baseline_advantages(
    rewards: torch.Tensor, kl: list[torch.Tensor], kl_coef: float
) -> list[torch.Tensor]:
    """REINFORCE++-baseline (arXiv 2501.03262): (reward - group mean) on every token, minus kl_coef * kl_t.

    Args:
        rewards: [B] rewards with the group mean already subtracted (:func:`post_process_rewards`).
        kl: B tensors [R_i] of per-token KL to the reference.

    Returns:
        B tensors [R_i] of unwhitened advantages.
    """
    return [float(r) - kl_coef * k.float() for k, r in zip(kl, rewards.tolist())]


def masked_whiten(
    values: torch.Tensor,
    mask: torch.Tensor,
    process_group: dist.ProcessGroup | None = None,
    shift_mean: bool = True,
    eps: float = 1e-8,
) -> torch.Tensor:
    """Whiten ``values`` with the mean and unbiased variance of its masked entries across ranks.

    The sums (x, x**2, count) are all-reduced over ``process_group`` (pass the data-parallel group,
    including context-parallel ranks if any; None means these tensors are the whole batch). Every
    rank then uses the same global statistics.

    Args:
        values: [T] advantages of this rank's samples, concatenated.
        mask: [T] 0/1 loss mask for the same tokens.
        shift_mean: if False, the mean is added back (scale only).

    Returns:
        [T] (values - mean) / sqrt(var + eps) (plus mean if not shift_mean), float32.
    """
    mask = mask.to(torch.float64)
    v = values.to(torch.float64)
    stats = torch.stack([(v * mask).sum(), (v * v * mask).sum(), mask.sum()])
    if process_group is not None:
        dist.all_reduce(stats, group=process_group)
    total, total_sq, count = stats.tolist()
    if count == 0:
        raise ValueError("no token has loss mask 1 across the group; cannot normalise advantages")
    mean = total / count
    var = total_sq / count - mean * mean
    if count >= 2:
        var *= count / (count - 1)  # Bessel's correction
    whitened = (v - mean) / math.sqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened.float()


def compute_advantages_and_returns(
    args,
    *,
    rewards: Sequence[float] | torch.Tensor,
    loss_masks: list[torch.Tensor],
    log_probs: list[torch.Tensor] | None = None,
    ref_log_probs: list[torch.Tensor] | None = None,
    rollout_log_probs: list[torch.Tensor] | None = None,
    values: list[torch.Tensor] | None = None,
    process_group: dist.ProcessGroup | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-token advantages and returns for ``args.advantage_estimator`` (slime's loss.py function of the same name).

    Args:
        args: reads advantage_estimator, kl_coef, kl_loss_type, gamma, lambd, normalize_advantages,
            use_rollout_logprobs.
        rewards: [B] rewards after :func:`post_process_rewards`.
        loss_masks: B tensors [R_i] of 0/1.
        log_probs: B tensors [R_i], the old actor's log-probs (needed when kl_coef != 0).
        ref_log_probs: B tensors [R_i], the reference model's log-probs (needed when kl_coef != 0).
        rollout_log_probs: B tensors [R_i] from the engine; used instead of ``log_probs`` with
            ``--use-rollout-logprobs``.
        values: B tensors [R_i] from the critic (ppo only).
        process_group: data-parallel group for ``--normalize-advantages`` (None: this batch is all).

    Returns:
        (advantages, returns): B tensors [R_i] each, float32. ``returns`` are the critic's targets for ppo.
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    policy_log_probs = rollout_log_probs if args.use_rollout_logprobs else log_probs
    if args.kl_coef == 0 or policy_log_probs is None:
        kl = [torch.zeros_like(m, dtype=torch.float32) for m in loss_masks]
    else:
        if ref_log_probs is None:
            raise ValueError("kl_coef != 0 needs ref_log_probs")
        kl = [compute_approx_kl(lp, ref, args.kl_loss_type) for lp, ref in zip(policy_log_probs, ref_log_probs)]

    estimator = args.advantage_estimator
    if estimator in ("grpo", "gspo", "cispo"):
        # (the KL to the reference, if any, enters these through --use-kl-loss, not the reward)
        returns = get_grpo_returns(rewards, kl)
        advantages = list(returns)
    elif estimator == "ppo":
        if values is None:
            raise ValueError("advantage_estimator ppo needs the critic's values")
        token_rewards = []
        for i, (k, r) in enumerate(zip(kl, rewards.tolist())):
            if k.numel() == 0:
                raise ValueError(f"sample {i} has an empty response")
            # KL penalty on every token, the scalar reward on the last response token (PPO-RLHF shaping)
            token_reward = -args.kl_coef * k.float()
            token_reward[-1] += r
            token_rewards.append(token_reward)
        advantages, returns = gae_advantages_and_returns(token_rewards, values, args.gamma, args.lambd)
    elif estimator == "reinforce_plus_plus":
        returns = get_reinforce_plus_plus_returns(rewards, kl, loss_masks, args.kl_coef, args.gamma)
        advantages = list(returns)
    elif estimator == "reinforce_plus_plus_baseline":
        advantages = get_reinforce_plus_plus_baseline_advantages(rewards, kl, args.kl_coef)
        returns = advantages
    else:
        raise ValueError(f"unknown advantage_estimator {estimator!r}; choose one of {', '.join(ADVANTAGE_ESTIMATORS)}")

    if args.normalize_advantages:
        # every rank joins the all-reduce, even one that holds no samples in this step
        flat_advantages = torch.cat(advantages) if advantages else torch.zeros(0)
        flat_masks = torch.cat(loss_masks) if loss_masks else torch.zeros(0)
        flat = masked_whiten(flat_advantages, flat_masks, process_group=process_group)
        advantages = list(flat.split([len(a) for a in advantages]))
    return advantages, returns
