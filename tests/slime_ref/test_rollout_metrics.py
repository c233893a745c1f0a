"""Rollout and eval metrics: exact values of pass@k, --log-passrate and the rollout summary."""

from argparse import Namespace

import pytest

from slime_ref.rollout.metrics import eval_metrics, pass_at_k, pass_rates, rollout_metrics
from slime_ref.types import Sample


def test_pass_at_k_is_the_unbiased_estimator():
    # n=4, c=1: pass@1 = 1/4, pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0


def test_pass_rates_average_over_groups_for_powers_of_two():
    rewards = [1, 0, 0, 0,   0, 0, 0, 0]
    assert pass_rates(rewards, 4) == pytest.approx({"pass@1": 0.125, "pass@2": 0.25, "pass@4": 0.5})
    assert pass_rates(rewards, 1) == {}


def _samples(rewards, length=3, truncated=()):
    out = []
    for i, r in enumerate(rewards):
        s = Sample(index=i, group_index=i // 2, prompt="p", tokens=[1] * (2 + length), response_length=length,
                   reward=r)
        if i in truncated:
            s.status = Sample.Status.TRUNCATED
        out.append(s)
    return out


def test_rollout_metrics_with_log_passrate():
    args = Namespace(n_samples_per_prompt=2, log_passrate=True, log_multi_turn=False, rollout_num_gpus=2)
    rewards = [1.0, 0.0, 0.0, 0.0]
    metrics = rollout_metrics(args, _samples(rewards, truncated={1}), rewards, rollout_time=2.0)
    assert metrics["rollout/raw_reward"] == 0.25
    assert metrics["rollout/truncated_ratio"] == 0.25
    assert metrics["rollout/zero_std_ratio"] == 0.5
    assert metrics["passrate/pass@1"] == pytest.approx(0.25)
    assert metrics["passrate/pass@2"] == pytest.approx(0.5)
    assert metrics["perf/tokens_per_gpu_per_sec"] == pytest.approx(12 / 2.0 / 2)
    args.log_passrate = False
    assert not any(k.startswith("passrate/") for k in rollout_metrics(args, _samples(rewards), rewards, 1.0))


def test_eval_metrics_report_mean_truncation_and_pass_at_k():
    args = Namespace(n_samples_per_eval_prompt=2)
    out = eval_metrics(args, {"arith": {"rewards": [1, 1, 0, 1], "truncated": [False, False, True, False]}})
    assert out == pytest.approx({"eval/arith": 0.75, "eval/arith-truncated_ratio": 0.25,
                                 "eval/arith-pass@1": 0.75, "eval/arith-pass@2": 1.0})


def test_log_multi_turn_separates_environment_tokens_and_counts_rounds():
    samples = _samples([1.0, 0.0])
    samples[0].loss_mask = [1, 0, 1]  # one environment token inside a 3-token response
    samples[0].metadata = {"round_number": 2}
    samples[1].metadata = {"round_number": 1}
    samples[1].response_length = 4
    samples[1].loss_mask = [1, 1, 1, 1]
    args = Namespace(n_samples_per_prompt=2, log_passrate=False, log_multi_turn=True, rollout_num_gpus=0,
                     rollout_max_response_len=4)
    m = rollout_metrics(args, samples, [1.0, 0.0], 1.0)
    assert m["multi_turn/raw_response_length/response_length_mean"] == 3.5
    assert m["multi_turn/raw_response_length/response_length_clip_ratio"] == 0.5
    assert m["multi_turn/wo_obs_response_length/response_length_mean"] == 3.0
    assert m["multi_turn/wo_obs_response_length/response_length_min"] == 2
    assert m["multi_turn/multi_turn_metric/round_number_mean"] == 1.5
    assert m["multi_turn/multi_turn_metric/round_number_max"] == 2
