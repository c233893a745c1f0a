"""A --custom-generate-function-path hook that returns several Samples for one input sample (slime's
multi-agent examples do): the rollout manager flattens the rollout to Samples, as slime does, and
every Sample of one prompt stays in its prompt's group. No engine is started: the hook answers."""

from __future__ import annotations

import math
import sys

import pytest

from slime_ref.arguments import parse_args
from slime_ref.types import Sample

HOOKS = '''
import copy

from slime_ref.types import Sample


async def two_samples(args, sample, sampling_params):
    """Two Samples per input: a copy of it (its group_index kept, reward 1) and one made fresh
    (no group_index, reward 0)."""
    prompt = [7, 8, 9]
    kept = copy.deepcopy(sample)
    kept.tokens, kept.response, kept.response_length = prompt + [1, 2], "ab", 2
    kept.rollout_log_probs, kept.status, kept.reward = [-0.5, -0.5], Sample.Status.COMPLETED, 1.0
    fresh = Sample(prompt=sample.prompt, label=sample.label, tokens=prompt + [3], response="c", response_length=1,
                   rollout_log_probs=[-0.25], status=Sample.Status.COMPLETED, reward=0.0)
    kept.rollout_id = fresh.rollout_id = sample.index  # one generation: slime requires a shared rollout_id
    return [kept, fresh]


async def two_samples_without_rollout_id(args, sample, sampling_params):
    pair = await two_samples(args, sample, sampling_params)
    for s in pair:
        s.rollout_id = None
    return pair
'''


@pytest.fixture
def hooks(tmp_path, monkeypatch):
    (tmp_path / "list_generate_hooks.py").write_text(HOOKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("list_generate_hooks", None)
    yield "list_generate_hooks"
    sys.modules.pop("list_generate_hooks", None)


def manager_for(tiny, tmp_path, hook: str):
    from slime_ref.data.source import load_tokenizer, make_data_source
    from slime_ref.ray.rollout_manager import RolloutManager
    from slime_ref.utils.hooks import load_function

    args = parse_args([
        "--hf-checkpoint", str(tiny.model_dir), "--prompt-data", str(tiny.train_path), "--input-key", "prompt",
        "--label-key", "label", "--apply-chat-template", "--num-rollout", "1", "--rollout-batch-size", "2",
        "--n-samples-per-prompt", "2", "--global-batch-size", "4", "--rollout-max-response-len", "4",
        "--actor-num-gpus-per-node", "1", "--output-dir", str(tmp_path / "run"),
        "--custom-generate-function-path", hook,
        "--save-debug-rollout-data", str(tmp_path / "debug" / "rollout_{rollout_id}.pt"),
    ])
    args.sglang_router_ip, args.sglang_router_port = "127.0.0.1", 9  # never contacted: the hook answers
    manager = RolloutManager(args, placement=None)
    # what start() sets up, without engines (and without freezing this test process's collector)
    manager.data_source = make_data_source(args, load_tokenizer(args))
    manager.rollout_fn = load_function(args.rollout_function_path, "--rollout-function-path")
    return manager


def test_a_generate_hook_returning_a_list_trains_on_every_sample_in_its_prompts_group(tiny, tmp_path, hooks):
    import torch

    manager = manager_for(tiny, tmp_path, f"{hooks}.two_samples")
    data, metrics = manager.generate(0)

    # 2 prompts x 2 input samples x 2 Samples each, in order: (kept, fresh) per input sample
    assert len(data["tokens"]) == len(data["rewards"]) == len(data["loss_masks"]) == 8
    assert data["raw_reward"] == [1.0, 0.0] * 4
    assert data["response_lengths"] == [2, 1] * 4
    assert data["rollout_log_probs"] == [[-0.5, -0.5], [-0.25]] * 4
    # each prompt's group is its four Samples [1, 0, 1, 0] (the fresh ones joined their prompt's
    # group_index), not chunks of --n-samples-per-prompt: +-0.5 / std(1, 0, 1, 0)
    z = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert data["rewards"] == pytest.approx([z, -z] * 4)
    assert metrics["rollout/raw_reward"] == 0.5 and metrics["rollout/zero_std_ratio"] == 0.0

    # the debug dump holds the same eight Samples, each with its prompt's group_index
    saved = torch.load(tmp_path / "debug" / "rollout_0.pt", weights_only=False)["samples"]
    assert len(saved) == 8
    groups = [s["group_index"] for s in saved]
    assert groups[:4] == [groups[0]] * 4 and groups[4:] == [groups[4]] * 4 and groups[0] != groups[4]


def test_flatten_rollout_gives_samples_in_order_and_a_group_index_to_each():
    """Any depth (a custom rollout function may nest further), as slime flattens until the items are Samples."""
    from slime_ref.rollout.train_data import flatten_rollout

    def s(index, group_index=None):
        return Sample(index=index, group_index=group_index)

    a, b, c, d, e, f = s(0, 5), s(None), s(1, 5), s(2), s(3), s(None)
    a.rollout_id = b.rollout_id = 0
    d.rollout_id = e.rollout_id = 1
    flat = flatten_rollout([[[a, b], c], [[[d, e]], f]])
    assert flat == [a, b, c, d, e, f]
    # b joins its group's index; the second group carries none and gets a new one
    assert [x.group_index for x in flat] == [5, 5, 5, 6, 6, 6]
    # a rollout of bare Samples (no groups) is left to --n-samples-per-prompt chunks
    bare = [s(0), s(1)]
    assert flatten_rollout(bare) == bare and [x.group_index for x in bare] == [None, None]


def test_several_samples_of_one_generation_without_a_shared_rollout_id_stop_the_rollout_as_in_slime(
        tiny, tmp_path, hooks):
    """slime v0.3.1 asserts it (ray/rollout.py, _validate_rollout_id_annotated): the loss would count
    the generation once per Sample."""
    from slime_ref.errors import UserError
    from slime_ref.rollout.train_data import check_rollout_ids

    manager = manager_for(tiny, tmp_path, f"{hooks}.two_samples_without_rollout_id")
    with pytest.raises(UserError, match=r"returned 2 Samples for one input sample with Sample.rollout_id "
                                        r"\[None, None\]: slime requires one shared, set rollout_id"):
        manager.generate(0)
    one, two = Sample(rollout_id=1), Sample(rollout_id=2)
    with pytest.raises(UserError, match=r"rollout_id \[1, 2\]"):
        check_rollout_ids([[[one, two]]])
    check_rollout_ids([[one, two]])  # a group of plain Samples (depth 1): no rule, as in slime
    check_rollout_ids([[[one]]])  # a single Sample: nothing to share
