"""slime-check quickstart: the guided run raises the held-out reward, writes only under --out, and
leaves no process behind, also when interrupted."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
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


@pytest.fixture(scope="module")
def quickstart_run():
    """One quick start as the README runs it (``--out slime-quickstart`` in the working directory),
    stdout piped; the tests below read what it printed and wrote."""
    # a short path, as a user's usually is: Ray's socket paths under OUT/ray must fit 107 bytes
    base = Path(tempfile.mkdtemp(prefix="qs-", dir="/tmp"))
    cwd = base / "cwd"
    cwd.mkdir()
    out = cwd / "slime-quickstart"
    umask = os.umask(0o022)
    os.umask(umask)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "RAY_AUTH_MODE")}
    result = subprocess.run(["slime-check", "quickstart", "--out", "slime-quickstart", "--seed", "0"], cwd=cwd,
                            capture_output=True, text=True, timeout=900, env=env)
    yield result, out, cwd, umask
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_quickstart_raises_the_eval_reward_and_cleans_up(quickstart_run):
    result, out, cwd, _ = quickstart_run
    assert result.returncode == 0, result.stderr[-4000:] + result.stdout[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reward_after"] - summary["reward_before"] >= 0.3, summary["eval"]
    assert summary["wall_s"] > 0
    assert {"checks", "assets", "warmup", "grpo", "grpo/rollout", "grpo/train", "grpo/update_weights"} <= set(
        summary["phase_s"])
    assert (out / "reward.png").read_bytes()[:4] == b"\x89PNG"
    # every sync was checked: engines' log-probs equal the trainer's
    grpo = [json.loads(line) for line in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    checks = [r["perf/weight_check_max_abs_diff"] for r in grpo if "perf/weight_check_max_abs_diff" in r]
    assert checks and max(checks) <= 1e-5
    # item 4: the KL panel has a series that moves (KL to the warm-up model, logged, not trained on)
    kl = [r["train/kl_loss"] for r in grpo if "train/kl_loss" in r]
    assert kl and max(kl) > 0
    # only under --out: nothing else in the working directory, Ray's session files inside --out
    assert list(cwd.iterdir()) == [out]
    assert any((out / "ray").iterdir())
    assert _wait_none_left(str(out)) == []


@pytest.mark.slow
def test_quickstart_output_reads_right_piped(quickstart_run):
    """Items 5-8 and 10 of issue 44, on the rendered output of the shared run."""
    result, out, _, umask = quickstart_run
    assert result.returncode == 0, result.stderr[-4000:]
    text = result.stdout + result.stderr
    summary = json.loads((out / "summary.json").read_text())
    # 5: the first eval is the summary's reward_before, labelled as before training
    assert f"eval before training: arith {summary['reward_before']:.3f}" in result.stdout
    assert "eval after rollout 0:" not in result.stdout
    assert f"before training {summary['reward_before']:.3f} -> after" in result.stdout
    # 6: the warm-up's bar ends with its loss, not a reward of 0
    warm_bar = next(line for line in result.stdout.splitlines() if line.startswith("warm-up "))
    assert "loss " in warm_bar and "reward" not in warm_bar and "generating" not in warm_bar
    # 7: piped, the console is as wide as prereqs' and config's: no path is cut
    assert "…" not in result.stdout
    assert str(out / "reward.png") in result.stdout and str(out / "summary.json") in result.stdout
    # 8: Ray's token-authentication notice is not shown (the run owns its Ray)
    assert "Token authentication" not in text
    # 10: what the run writes has the umask's usual mode
    for path in [out / "summary.json", out / "reward.png", *(out / "grpo" / "hf").iterdir(),
                 *(out / "warmup" / "hf").iterdir()]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path
    assert stat.S_IMODE((out / "grpo" / "hf").stat().st_mode) == 0o777 & ~umask


@pytest.mark.slow
def test_the_trained_model_is_saved_and_exported_as_hf(quickstart_run):
    """Item 3: the GRPO-trained model is a Megatron checkpoint and an HF copy, and differs from the warm-up."""
    from safetensors.torch import load_file

    result, out, _, _ = quickstart_run
    assert result.returncode == 0, result.stderr[-4000:]
    args = json.loads((out / "grpo" / "args.json").read_text())
    assert args["save"] == str(out / "grpo" / "checkpoint") and args["save_hf"] == str(out / "grpo" / "hf")
    assert any((out / "grpo" / "checkpoint").iterdir())
    trained = load_file(out / "grpo" / "hf" / "model.safetensors")
    warm = load_file(out / "warmup" / "hf" / "model.safetensors")
    assert trained.keys() == warm.keys()
    assert any(not (trained[k] == warm[k]).all() for k in trained)
    assert (out / "grpo" / "hf" / "tokenizer.json").is_file() and (out / "grpo" / "hf" / "config.json").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outputs"]["trained_model_hf"] == str(out / "grpo" / "hf")


def _printed_next_steps(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Next steps, from this directory"))
    commands = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        if not line.startswith("      "):  # a command; its description is indented further
            commands.append(line.strip())
    return commands


@pytest.mark.slow
def test_the_next_steps_run_as_printed(quickstart_run):
    """Item 2: each printed next step runs, as printed, from the directory the quick start ran in."""
    result, out, cwd, _ = quickstart_run
    assert result.returncode == 0, result.stderr[-4000:]
    commands = _printed_next_steps(result.stdout)
    assert commands == json.loads((out / "summary.json").read_text())["next_steps"]
    assert commands[0].startswith("slime-ref generate slime-quickstart/grpo/hf ")
    assert any(c.startswith("slime-check smoke --env TINY=slime-quickstart/assets") for c in commands)
    for command in commands:
        ran = subprocess.run(command, shell=True, cwd=cwd, capture_output=True, text=True, timeout=900)
        assert ran.returncode == 0, f"{command}\n{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}"
        if command.startswith("slime-ref generate"):
            answers = [line for line in ran.stdout.splitlines() if "  ->  " in line]
            assert len(answers) == 3 and any("\\boxed{" in line for line in answers), ran.stdout
    assert list(cwd.iterdir()) == [out]  # the smoke's files too stay under the quick start's folder
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
    from slime_rehearse import quickstart as qs
    from slime_rehearse.cli import cli

    monkeypatch.setattr(qs, "quickstart_checks", lambda out: [
        Finding("quickstart.memory", Status.FAIL, "0.5 GiB of memory available", "free memory", qs.DOC)])
    out = tmp_path / "qs"
    result = CliRunner().invoke(cli, ["quickstart", "--out", str(out)], standalone_mode=False)
    assert isinstance(result.exception, Exception) and "quickstart.memory" in str(result.exception)
    assert not (out / "assets").exists()


def test_quickstart_checks_pass_on_this_machine(tmp_path):
    from slime_rehearse.quickstart import quickstart_checks

    findings = quickstart_checks(tmp_path)
    assert {f.id for f in findings} >= {"quickstart.packages", "quickstart.memory", "quickstart.shm"}
    assert not [f for f in findings if f.status is Status.FAIL]


def test_recipe_flags_parse_and_keep_the_batch_identity(tiny, tmp_path):
    from slime_ref.arguments import parse_args
    from slime_rehearse.quickstart import QuickstartConfig, grpo_argv, warmup_argv

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
    from slime_rehearse.quickstart import InterruptLatch

    events, totals = [], []
    before = signal.getsignal(signal.SIGINT)

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
    assert signal.getsignal(signal.SIGINT) is before  # the latch puts back what it found
