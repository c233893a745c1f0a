"""Faults of the job itself: a training rank or the driver is SIGKILLed, a reward hook misbehaves,
or an engine keeps answering HTTP 500.

A killed part stops the rest; ``--load`` then resumes from the last complete checkpoint and trains
on exactly the prompts the uninterrupted run would have used.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

import pytest
import torch
from _harness import LaunchedRun, assert_clean_stop, grpo_flags

pytestmark = pytest.mark.slow

STOP_WITHIN_S = 60


def _saved(save) -> int | None:
    tracker = save / "latest_checkpointed_iteration.txt"
    text = tracker.read_text().strip() if tracker.is_file() else ""
    return int(text) if text.isdigit() else None


def _prompts_trained(dump_dir) -> dict[int, list]:
    """Prompts of each rollout, from --save-debug-rollout-data dumps."""
    trained = {}
    for path in sorted(dump_dir.glob("rollout_*.pt")):
        dump = torch.load(path, weights_only=False)
        trained[dump["rollout_id"]] = [s["prompt"] for s in dump["samples"]]
    return trained


def _resumable(tiny, out, save):
    return grpo_flags(tiny, out, "--num-rollout", "5", "--save", str(save), "--load", str(save), "--save-interval",
                      "1", "--rollout-shuffle", "--save-debug-rollout-data",
                      str(out / "dumps" / "rollout_{rollout_id}.pt"))


@pytest.fixture(scope="module")
def uninterrupted(tiny, tmp_path_factory):
    """The prompts an uninterrupted 5-rollout run trains on."""
    root = tmp_path_factory.mktemp("whole")
    run = LaunchedRun(_resumable(tiny, root / "run", root / "ckpt"), root / "console")
    try:
        code, _ = run.finish(timeout=600)
        assert code == 0, run.stderr()[-3000:]
    finally:
        run.kill()
    prompts = _prompts_trained(root / "run" / "dumps")
    assert sorted(prompts) == list(range(5))
    return prompts


@pytest.mark.parametrize("victim", ["training rank", "driver"])
def test_a_killed_training_rank_or_driver_stops_the_rest_and_load_resumes(tiny, tmp_path, uninterrupted, victim):
    out, save = tmp_path / "run", tmp_path / "ckpt"
    run = LaunchedRun(_resumable(tiny, out, save), tmp_path / "console")
    try:
        run.wait_for(lambda: (_saved(save) or 0) >= 1, 400, "the checkpoint of rollout 1")
        procs = run.processes(out)
        pid = procs["train_ranks"][0] if victim == "training rank" else procs["driver"]
        os.kill(pid, signal.SIGKILL)
        code, took = run.finish(timeout=120)
        if victim == "training rank":
            assert_clean_stop(run, code, "training rank 0 died", "worker-")
            assert took < STOP_WITHIN_S
        else:
            assert code == -signal.SIGKILL
            assert run.leftovers(timeout=STOP_WITHIN_S) == []  # everything the driver started goes with it
    finally:
        run.kill()
    saved = _saved(save)
    assert saved is not None and saved < 4, "the kill came too late to interrupt the run"

    resumed = LaunchedRun(_resumable(tiny, out, save), tmp_path / "console-resumed")
    try:
        code, _ = resumed.finish(timeout=600)
        assert code == 0, resumed.stderr()[-3000:]
    finally:
        resumed.kill()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r["rollout_id"] for r in records if "train/pg_loss" in r]
    assert trained[-(4 - saved):] == list(range(saved + 1, 5)), trained  # right after the last checkpoint
    assert _prompts_trained(out / "dumps") == uninterrupted  # and on the same prompts


@pytest.mark.parametrize("hook, returned", [("reward_none_on_third", "returned None"),
                                            ("reward_nan_on_third", "returned nan"),
                                            ("reward_raises_on_third", "raised KeyError ('answer')")])
def test_a_bad_reward_names_the_hook_and_the_sample(tiny, tmp_path, hook, returned):
    out = tmp_path / "run"
    run = LaunchedRun(grpo_flags(tiny, out, "--num-rollout", "1", "--custom-rm-path", f"fault_hooks.{hook}"),
                      tmp_path / "console")
    try:
        code, _ = run.finish(timeout=300)
    finally:
        run.kill()
    line = assert_clean_stop(run, code, f"--custom-rm-path fault_hooks.{hook}", returned, "sample 2 (prompt ")
    assert code == 2, line


def test_an_engine_answering_500_is_retried_as_slime_does_then_stops(tiny, tmp_path):
    """A router that answers /generate with HTTP 500: slime's post() retries 60 times, 1 s apart,
    then fails; slime-ref does the same and stops with the URL and the answer."""
    from aiohttp import web

    calls = []

    async def failing(request):
        calls.append(time.monotonic())
        return web.Response(status=500, text="CUDA error: an illegal memory access was encountered")

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", failing)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    out = tmp_path / "run"
    run = LaunchedRun(grpo_flags(tiny, out, "--num-rollout", "1", "--sglang-router-ip", "127.0.0.1",
                                 "--sglang-router-port", str(port)), tmp_path / "console")
    try:
        code, _ = run.finish(timeout=400)
    finally:
        run.kill()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.run_until_complete(runner.cleanup())
        loop.close()
    line = assert_clean_stop(run, code, f"127.0.0.1:{port}/generate", "HTTP 500", "illegal memory access")
    assert code == 1, line
    assert len(calls) >= 61, (len(calls), line)  # 1 try + 60 retries of each request
    assert 55 < calls[-1] - calls[0] < 200  # retried about 1 s apart for a minute, not with a growing backoff
