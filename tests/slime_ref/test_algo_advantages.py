"""Group reward normalisation and per-token advantages/returns for every estimator."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from algo_args import make_args
from slime_ref.algo.advantages import (
    chunked_gae,
    compute_advantages_and_returns,
    gae_advantages_and_returns,
    get_reinforce_plus_plus_returns,
    group_normalize,
    masked_whiten,
    post_process_rewards,
)
from slime_ref.errors import UserError
from slime_ref.types import Sample


def _samples(rewards, group_size):
    return [Sample(index=i, group_index=i // group_size, reward=r) for i, r in enumerate(rewards)]


# ---------------------------------------------------------------------------------------------
# Group normalisation
# ---------------------------------------------------------------------------------------------

REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0]  # two groups of four


def test_grpo_divides_the_centred_rewards_by_the_group_std():
    # group 1: mean 0.5, centred +-0.5, unbiased std sqrt(4*0.25/3) = sqrt(1/3)
    # group 2: mean 0.75, centred [.25, .25, .25, -.75], unbiased std sqrt((3*.0625 + .5625)/3) = 0.5
    s1, s2 = math.sqrt(1 / 3) + 1e-6, 0.5 + 1e-6
    expected = [0.5 / s1, -0.5 / s1, -0.5 / s1, 0.5 / s1, 0.25 / s2, 0.25 / s2, 0.25 / s2, -0.75 / s2]
    raw, rewards = post_process_rewards(make_args(), _samples(REWARDS, 4))
    assert raw == REWARDS
    assert rewards == pytest.approx(expected, abs=1e-6)


def test_dr_grpo_only_subtracts_the_group_mean():
    args = make_args("--disable-grpo-std-normalization")
    _, rewards = post_process_rewards(args, _samples(REWARDS, 4))
    assert rewards == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.25, 0.25, 0.25, -0.75])


@pytest.mark.parametrize("estimator", ["gspo", "cispo"])
def test_gspo_and_cispo_normalise_like_grpo(estimator):
    grpo = post_process_rewards(make_args(), _samples(REWARDS, 4))[1]
    other = post_process_rewards(make_args(advantage_estimator=estimator), _samples(REWARDS, 4))[1]
    assert other == grpo


def test_reinforce_plus_plus_baseline_subtracts_the_mean_but_never_divides():
    args = make_args("--advantage-estimator", "reinforce_plus_plus_baseline", "--normalize-advantages")
    assert args.grpo_std_normalization  # the std flag is on, and still unused by this estimator
    _, rewards = post_process_rewards(args, _samples(REWARDS, 4))
    assert rewards == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.25, 0.25, 0.25, -0.75])


@pytest.mark.parametrize(
    "argv",
    [
        ("--advantage-estimator", "reinforce_plus_plus", "--normalize-advantages"),
        (),  # ppo, set below: its tensor functions are tested though no critic trains yet
        ("--disable-rewards-normalization",),
    ],
)
def test_raw_rewards_pass_through(argv):
    args = make_args(*argv) if argv else make_args(advantage_estimator="ppo")
    raw, rewards = post_process_rewards(args, _samples(REWARDS, 4))
    assert raw == rewards == REWARDS


def test_one_sample_per_prompt_turns_std_normalisation_off():
    args = make_args(
        "--rollout-batch-size", "4", "--n-samples-per-prompt", "1", "--global-batch-size", "4"
    )  # later flags win over the base argv
    assert args.grpo_std_normalization is False
    # each group is one sample: centred reward 0, and no division by an undefined std
    assert post_process_rewards(args, _samples([1.0, 0.0, 1.0, 1.0], 1))[1] == [0.0, 0.0, 0.0, 0.0]


def test_dict_rewards_need_reward_key():
    samples = [Sample(index=i, group_index=0, reward={"score": float(i), "acc": True}) for i in range(4)]
    with pytest.raises(UserError, match="--reward-key"):
        post_process_rewards(make_args(), samples)
    raw, _ = post_process_rewards(make_args("--reward-key", "score"), samples)
    assert raw == [0.0, 1.0, 2.0, 3.0]


def test_groups_come_from_group_index_not_position():
    # uneven groups, interleaved: group 7 = rewards [2, 4] (mean 3), group 3 = [1] (mean 1),
    # group 5 = [0, 3, 6] (mean 3)
    samples = [
        Sample(group_index=7, reward=2.0),
        Sample(group_index=3, reward=1.0),
        Sample(group_index=5, reward=0.0),
        Sample(group_index=7, reward=4.0),
        Sample(group_index=5, reward=3.0),
        Sample(group_index=5, reward=6.0),
    ]
    _, rewards = post_process_rewards(make_args("--disable-grpo-std-normalization"), samples)
    assert rewards == pytest.approx([-1.0, 0.0, -3.0, 1.0, 0.0, 3.0])


def test_vectorised_group_normalisation_equals_a_per_group_loop():
    rng = random.Random(0)
    for trial in range(50):
        sizes = [rng.randint(1, 6) for _ in range(rng.randint(1, 8))]
        group_ids = [g for g, n in enumerate(sizes) for _ in range(n)]
        rng.shuffle(group_ids)
        rewards = [rng.choice([0.0, 1.0, rng.uniform(-2, 2)]) for _ in group_ids]
        for divide_std in (True, False):
            got = group_normalize(torch.tensor(rewards), torch.tensor(group_ids), divide_std=divide_std)
            for i, (g, r) in enumerate(zip(group_ids, rewards)):
                members = [x for gid, x in zip(group_ids, rewards) if gid == g]
                mean = sum(members) / len(members)
                expected = r - mean
                if divide_std:
                    n = len(members)
                    var = sum((x - mean) ** 2 for x in members) / (n - 1) if n > 1 else 0.0  # one sample: std 0
                    expected /= math.sqrt(var) + 1e-6
                assert got[i].item() == pytest.approx(expected, rel=1e-5, abs=1e-5), (trial, i)


def test_custom_reward_post_process_hook_replaces_the_step(tmp_path, monkeypatch):
    (tmp_path / "my_post.py").write_text(
        "def post(args, samples):\n    return [1.0] * len(samples), [2.0] * len(samples)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    args = make_args("--custom-reward-post-process-path", "my_post.post")
    assert post_process_rewards(args, _samples(REWARDS, 4)) == ([1.0] * 8, [2.0] * 8)


# ---------------------------------------------------------------------------------------------
# Per-token advantages and returns
# ---------------------------------------------------------------------------------------------


def test_grpo_broadcasts_each_reward_to_its_tokens():
    args = make_args(kl_coef=0.1)  # GRPO ignores the reward KL
    masks = [torch.ones(2), torch.tensor([1.0, 1.0, 0.0])]
    advantages, returns = compute_advantages_and_returns(
        args, rewards=[0.5, -1.0], loss_masks=masks,
        log_probs=[torch.zeros(2), torch.zeros(3)], ref_log_probs=[torch.ones(2), torch.ones(3)],
    )
    assert [a.tolist() for a in advantages] == [[0.5, 0.5], [-1.0, -1.0, -1.0]]
    assert [r.tolist() for r in returns] == [[0.5, 0.5], [-1.0, -1.0, -1.0]]


def test_ppo_gae_with_kl_penalty_by_hand():
    # kl (k1) = log_probs - ref = [0.2, 0.0, -0.1]; kl_coef 0.1 -> token rewards [-0.02, 0, 0.01 + 1.0]
    # values [0.5, 0.4, 0.3], gamma 0.9, lambda 0.8 (gamma*lambda = 0.72):
    #   t=2: delta = 1.01 - 0.3 = 0.71                 A2 = 0.71
    #   t=1: delta = 0 + 0.9*0.3 - 0.4 = -0.13          A1 = -0.13 + 0.72*0.71 = 0.3812
    #   t=0: delta = -0.02 + 0.9*0.4 - 0.5 = -0.16      A0 = -0.16 + 0.72*0.3812 = 0.114464
    #   returns = A + V = [0.614464, 0.7812, 1.01]
    args = make_args("--gamma", "0.9", "--lambd", "0.8", advantage_estimator="ppo", kl_coef=0.1)
    advantages, returns = compute_advantages_and_returns(
        args, rewards=[1.0], loss_masks=[torch.ones(3)],
        log_probs=[torch.tensor([-1.0, -2.0, -3.1])], ref_log_probs=[torch.tensor([-1.2, -2.0, -3.0])],
        values=[torch.tensor([0.5, 0.4, 0.3])],
    )
    assert advantages[0].tolist() == pytest.approx([0.114464, 0.3812, 0.71], abs=1e-6)
    assert returns[0].tolist() == pytest.approx([0.614464, 0.7812, 1.01], abs=1e-6)


def test_batched_gae_equals_a_per_sample_loop():
    rng = random.Random(1)
    for _ in range(20):
        lengths = [rng.randint(1, 9) for _ in range(rng.randint(1, 6))]
        rewards = [torch.randn(n) for n in lengths]
        values = [torch.randn(n) for n in lengths]
        gamma, lambd = rng.uniform(0.5, 1.0), rng.uniform(0.5, 1.0)
        advantages, returns = gae_advantages_and_returns(rewards, values, gamma, lambd)
        for r, v, a, g in zip(rewards, values, advantages, returns):
            running, expected = 0.0, []
            for t in reversed(range(len(r))):
                next_value = v[t + 1].item() if t + 1 < len(r) else 0.0
                running = r[t].item() + gamma * next_value - v[t].item() + gamma * lambd * running
                expected.append(running)
            expected.reverse()
            assert a.tolist() == pytest.approx(expected, abs=1e-5)
            assert g.tolist() == pytest.approx([x + y for x, y in zip(expected, v.tolist())], abs=1e-5)


def test_reinforce_plus_plus_returns_by_hand():
    # masked kl [0.2, 0.4, 0.1, 0] * -0.5 = [-0.1, -0.2, -0.05, 0]; reward 1 on the last kept token (t=2)
    # G3 = 0; G2 = 0.95; G1 = -0.2 + 0.9*0.95 = 0.655; G0 = -0.1 + 0.9*0.655 = 0.4895
    returns = get_reinforce_plus_plus_returns(
        torch.tensor([1.0]), [torch.tensor([0.2, 0.4, 0.1, 0.3])], [torch.tensor([1, 1, 1, 0])], kl_coef=0.5, gamma=0.9
    )
    assert returns[0].tolist() == pytest.approx([0.4895, 0.655, 0.95, 0.0], abs=1e-6)


def test_reinforce_plus_plus_rejects_an_all_masked_sample():
    with pytest.raises(ValueError, match="all-zero loss mask"):
        get_reinforce_plus_plus_returns(torch.tensor([1.0]), [torch.zeros(2)], [torch.zeros(2)], 0.0, 1.0)


def test_reinforce_plus_plus_through_the_dispatcher_is_whitened():
    args = make_args("--advantage-estimator", "reinforce_plus_plus", "--normalize-advantages")
    masks = [torch.ones(2), torch.ones(2)]
    advantages, returns = compute_advantages_and_returns(args, rewards=[1.0, 0.0], loss_masks=masks)
    # returns [1, 1], [0, 0] (gamma 1, no KL); whitened: mean 0.5, unbiased var 1/3
    assert [r.tolist() for r in returns] == [[1.0, 1.0], [0.0, 0.0]]
    z = 0.5 / math.sqrt(1 / 3 + 1e-8)
    assert torch.cat(advantages).tolist() == pytest.approx([z, z, -z, -z], abs=1e-6)


def test_reinforce_plus_plus_baseline_by_hand():
    # reward 0.5 (already group-centred) - 0.5 * kl [0.2, -0.1] = [0.4, 0.55]; returns are the unwhitened advantages
    # (the flags require --normalize-advantages; it is switched off afterwards to see the raw values)
    args = make_args("--advantage-estimator", "reinforce_plus_plus_baseline", "--normalize-advantages",
                     normalize_advantages=False, kl_coef=0.5)
    advantages, returns = compute_advantages_and_returns(
        args, rewards=[0.5], loss_masks=[torch.ones(2)],
        log_probs=[torch.tensor([-1.0, -1.0])], ref_log_probs=[torch.tensor([-1.2, -0.9])],
    )
    assert advantages[0].tolist() == pytest.approx([0.4, 0.55])
    assert returns[0].tolist() == pytest.approx([0.4, 0.55])


def test_use_rollout_logprobs_takes_the_engine_log_probs_for_the_reward_kl():
    args = make_args("--advantage-estimator", "reinforce_plus_plus_baseline", "--normalize-advantages",
                     "--use-rollout-logprobs", normalize_advantages=False, kl_coef=1.0)
    advantages, _ = compute_advantages_and_returns(
        args, rewards=[0.0], loss_masks=[torch.ones(1)], log_probs=[torch.tensor([-5.0])],
        rollout_log_probs=[torch.tensor([-1.0])], ref_log_probs=[torch.tensor([-1.5])],
    )
    assert advantages[0].tolist() == pytest.approx([-0.5])  # -(kl of rollout vs ref = 0.5)


def test_masked_whiten_by_hand():
    # kept [1, 2, 3]: mean 2, biased var 2/3, Bessel x 3/2 -> 1; the masked 100 is shifted but not counted
    out = masked_whiten(torch.tensor([1.0, 2.0, 3.0, 100.0]), torch.tensor([1, 1, 1, 0]))
    scale = 1 / math.sqrt(1 + 1e-8)
    assert out.tolist() == pytest.approx([-scale, 0.0, scale, 98 * scale], abs=1e-6)


def _whiten_on_rank(rank, tmp_dir, halves):
    dist.init_process_group("gloo", init_method=f"file://{tmp_dir}/init", rank=rank, world_size=2)
    try:
        values, mask = halves[rank]
        torch.save(masked_whiten(values, mask, process_group=dist.group.WORLD), f"{tmp_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_masked_whiten_uses_the_statistics_of_the_whole_process_group(tmp_path):
    torch.manual_seed(0)
    values, mask = torch.randn(11), (torch.rand(11) > 0.3).float()
    halves = [(values[:4], mask[:4]), (values[4:], mask[4:])]
    mp.spawn(_whiten_on_rank, args=(str(tmp_path), halves), nprocs=2, join=True)
    got = torch.cat([torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)])
    expected = masked_whiten(values, mask)  # one process with all the data
    assert torch.allclose(got, expected, atol=1e-6)


def test_chunked_gae_by_hand_across_a_chunk_boundary():
    # the hand case above without KL: token rewards [0, 0, 1], values [0.5, 0.4, 0.3], gamma 0.9, lambda 0.8
    #   A2 = 0.7; A1 = -0.13 + 0.72*0.7 = 0.374; A0 = -0.14 + 0.72*0.374 = 0.12928
    rewards, values = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.4, 0.3]])
    for chunk_size in (1, 2, 3, 8):
        advantages, returns = chunked_gae(rewards, values, 0.9, 0.8, chunk_size=chunk_size)
        assert advantages[0].tolist() == pytest.approx([0.12928, 0.374, 0.7], abs=1e-6)
        assert returns[0].tolist() == pytest.approx([0.62928, 0.774, 1.0], abs=1e-6)
