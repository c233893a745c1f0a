"""Metrics reach the JSONL file, TensorBoard and W&B (offline), and `slime-ref plot` draws them."""

from __future__ import annotations

import argparse
import subprocess
import time

import pytest

from slime_ref.utils.tracking import METRICS_FILE, PREVIOUS_METRICS_FILE, Tracker, read_metrics


def _args(**kw):
    base = dict(use_tensorboard=False, tb_project_name=None, tb_experiment_name=None, use_wandb=False,
                wandb_mode=None, wandb_project=None, wandb_group=None, wandb_dir=None)
    base.update(kw)
    return argparse.Namespace(**base)


def _log_run(tracker, n=5):
    for i in range(n):
        tracker.log({"rollout/raw_reward": 0.1 * i, "train/ppo_kl": 0.0, "rollout/response_length": 4 + i,
                     "perf/train_time": 0.5, "eval/tiny": 0.2 * i, "train/nan": float("nan")}, rollout_id=i)


def test_jsonl_records_and_torn_line(tmp_path):
    t = Tracker(_args(), tmp_path)
    _log_run(t)
    t.close()
    with open(tmp_path / METRICS_FILE, "a") as f:
        f.write('{"rollout_id": 5, "rollout/raw')  # a crash mid-write
    records = read_metrics(tmp_path)
    assert [r["rollout_id"] for r in records] == [0, 1, 2, 3, 4]
    assert records[3]["rollout/raw_reward"] == pytest.approx(0.3)
    assert records[0]["train/nan"] is None


def test_a_new_run_starts_a_new_file_and_a_resumed_run_appends(tmp_path):
    first = Tracker(_args(), tmp_path)
    _log_run(first, n=3)
    first.close()
    again = Tracker(_args(), tmp_path)  # from rollout 0 again: the earlier run's rows move aside
    _log_run(again, n=2)
    again.close()
    assert [r["rollout_id"] for r in read_metrics(tmp_path)] == [0, 1]
    assert (tmp_path / PREVIOUS_METRICS_FILE).read_text().count("\n") == 3
    resumed = Tracker(_args(), tmp_path, start_rollout_id=2)
    resumed.log({"rollout/raw_reward": 1.0}, rollout_id=2)
    resumed.close()
    assert [r["rollout_id"] for r in read_metrics(tmp_path)] == [0, 1, 2]


def test_tensorboard_event_file(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t = Tracker(_args(use_tensorboard=True, tb_project_name="p", tb_experiment_name="e"), tmp_path)
    _log_run(t)
    t.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard" / "p" / "e"))
    acc.Reload()
    values = [e.value for e in acc.Scalars("rollout/raw_reward")]
    assert values == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])


def test_wandb_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    t = Tracker(_args(use_wandb=True, wandb_mode="offline", wandb_project="slime-ref-test"), tmp_path)
    _log_run(t, n=3)
    t.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    # closing stops the wandb-core service the run started
    import psutil

    deadline = time.monotonic() + 30
    while any("wandb-core" in " ".join(c.cmdline()) for c in psutil.Process().children(recursive=True)):
        assert time.monotonic() < deadline, "wandb-core still running after Tracker.close()"
        time.sleep(0.5)


def test_plot_writes_png(tmp_path):
    t = Tracker(_args(), tmp_path)
    _log_run(t)
    t.close()
    r = subprocess.run(["slime-ref", "plot", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    png = tmp_path / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_metrics_exits_2(tmp_path):
    r = subprocess.run(["slime-ref", "plot", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "metrics.jsonl" in r.stderr and "Traceback" not in r.stderr
