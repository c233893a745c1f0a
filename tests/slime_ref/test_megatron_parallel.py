"""The Megatron actor on CPU over gloo: HF parity, export, step-0 invariants, TP/PP/DP equivalence.

Each parallel layout runs once (module fixture) in freshly spawned processes; the tests below
read its results. The same seeded train data goes through every layout, so the per-step losses
must agree with the single-process run.
"""

from __future__ import annotations

import pytest

from megatron_workers import parallel_worker, run_workers

COMMON = ["--global-batch-size", "4", "--lr", "1e-3", "--lr-decay-style", "constant",
          "--attention-dropout", "0", "--hidden-dropout", "0"]

LAYOUTS = {
    "tp1": (1, ["--micro-batch-size", "2"]),
    "tp2": (2, ["--micro-batch-size", "2", "--tensor-model-parallel-size", "2"]),
    "pp2": (2, ["--pipeline-model-parallel-size", "2", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "24"]),
    "dp2": (2, ["--micro-batch-size", "1"]),
}


@pytest.fixture(scope="module")
def runs(tiny):
    return {
        name: run_workers(parallel_worker, world, model_dir=str(tiny.model_dir), argv=COMMON + extra)
        for name, (world, extra) in LAYOUTS.items()
    }


def _losses(run):
    return [step["train/loss"] for rollout in run[0]["metrics"] for step in rollout]


@pytest.mark.parametrize("layout", ["tp1", "tp2"])
def test_logits_match_hf(runs, layout):
    assert runs[layout][0]["logits_max_diff"] < 1e-5


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_export_is_bit_identical_to_the_hf_checkpoint(runs, layout):
    export = runs[layout][0]["export"]
    assert export["same_names"] and export["identical"]
    # every bucket stays under the limit (the largest tensor, fc1 [768, 128] fp32, is 393 KB)
    assert export["num_buckets"] > 3 and export["oversized_multi_tensor_buckets"] == 0


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_step_zero_train_logprobs_equal_reference_exactly(runs, layout):
    last_stage = [r for r in runs[layout] if r["num_scored"]]
    assert last_stage and all(r["ref_equals_actor"] for r in last_stage)
    first = runs[layout][0]["metrics"][0][0]
    # k2 KL is a sum of squares: exactly zero only if every train log-prob equals its reference
    assert first["train/kl_loss"] == 0.0
    assert first["train/ppo_kl"] == 0.0
    assert runs[layout][0]["metrics"][0][1]["train/ppo_kl"] != 0.0  # the first step moved the weights


@pytest.mark.parametrize("layout", ["tp2", "pp2", "dp2"])
def test_loss_curve_matches_single_process(runs, layout):
    reference, other = _losses(runs["tp1"]), _losses(runs[layout])
    assert len(reference) == len(other) == 4
    assert max(abs(a - b) for a, b in zip(reference, other)) < 1e-5
    grad_norms = [s["train/grad_norm"] for r in runs[layout][0]["metrics"] for s in r]
    ref_norms = [s["train/grad_norm"] for r in runs["tp1"][0]["metrics"] for s in r]
    assert max(abs(a - b) / b for a, b in zip(ref_norms, grad_norms)) < 1e-5


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sft_loss_is_the_mean_response_nll_and_layout_independent(runs, layout):
    first = runs[layout][0]
    if "sft_expected_first_loss" in first:
        assert abs(first["sft_metrics"][0]["train/loss"] - first["sft_expected_first_loss"]) < 1e-6
    reference = [s["train/loss"] for s in runs["tp1"][0]["sft_metrics"]]
    assert max(abs(a - b) for a, b in zip(reference, [s["train/loss"] for s in first["sft_metrics"]])) < 1e-5
    assert "sft_expected_first_loss" in runs["tp1"][0]


def test_rollout_logprobs_from_an_engine_that_agrees_leave_nothing_off_policy(runs):
    first_step = runs["tp1"][0]["rollout_logprob_metrics"][0]
    assert first_step["train/ppo_kl"] == 0.0 and first_step["train/train_rollout_logprob_abs_diff"] == 0.0
    assert runs["tp1"][0]["rollout_logprob_metrics"][1]["train/ppo_kl"] != 0.0


def test_every_rank_reports_the_same_metrics(runs):
    def reduced(result):  # train/* are reduced over ranks; perf/* timers are each rank's own
        return [[{k: v for k, v in step.items() if not k.startswith("perf/")} for step in r] for r in result["metrics"]]

    for layout, results in runs.items():
        assert all(reduced(r) == reduced(results[0]) for r in results), layout
        for rollout in results[0]["metrics"]:  # slime's timers come with a rollout's last step
            assert {"perf/data_preprocess_time", "perf/actor_train_time"} <= set(rollout[-1])
