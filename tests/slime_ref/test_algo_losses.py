"""Policy/value/SFT losses: hand-computed values, step-0 identities, micro-batch invariance."""

from __future__ import annotations

import math
import random

import pytest
import torch

from algo_args import make_args
from slime_ref.algo.losses import (
    StepMean,
    compute_cispo_loss,
    compute_policy_loss,
    count_loss_tokens,
    policy_loss_function,
    sequence_mean_log_ratio,
    sft_loss_function,
    truncated_importance_weights,
    value_loss_function,
)


def _t(*values):
    return torch.tensor(values, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------

RATIOS = _t(0.5, 1.0, 1.5, 1.5, 4.0)
ADVANTAGES = _t(1.0, 1.0, 1.0, -1.0, -1.0)


def test_ppo_clip_with_clip_higher_by_hand():
    # eps_clip 0.2, eps_clip_high 0.28 -> ratio clipped to [0.8, 1.28]; loss = max(-r*A, -clip(r)*A)
    #   r=0.5 A=+1: max(-0.5, -0.8)  = -0.5   (unclipped; no clip below 1 - eps for positive A)
    #   r=1.0 A=+1: max(-1, -1)      = -1
    #   r=1.5 A=+1: max(-1.5, -1.28) = -1.28  (clipped)
    #   r=1.5 A=-1: max(1.5, 1.28)   = 1.5
    #   r=4.0 A=-1: max(4.0, 1.28)   = 4.0
    losses, clipfrac = compute_policy_loss(-torch.log(RATIOS), ADVANTAGES, 0.2, 0.28)
    assert losses.tolist() == pytest.approx([-0.5, -1.0, -1.28, 1.5, 4.0], abs=1e-6)
    assert clipfrac.tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]


def test_dual_clip_caps_negative_advantage_losses():
    # eps_clip_c 3: for A<0 the loss is min(loss, -3*A = 3): 1.5 stays, 4.0 becomes 3.0; A>0 untouched
    losses, clipfrac = compute_policy_loss(-torch.log(RATIOS), ADVANTAGES, 0.2, 0.28, eps_clip_c=3.0)
    assert losses.tolist() == pytest.approx([-0.5, -1.0, -1.28, 1.5, 3.0], abs=1e-6)
    assert clipfrac.tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="eps_clip_c"):
        compute_policy_loss(torch.zeros(1), torch.ones(1), 0.2, 0.2, eps_clip_c=1.0)


def test_cispo_by_hand():
    # ratio [0.5, 1.5] clipped to [0.8, 1.28]; loss = -sg(clip) * A * logp = [-(0.8*1*-1), -(1.28*-1*-2)]
    log_probs = _t(-1.0, -2.0).requires_grad_()
    losses, clipfrac = compute_cispo_loss(-torch.log(_t(0.5, 1.5)), log_probs, _t(1.0, -1.0), 0.2, 0.28)
    assert losses.tolist() == pytest.approx([0.8, -2.56], abs=1e-6)
    assert clipfrac.tolist() == [1.0, 1.0]
    losses.sum().backward()  # gradient flows through log-probs with the clipped ratio as a constant
    assert log_probs.grad.tolist() == pytest.approx([-0.8, 1.28], abs=1e-6)


def test_truncated_importance_weights_by_hand():
    # ratio = exp(train - rollout) = [1, e, 1/e]; clip to [0.5, 2] -> [1, 2, 0.5]
    weights, metrics = truncated_importance_weights(_t(-1.0, -1.0, -1.0), _t(-1.0, -2.0, 0.0), 0.5, 2.0)
    assert weights.tolist() == pytest.approx([1.0, 2.0, 0.5])
    assert metrics["tis"].tolist() == pytest.approx([1.0, math.e, 1 / math.e], rel=1e-6)
    assert metrics["tis_clipfrac"].tolist() == [0.0, 1.0, 1.0]
    assert metrics["tis_abs"].tolist() == pytest.approx([0.0, math.e - 1, 1 - 1 / math.e], rel=1e-6)


def test_step_mean_by_hand():
    # values [1, 2, (3)] and [4], masks [1, 1, 0] and [1]
    values, masks = _t(1, 2, 3, 4), [_t(1, 1, 0), _t(1)]
    # per sample, 4 samples in the step: (mean(1, 2) + 4) / 4 = (1.5 + 4) / 4 = 1.375
    per_sample = StepMean.build(masks, calculate_per_token_loss=False, num_samples=4, num_tokens=10)
    assert per_sample(values).item() == pytest.approx(1.375)
    # per token, 10 tokens in the step: (1 + 2 + 4) / 10
    per_token = StepMean.build(masks, calculate_per_token_loss=True, num_samples=4, num_tokens=10)
    assert per_token(values).item() == pytest.approx(0.7)


def test_count_loss_tokens_counts_an_all_masked_sample_once():
    assert count_loss_tokens([_t(1, 1, 0), _t(0, 0), _t(1)]) == 2 + 1 + 1


def test_sequence_mean_log_ratio_equals_a_per_sample_loop():
    rng = random.Random(2)
    torch.manual_seed(2)
    lengths = [rng.randint(1, 7) for _ in range(9)]
    old = [torch.randn(n) for n in lengths]
    new = [torch.randn(n) for n in lengths]
    masks = [(torch.rand(n) > 0.4).float() for n in lengths]
    got = sequence_mean_log_ratio(old, new, masks).split(lengths)
    for o, n, m, g in zip(old, new, masks, got):
        expected = ((o - n) * m).sum() / max(m.sum().item(), 1.0)
        assert torch.allclose(g, expected.expand(len(o)), atol=1e-6)


# ---------------------------------------------------------------------------------------------
# policy_loss_function
# ---------------------------------------------------------------------------------------------


def _policy_loss(args, batch, **counts):
    return policy_loss_function(args, **batch, **counts)


def test_gspo_uses_one_clipped_ratio_per_sequence():
    # sample 1: old - new = [-0.2, 0.2] -> mean 0 -> ratio 1 -> loss -A = -1 per token
    # sample 2: old - new = [-0.5, -0.5, (masked)] -> mean -0.5 -> ratio e^0.5 = 1.65 -> clipped 1.2 -> -1.2 per token
    # per token over 4 kept tokens: pg_loss = (-1 - 1 - 1.2 - 1.2) / 4 = -1.1; clipfrac 2/4; ppo_kl (0+0-0.5-0.5)/4
    args = make_args("--advantage-estimator", "gspo", "--calculate-per-token-loss")
    batch = dict(
        log_probs=[_t(-0.8, -1.2), _t(-0.5, -1.5, -9.0)],
        old_log_probs=[_t(-1.0, -1.0), _t(-1.0, -2.0, -3.0)],
        advantages=[_t(1, 1), _t(1, 1, 1)],
        loss_masks=[_t(1, 1), _t(1, 1, 0)],
    )
    loss, metrics = _policy_loss(args, batch, num_samples=2, num_tokens=4)
    assert metrics["pg_loss"].item() == pytest.approx(-1.1, abs=1e-6)
    assert metrics["pg_clipfrac"].item() == pytest.approx(0.5)
    assert metrics["ppo_kl"].item() == pytest.approx(-0.25, abs=1e-6)
    assert loss.item() == pytest.approx(-1.1, abs=1e-6)


def test_entropy_bonus_kl_loss_and_logprob_diff_by_hand():
    # on-policy (old = new): pg_loss per sample = mean(-A) = -0.5 for one sample of 2 tokens, A = [1, 0]
    # entropy [2, 4] -> entropy_loss 3; loss -= 0.01 * 3
    # kl (k1) = logp - ref = [-1 - -1.5, -2 - -1.5] = [0.5, -0.5] -> kl_loss 0; then with ref shifted: see below
    # rollout log-probs [-1.1, -2.2]: |old - rollout| = [0.1, 0.2] -> 0.15
    args = make_args("--use-kl-loss", "--kl-loss-coef", "0.1", "--entropy-coef", "0.01")
    batch = dict(
        log_probs=[_t(-1.0, -2.0).requires_grad_()],
        advantages=[_t(1.0, 0.0)],
        loss_masks=[_t(1, 1)],
        entropy=[_t(2.0, 4.0)],
        ref_log_probs=[_t(-1.5, -3.0)],  # kl = [0.5, 1.0] -> kl_loss 0.75
        rollout_log_probs=[_t(-1.1, -2.2)],
    )
    loss, metrics = _policy_loss(args, batch, num_samples=1, num_tokens=2)
    assert metrics["pg_loss"].item() == pytest.approx(-0.5)
    assert metrics["entropy_loss"].item() == pytest.approx(3.0)
    assert metrics["kl_loss"].item() == pytest.approx(0.75)
    assert metrics["train_rollout_logprob_abs_diff"].item() == pytest.approx(0.15, abs=1e-6)
    assert loss.item() == pytest.approx(-0.5 - 0.01 * 3.0 + 0.1 * 0.75)
    assert set(metrics) == {"loss", "pg_loss", "pg_clipfrac", "ppo_kl", "entropy_loss", "kl_loss",
                            "train_rollout_logprob_abs_diff"}


def test_unbiased_kl_weights_the_kl_by_the_policy_ratio():
    # logp - old = log 2 -> ratio 2; k1 kl = logp - ref = 0.5 -> kl_loss 2 * 0.5 = 1.0
    args = make_args("--use-kl-loss", "--use-unbiased-kl")
    batch = dict(
        log_probs=[_t(-1.0)], old_log_probs=[_t(-1.0 - math.log(2))], advantages=[_t(0.0)],
        loss_masks=[_t(1)], ref_log_probs=[_t(-1.5)],
    )
    _, metrics = _policy_loss(args, batch, num_samples=1, num_tokens=1)
    assert metrics["kl_loss"].item() == pytest.approx(1.0, rel=1e-6)


def test_tis_weights_the_policy_loss_and_reports_its_metrics():
    # on-policy, A = [1, 1] -> pg_losses [-1, -1]; TIS ratio exp(old - rollout) = [1, e] -> weights [1, 2]
    # per-sample mean of [-1, -2] = -1.5; tis = mean(1, e); tis_clipfrac 0.5; ois 1
    args = make_args("--use-tis")
    batch = dict(
        log_probs=[_t(-1.0, -1.0)], advantages=[_t(1.0, 1.0)], loss_masks=[_t(1, 1)],
        rollout_log_probs=[_t(-1.0, -2.0)],
    )
    _, metrics = _policy_loss(args, batch, num_samples=1, num_tokens=2)
    assert metrics["pg_loss"].item() == pytest.approx(-1.5)
    assert metrics["tis"].item() == pytest.approx((1 + math.e) / 2, rel=1e-6)
    assert metrics["tis_clipfrac"].item() == pytest.approx(0.5)
    assert metrics["ois"].item() == pytest.approx(1.0)
    assert metrics["tis_abs"].item() == pytest.approx((math.e - 1) / 2, rel=1e-6)


@pytest.mark.parametrize("estimator", ["grpo", "gspo", "cispo"])
def test_step_zero_has_exactly_zero_ppo_kl_and_clipfrac(estimator):
    """First step of a rollout: old log-probs equal the new ones, so nothing is off-policy or clipped."""
    torch.manual_seed(0)
    lengths = [5, 3, 8]
    log_probs = [torch.log_softmax(torch.randn(n, 16), -1)[:, 0].requires_grad_() for n in lengths]
    batch = dict(
        log_probs=log_probs,
        old_log_probs=[lp.detach().clone() for lp in log_probs],
        advantages=[torch.randn(n) * 3 for n in lengths],
        loss_masks=[(torch.rand(n) > 0.2).float() for n in lengths],
    )
    args = make_args("--advantage-estimator", estimator, "--eps-clip-high", "0.28")
    _, metrics = _policy_loss(args, batch, num_samples=3, num_tokens=count_loss_tokens(batch["loss_masks"]))
    assert metrics["ppo_kl"].item() == 0.0
    assert metrics["pg_clipfrac"].item() == 0.0


def _random_batch(rng, num_samples):
    torch.manual_seed(rng.randrange(2**31))  # the tensors follow rng's seed, not the tests run before
    lengths = [rng.randint(1, 12) for _ in range(num_samples)]
    masks = []
    for n in lengths:
        mask = torch.tensor([float(rng.random() > 0.25) for _ in range(n)])
        if rng.random() < 0.1:
            mask.zero_()  # a removed sample still counts in the step
        masks.append(mask)
    return dict(
        log_probs=[(torch.randn(n) - 2).requires_grad_() for n in lengths],
        old_log_probs=[torch.randn(n) - 2 for n in lengths],
        advantages=[torch.randn(n) for n in lengths],
        loss_masks=masks,
        entropy=[torch.rand(n) * 3 for n in lengths],
        ref_log_probs=[torch.randn(n) - 2 for n in lengths],
        rollout_log_probs=[torch.randn(n) - 2 for n in lengths],
    )


def _sub_batch(batch, indices):
    return {key: [values[i] for i in indices] for key, values in batch.items()}


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("estimator", ["grpo", "gspo", "cispo"])
def test_loss_and_gradients_do_not_depend_on_the_micro_batch_split(per_token, estimator):
    rng = random.Random(f"{estimator}/{per_token}")  # a str seed is the same in every process
    argv = ["--advantage-estimator", estimator, "--use-kl-loss", "--kl-loss-coef", "0.05", "--kl-loss-type",
            "low_var_kl", "--entropy-coef", "0.01", "--use-tis", "--eps-clip-high", "0.28", "--eps-clip-c", "3"]
    if per_token:
        argv.append("--calculate-per-token-loss")
    args = make_args(*argv)
    for _ in range(5):
        batch = _random_batch(rng, rng.randint(2, 9))
        num_samples, num_tokens = len(batch["loss_masks"]), count_loss_tokens(batch["loss_masks"])
        full_loss, full_metrics = _policy_loss(args, batch, num_samples=num_samples, num_tokens=num_tokens)
        full_grads = torch.autograd.grad(full_loss, batch["log_probs"])

        order = list(range(num_samples))
        rng.shuffle(order)
        cuts = sorted(rng.sample(range(1, num_samples), rng.randint(0, num_samples - 1)))
        parts = [order[a:b] for a, b in zip([0, *cuts], [*cuts, num_samples])]
        split_loss, split_metrics = 0.0, {}
        for part in parts:
            loss, metrics = _policy_loss(args, _sub_batch(batch, part), num_samples=num_samples, num_tokens=num_tokens)
            split_loss = split_loss + loss
            for name, value in metrics.items():
                split_metrics[name] = split_metrics.get(name, 0.0) + value
        split_grads = torch.autograd.grad(split_loss, batch["log_probs"])

        assert split_loss.item() == pytest.approx(full_loss.item(), abs=1e-5)
        assert set(split_metrics) == set(full_metrics)
        for name in full_metrics:
            assert split_metrics[name].item() == pytest.approx(full_metrics[name].item(), abs=1e-5), name
        for a, b in zip(full_grads, split_grads):
            assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("per_token", [False, True])
def test_value_and_sft_losses_do_not_depend_on_the_micro_batch_split(per_token):
    rng = random.Random(5)
    args = make_args(advantage_estimator="ppo", calculate_per_token_loss=per_token)
    batch = _random_batch(rng, 6)
    critic = dict(values=batch["log_probs"], old_values=batch["old_log_probs"], returns=batch["ref_log_probs"],
                  loss_masks=batch["loss_masks"])
    counts = dict(num_samples=6, num_tokens=count_loss_tokens(batch["loss_masks"]))
    halves = ([0, 2, 4], [1, 3, 5])
    for fn, data in ((value_loss_function, critic),
                     (sft_loss_function, dict(log_probs=batch["log_probs"], loss_masks=batch["loss_masks"]))):
        full, _ = fn(args, **data, **counts)
        split = sum(fn(args, **_sub_batch(data, half), **counts)[0] for half in halves)
        assert split.item() == pytest.approx(full.item(), abs=1e-6)


def test_value_loss_by_hand():
    # v - v_old = [0.5, 0] -> clipped values [0.7, 2.0]; (clipped - G)^2 = [0.64, 1.0]; (v - G)^2 = [0.25, 1.0]
    # max = [0.64, 1.0]; per token over 2 tokens -> 0.82; clipfrac [1, 0] -> 0.5
    args = make_args("--calculate-per-token-loss", advantage_estimator="ppo")
    loss, metrics = value_loss_function(
        args, values=[_t(1.0, 2.0)], old_values=[_t(0.5, 2.0)], returns=[_t(1.5, 1.0)], loss_masks=[_t(1, 1)],
        num_samples=1, num_tokens=2,
    )
    assert loss.item() == pytest.approx(0.82)
    assert metrics == {"value_loss": pytest.approx(loss.item()), "value_clipfrac": pytest.approx(0.5)}


def test_sft_loss_by_hand():
    # per-sample means of the NLL: sample 1 mean(1, 2) = 1.5, sample 2: 3 -> (1.5 + 3) / 2 = 2.25
    args = make_args("--loss-type", "sft_loss")
    loss, metrics = sft_loss_function(
        args, log_probs=[_t(-1.0, -2.0), _t(-3.0)], loss_masks=[_t(1, 1), _t(1)], num_samples=2, num_tokens=3
    )
    assert loss.item() == pytest.approx(2.25)
    assert metrics["loss"].item() == pytest.approx(2.25)


def test_missing_inputs_are_reported():
    base = dict(log_probs=[_t(-1.0)], advantages=[_t(1.0)], loss_masks=[_t(1)])
    with pytest.raises(ValueError, match="ref_log_probs"):
        _policy_loss(make_args("--use-kl-loss"), base, num_samples=1, num_tokens=1)
    with pytest.raises(ValueError, match="rollout_log_probs"):
        _policy_loss(make_args("--use-tis"), base, num_samples=1, num_tokens=1)
    with pytest.raises(ValueError, match="entropy"):
        _policy_loss(make_args("--entropy-coef", "0.1"), base, num_samples=1, num_tokens=1)
