"""Policy, value and SFT losses, and the step-level reduction that makes them micro-batch invariant.

Inputs are per-sample response tensors of ONE micro-batch: ``list[Tensor]``, entry i of shape [R_i].
Internally they are concatenated into flat [T] tensors (T = sum of R_i), as in slime's loss.py.

Reduction (slime's ``sum_of_sample_mean``, made explicit): every loss and metric is a *partial* of
the optimizer step's mean, computed with the step's global counts, so that adding the results of
all micro-batches on all data-parallel ranks gives the step value:

- per sample (default):             sum_i  [sum_t m_it x_it / max(sum_t m_it, 1)] / num_samples
- per token (``--calculate-per-token-loss``): sum_i sum_t m_it x_it / num_tokens

``num_samples`` is the number of samples in the optimizer step (global batch, all DP ranks);
``num_tokens`` is the step's sum over samples of max(loss-mask sum, 1) (:func:`count_loss_tokens`).

How a Megatron actor uses this (one micro-batch; all lists hold [R_i] tensors of that micro-batch)::

    loss, metrics = policy_loss_function(
        args,
        log_probs=log_probs,             # current policy, requires grad
        entropy=entropy,                 # current policy's token entropy
        advantages=batch["advantages"],
        loss_masks=batch["loss_masks"],
        old_log_probs=batch.get("log_probs"),           # old actor (None: on-policy, use log_probs)
        ref_log_probs=batch.get("ref_log_probs"),       # needed with --use-kl-loss
        rollout_log_probs=batch.get("rollout_log_probs"),  # engine's, for TIS and the mismatch metric
        num_samples=step_num_samples, num_tokens=step_num_tokens,
    )

``loss`` is already divided by the step's global count, so the gradients of all micro-batches and
DP ranks must be SUMMED. Megatron's schedule averages over micro-batches (divides by
``num_microbatches``) and DP averages gradients (divides by the DP size, context-parallel ranks
included); multiply the loss by ``num_microbatches * dp_size`` before returning it to Megatron, as
slime's ``loss_function`` does, and leave Megatron's own per-token loss normalisation off.
Metrics are detached partials too: sum them over micro-batches and DP ranks. A micro-batch with no
samples gives a zero loss without grad; add ``0 * logits.sum()`` so its backward still runs.

Metric names are slime's: loss, pg_loss, pg_clipfrac, ppo_kl, entropy_loss, kl_loss,
train_rollout_logprob_abs_diff, ois, tis, tis_clipfrac, tis_abs; value_loss, value_clipfrac.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slime_ref.algo.kl import compute_approx_kl
from slime_ref.utils.index_cache import cached_index

# ---------------------------------------------------------------------------------------------
# Reduction
# ---------------------------------------------------------------------------------------------


def count_loss_tokens(loss_masks: list[torch.Tensor]) -> int:
    """Token count for per-token reduction: sum over samples of max(mask sum, 1), as slime counts.

    Given all the samples of one optimizer step, this is that step's ``num_tokens``. The Megatron
    actor needs no all-reduce for it: it counts max(mask sum, 1) per sample once for the whole rollout
    (``loss_token_counts``) and :func:`slime_ref.backends.megatron.data.schedule_rollout` adds up the
    counts of each step's samples across all DP ranks.
    """
    return int(sum(max(int(m.sum().item()), 1) for m in loss_masks))


@dataclass(frozen=True)
class StepMean:
    """Partial of a step-level masked mean over one micro-batch (see the module docstring).

    ``token_weights`` [T] holds each token's weight in the step mean; calling the object on a flat
    [T] tensor returns the weighted sum (a 0-dim tensor, differentiable).
    """

    token_weights: torch.Tensor

    @classmethod
    def build(
        cls, loss_masks: list[torch.Tensor], *, calculate_per_token_loss: bool, num_samples: int, num_tokens: int
    ) -> StepMean:
        if not loss_masks:
            return cls(torch.zeros(0))
        masks = [m.float() for m in loss_masks]
        if calculate_per_token_loss:
            if num_tokens <= 0:
                raise ValueError(f"num_tokens must be positive, got {num_tokens}")
            weights = torch.cat(masks) / num_tokens
        else:
            if num_samples <= 0:
                raise ValueError(f"num_samples must be positive, got {num_samples}")
            weights = torch.cat([m / (m.sum().clamp(min=1) * num_samples) for m in masks])
        return cls(weights)

    def __call__(self, values: torch.Tensor) -> torch.Tensor:
        return (values * self.token_weights.to(values.device)).sum()


def _step_mean(args, loss_masks: list[torch.Tensor], num_samples: int, num_tokens: int) -> StepMean:
    return StepMean.build(
        loss_masks,
        calculate_per_token_loss=args.calculate_per_token_loss,
        num_samples=num_samples,
        num_tokens=num_tokens,
    )


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(tensors) if tensors else torch.zeros(0)


def _segment_ids(lengths: list[int], device=None) -> torch.Tensor:
    """[T] index of the sample each token belongs to."""
    return cached_index(("segment_ids", tuple(lengths), str(device)), lambda: torch.repeat_interleave(
        torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device)))


# ---------------------------------------------------------------------------------------------
# Building blocks (flat [T] tensors)
# ---------------------------------------------------------------------------------------------


def compute_policy_loss(
    ppo_kl: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate per token (Schulman et al., arXiv 1707.06347).

    ratio = exp(-ppo_kl) = pi_theta / pi_old. Loss = max(-ratio * A, -clip(ratio, 1 - eps_clip,
    1 + eps_clip_high) * A). An upper bound wider than the lower one is DAPO's clip-higher
    (arXiv 2503.14476). With ``eps_clip_c`` (> 1), dual-clip PPO (Ye et al., arXiv 1912.09729)
    caps the loss of negative-advantage tokens at -eps_clip_c * A, so a huge ratio cannot blow it up.

    Args:
        ppo_kl: [T] log pi_old - log pi_theta per token (or per sequence, expanded, for GSPO).
        advantages: [T].

    Returns:
        (pg_losses [T], clipfrac [T]): clipfrac is 1 where the clipped term is the larger one.
    """
    ratio = torch.exp(-ppo_kl)
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high) * advantages
    pg_losses = torch.maximum(unclipped, clipped)
    clipfrac = (clipped > unclipped).float()
    if eps_clip_c is not None:
        if eps_clip_c <= 1.0:
            raise ValueError(f"eps_clip_c must be > 1.0 for dual-clip PPO, got {eps_clip_c}")
        capped = torch.minimum(pg_losses, -eps_clip_c * advantages)
        pg_losses = torch.where(advantages < 0, capped, pg_losses)
    return pg_losses, clipfrac


def compute_cispo_loss(
    ppo_kl: torch.Tensor, log_probs: torch.Tensor, advantages: torch.Tensor, eps_clip: float, eps_clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): -sg(clip(ratio)) * A * log pi_theta per token.

    The ratio is clipped under stop-gradient and the gradient flows through ``log_probs``, so clipped
    tokens still contribute a gradient.

    Returns:
        (pg_losses [T], clipfrac [T]): clipfrac is 1 where the ratio was clipped.
    """
    ratio = torch.exp(-ppo_kl)
    clipped_ratio = ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    return -clipped_ratio.detach() * advantages * log_probs, (clipped_ratio != ratio).float()


def sequence_mean_log_ratio(
    old_log_probs: list[torch.Tensor], log_probs: list[torch.Tensor], loss_masks: list[torch.Tensor]
) -> torch.Tensor:
    """GSPO's sequence-level ``ppo_kl`` (Zheng et al., arXiv 2507.18071), expanded to every token.

    s_i = sum_t m_t (log pi_old - log pi_theta) / max(sum_t m_t, 1); exp(-s_i) is the length-normalised
    sequence likelihood ratio (pi_theta(y|x) / pi_old(y|x))^(1/|y|). Gradients reach every token of y.

    Args:
        old_log_probs, log_probs, loss_masks: B tensors [R_i].

    Returns:
        [T] with s_i repeated on each of sample i's tokens.
    """
    lengths = [len(lp) for lp in log_probs]
    if not lengths:
        return torch.zeros(0)
    mask = _flat(loss_masks).float()
    diff = (_flat(old_log_probs) - _flat(log_probs)) * mask
    segment = _segment_ids(lengths, diff.device)
    sums = torch.zeros(len(lengths), dtype=diff.dtype, device=diff.device).index_add(0, segment, diff)
    counts = torch.zeros(len(lengths), device=diff.device).index_add(0, segment, mask).clamp(min=1)
    return (sums / counts)[segment]


def truncated_importance_weights(
    train_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, tis_clip_low: float, tis_clip: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated importance sampling between the trainer's and the engine's log-probs.

    The engine samples with slightly different numerics than the trainer scores, so the rollout is
    mildly off-policy. Weighting each token by w = clip(pi_train / pi_rollout, tis_clip_low, tis_clip)
    corrects it with bounded variance (Yao et al., https://fengyao.notion.site/off-policy-rl).

    Args:
        train_log_probs: [T] old-actor log-probs from the trainer (no grad).
        rollout_log_probs: [T] log-probs the engine reported for the same tokens.

    Returns:
        (weights [T], per-token metrics {"tis": ratio, "tis_clipfrac": 0/1, "tis_abs": |ratio - 1|}).
    """
    ratio = torch.exp(train_log_probs.detach() - rollout_log_probs)
    weights = ratio.clamp(min=tis_clip_low, max=tis_clip)
    metrics = {"tis": ratio, "tis_clipfrac": (weights != ratio).float(), "tis_abs": (ratio - 1).abs()}
    return weights, metrics


# ---------------------------------------------------------------------------------------------
# Loss functions (per-sample lists of one micro-batch in, scalar loss + metrics out)
# ---------------------------------------------------------------------------------------------


def policy_loss_function(
    args,
    *,
    log_probs: list[torch.Tensor],
    advantages: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    num_samples: int,
    num_tokens: int,
    entropy: list[torch.Tensor] | None = None,
    old_log_probs: list[torch.Tensor] | None = None,
    ref_log_probs: list[torch.Tensor] | None = None,
    rollout_log_probs: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """slime's ``policy_loss_function``: PPO/GSPO/CISPO surrogate + entropy bonus + KL loss, with TIS.

    ``--eps-clip-c`` (dual clip) is applied here; slime v0.3.1 declares the flag but does not pass it
    to its loss (fixed after the release), so there it has no effect.

    Args:
        args: reads advantage_estimator, eps_clip, eps_clip_high, eps_clip_c, entropy_coef,
            use_kl_loss, kl_loss_coef, kl_loss_type, use_unbiased_kl, use_tis, tis_clip,
            tis_clip_low, use_rollout_logprobs, calculate_per_token_loss.
        log_probs: B tensors [R_i], current policy log-probs of the response tokens (with grad).
        advantages: B tensors [R_i].
        loss_masks: B tensors [R_i] of 0/1.
        num_samples, num_tokens: the optimizer step's global counts (module docstring).
        entropy: B tensors [R_i], the current policy's entropy per token (needed if entropy_coef != 0).
        old_log_probs: B tensors [R_i], the old actor's log-probs; None means on-policy
            (the detached ``log_probs``). Ignored with ``--use-rollout-logprobs``.
        ref_log_probs: B tensors [R_i], needed with ``--use-kl-loss``.
        rollout_log_probs: B tensors [R_i] from the engine; needed with ``--use-tis`` or
            ``--use-rollout-logprobs``.

    Returns:
        (loss, metrics): loss is a 0-dim tensor with grad; metrics are detached 0-dim tensors.
    """
    step_mean = _step_mean(args, loss_masks, num_samples, num_tokens)
    if args.use_rollout_logprobs:
        if rollout_log_probs is None:
            raise ValueError("--use-rollout-logprobs needs rollout_log_probs")
        old_log_probs = rollout_log_probs
    elif old_log_probs is None:
        old_log_probs = [lp.detach() for lp in log_probs]

    current = _flat(log_probs)
    old = _flat(old_log_probs).to(current.device)
    adv = _flat(advantages).to(current.device)

    if args.advantage_estimator == "gspo":
        ppo_kl = sequence_mean_log_ratio(old_log_probs, log_probs, loss_masks)
    else:
        ppo_kl = old - current
    if args.advantage_estimator == "cispo":
        pg_losses, clipfrac = compute_cispo_loss(ppo_kl, current, adv, args.eps_clip, args.eps_clip_high)
    else:
        pg_losses, clipfrac = compute_policy_loss(ppo_kl, adv, args.eps_clip, args.eps_clip_high, args.eps_clip_c)

    metrics: dict[str, torch.Tensor] = {}
    if args.use_tis:
        if rollout_log_probs is None:
            raise ValueError("--use-tis needs rollout_log_probs")
        # the old actor's log-probs (not the engine's, which is what TIS corrects for)
        weights, tis_metrics = truncated_importance_weights(
            old, _flat(rollout_log_probs).to(old.device), args.tis_clip_low, args.tis_clip
        )
        pg_losses = pg_losses * weights
        metrics["ois"] = step_mean(torch.exp(-ppo_kl).detach())
        metrics.update({name: step_mean(value) for name, value in tis_metrics.items()})

    pg_loss = step_mean(pg_losses)
    loss = pg_loss
    if entropy is not None:
        entropy_loss = step_mean(_flat(entropy).to(current.device))
        loss = loss - args.entropy_coef * entropy_loss  # entropy bonus: higher entropy lowers the loss
        metrics["entropy_loss"] = entropy_loss
    elif args.entropy_coef != 0:
        raise ValueError("entropy_coef != 0 needs the per-token entropy")

    if args.use_kl_loss:
        if ref_log_probs is None:
            raise ValueError("--use-kl-loss needs ref_log_probs")
        importance_ratio = torch.exp(current - old) if args.use_unbiased_kl else None
        kl = compute_approx_kl(
            current, _flat(ref_log_probs).to(current.device), args.kl_loss_type, importance_ratio=importance_ratio
        )
        kl_loss = step_mean(kl)
        loss = loss + args.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss

    if rollout_log_probs is not None:
        # how far the trainer's scores are from the engine's for the same tokens
        compared = current if args.use_rollout_logprobs else old
        metrics["train_rollout_logprob_abs_diff"] = step_mean((compared - _flat(rollout_log_probs)).abs())

    metrics.update(loss=loss, pg_loss=pg_loss, pg_clipfrac=step_mean(clipfrac), ppo_kl=step_mean(ppo_kl))
    return loss, {name: value.detach() for name, value in metrics.items()}


def value_loss_function(
    args,
    *,
    values: list[torch.Tensor],
    old_values: list[torch.Tensor],
    returns: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    num_samples: int,
    num_tokens: int,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss for the PPO critic: max((V_clip - G)^2, (V - G)^2).

    V_clip = V_old + clip(V - V_old, -value_clip, value_clip) keeps the critic near its old
    predictions (PPO, arXiv 1707.06347, as in the OpenAI baselines implementation).

    Args:
        args: reads value_clip, calculate_per_token_loss.
        values: B tensors [R_i], the critic's current values (with grad).
        old_values: B tensors [R_i], its values when the advantages were computed.
        returns: B tensors [R_i], GAE returns.

    Returns:
        (loss, {"value_loss", "value_clipfrac"}).
    """
    step_mean = _step_mean(args, loss_masks, num_samples, num_tokens)
    v = _flat(values)
    v_old = _flat(old_values).to(v.device)
    g = _flat(returns).to(v.device)
    clipped = v_old + (v - v_old).clamp(-args.value_clip, args.value_clip)
    losses = torch.maximum((clipped - g).pow(2), (v - g).pow(2))
    loss = step_mean(losses)
    clipfrac = step_mean(((v - v_old).abs() > args.value_clip).float())
    return loss, {"value_loss": loss.detach(), "value_clipfrac": clipfrac.detach()}


def sft_loss_function(
    args,
    *,
    log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    num_samples: int,
    num_tokens: int,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Negative log-likelihood of the response tokens (``--loss-type sft_loss``).

    Args:
        args: reads calculate_per_token_loss.
        log_probs: B tensors [R_i], log-probs of the target response tokens (with grad).

    Returns:
        (loss, {"loss"}).
    """
    step_mean = _step_mean(args, loss_masks, num_samples, num_tokens)
    loss = -step_mean(_flat(log_probs))
    return loss, {"loss": loss.detach()}
