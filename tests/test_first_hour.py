"""What a newcomer meets in the first hour (issue 44): the quick start's outputs and follow-up
commands, and bad input to ``slime-ref train`` caught before Ray starts, each in one line."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest


@pytest.fixture
def umask():
    def set_mask(mask: int) -> None:
        os.umask(mask)

    previous = os.umask(0o022)
    os.umask(previous)
    yield set_mask
    os.umask(previous)


# ---------------------------------------------------------------------------------------------
# item 10: files and directories written atomically get the umask's usual mode, not mkstemp's 0600


@pytest.mark.parametrize("mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775),
                                                       (0o077, 0o600, 0o700)])
def test_atomic_writes_take_the_umask_mode(tmp_path, umask, mask, file_mode, dir_mode):
    from slime_common.fileio import atomic_directory, atomic_write_json

    umask(mask)
    atomic_write_json(tmp_path / "summary.json", {"a": 1})
    with atomic_directory(tmp_path / "hf") as scratch:
        (scratch / "config.json").write_text("{}")
    assert stat.S_IMODE((tmp_path / "summary.json").stat().st_mode) == file_mode
    assert stat.S_IMODE((tmp_path / "hf").stat().st_mode) == dir_mode


def test_a_plot_is_readable_by_the_group_and_others(tmp_path, umask):
    import json

    from slime_ref.plot import plot_run

    umask(0o022)
    rows = [{"rollout_id": i, "rollout/raw_reward": i / 10, "train/kl_loss": 0.0} for i in range(3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = plot_run(tmp_path, tmp_path / "reward.png")
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


# ---------------------------------------------------------------------------------------------
# item 11: `slime-ref train` with no flags is a usage error, not 629 lines of help


@pytest.mark.parametrize("command", ["train", "train-async"])
def test_train_without_flags_gives_the_usage_and_the_required_flags(command):
    result = subprocess.run([sys.executable, "-m", "slime_ref.cli", command], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"usage: slime-ref {command} --hf-checkpoint DIR --prompt-data FILE")
    assert len(lines) < 12
    for flag in ("--hf-checkpoint", "--prompt-data", "--rollout-batch-size", "--num-rollout", "--global-batch-size"):
        assert any(line.lstrip().startswith(flag) for line in lines[2:]), flag
    assert f"slime-ref {command} --help" in result.stderr
