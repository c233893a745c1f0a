"""Hooks the fault tests pass to runs (this folder is on the runs' PYTHONPATH)."""

from __future__ import annotations

import math


async def long_generate(args, sample, sampling_params, evaluation=False):
    """The default generate, made to run to --rollout-max-response-len (ignore_eos), so that a fault
    lands while requests are in flight."""
    from slime_ref.rollout.sglang_rollout import generate

    return await generate(args, sample, {**sampling_params, "ignore_eos": True})


def _bad_on_third(sample, value):
    return value if sample.index == 2 else 1.0


def reward_none_on_third(args, sample):
    return _bad_on_third(sample, None)


def reward_nan_on_third(args, sample):
    return _bad_on_third(sample, math.nan)


def reward_raises_on_third(args, sample):
    if sample.index == 2:
        raise KeyError("answer")
    return 1.0
