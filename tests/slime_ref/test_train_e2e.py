"""slime-ref train end to end on CPU: the real stack (Ray, sglang-router, built-in engines, Megatron actor).

Each run checks weights after every sync (--check-weight-update-equal: the engines' log-probs of a
fixed sequence must equal the trainer's, fp32), so a run that finishes has passed that check.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from _runs import grpo_flags


def run_train(flags: list[str], command: str = "train", timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(["slime-ref", command, *flags], capture_output=True, text=True, timeout=timeout, env=env)


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def assert_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-4000:]}"


@pytest.mark.slow  # a real run: Ray, engines, router, Megatron
def test_disaggregated_tp2_trainer_two_engines_distributed_sync(tiny, tmp_path):
    """TP=2 trainer and 2 engines behind the router, weights broadcast over a gloo group."""
    out = tmp_path / "run"
    result = run_train(grpo_flags(
        tiny, out, "--num-rollout", "3", "--actor-num-gpus-per-node", "2", "--tensor-model-parallel-size", "2",
        "--rollout-num-gpus", "2", "--update-weight-transport", "nccl",
        "--eval-prompt-data", "arith", str(tiny.eval_path), "--eval-interval", "3", "--n-samples-per-eval-prompt", "2",
    ))
    assert_ok(result)
    records = metrics(out)
    rollouts = [r for r in records if "train/pg_loss" in r]
    assert [r["rollout_id"] for r in rollouts] == [0, 1, 2]
    for r in rollouts:
        assert r["perf/weight_check_max_abs_diff"] <= 1e-5
        assert r["perf/update_weights_bytes"] > 0
        assert 0.0 <= r["rollout/raw_reward"] <= 1.0
        assert 0.0 < r["perf/actor_train_time"] < r["perf/train_time"]  # slime's timers of the train phase
    evals = [r for r in records if "eval/arith" in r]
    assert [r["rollout_id"] for r in evals] == [0, 2]  # before training and at the end
    assert "eval/arith-pass@2" in evals[-1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reward_before"] == evals[0]["eval/arith"]
    assert set(summary["phase_s"]) >= {"setup", "rollout", "train", "update_weights", "eval"}
    logs = {p.name for p in (out / "logs").iterdir()}
    assert {"engine-0.log", "engine-1.log", "router.log"} <= logs


@pytest.mark.slow  # a real run: Ray, engines, router, Megatron
def test_colocated_tensor_sync_and_disk_sync(tiny, tmp_path):
    for extra, name in (
        (["--colocate"], "colocated"),
        (["--update-weight-transport", "disk", "--update-weight-disk-dir", str(tmp_path / "w")], "disk"),
    ):
        out = tmp_path / name
        assert_ok(run_train(grpo_flags(tiny, out, "--num-rollout", "2", "--actor-num-gpus-per-node", "1", *extra)))
        rollouts = [r for r in metrics(out) if "train/pg_loss" in r]
        assert len(rollouts) == 2 and all(r["perf/weight_check_max_abs_diff"] <= 1e-5 for r in rollouts)


@pytest.mark.slow  # two real runs: Ray, engines, router, Megatron
def test_a_saved_rollout_trains_again_exactly_like_the_live_one(tiny, tmp_path):
    """slime's --save-debug-rollout-data, then --load-debug-rollout-data: no engine, same samples,
    so the same log-probs, advantages, loss and gradient norm (fp32 on CPU; bench/vs_slime.py gives
    slime and slime-ref one such batch). Two optimizer steps, so the old log-probs get their own pass;
    a zero-weight KL loss, so the reference model's too."""
    import torch

    def run(name, *extra):
        out = tmp_path / name
        assert_ok(run_train(grpo_flags(tiny, out, "--num-rollout", "1", "--actor-num-gpus-per-node", "1",
                                       "--global-batch-size", "8", "--num-steps-per-rollout", "2",
                                       "--use-kl-loss", "--kl-loss-coef", "0", "--ref-load", str(tiny.model_dir),
                                       "--save-debug-train-data", str(out / "train_{rollout_id}_{rank}.pt"), *extra)))
        step = next(r for r in metrics(out) if "train/pg_loss" in r)
        dump = torch.load(out / "train_0_0.pt", weights_only=False)
        return out, step, dump

    saved = tmp_path / "rollout_{rollout_id}.pt"
    _, live, live_dump = run("live", "--save-debug-rollout-data", str(saved))
    out, again, again_dump = run("again", "--load-debug-rollout-data", str(saved))
    assert json.loads((out / "args.json").read_text())["debug_train_only"] is True
    assert not (out / "logs" / "engine-0.log").exists()  # no engine started
    a, b = live_dump["rollout_data"], again_dump["rollout_data"]
    assert len(a["log_probs"]) == 16 and all(lp is not None for lp in a["log_probs"])
    assert [t.numel() for t in a["log_probs"]] == a["response_lengths"]
    assert a["response_lengths"] == b["response_lengths"] and a["rewards"] == b["rewards"]
    for key in ("tokens", "log_probs", "ref_log_probs", "advantages"):
        for x, y in zip(a[key], b[key], strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
    for ref, old in zip(a["ref_log_probs"], a["log_probs"], strict=True):  # before the first step: same weights
        torch.testing.assert_close(ref, old, rtol=0, atol=0)
    for name in ("train/pg_loss", "train/grad_norm", "train/ppo_kl"):
        assert again[name] == pytest.approx(live[name], rel=1e-6, abs=1e-9), name


@pytest.mark.slow  # a real run: Ray, engines, router, Megatron
def test_train_async_overlaps_and_refuses_colocate(tiny, tmp_path):
    out = tmp_path / "async"
    assert_ok(run_train(grpo_flags(tiny, out, "--num-rollout", "3", "--actor-num-gpus-per-node", "1",
                                   "--update-weights-interval", "2"), command="train-async"))
    rollouts = [r for r in metrics(out) if "train/pg_loss" in r]
    assert [r["rollout_id"] for r in rollouts] == [0, 1, 2]
    synced = [r["rollout_id"] for r in rollouts if "perf/update_weights_time" in r]
    assert synced == [1]  # every 2 rollouts: after rollout 1 (the run ends before rollout 3)
    refused = run_train(grpo_flags(tiny, tmp_path / "x", "--num-rollout", "1", "--colocate"), command="train-async")
    assert refused.returncode == 2 and "--colocate" in refused.stderr and "Traceback" not in refused.stderr


def _prompts_trained(dump_dir: Path) -> dict[int, list[str]]:
    """Prompts of each rollout, from --save-debug-rollout-data dumps (one file per rollout id)."""
    import torch

    trained = {}
    for path in sorted(dump_dir.glob("rollout_*.pt")):
        dump = torch.load(path, weights_only=False)
        trained[dump["rollout_id"]] = [s["prompt"] for s in dump["samples"]]
    return trained


@pytest.mark.slow  # a real run: Ray, engines, router, Megatron
def test_sigkill_mid_run_then_resume_trains_on_the_same_prompts(tiny, tmp_path):
    """Kill the trainer's whole process group with SIGKILL mid-run, resume from --load: the prompts
    trained on, rollout by rollout, equal an uninterrupted run's."""
    def flags(out: Path, save: Path) -> list[str]:
        return grpo_flags(tiny, out, "--num-rollout", "6", "--actor-num-gpus-per-node", "1", "--colocate",
                          "--rollout-shuffle", "--save", str(save), "--load", str(save), "--save-interval", "1",
                          "--save-debug-rollout-data", str(out / "dumps" / "rollout_{rollout_id}.pt"))

    whole = tmp_path / "whole"
    assert_ok(run_train(flags(whole, tmp_path / "whole-ckpt")))
    expected = _prompts_trained(whole / "dumps")
    assert sorted(expected) == list(range(6))

    out, save = tmp_path / "killed", tmp_path / "killed-ckpt"
    log = tmp_path / "killed.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(["slime-ref", "train", *flags(out, save)], stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + 400
    # wait until rollout 2 has been saved, then kill mid-run; a run that stops first is the failure
    while time.monotonic() < deadline and proc.poll() is None and _last_saved(save) < 2:
        time.sleep(0.2)
    # the run's processes, Ray's workers included: a training actor outside the process group that
    # outlived the kill could finish a checkpoint after `saved` is read below
    tree = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))] if proc.poll() is None \
        else [proc.pid]
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # it had already stopped, its group with it
        pass
    for pid in tree[1:]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)
    for pid in tree:
        _wait_gone(pid)
    saved = _last_saved(save)
    if saved < 2:
        why = "in 400 s" if proc.returncode == -signal.SIGKILL else f"it stopped on its own, exit {proc.returncode}"
        tail = log.read_text(errors="replace")[-3000:]
        pytest.fail(f"the run to be killed saved no rollout past 1 ({why}); its log ends:\n{tail}")
    assert saved < 5, "the kill came too late to interrupt the run"

    assert_ok(run_train(flags(out, save)))
    resumed = [r["rollout_id"] for r in metrics(out) if "train/pg_loss" in r]
    assert resumed[-(5 - saved):] == list(range(saved + 1, 6)), resumed  # resumed right after the checkpoint
    # a rollout generated before the kill but not yet saved is generated again, from the same prompts
    assert _prompts_trained(out / "dumps") == expected


def _last_saved(save: Path) -> int:
    """The last rollout a run has checkpointed under --save (-1 before its first)."""
    latest = save / "latest_checkpointed_iteration.txt"
    text = latest.read_text().strip() if latest.is_file() else ""
    return int(text) if text.isdigit() else -1


def _wait_gone(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid):
            return
        time.sleep(0.2)


def test_bad_flags_exit_2_without_starting_anything(tiny, tmp_path):
    typo = run_train(grpo_flags(tiny, tmp_path / "t", "--num-rollout", "1", "--rollout-temprature", "0.5"))
    assert typo.returncode == 2 and "did you mean --rollout-temperature?" in typo.stderr
    unsupported = run_train(grpo_flags(tiny, tmp_path / "u", "--num-rollout", "1", "--keep-old-actor"))
    assert unsupported.returncode == 2 and "does not implement: --keep-old-actor" in unsupported.stderr
    for result in (typo, unsupported):
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "t").exists()


def test_help_lists_slime_flags():
    result = subprocess.run(["slime-ref", "train", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for flag in ("--rollout-batch-size", "--advantage-estimator", "--colocate", "--tensor-model-parallel-size",
                 "--eval-prompt-data", "--update-weight-buffer-size"):
        assert flag in result.stdout


@pytest.mark.slow  # a real run: Ray, engines, router, Megatron
def test_joins_a_separately_started_ray_head(tiny, tmp_path):
    """Multi-node goes through an existing cluster: `ray start --head`, then RAY_ADDRESS."""
    from slime_ref.utils.net import PortAllocator

    # Ray refuses a GCS port inside its own worker-port range (10002-19999, where slime-ref's start)
    port = PortAllocator(base=20000).allocate()
    # a short path: Ray's socket paths under it must fit the 107-byte Unix limit
    ray_dir = tempfile.mkdtemp(prefix="ray-join-", dir="/tmp")
    ray_bin = str(Path(sys.executable).with_name("ray"))
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    head = subprocess.Popen(
        [ray_bin, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port),
         "--num-cpus", "6", "--include-dashboard", "false", "--temp-dir", ray_dir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True,
    )
    try:
        out = tmp_path / "joined"
        flags = grpo_flags(tiny, out, "--num-rollout", "1", "--actor-num-gpus-per-node", "1", "--colocate")
        address = f"127.0.0.1:{port}"
        # `ray start --head` turns on token authentication; the CLI then needs RAY_AUTH_MODE=token
        client_env = {**env, "RAY_AUTH_MODE": "token"}

        def head_answers() -> bool:
            probe = subprocess.run([ray_bin, "status", "--address", address], capture_output=True, timeout=60,
                                   env=client_env)
            return probe.returncode == 0

        deadline = time.monotonic() + 90
        while not head_answers():
            assert time.monotonic() < deadline, "the Ray head did not come up"
            time.sleep(2)
        result = subprocess.run(["slime-ref", "train", *flags], capture_output=True, text=True, timeout=400,
                                env={**os.environ, "RAY_ADDRESS": address})
        assert_ok(result)
        assert len([r for r in metrics(out) if "train/pg_loss" in r]) == 1
        # a joined cluster belongs to the user: the run leaves it running
        assert head.poll() is None
        assert head_answers()
    finally:  # the head and the Ray processes it started share its process group: stop them by group
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=30)
        shutil.rmtree(ray_dir, ignore_errors=True)
