"""Glue between a packed micro-batch and the pure loss/advantage functions of ``slime_ref.algo``.

The maths lives in ``slime_ref.algo`` (per-sample response tensors in, step-normalised partials
out). Here we only pick the right per-sample fields of a micro-batch and pass the optimizer
step's global sample/token counts, so that the micro-batch losses of all ranks add up to the
step's loss.
"""

from __future__ import annotations

import torch

from slime_ref.algo.advantages import compute_advantages_and_returns
from slime_ref.algo.losses import policy_loss_function, sft_loss_function, value_loss_function


def micro_batch_loss(args, mb, log_probs: list[torch.Tensor], entropy: list[torch.Tensor], step):
    """(loss, detached metrics) of one micro-batch; both are partials of the step's value.

    Args:
        mb: the ``PackedMicroBatch`` (its ``fields`` hold the per-sample train data).
        log_probs, entropy: [R_i] tensors of the current policy, one per sample in ``mb``.
        step: the ``StepSchedule`` (global ``num_samples`` / ``num_tokens`` of the step).
    """
    f = mb.fields
    counts = {"num_samples": step.num_samples, "num_tokens": step.num_tokens}
    if args.loss_type == "sft_loss":
        return sft_loss_function(args, log_probs=log_probs, loss_masks=f["loss_masks"], **counts)
    if args.loss_type != "policy_loss":
        raise ValueError(f"unsupported --loss-type {args.loss_type}")
    return policy_loss_function(
        args,
        log_probs=log_probs,
        entropy=entropy,
        advantages=f["advantages"],
        loss_masks=f["loss_masks"],
        old_log_probs=_present(f.get("log_probs")),
        ref_log_probs=_present(f.get("ref_log_probs")),
        rollout_log_probs=_present(f.get("rollout_log_probs")),
        **counts,
    )


def value_micro_batch_loss(args, mb, values: list[torch.Tensor], step):
    """The critic's clipped value loss of one micro-batch (a partial of the step's, as above)."""
    f = mb.fields
    return value_loss_function(
        args, values=values, old_values=f["values"], returns=f["returns"], loss_masks=f["loss_masks"],
        num_samples=step.num_samples, num_tokens=step.num_tokens,
    )


def advantages_and_returns(args, rollout: dict, indices: list[int], process_group=None):
    """Advantages and returns of the samples ``indices`` (this rank's share) of a rollout."""

    def pick(key):
        values = rollout.get(key)
        return None if values is None else _present([values[i] for i in indices])

    return compute_advantages_and_returns(
        args,
        rewards=torch.as_tensor([float(rollout["rewards"][i]) for i in indices], dtype=torch.float32),
        loss_masks=[rollout["loss_masks"][i] for i in indices],
        log_probs=pick("log_probs"),
        ref_log_probs=pick("ref_log_probs"),
        rollout_log_probs=pick("rollout_log_probs"),
        values=pick("values"),
        process_group=process_group,
    )


def _present(values):
    """A per-sample list, or None when the field was not computed for these samples."""
    if values is None or any(v is None for v in values):
        return None
    return values
