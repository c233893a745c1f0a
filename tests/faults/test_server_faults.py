"""Faults of the serving side: an engine or the router dies, or an engine hangs, mid-rollout.

Each run either recovers as slime does (``--use-fault-tolerance``: the engine restarts and the run
finishes) or stops within 60 s: one error line that names what failed and its log, a non-zero exit,
no traceback, and no process left behind.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
from _harness import LaunchedRun, assert_clean_stop, engine_state, grpo_flags

pytestmark = pytest.mark.slow

# Rollouts that take a while (responses run to 200 tokens), so the fault lands mid-rollout.
LONG_ROLLOUTS = ("--custom-generate-function-path", "fault_hooks.long_generate", "--rollout-max-response-len", "200")
STOP_WITHIN_S = 60


def _in_flight(out, engine: int):
    """Once engine ``engine`` is generating a rollout (several requests running, tokens out): its pid.
    One running request may be the weight check's probe between rollouts, or a health check."""
    def check():
        procs = json.loads((out / "processes.json").read_text()) if (out / "processes.json").is_file() else None
        if not procs:
            return None
        state = engine_state(procs["engine_urls"][engine])
        if state.get("num_running_reqs", 0) >= 2 and state.get("num_generated_tokens", 0) > 0:
            return procs["engines"][engine]
        return None
    return check


def _launch(tiny, tmp_path, *extra):
    out = tmp_path / "run"
    return out, LaunchedRun(grpo_flags(tiny, out, *LONG_ROLLOUTS, *extra), tmp_path / "console")


def test_engine_killed_mid_rollout_stops_the_run(tiny, tmp_path):
    out, run = _launch(tiny, tmp_path, "--num-rollout", "3", "--rollout-num-gpus", "2")
    try:
        pid = run.wait_for(_in_flight(out, 1), 300, "engine-1 generating")
        os.kill(pid, signal.SIGKILL)
        code, took = run.finish(timeout=120)
        line = assert_clean_stop(run, code, "rollout engine-1", "was killed by SIGKILL", "engine-1.log",
                                 "--use-fault-tolerance")
        assert took < STOP_WITHIN_S, (took, line)
    finally:
        run.kill()


def test_engine_killed_mid_rollout_is_restarted_with_fault_tolerance(tiny, tmp_path):
    out, run = _launch(tiny, tmp_path, "--num-rollout", "3", "--rollout-num-gpus", "2", "--use-fault-tolerance",
                       "--rollout-health-check-interval", "2", "--rollout-health-check-timeout", "20")
    try:
        pid = run.wait_for(_in_flight(out, 1), 300, "engine-1 generating")
        os.kill(pid, signal.SIGKILL)
        code, _ = run.finish(timeout=600)
        assert code == 0, run.stderr()[-4000:]
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        trained = [r["rollout_id"] for r in records if "train/pg_loss" in r]
        assert trained == [0, 1, 2]  # the rollout the engine died in finished, and so did the rest
        # the restarted engine got the trainer's weights: --check-weight-update-equal compared every engine
        assert all(
            r["perf/weight_check_max_abs_diff"] <= 1e-5 for r in records if "perf/weight_check_max_abs_diff" in r
        )
        restarted = json.loads((out / "processes.json").read_text())["engines"][1]
        assert restarted != pid
        assert run.leftovers() == []
    finally:
        run.kill()


def test_router_killed_mid_rollout_stops_the_run(tiny, tmp_path):
    out, run = _launch(tiny, tmp_path, "--num-rollout", "3")
    try:
        run.wait_for(_in_flight(out, 0), 300, "engine-0 generating")
        router = json.loads((out / "processes.json").read_text())["router"]
        os.kill(router, signal.SIGKILL)
        code, took = run.finish(timeout=120)
        assert_clean_stop(run, code, "the router", "was killed by SIGKILL", "router.log")
        assert took < STOP_WITHIN_S
    finally:
        run.kill()


def test_hung_engine_stops_the_run_after_the_health_check_timeout(tiny, tmp_path):
    """SIGSTOP: the process lives but answers nothing. slime without --use-fault-tolerance would wait
    forever; slime-ref's watch stops the run after --rollout-health-check-timeout."""
    out, run = _launch(tiny, tmp_path, "--num-rollout", "3", "--rollout-health-check-interval", "2",
                       "--rollout-health-check-timeout", "10")
    try:
        pid = run.wait_for(_in_flight(out, 0), 300, "engine-0 generating")
        os.kill(pid, signal.SIGSTOP)
        code, took = run.finish(timeout=120)
        assert_clean_stop(run, code, "rollout engine-0", "did not answer /health_generate within 10 s",
                          "engine-0.log")
        assert took < STOP_WITHIN_S
    finally:
        run.kill()


def test_an_engine_hung_during_the_weight_check_fails_it_after_the_health_check_timeout(tiny, tmp_path):
    """Between rollouts the watch is paused; the weight check's probe (--check-weight-update-equal) to an
    engine that answers nothing fails after --rollout-health-check-timeout, naming the engine."""
    import time

    from slime_ref.arguments import parse_args
    from slime_ref.ray.rollout_manager import RolloutManager
    from slime_ref.rollout.servers import RolloutServers
    from slime_ref.rollout.sglang_client import EngineError

    args = parse_args(grpo_flags(tiny, tmp_path / "run", "--num-rollout", "1", "--rollout-health-check-timeout", "3"))
    manager = RolloutManager(args, placement=None)
    with RolloutServers(tiny.model_dir, log_dir=tmp_path / "logs", with_router=False) as servers:
        manager.engine_urls = list(servers.engine_urls)
        url = servers.engine_urls[0]
        assert len(manager.score(list(range(3, 15)), 4)[0]) == 4  # answering: four log-probs back
        os.kill(servers.engines[0].pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            with pytest.raises(EngineError) as err:
                manager.score(list(range(3, 15)), 4)
            took = time.monotonic() - start
        finally:
            os.kill(servers.engines[0].pid, signal.SIGCONT)
    assert f"{url}/generate" in str(err.value) and "timed out" in str(err.value)
    assert 3 <= took < 30
