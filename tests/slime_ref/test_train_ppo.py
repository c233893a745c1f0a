"""PPO with a critic (``--advantage-estimator ppo``) end to end on CPU: the critic's TrainGroup on the
actor's bundles, GAE advantages from its values, the clipped value loss, checkpoints side by side."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from _runs import grpo_flags

# random rewards: the critic has something to fit from the first rollout on
PPO = ("--advantage-estimator", "ppo", "--rm-type", "random", "--actor-num-gpus-per-node", "1")


def run_train(flags: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(["slime-ref", "train", *flags], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-4000:]}"
    return result


def rollouts(out: Path) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "train/value_loss" in r]


@pytest.mark.slow  # a real run: Ray, engines, router, two Megatron models
def test_ppo_colocated_saves_and_resumes_actor_and_critic(tiny, tmp_path):
    out, ck = tmp_path / "run", tmp_path / "ck"
    run_train(grpo_flags(tiny, out, *PPO, "--colocate", "--num-rollout", "2", "--save", str(ck),
                         "--save-interval", "2"))
    records = rollouts(out)
    assert [r["rollout_id"] for r in records] == [0, 1]
    for r in records:
        assert {"train/pg_loss", "train/value_clipfrac"} <= set(r)
        assert r["perf/weight_check_max_abs_diff"] <= 1e-5
    assert any(r["train/value_loss"] > 0 for r in records)
    assert (ck / "iter_0000001").is_dir() and (ck / "critic" / "iter_0000001").is_dir()

    # resume: both models come back from rollout 1 (a critic at another rollout is refused)
    out2 = tmp_path / "resumed"
    run_train(grpo_flags(tiny, out2, *PPO, "--colocate", "--num-rollout", "3", "--load", str(ck),
                         "--save", str(ck), "--save-interval", "3"))
    assert json.loads((out2 / "summary.json").read_text())["start_rollout_id"] == 2
    assert [r["rollout_id"] for r in rollouts(out2)] == [2]
    assert (ck / "critic" / "iter_0000002").is_dir()


@pytest.mark.slow  # a real run: Ray, engines, router, two Megatron models
def test_ppo_disaggregated(tiny, tmp_path):
    out = tmp_path / "run"
    run_train(grpo_flags(tiny, out, *PPO, "--rollout-num-gpus", "1", "--num-rollout", "2", "--gamma", "0.99",
                         "--lambd", "0.95", "--value-clip", "0.1"))
    records = rollouts(out)
    assert [r["rollout_id"] for r in records] == [0, 1]
    assert all("train/pg_loss" in r for r in records)
    processes = json.loads((out / "processes.json").read_text())
    assert len(processes["critic_ranks"]) == len(processes["train_ranks"]) == 1


@pytest.mark.slow  # a real run: Ray, engines, router, two Megatron models
def test_critic_only_run_leaves_the_actor_bit_identical(tiny, tmp_path):
    out, ck = tmp_path / "run", tmp_path / "ck"
    run_train(grpo_flags(tiny, out, *PPO, "--colocate", "--num-rollout", "2", "--num-critic-only-steps", "2",
                         "--save", str(ck), "--save-interval", "2", "--save-hf", str(tmp_path / "hf_{rollout_id}")))
    records = rollouts(out)
    assert [r["rollout_id"] for r in records] == [0, 1]
    assert not any("train/pg_loss" in r for r in records)  # the actor did not train
    assert any(r["train/value_loss"] > 0 for r in records)
    before = load_file(str(Path(tiny.model_dir) / "model.safetensors"))
    after = load_file(str(tmp_path / "hf_1" / "model.safetensors"))
    assert set(after) <= set(before)
    for name, tensor in after.items():
        assert torch.equal(tensor, before[name]), name


@pytest.mark.slow  # the quick start's warm-up and 80 rollouts, with a critic (about 4 minutes on 2 cores)
def test_ppo_raises_the_reward_by_the_grpo_quickstarts_margin(tmp_path):
    """The GRPO quick start's recipe with --advantage-estimator ppo: the held-out reward rises by at
    least the 0.3 the quick start must reach (measured: 0.18 -> 0.77 with PPO, 0.23 -> 0.78 with GRPO)."""
    from slime_ref.arguments import parse_args
    from slime_ref.assets import make_tiny
    from slime_ref.train import train
    from slime_rehearse.quickstart import QuickstartConfig, grpo_argv, warmup_argv

    out = tmp_path / "qs"
    cfg = QuickstartConfig(seed=0)
    assets = make_tiny(out / "assets", seed=0)
    train(parse_args(warmup_argv(cfg, assets, out)))
    argv = grpo_argv(cfg, assets, out)
    argv[argv.index("--advantage-estimator") + 1] = "ppo"
    summary = train(parse_args(argv))
    assert summary["reward_after"] - summary["reward_before"] >= 0.3, summary["eval"]


@pytest.mark.slow  # two real runs
def test_a_grpo_checkpoint_continues_with_ppo_and_a_fresh_critic(tiny, tmp_path):
    ck = tmp_path / "ck"
    run_train(grpo_flags(tiny, tmp_path / "grpo", "--actor-num-gpus-per-node", "1", "--colocate", "--num-rollout", "1",
                         "--save", str(ck), "--save-interval", "1"))
    out = tmp_path / "ppo"
    run_train(grpo_flags(tiny, out, *PPO, "--colocate", "--num-rollout", "2", "--load", str(ck)))
    assert json.loads((out / "summary.json").read_text())["start_rollout_id"] == 1
    assert [r["rollout_id"] for r in rollouts(out)] == [1]
