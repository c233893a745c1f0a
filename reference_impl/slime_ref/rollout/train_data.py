"""A rollout's Samples into the trainer's data: flattening nested hook output, slime's rollout-id rule,
slime's ``_convert_samples_to_train_data`` dict, and the --save/--load-debug-rollout-data files."""

from __future__ import annotations

from pathlib import Path


def save_debug_rollout_data(path_template: str, rollout_id: int, samples) -> None:
    """slime's --save-debug-rollout-data: one file per rollout, written atomically."""
    import io

    import torch

    from slime_ref.utils.fileio import atomic_write_bytes

    buffer = io.BytesIO()
    torch.save({"rollout_id": rollout_id, "samples": [s.to_dict() for s in samples]}, buffer)
    atomic_write_bytes(path_template.format(rollout_id=rollout_id), buffer.getvalue())


def load_debug_rollout_data(path_template: str, rollout_id: int) -> list:
    """slime's --load-debug-rollout-data: the samples a --save-debug-rollout-data file holds."""
    import torch

    from slime_ref.errors import UserError
    from slime_ref.types import Sample

    path = Path(path_template.format(rollout_id=rollout_id))
    if not path.is_file():
        raise UserError(f"--load-debug-rollout-data: no file {path} for rollout {rollout_id}")
    try:
        saved = torch.load(path, weights_only=False)
        return [Sample.from_dict(d) for d in saved["samples"]]
    except (OSError, RuntimeError, KeyError, TypeError, ValueError) as e:
        raise UserError(f"--load-debug-rollout-data: {path} is not a file --save-debug-rollout-data wrote ({e})") \
            from None


def flatten_rollout(groups) -> list:
    """A rollout's Samples, flat and in order, as slime flattens a rollout's output until its items
    are Samples: a group may hold lists of Samples (a --custom-generate-function-path hook that
    returns several for one input sample), nested to any depth.

    Rewards are normalised per ``Sample.group_index``; a Sample that a hook made without one joins
    its group's: the one index its group's other Samples carry, or a new index of its own when none
    carries one. (A rollout whose items are bare Samples, not groups, is left as it is.)
    """
    from slime_ref.rollout.filters import flatten_samples

    check_rollout_ids(groups)
    per_group = [flatten_samples(group) for group in groups]
    known = {s.group_index for leaves in per_group for s in leaves if s.group_index is not None}
    next_free = max(known, default=-1) + 1
    for group, leaves in zip(groups, per_group):
        if not isinstance(group, (list, tuple)) or all(s.group_index is not None for s in leaves):
            continue
        own = {s.group_index for s in leaves if s.group_index is not None}
        if len(own) > 1:
            continue  # a group already split across indices: nothing to join
        if own:
            index = own.pop()
        else:
            index, next_free = next_free, next_free + 1
        for s in leaves:
            if s.group_index is None:
                s.group_index = index
    return [s for leaves in per_group for s in leaves]


def check_rollout_ids(node, depth: int = 0) -> None:
    """slime's rule for a generate hook that returns several Samples for one input sample (a
    rollout's output nested three deep: prompt x sample x Samples of one generation): every Sample of
    such a list carries one shared, set ``Sample.rollout_id``, so that the loss counts the generation
    once. slime v0.3.1 stops the run otherwise (``_validate_rollout_id_annotated``); so does slime-ref,
    with the fix in the message."""
    if not isinstance(node, (list, tuple)):
        return
    if node and not isinstance(node[0], (list, tuple)):
        if depth >= 2 and len(node) > 1:
            ids = [getattr(s, "rollout_id", None) for s in node]
            if None in ids or len(set(ids)) > 1:
                from slime_ref.errors import UserError

                raise UserError(f"a --custom-generate-function-path hook returned {len(node)} Samples for one "
                                f"input sample with Sample.rollout_id {ids}: slime requires one shared, set "
                                "rollout_id on all of them (set sample.rollout_id to the same number on each "
                                "Sample the call returns)")
        return
    for item in node:
        check_rollout_ids(item, depth + 1)


def samples_to_train_data(samples, raw_rewards, rewards) -> dict:
    """slime's ``_convert_samples_to_train_data``: per-sample lists the trainer consumes."""
    data = {
        "tokens": [s.tokens for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "rewards": [float(r) for r in rewards],
        "raw_reward": [float(r) for r in raw_rewards],
        "truncated": [int(s.status.name == "TRUNCATED") for s in samples],
        "loss_masks": [
            [0] * s.response_length if s.remove_sample
            else (list(s.loss_mask) if s.loss_mask is not None else [1] * s.response_length)
            for s in samples
        ],
        "sample_indices": [s.index for s in samples],
    }
    if all(s.rollout_log_probs is not None for s in samples):
        data["rollout_log_probs"] = [list(s.rollout_log_probs) for s in samples]
    return data
