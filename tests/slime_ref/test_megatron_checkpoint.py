"""Checkpoints: a job SIGKILLed mid-save resumes bit-for-bit; converting HF <-> torch_dist is lossless.

The training run uses dropout and two data-parallel ranks, so an exact resume needs the weights,
the distributed optimizer state, the LR schedule and every rank's RNG state back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from megatron_workers import load_and_score_worker, resume_worker, run_workers

TESTS = Path(__file__).parents[1]
ARGV = ["--global-batch-size", "4", "--micro-batch-size", "1", "--lr", "1e-3", "--lr-warmup-iters", "2",
        "--lr-decay-style", "cosine", "--lr-decay-iters", "8", "--attention-dropout", "0.1", "--hidden-dropout", "0.1"]
CRASH_AT = 2


def _run_cli(*args):
    r = subprocess.run([sys.executable, "-m", "slime_ref.cli", *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r


@pytest.fixture(scope="module")
def uninterrupted(tiny):
    return run_workers(resume_worker, 2, model_dir=str(tiny.model_dir), argv=ARGV, stop=CRASH_AT + 2)[0]


@pytest.fixture(scope="module")
def crashed(tiny, tmp_path_factory):
    """Start a job that saves after every rollout; SIGKILL it while it saves rollout CRASH_AT."""
    save = tmp_path_factory.mktemp("ckpt") / "save"
    marker = save.parent / "saving"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "RESUME_ARGV": json.dumps(ARGV)}
    proc = subprocess.Popen(
        [sys.executable, str(TESTS / "megatron_workers.py"), "crash", str(tiny.model_dir), str(save), str(marker),
         str(CRASH_AT)],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the job never reached the save of rollout 2"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the job's own process group: the launcher and its 2 ranks
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    return save


def test_learning_rate_warms_up_then_decays(uninterrupted):
    # --lr-warmup-iters 2 of --global-batch-size 4: the scheduler counts samples, as slime's does
    lrs = uninterrupted["lrs"]
    assert lrs[:3] == pytest.approx([0.0, 5e-4, 1e-3], abs=1e-12)
    assert 0 < lrs[3] < lrs[2] and all(b <= a for a, b in zip(lrs[2:], lrs[3:]))


def test_a_save_killed_midway_leaves_the_previous_checkpoint_current(crashed):
    assert (crashed / "latest_checkpointed_iteration.txt").read_text().strip() == str(CRASH_AT - 1)
    assert (crashed / f".iter_{CRASH_AT:07d}.partial").is_dir()  # written, never published
    assert not (crashed / f"iter_{CRASH_AT:07d}").exists()


def test_resume_after_sigkill_continues_bit_for_bit(tiny, crashed, uninterrupted):
    resumed = run_workers(resume_worker, 2, model_dir=str(tiny.model_dir), stop=CRASH_AT + 2,
                          argv=ARGV + ["--load", str(crashed), "--save", str(crashed),
                                       "--save-hf", str(crashed.parent / "hf_{rollout_id}")])
    first = resumed[0]
    assert first["start"] == CRASH_AT and first["data_state"] == {"next_offset": CRASH_AT}
    for rollout_id in (CRASH_AT, CRASH_AT + 1):
        assert first["losses"][rollout_id] == uninterrupted["losses"][rollout_id]
    assert all(r["losses"] == first["losses"] for r in resumed)
    assert (crashed / "latest_checkpointed_iteration.txt").read_text().strip() == str(CRASH_AT + 1)


def test_convert_round_trip_is_lossless_and_loads_under_tp2(tiny, tmp_path):
    torch_dist = tmp_path / "torch_dist"
    _run_cli("convert", "hf-to-torch-dist", "--hf-checkpoint", str(tiny.model_dir), "--save", str(torch_dist))
    assert (torch_dist / "latest_checkpointed_iteration.txt").read_text().strip() == "release"
    back = tmp_path / "hf"
    _run_cli("convert", "torch-dist-to-hf", "--input-dir", str(torch_dist), "--output-dir", str(back),
             "--origin-hf-dir", str(tiny.model_dir))
    source, converted = load_file(tiny.model_dir / "model.safetensors"), load_file(back / "model.safetensors")
    assert set(source) == set(converted) and all(torch.equal(source[k], converted[k]) for k in source)
    assert (back / "tokenizer.json").read_bytes() == (tiny.model_dir / "tokenizer.json").read_bytes()

    # saved from one process, loaded resharded over two tensor-parallel ranks
    result = run_workers(
        load_and_score_worker,
        2,
        model_dir=str(tiny.model_dir),
        argv=[
            "--tensor-model-parallel-size",
            "2",
            "--load",
            str(torch_dist),
            "--global-batch-size",
            "2",
            "--attention-dropout",
            "0",
            "--hidden-dropout",
            "0",
        ],
    )[0]
    assert result["start"] == 0 and result["logits_max_diff"] < 1e-5


def test_training_checkpoint_converts_to_the_same_weights_as_save_hf(tiny, crashed, tmp_path):
    """Runs after the resume test: iter_3 and hf_3 hold the same trained weights."""
    last = CRASH_AT + 1
    out = tmp_path / "from_ckpt"
    _run_cli("convert", "torch-dist-to-hf", "--input-dir", str(crashed), "--output-dir", str(out),
             "--origin-hf-dir", str(tiny.model_dir))
    saved_hf = load_file(crashed.parent / f"hf_{last}" / "model.safetensors")
    converted = load_file(out / "model.safetensors")
    original = load_file(tiny.model_dir / "model.safetensors")
    assert set(saved_hf) == set(converted) and all(torch.equal(saved_hf[k], converted[k]) for k in saved_hf)
    assert not torch.equal(saved_hf["lm_head.weight"], original["lm_head.weight"])  # it did train


def test_convert_reports_a_missing_checkpoint_in_one_line(tmp_path, tiny):
    r = subprocess.run([sys.executable, "-m", "slime_ref.cli", "convert", "torch-dist-to-hf", "--input-dir",
                        str(tmp_path), "--output-dir", str(tmp_path / "o"), "--origin-hf-dir", str(tiny.model_dir)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--input-dir" in r.stderr
