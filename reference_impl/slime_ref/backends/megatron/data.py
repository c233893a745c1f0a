"""Which samples each data-parallel rank trains on, in which micro-batches, and the packed tensors.

One rollout's train data (every sample of the rollout, on every rank) is split into optimizer
steps of ``--global-batch-size`` consecutive samples. Each step's samples are grouped into
micro-batches, either ``--micro-batch-size`` samples each or, with ``--use-dynamic-batch-size``,
first-fit packs of at most ``--max-tokens-per-gpu`` tokens. The number of micro-batches is made a
multiple of the data-parallel size and they are dealt to the ranks round-robin, so every rank
runs the same number of micro-batches per step (pipeline stages must agree); with
``--balance-data`` they are dealt by estimated FLOPs instead. This is slime's
"pack first, distribute second" schedule (slime/utils/dp_schedule.py).

A micro-batch becomes one pack: its samples' tokens concatenated into a single [1, T] sequence with
a :class:`~slime_ref.backends.megatron.layers.PackedSequence` describing the boundaries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from slime_ref.backends.megatron.layers import PackedSequence, to_device
from slime_ref.errors import UserError


@dataclass(frozen=True)
class StepSchedule:
    """One optimizer step as seen by one DP rank.

    ``micro_batches``: this rank's micro-batches, each a list of sample indices into the rollout.
    ``num_samples``: samples in the whole step (all DP ranks); ``num_tokens``: their loss tokens
    (sum over samples of max(loss-mask sum, 1)). The loss functions divide by these.
    """

    micro_batches: list[list[int]]
    num_samples: int
    num_tokens: int


def first_fit_pack(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """First-fit bins of indices with token sums <= max_tokens (an oversized sample sits alone)."""
    bins: list[list[int]] = []
    sums: list[int] = []
    for i, n in enumerate(lengths):
        for j, s in enumerate(sums):
            if s + n <= max_tokens:
                bins[j].append(i)
                sums[j] += n
                break
        else:
            bins.append([i])
            sums.append(n)
    return bins


def split_largest_bins(bins: list[list[int]], target: int, lengths: list[int]) -> None:
    """Grow ``bins`` in place to ``target`` bins by halving the largest multi-sample bin (by tokens)."""
    while len(bins) < target:
        candidates = [(sum(lengths[i] for i in b), k) for k, b in enumerate(bins) if len(b) > 1]
        if not candidates:
            return
        _, k = max(candidates)
        halves, sums = [[], []], [0, 0]
        for i in sorted(bins[k], key=lambda i: -lengths[i]):
            h = 0 if sums[0] <= sums[1] else 1
            halves[h].append(i)
            sums[h] += lengths[i]
        bins[k] = sorted(halves[0])
        bins.append(sorted(halves[1]))


def balanced_partition(costs: list[float], parts: int) -> list[list[int]]:
    """Split item indices into ``parts`` lists of equal length with close cost sums.

    Largest cost first, each item to the lightest part that still has room (``len(costs)`` must
    be a multiple of ``parts``). slime's --balance-data uses Karmarkar-Karp for the same goal;
    greedy LPT is within 4/3 of optimal and deterministic. Each part is returned sorted.
    """
    size = len(costs) // parts
    loads = [0.0] * parts
    out: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min((r for r in range(parts) if len(out[r]) < size), key=lambda r: (loads[r], r))
        out[r].append(i)
        loads[r] += costs[i]
    return [sorted(p) for p in out]


def schedule_rollout(
    total_lengths: list[int],
    loss_token_counts: list[int],
    *,
    global_batch_size: int,
    dp_rank: int,
    dp_size: int,
    micro_batch_size: int = 1,
    use_dynamic_batch_size: bool = False,
    max_tokens_per_gpu: int | None = None,
    workload: Callable[[int], float] | None = None,
) -> list[StepSchedule]:
    """This DP rank's micro-batch schedule for every optimizer step of one rollout.

    Args:
        total_lengths: prompt + response tokens of each sample.
        loss_token_counts: each sample's max(loss-mask sum, 1).
        global_batch_size: samples per optimizer step (all DP ranks together). Trailing samples
            that do not fill a step are not trained on.
        workload: ``--balance-data``: estimated cost of a sample from its length. Micro-batches
            then go to ranks by :func:`balanced_partition` of their summed cost instead of
            round-robin (still the same count per rank).

    Returns:
        one StepSchedule per step, ``len(total_lengths) // global_batch_size`` of them.
    """
    num_steps = len(total_lengths) // global_batch_size
    if num_steps < 1:
        raise UserError(
            f"--global-batch-size {global_batch_size}: the rollout has only {len(total_lengths)} samples; "
            "make rollout_batch_size * n_samples_per_prompt at least the global batch size"
        )
    if use_dynamic_batch_size and not max_tokens_per_gpu:
        raise UserError("--use-dynamic-batch-size needs --max-tokens-per-gpu")
    steps = []
    for step in range(num_steps):
        indices = list(range(step * global_batch_size, (step + 1) * global_batch_size))
        lengths = [total_lengths[i] for i in indices]
        if use_dynamic_batch_size:
            bins = first_fit_pack(lengths, max_tokens_per_gpu)
            target = -(-len(bins) // dp_size) * dp_size
            split_largest_bins(bins, target, lengths)
            if len(bins) % dp_size:
                raise UserError(
                    f"--global-batch-size {global_batch_size}: a step has too few samples to give each of "
                    f"the {dp_size} data-parallel ranks a micro-batch"
                )
        else:
            if global_batch_size % (micro_batch_size * dp_size):
                raise UserError(
                    f"--global-batch-size {global_batch_size} must be a multiple of --micro-batch-size "
                    f"{micro_batch_size} x data-parallel size {dp_size} (or use --use-dynamic-batch-size)"
                )
            bins = [list(range(i, i + micro_batch_size)) for i in range(0, global_batch_size, micro_batch_size)]
        if workload is None:
            my_bins = list(range(dp_rank, len(bins), dp_size))
        else:
            costs = [sum(workload(lengths[i]) for i in b) for b in bins]
            my_bins = balanced_partition(costs, dp_size)[dp_rank]
        mine = [[indices[i] for i in bins[k]] for k in my_bins]
        steps.append(StepSchedule(mine, global_batch_size, sum(loss_token_counts[i] for i in indices)))
    return steps


@dataclass
class PackedMicroBatch:
    """The tensors of one micro-batch, ready for the model and the loss.

    ``tokens`` [1, T] on the model's device; per-sample lists are in pack order and hold the
    response-length tensors of the train data (loss masks, advantages, log-probs, ...).
    """

    sample_indices: list[int]
    tokens: torch.Tensor
    packed: PackedSequence
    total_lengths: list[int]
    response_lengths: list[int]
    fields: dict[str, list[torch.Tensor]]


def pack_micro_batch(rollout: dict, indices: list[int], device, keys: tuple[str, ...] = ()) -> PackedMicroBatch:
    """Concatenate the samples ``indices`` of ``rollout`` into one pack.

    ``rollout["tokens"]`` holds per-sample 1-D token tensors; ``keys`` names other per-sample
    lists (1-D response tensors) to carry along, in the same order.
    """
    seqs = [rollout["tokens"][i] for i in indices]
    lengths = [int(s.numel()) for s in seqs]
    return PackedMicroBatch(
        sample_indices=list(indices),
        tokens=to_device(torch.cat(seqs), device)[None],
        packed=PackedSequence.from_lengths(lengths, device),
        total_lengths=lengths,
        response_lengths=[int(rollout["response_lengths"][i]) for i in indices],
        fields={k: [rollout[k][i] for i in indices] for k in keys if rollout.get(k) is not None},
    )
