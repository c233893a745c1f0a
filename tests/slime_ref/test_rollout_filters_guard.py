"""--dynamic-sampling-max-groups (slime-ref only): a rollout whose dynamic filter keeps too few groups
stops after that many finished groups and fills its batch with the best dropped ones; without the flag
the rollout samples on, as slime's does. The rollouts here run the default rollout function with a
generate hook that answers without an engine, so no engine is started."""

from __future__ import annotations

import importlib
import sys
from argparse import Namespace

import pytest

from slime_ref.arguments import parse_args
from slime_ref.errors import UserError
from slime_ref.rollout import filters, sglang_rollout
from slime_ref.rollout.filters import best_dropped_groups, guard_metrics, reward_spread
from slime_ref.types import Sample

GUARD_KEYS = ("groups_seen", "groups_dropped", "dropped_with_spread", "starved", "filled")

# ---------------------------------------------------------------------------------------------
# the selection, exactly


def _group(*rewards):
    """A group of Samples with these rewards; a tuple is the list of Samples one generate call returned."""
    return [[Sample(reward=x) for x in r] if isinstance(r, tuple) else Sample(reward=r) for r in rewards]


def test_best_dropped_groups_rank_by_spread_then_mean_then_draw_order():
    args = Namespace(reward_key=None)
    g0 = _group(1, 1, 1, 1)          # std 0,        mean 1
    g1 = _group(0, 1, 0, 1)          # std sqrt(1/3), mean 0.5
    g2 = _group(0, 0, 0, 0)          # std 0,        mean 0
    g3 = _group(1, 0, 1, 1)          # std 0.5,      mean 0.75
    g4 = _group(1, 0, 1, 0)          # std sqrt(1/3), mean 0.5 (as g1, drawn later)
    g5 = _group((2, 0), (1,))        # a list-returning generate's group: [2, 0, 1], std 1, mean 1
    dropped = [g0, g1, g2, g3, g4, g5]

    assert reward_spread(args, g3) == (0.5, 0.75)
    assert reward_spread(args, g5) == (1.0, 1.0)
    assert reward_spread(args, g2) == (0.0, 0.0)
    assert reward_spread(args, _group(0.25)) == (0.0, 0.25)  # one sample: no spread, not NaN

    assert best_dropped_groups(args, dropped, 3) == [g5, g1, g4]
    assert best_dropped_groups(args, dropped, 10) == [g5, g1, g4, g3, g0, g2]
    assert best_dropped_groups(args, dropped, 0) == []
    assert best_dropped_groups(args, [], 2) == []

    # dict rewards are read through --reward-key
    scored = [[Sample(reward={"score": 0.0, "acc": False}), Sample(reward={"score": 1.0, "acc": True})],
              [Sample(reward={"score": 1.0, "acc": True})] * 2]
    assert best_dropped_groups(Namespace(reward_key="score"), scored, 1) == [scored[0]]

    kept = _group(0, 1, 1, 1)
    assert guard_metrics(args, [*dropped, kept], dropped, starved=True, filled=3) == {
        "rollout/dynamic_filter/groups_seen": 7,
        "rollout/dynamic_filter/groups_dropped": 6,
        "rollout/dynamic_filter/dropped_with_spread": 4,  # g1, g3, g4, g5
        "rollout/dynamic_filter/starved": 1,
        "rollout/dynamic_filter/filled": 3,
    }


# ---------------------------------------------------------------------------------------------
# the rollout

HOOKS = '''
from slime_ref.rollout.filters import DynamicFilterOutput
from slime_ref.types import Sample

FINISHED = []   # every finished group, as --rollout-all-samples-process-path sees them
CALLS = []      # one entry per dynamic-filter call


async def answer(args, sample, sampling_params):
    """No engine: a one-token answer. Groups of even group_index reward their first sample (their
    rewards differ); odd groups reward none."""
    sample.tokens = [7, 8, 9, 1]
    sample.response, sample.response_length = "a", 1
    sample.rollout_log_probs, sample.status = [-0.5], Sample.Status.COMPLETED
    first = sample.index % args.n_samples_per_prompt == 0
    sample.reward = 1.0 if sample.group_index % 2 == 0 and first else 0.0
    return sample


def drop_all(args, samples, **kwargs):
    CALLS.append(samples[0].group_index)
    return DynamicFilterOutput(keep=False, reason="test")


def drop_first_three(args, samples, **kwargs):
    CALLS.append(samples[0].group_index)
    return DynamicFilterOutput(keep=len(CALLS) > 3, reason="test")


def record(args, groups, get_samples):
    FINISHED.extend(groups)
'''


@pytest.fixture
def hooks(tmp_path, monkeypatch):
    (tmp_path / "guard_hooks.py").write_text(HOOKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("guard_hooks", None)
    yield importlib.import_module("guard_hooks")
    sys.modules.pop("guard_hooks", None)


def guard_args(tiny, tmp_path, *extra):
    args = parse_args([
        "--hf-checkpoint", str(tiny.model_dir), "--prompt-data", str(tiny.train_path), "--input-key", "prompt",
        "--label-key", "label", "--apply-chat-template", "--num-rollout", "1", "--rollout-batch-size", "2",
        "--n-samples-per-prompt", "2", "--global-batch-size", "4", "--rollout-max-response-len", "4",
        "--actor-num-gpus-per-node", "1", "--output-dir", str(tmp_path / "run"),
        "--custom-generate-function-path", "guard_hooks.answer",
        "--rollout-all-samples-process-path", "guard_hooks.record", *extra,
    ])
    args.sglang_router_ip, args.sglang_router_port = "127.0.0.1", 9  # never contacted: the hook answers
    return args


def generate(args):
    """The rollout manager's generate (train data, metrics) without engines or Ray."""
    from slime_ref.data.source import load_tokenizer, make_data_source
    from slime_ref.ray.rollout_manager import RolloutManager
    from slime_ref.utils.hooks import load_function

    manager = RolloutManager(args, placement=None)
    manager.data_source = make_data_source(args, load_tokenizer(args))
    manager.rollout_fn = load_function(args.rollout_function_path, "--rollout-function-path")
    return manager.generate(0)


def test_a_filter_that_drops_everything_ends_with_a_full_batch_of_the_best_dropped_groups(tiny, tmp_path, hooks):
    args = guard_args(tiny, tmp_path, "--dynamic-sampling-filter-path", "guard_hooks.drop_all",
                      "--dynamic-sampling-max-groups", "4")
    data, metrics = generate(args)

    seen = len(hooks.FINISHED)
    assert seen >= 4 and len(hooks.CALLS) == seen  # stopped once 4 had finished (a round may end a few more)
    # a full batch: --rollout-batch-size 2 groups of 2, trained on
    assert len(data["tokens"]) == len(data["rewards"]) == 4
    # filled with the groups of the largest spread: those of even group_index, earliest drawn first
    finished = sorted(hooks.FINISHED, key=lambda g: g[0].index)
    best = best_dropped_groups(args, finished, 2)
    assert data["sample_indices"] == sorted(s.index for g in best for s in g)
    assert data["raw_reward"] == [1.0, 0.0, 1.0, 0.0]
    spread = sum(g[0].group_index % 2 == 0 for g in hooks.FINISHED)
    assert spread >= 2
    assert {k: metrics[f"rollout/dynamic_filter/{k}"] for k in GUARD_KEYS} == {
        "groups_seen": seen, "groups_dropped": seen, "dropped_with_spread": spread, "starved": 1, "filled": 2}
    assert metrics["rollout/dynamic_filter/drop_test"] == seen  # the per-reason count stays


@pytest.mark.parametrize("max_groups", [None, "100"])
def test_without_starvation_the_guard_is_not_consulted(tiny, tmp_path, hooks, monkeypatch, max_groups):
    """No flag (slime's behaviour), or a bound the rollout does not reach: the filter alone decides."""
    def never(*a, **kw):
        raise AssertionError("the guard filled a batch the filter filled itself")

    monkeypatch.setattr(sglang_rollout, "best_dropped_groups", never)
    extra = ["--dynamic-sampling-max-groups", max_groups] if max_groups else []
    args = guard_args(tiny, tmp_path, "--dynamic-sampling-filter-path", "guard_hooks.drop_first_three", *extra)
    data, metrics = generate(args)

    dropped = set(hooks.CALLS[:3])
    assert len(data["tokens"]) == 4
    kept_groups = {i // 2 for i in data["sample_indices"]}
    assert len(kept_groups) == 2 and not kept_groups & dropped  # only groups the filter kept
    seen = len(hooks.FINISHED)
    assert {k: metrics[f"rollout/dynamic_filter/{k}"] for k in GUARD_KEYS if k != "dropped_with_spread"} == {
        "groups_seen": seen, "groups_dropped": 3, "starved": 0, "filled": 0}
    assert metrics["rollout/dynamic_filter/drop_test"] == 3


def test_no_filter_no_guard_metrics(tiny, tmp_path, hooks):
    _, metrics = generate(guard_args(tiny, tmp_path, "--dynamic-sampling-max-groups", "2"))
    assert not any(k.startswith("rollout/dynamic_filter/") for k in metrics)
    assert len(hooks.FINISHED) == 2


def test_the_flag_is_slime_refs_own_and_bounded_below_by_the_batch():
    minimal = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--global-batch-size", "8",
               "--num-rollout", "1"]
    assert parse_args(minimal).dynamic_sampling_max_groups is None  # unlimited, as slime
    assert parse_args([*minimal, "--dynamic-sampling-max-groups", "4"]).dynamic_sampling_max_groups == 4
    with pytest.raises(UserError, match="--dynamic-sampling-max-groups 3 must be >= --rollout-batch-size 4"):
        parse_args([*minimal, "--dynamic-sampling-max-groups", "3"])
    with pytest.raises(UserError, match="--dynamic-sampling-max-groups must be a positive integer"):
        parse_args([*minimal, "--dynamic-sampling-max-groups", "0"])
    from slime_ref.arguments import build_parser

    groups = {a.dest: g.title for g in build_parser()._action_groups for a in g._group_actions}
    assert groups["dynamic_sampling_max_groups"] == groups["output_dir"] == "slime-ref only"
    assert filters.SPREAD_EPS == 1e-6
