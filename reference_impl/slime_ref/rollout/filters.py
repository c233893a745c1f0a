"""Dynamic sampling filters (slime's ``filter_hub``): keep or drop a finished group of samples.

DAPO (arXiv 2503.14476) drops groups whose rewards are all equal: their group-normalised advantages
are all zero, so they only dilute the batch. ``--dynamic-sampling-filter-path`` names a function
``f(args, samples: list[Sample], **kwargs) -> DynamicFilterOutput`` (a plain bool is accepted too);
the rollout keeps sampling ``--over-sampling-batch-size`` more prompts until ``--rollout-batch-size``
groups are kept. Dropped groups are counted per reason as ``rollout/dynamic_filter/drop_<reason>``.

``--dynamic-sampling-max-groups N`` (slime-ref only; slime keeps sampling) bounds that search: once N
groups have finished in one rollout and fewer than ``--rollout-batch-size`` were kept, the rollout
stops and fills the batch with :func:`best_dropped_groups`. A rehearsal on a random model, whose
groups almost never differ in reward, then ends instead of drawing thousands of groups.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from slime_ref.types import Sample


def flatten_samples(nested) -> list[Sample]:
    """The Samples of a rollout's output, a group or any nesting of lists of them, in order.

    A ``--custom-generate-function-path`` hook may return a list of Samples for one input sample,
    so a group can hold lists, and a rollout lists of such groups; slime flattens until the items
    are Samples. A bare Sample is a list of one.
    """
    return list(_leaves(nested))


def _leaves(node) -> Iterator[Sample]:
    if isinstance(node, (list, tuple)):
        for item in node:
            yield from _leaves(item)
    else:
        yield node


SPREAD_EPS = 1e-6  # rewards whose standard deviation is at most this are "all equal", as in the filters


def reward_spread(args, group) -> tuple[float, float]:
    """(standard deviation, mean) of a group's rewards (``sample.get_reward_value(args)`` of every
    Sample in it, lists flattened). The deviation is the sample one (n - 1), as
    :func:`check_reward_nonzero_std` measures it; 0 for a group of one. A group whose rewards are not
    numbers (a dict without ``--reward-key``, or none) counts as (0, 0)."""
    try:
        rewards = [float(s.get_reward_value(args)) for s in flatten_samples(group)]
    except (TypeError, ValueError):
        return 0.0, 0.0
    if not rewards:
        return 0.0, 0.0
    mean = sum(rewards) / len(rewards)
    if len(rewards) < 2:
        return 0.0, mean
    return (sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) ** 0.5, mean


def best_dropped_groups(args, dropped: list, n: int) -> list:
    """The ``n`` best of the groups the dynamic filter dropped, best first, to fill a starved batch.

    ``dropped`` is in draw order. Best is the highest standard deviation of rewards (the group's
    advantages are the least zero), then the highest mean reward, then the earliest drawn; see
    :func:`reward_spread`. Fewer than ``n`` groups give all of them. Pure: reads the rewards only.
    """
    if n <= 0:
        return []
    ranked = sorted(range(len(dropped)), key=lambda i: (*(-x for x in reward_spread(args, dropped[i])), i))
    return [dropped[i] for i in ranked[:n]]


def guard_metrics(args, finished: list, dropped: list, *, starved: bool, filled: int) -> dict[str, int]:
    """The starvation guard's record of one rollout (a dynamic filter set): every finished group, those
    the filter dropped (the ones used to fill included), those of them whose rewards were not all
    equal (std > 1e-6: dropped by the filter's own choice, not for lack of signal), whether the guard
    filled the batch (1/0) and with how many dropped groups."""
    return {
        "rollout/dynamic_filter/groups_seen": len(finished),
        "rollout/dynamic_filter/groups_dropped": len(dropped),
        "rollout/dynamic_filter/dropped_with_spread": sum(reward_spread(args, g)[0] > SPREAD_EPS for g in dropped),
        "rollout/dynamic_filter/starved": int(starved),
        "rollout/dynamic_filter/filled": filled,
    }


@dataclass
class DynamicFilterOutput:
    keep: bool
    reason: str | None = None  # why a group was dropped, for the drop metrics
    # keep a rejected group anyway when dropping it would leave too few to fill the rollout batch
    keep_when_insufficient: bool = False


def check_reward_nonzero_std(args, samples: list[Sample], **kwargs) -> DynamicFilterOutput:
    """Keep a group only if its rewards are not all the same (std > 1e-6)."""
    rewards = [sample.get_reward_value(args) for sample in samples]
    keep = bool(torch.tensor(rewards, dtype=torch.float64).std() > 1e-6)
    return DynamicFilterOutput(keep=keep, reason=None if keep else f"zero_std_{round(rewards[0], 1)}")


def check_reward_nonzero_std_with_fallback(args, samples: list[Sample], **kwargs) -> DynamicFilterOutput:
    """As :func:`check_reward_nonzero_std`, but never forces another sampling round."""
    output = check_reward_nonzero_std(args, samples, **kwargs)
    output.keep_when_insufficient = True
    return output


def call_dynamic_filter(filter_fn: Callable | None, args, samples: list[Sample], **kwargs) -> DynamicFilterOutput:
    """Run a filter (None keeps everything); a bool result becomes ``DynamicFilterOutput(keep=...)``."""
    if filter_fn is None:
        return DynamicFilterOutput(keep=True)
    output = filter_fn(args, samples, **kwargs)
    return output if isinstance(output, DynamicFilterOutput) else DynamicFilterOutput(keep=bool(output))


def should_drop(output: DynamicFilterOutput, *, remaining_batch_size: int, target_data_size: int) -> bool:
    """Drop unless kept, or rejected-but-needed: in flight + kept groups no longer exceed the target."""
    if output.keep:
        return False
    return not (output.keep_when_insufficient and remaining_batch_size <= target_data_size)


def drop_metrics(reasons: Iterable[str | None]) -> dict[str, int]:
    """``{"rollout/dynamic_filter/drop_<reason>": count}`` for the dropped groups' reasons."""
    counts = Counter(reason for reason in reasons if reason)
    return {f"rollout/dynamic_filter/drop_{reason}": n for reason, n in counts.items()}
