"""slime-check quickstart: the guided run raises the held-out reward, writes only under --out, and
leaves no process behind, also when interrupted."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from slime_check.findings import Finding, Status


def _processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(text in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _wait_none_left(marker: str, timeout: float = 60) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    left = _processes_mentioning(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _processes_mentioning(marker)
    return left


@pytest.fixture
def short_tmp():
    path = Path(tempfile.mkdtemp(prefix="qs-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_quickstart_raises_the_eval_reward_and_cleans_up(short_tmp):
    # a short --out, as a user's usually is: Ray's socket paths under OUT/ray must fit 107 bytes
    out = short_tmp / "qs"
    cwd = short_tmp / "cwd"
    cwd.mkdir()
    result = subprocess.run(["slime-check", "quickstart", "--out", str(out), "--seed", "0"], cwd=cwd,
                            capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "160"})
    assert result.returncode == 0, result.stderr[-4000:] + result.stdout[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reward_after"] - summary["reward_before"] >= 0.3, summary["eval"]
    assert summary["wall_s"] > 0
    assert {"checks", "assets", "warmup", "grpo", "grpo/rollout", "grpo/train", "grpo/update_weights"} <= set(
        summary["phase_s"])
    assert (out / "reward.png").read_bytes()[:4] == b"\x89PNG"
    assert "Next steps toward a real slime run" in result.stdout
    # every sync was checked: engines' log-probs equal the trainer's
    grpo = [json.loads(line) for line in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    checks = [r["perf/weight_check_max_abs_diff"] for r in grpo if "perf/weight_check_max_abs_diff" in r]
    assert checks and max(checks) <= 1e-5
    # only under --out: nothing in the working directory, Ray's session files inside --out
    assert list(cwd.iterdir()) == []
    assert any((out / "ray").iterdir())
    assert _wait_none_left(str(out)) == []


@pytest.mark.slow
def test_ctrl_c_stops_exactly_what_the_quickstart_started(tmp_path):
    out = tmp_path / "qs"
    proc = subprocess.Popen(["slime-check", "quickstart", "--out", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    # The router is started once every engine answers /health_generate: its log means the servers are up.
    router_log = out / "grpo" / "logs" / "router.log"

    def servers_up() -> bool:
        return router_log.is_file() and any(p.pid != proc.pid for p in _processes_mentioning(str(out)))

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None and not servers_up():
        time.sleep(0.5)
    assert servers_up(), "the GRPO phase's engines and router never came up"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) != 0
    assert _wait_none_left(str(out)) == []


def test_a_failed_check_refuses_to_start(tmp_path, monkeypatch):
    from slime_check import quickstart as qs
    from slime_check.cli import cli

    monkeypatch.setattr(qs, "quickstart_checks", lambda out: [
        Finding("quickstart.memory", Status.FAIL, "0.5 GiB of memory available", "free memory", qs.DOC)])
    out = tmp_path / "qs"
    result = CliRunner().invoke(cli, ["quickstart", "--out", str(out)], standalone_mode=False)
    assert isinstance(result.exception, Exception) and "quickstart.memory" in str(result.exception)
    assert not (out / "assets").exists()


def test_quickstart_checks_pass_on_this_machine(tmp_path):
    from slime_check.quickstart import quickstart_checks

    findings = quickstart_checks(tmp_path)
    assert {f.id for f in findings} >= {"quickstart.packages", "quickstart.memory", "quickstart.shm"}
    assert not [f for f in findings if f.status is Status.FAIL]


def test_recipe_flags_parse_and_keep_the_batch_identity(tiny, tmp_path):
    from slime_check.quickstart import QuickstartConfig, grpo_argv, warmup_argv
    from slime_ref.arguments import parse_args

    cfg = QuickstartConfig()
    (tmp_path / "warmup" / "hf").mkdir(parents=True)
    for src in tiny.model_dir.iterdir():
        (tmp_path / "warmup" / "hf" / src.name).write_bytes(src.read_bytes())
    warm = parse_args(warmup_argv(cfg, tiny, tmp_path))
    assert warm.loss_type == "sft_loss" and warm.debug_train_only and warm.rollout_num_gpus == 0
    grpo = parse_args(grpo_argv(cfg, tiny, tmp_path))
    assert grpo.global_batch_size * grpo.num_steps_per_rollout == grpo.rollout_batch_size * grpo.n_samples_per_prompt
    assert grpo.colocate and grpo.check_weight_update_equal and grpo.eval_datasets == [("arith", str(tiny.eval_path))]
    assert Path(grpo.hf_checkpoint) == tmp_path / "warmup" / "hf"


def test_a_swallowed_ctrl_c_still_stops_the_run_at_its_next_phase():
    # a KeyboardInterrupt raised inside a finalizer is dropped by Python; the latch remembers it
    from slime_check.quickstart import InterruptLatch

    events, totals = [], []

    class Display:
        def __call__(self, phase, **info):
            events.append(phase)

        def set_total(self, n):
            totals.append(n)

    with InterruptLatch() as latch:
        progress = latch.guard(Display())
        progress("rollout", rollout_id=0)
        progress.set_total(5)  # the display's own methods pass through
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            progress("train", rollout_id=0)
    assert events == ["rollout"] and totals == [5]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
