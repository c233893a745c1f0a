"""Checkpoint faults: the disk fills during a save; --load names a damaged or incomplete checkpoint.

Each case runs the job it breaks in a subprocess of its own session and watches its process tree:
the job must stop by itself within a deadline, with every rank failing the same way and one
message that names the path, and nothing it started may outlive it.

Full disks are real ones: a small tmpfs mounted for the test (root only; skipped otherwise), so the
writes fail with ENOSPC from several processes at once, as they do on a full shared disk.
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
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from _harness import grpo_flags

TESTS = Path(__file__).resolve().parent.parent
JOBS = Path(__file__).resolve().parent / "_checkpoint_jobs.py"
TRACKER = "latest_checkpointed_iteration.txt"
JOB_TIMEOUT = 300  # a job is two ranks that import megatron, build the tiny model and train it: ~30 s alone


# ---------------------------------------------------------------------------------------------
# helpers: watched subprocesses, tmpfs disks


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float  # from start to the exit of the launched process
    stop_s: float  # from its exit until the last process it started was gone
    exited_at: float  # time.time() at its exit (to compare with file times)
    started: list[str] = field(default_factory=list)  # descendants seen while it ran ("pid name")
    left: list[str] = field(default_factory=list)  # those still alive after the deadline

    def result(self) -> dict:
        assert self.returncode == 0, f"exit {self.returncode}\n{self.stderr[-4000:]}"
        return json.loads(self.stdout.strip().splitlines()[-1])


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run_watched(cmd: list[str], timeout: float, env: dict | None = None, grace: float = 60) -> Finished:
    """Run ``cmd`` in its own session; record every descendant while it runs; after it exits, wait
    up to ``grace`` seconds for all of them to be gone. Whatever remains is killed (and reported)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    seen: dict[int, psutil.Process] = {}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, start_new_session=True)
        root = psutil.Process(proc.pid)
        try:
            while True:
                try:
                    for child in root.children(recursive=True):
                        seen.setdefault(child.pid, child)
                except psutil.NoSuchProcess:
                    pass
                try:
                    proc.wait(timeout=0.1)
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() - start > timeout:
                        raise AssertionError(f"{' '.join(cmd[:3])} ... still running after {timeout} s") from None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        exited, exited_at = time.monotonic(), time.time()
        deadline = exited + grace
        while any(_alive(p) for p in seen.values()) and time.monotonic() < deadline:
            psutil.wait_procs([p for p in seen.values() if _alive(p)], timeout=0.2)
        stopped = time.monotonic()
        left = [p for p in seen.values() if _alive(p)]
        for p in left:  # not ours to leave behind; the assertion on `left` reports them
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        out.seek(0)
        err.seek(0)
        names = {pid: _name(p) for pid, p in seen.items()}
        return Finished(proc.returncode, out.read(), err.read(), exited - start, stopped - exited, exited_at,
                        [f"{pid} {n}" for pid, n in names.items()], [f"{p.pid} {names[p.pid]}" for p in left])


def _name(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline()[:3])[:120] or p.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "?"


def job(kind: str, **spec) -> Finished:
    """A two-rank training job of _checkpoint_jobs.py, watched."""
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return run_watched([sys.executable, str(JOBS), kind, json.dumps(spec)], JOB_TIMEOUT, env)


class Tmpfs:
    """A tmpfs of a given size at ``path`` (mounted by the test; root only)."""

    def __init__(self, path: Path, size: int):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                           check=False, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); the full-disk tests need root")

    def resize(self, size: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True, timeout=30)

    def fill(self) -> Path:
        """Take every free byte (a file written until ENOSPC)."""
        filler = self.path / "filler"
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 16))
                    f.flush()
            except OSError:
                pass
        for size in (4096, 512, 1):  # and the last partial page
            try:
                with open(self.path / f"filler-{size}", "wb") as f:
                    while True:
                        f.write(b"\0" * size)
                        f.flush()
            except OSError:
                pass
        return filler

    def unmount(self) -> None:
        r = subprocess.run(["umount", str(self.path)], check=False, capture_output=True, timeout=60)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", str(self.path)], check=False, timeout=60)


@pytest.fixture
def tmpfs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted: list[Tmpfs] = []

    def mount(size: int, name: str = "disk") -> Tmpfs:
        disk = Tmpfs(tmp_path / name, size)
        mounted.append(disk)
        return disk

    yield mount
    for disk in mounted:
        disk.unmount()


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def assert_clean_stop(finished: Finished, limit_s: float) -> None:
    assert finished.left == [], f"left running: {finished.left}"
    assert finished.stop_s < limit_s, f"took {finished.stop_s:.1f} s to stop everything after exiting"


# ---------------------------------------------------------------------------------------------
# a good checkpoint to break


@pytest.fixture(scope="module")
def good(tiny, tmp_path_factory):
    """iter_0000000 of the two-rank job (model, distributed optimizer, RNG, data state), and its size."""
    save = tmp_path_factory.mktemp("good") / "save"
    finished = job("save", model_dir=str(tiny.model_dir), save=str(save), rollouts=1)
    result = finished.result()
    assert result["saved"] == [0] and result["ranks_agree"]
    assert_clean_stop(finished, 30)
    return save, dir_size(save / "iter_0000000")


# ---------------------------------------------------------------------------------------------
# 1. the disk fills during a save


def test_disk_full_mid_save_keeps_the_previous_checkpoint_and_the_run_resumes(tiny, good, tmpfs):
    """Room for two checkpoints and half a third: the third save fails in the shard writes of both
    ranks; both ranks stop at once with one message naming --save; iter_1 stays current, no .partial
    is left; on a larger disk the job resumes from iter_1 and saves iter_2 in the same directory."""
    _, size = good
    disk = tmpfs(int(2.5 * size))
    save = disk.path / "save"
    failed = job("save", model_dir=str(tiny.model_dir), save=str(save), rollouts=3)
    result = failed.result()
    assert result["saved"] == [0, 1] and result["failed_at"] == 2
    assert result["ranks_agree"], "the ranks ended differently"
    error = result["error"]
    assert error.startswith(f"--save {save}: no space left on device while writing iter_0000002 ("), error
    assert "the newest complete checkpoint is still iter_0000001" in error and "\n" not in error
    assert result["error_after_s"] < 30  # not the 10-minute collective timeout of a rank left waiting
    assert_clean_stop(failed, 30)
    assert (save / TRACKER).read_text().strip() == "1"
    assert sorted(p.name for p in save.iterdir()) == ["iter_0000000", "iter_0000001", TRACKER]  # no .partial
    cleaned_at = save.stat().st_mtime  # the failed save's .partial directory removed: the failure handled
    assert failed.exited_at - cleaned_at < 60

    disk.resize(5 * size)
    resumed = job("save", model_dir=str(tiny.model_dir), save=str(save), load=str(save), rollouts=1)
    result = resumed.result()
    assert result["start"] == 2 and result["data_state"] == {"next_offset": 2}
    assert result["saved"] == [2] and result["error"] is None
    assert_clean_stop(resumed, 30)
    assert (save / TRACKER).read_text().strip() == "2"
    assert not [p.name for p in save.iterdir() if p.name.startswith(".")]
    print(f"\ndisk full mid-save: error {failed.result()['error_after_s']:.2f} s after the save began; job exit "
          f"{failed.exited_at - cleaned_at:.1f} s after that; all {len(failed.started)} processes gone "
          f"{failed.stop_s:.2f} s later")


def test_disk_full_at_the_first_write_fails_every_rank_promptly(tiny, good, tmpfs):
    """No byte free: the first file of the save (common.pt, written by rank 0 alone) fails. The other
    rank, which megatron would leave waiting in the shard-write collective, fails with it."""
    _, size = good
    disk = tmpfs(2 * size)
    filler = disk.fill()
    save = disk.path / "save"
    failed = job("save", model_dir=str(tiny.model_dir), save=str(save), rollouts=1)
    result = failed.result()
    assert result["saved"] == [] and result["failed_at"] == 0 and result["ranks_agree"]
    error = result["error"]
    assert error.startswith(f"--save {save}: no space left on device while writing iter_0000000 ("), error
    assert "no earlier checkpoint was written" in error
    assert result["error_after_s"] < 30
    assert_clean_stop(failed, 30)
    assert not (save / TRACKER).exists() and not list(save.glob(".iter_*"))
    filler.unlink()
    print(f"\ndisk full at the first write: error {result['error_after_s']:.2f} s after the save began; "
          f"all {len(failed.started)} processes gone {failed.stop_s:.2f} s after the job exited")


# ---------------------------------------------------------------------------------------------
# 2. --load names a damaged or incomplete checkpoint


def _copy(good_save: Path, into: Path) -> Path:
    shutil.copytree(good_save, into)
    return into


DAMAGE_BEFORE_START = {
    # name: (damage to a copy of the save directory, text the one-line error must contain)
    "tracker_names_a_missing_iteration": (
        lambda d: (d / TRACKER).write_text("5\n"), "names iter_0000005, which is missing"),
    "tracker_empty": (lambda d: (d / TRACKER).write_text(""), f"{TRACKER}: expected an iteration number"),
    "tracker_lost": (lambda d: (d / TRACKER).unlink(), f"holds iter_0000000 but no {TRACKER}"),
    "metadata_json_not_json": (
        lambda d: (d / "iter_0000000" / "metadata.json").write_text("{\"sharded_backend\": "),
        "iter_0000000/metadata.json is not valid JSON"),
    "common_pt_empty": (lambda d: (d / "iter_0000000" / "common.pt").write_bytes(b""),
                        "iter_0000000/common.pt is empty"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE_BEFORE_START))
def test_damaged_load_is_refused_before_anything_starts(tiny, good, tmp_path, damage):
    """slime-ref train exits 2 with one line naming the file, before Ray or an engine starts."""

    breaks, expected = DAMAGE_BEFORE_START[damage]
    save = _copy(good[0], tmp_path / "save")
    breaks(save)
    out = tmp_path / "run"
    finished = run_watched(["slime-ref", "train", *grpo_flags(tiny, out, "--num-rollout", "1", "--load", str(save))],
                           timeout=120)
    assert finished.returncode == 2, finished.stderr[-3000:]
    lines = [line for line in finished.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"slime-ref: error: --load {save}"), finished.stderr
    assert expected in lines[0] and "Traceback" not in finished.stderr
    assert not out.exists()  # refused at flag validation: no run directory, no Ray
    assert_clean_stop(finished, 10)


def test_load_directories_that_hold_no_checkpoint_yet_start_fresh_and_a_file_is_refused(tmp_path):
    """The --save directory of a first run (absent, empty, or with only a crashed save's .partial)
    starts from the initial weights; anything else must be a checkpoint that resumes."""
    from slime_ref.backends.megatron.checkpoint import check_load
    from slime_ref.errors import UserError

    assert check_load(str(tmp_path / "absent")) is None
    (tmp_path / "first" / ".iter_0000000.partial").mkdir(parents=True)
    assert check_load(str(tmp_path / "first")) is None
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="a file, not a directory"):
        check_load(str(tmp_path / "file"))
    with pytest.raises(UserError, match="--ckpt-step 3 needs a checkpoint"):
        check_load(str(tmp_path / "absent"), step=3)
    with pytest.raises(UserError, match="--ckpt-step 3 names iter_0000003, which is missing"):
        check_load(str(tmp_path / "first"), step=3)


def _truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


DAMAGE_AT_LOAD = {
    "shard_truncated": (lambda d: _truncate(d / "__0_0.distcp"), "__0_0.distcp is truncated ("),
    "shard_missing": (lambda d: (d / "__1_1.distcp").unlink(), "__1_1.distcp is missing"),
    "common_pt_garbage": (lambda d: (d / "common.pt").write_bytes(b"not a checkpoint" * 8),
                          "common.pt cannot be read ("),
    "shard_index_garbage": (lambda d: (d / ".metadata").write_bytes(b"\x80\x04garbage" * 8),
                            ".metadata cannot be read ("),
}


def test_damaged_shards_are_refused_at_load_on_every_rank(tiny, good, tmp_path):
    """Damage only reading the tensors' index reveals: every rank refuses the checkpoint with the same
    message naming the file (before any collective read), and the intact one still loads."""
    dirs = {}
    for name, (breaks, _) in DAMAGE_AT_LOAD.items():
        ckpt = _copy(good[0], tmp_path / name) / "iter_0000000"
        breaks(ckpt)
        dirs[name] = str(ckpt)
    intact = str(good[0] / "iter_0000000")
    finished = job("load", model_dir=str(tiny.model_dir), dirs=[*dirs.values(), intact])
    result = finished.result()
    assert result["ranks_agree"]
    for name, path in dirs.items():
        error = result["errors"][path]
        assert error is not None, f"{name}: loaded without an error"
        assert error.startswith(f"--load {Path(path).parent}: {path}/"), error
        assert DAMAGE_AT_LOAD[name][1] in error and "\n" not in error
    assert result["errors"][intact] is None
    assert_clean_stop(finished, 30)


# ---------------------------------------------------------------------------------------------
# the same faults through `slime-ref train` (Ray, router, engine, training actor)


def _one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-4000:]
    errors = [line for line in stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, stderr[-4000:]
    return errors[0]


@pytest.mark.slow
def test_train_stops_cleanly_when_the_disk_fills(tiny, good, tmpfs, tmp_path):
    """A disk with room for a checkpoint or two: the save after them fails. The run exits with one
    line naming --save and no traceback, stops every process it started, and then resumes."""

    disk = tmpfs(int(1.5 * good[1]))  # a one-rank checkpoint is a little smaller than the two-rank one
    save = disk.path / "save"

    def flags(num_rollout: int) -> list[str]:
        return grpo_flags(tiny, tmp_path / "run", "--num-rollout", str(num_rollout), "--actor-num-gpus-per-node", "1",
                          "--colocate", "--save", str(save), "--load", str(save), "--save-interval", "1")

    finished = run_watched(["slime-ref", "train", *flags(5)], timeout=500)
    assert finished.returncode == 2, finished.stderr[-4000:]
    line = _one_error_line(finished.stderr)
    kept = int((save / TRACKER).read_text())
    assert line.startswith(f"slime-ref: error: --save {save}: no space left on device while writing "
                           f"iter_{kept + 1:07d} ("), line
    assert f"the newest complete checkpoint is still iter_{kept:07d}" in line
    assert_clean_stop(finished, 30)
    assert sorted(p.name for p in save.iterdir()) == [*(f"iter_{i:07d}" for i in range(kept + 1)), TRACKER]
    stop_s = finished.exited_at - save.stat().st_mtime  # from the failed save's clean-up to the exit
    assert stop_s < 60
    print(f"\ntrain, disk full: exit 2 {stop_s:.1f} s after the failed save of rollout {kept + 1} "
          f"(run {finished.wall_s:.1f} s); {len(finished.started)} processes, all gone {finished.stop_s:.2f} s "
          "after the exit")

    disk.resize(8 * good[1])
    resumed = run_watched(["slime-ref", "train", *flags(kept + 3)], timeout=500)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert (save / TRACKER).read_text().strip() == str(kept + 2)
    assert_clean_stop(resumed, 30)
    rollouts = [r["rollout_id"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
                if "train/pg_loss" in r]
    assert rollouts[-2:] == [kept + 1, kept + 2]  # resumed right after the checkpoint the failure kept


@pytest.mark.slow
def test_train_refuses_a_truncated_shard_after_starting_and_stops_everything(tiny, good, tmp_path):
    """A truncated shard passes the flag checks (they read no tensor index); the training actor
    refuses it: exit 2, one line naming the file, no traceback, nothing left running."""

    save = _copy(good[0], tmp_path / "save")
    _truncate(save / "iter_0000000" / "__1_0.distcp")
    flags = grpo_flags(tiny, tmp_path / "run", "--num-rollout", "1", "--actor-num-gpus-per-node", "1", "--colocate",
                       "--load", str(save))
    finished = run_watched(["slime-ref", "train", *flags], timeout=300)
    assert finished.returncode == 2, finished.stderr[-4000:]
    line = _one_error_line(finished.stderr)
    assert line.startswith(f"slime-ref: error: --load {save}: {save}/iter_0000000/__1_0.distcp is truncated"), line
    assert_clean_stop(finished, 30)
    print(f"\ntrain, truncated shard: exit 2 after {finished.wall_s:.1f} s; {len(finished.started)} processes, "
          f"all gone {finished.stop_s:.2f} s after the exit")
