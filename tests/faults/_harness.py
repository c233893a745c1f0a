"""Running a job under a fault: launch it, inject the fault when the run is where it should be, and
account for every process it started.

A :class:`LaunchedRun` is ``slime-ref train`` in a session of its own, with output in files (a full
pipe would stall it). While it runs, every poll records its process tree (Ray's GCS and raylet, the
workers, engines and router are all descendants of the driver), so that after it ends the test can
check that none of them is left, even one that was reparented when its parent died.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from slime_common.process_tree import kill_recorded

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
sys.path.insert(0, str(TESTS))  # the helpers the other end-to-end tests use

from _runs import grpo_flags  # noqa: E402  (re-exported for the fault tests)

__all__ = ["LaunchedRun", "assert_clean_stop", "engine_state", "grpo_flags"]


class LaunchedRun:
    def __init__(self, flags: list[str], log_dir: Path, command: str = "train", env: dict | None = None):
        log_dir.mkdir(parents=True, exist_ok=True)
        self.stdout_path, self.stderr_path = log_dir / "stdout.txt", log_dir / "stderr.txt"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200",
               "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]), **(env or {})}
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen([str(Path(sys.executable).with_name("slime-ref")), command, *flags],
                                         stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        self.started = time.monotonic()
        self.seen: dict[int, float] = {}  # pid -> create_time of every process the run had

    def snapshot(self) -> None:
        try:
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                self.seen.setdefault(p.pid, p.create_time())
        except psutil.NoSuchProcess:
            pass

    def wait_for(self, condition, timeout: float, what: str):
        """Poll ``condition()`` (recording the process tree) until it returns something truthy."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.snapshot()
            value = condition()
            if value:
                return value
            assert self.proc.poll() is None, (
                f"the run ended (exit {self.proc.returncode}) before {what}:\n{self.stderr()}"
            )
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}:\n{self.stderr()[-3000:]}")

    def finish(self, timeout: float) -> tuple[int, float]:
        """Wait for the run to end (recording its process tree); (exit status, seconds it took)."""
        start = time.monotonic()
        deadline = start + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"the run did not end within {timeout:.0f}s:\n{self.stderr()[-3000:]}")
            self.snapshot()
            time.sleep(0.2)
        took = time.monotonic() - start
        print(f"run ended: exit {self.proc.returncode}, {took:.1f} s after finish() was called")  # shown by -rP
        return self.proc.returncode, took

    def leftovers(self, timeout: float = 30) -> list[str]:
        """Processes of the run still alive ``timeout`` seconds after it ended (none, when it cleans up)."""
        deadline = time.monotonic() + timeout
        while True:
            alive = []
            for pid, created in self.seen.items():
                try:
                    p = psutil.Process(pid)
                    if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                        alive.append(f"{pid} {' '.join(p.cmdline())[:160]}")
                except psutil.NoSuchProcess:
                    continue
            if not alive or time.monotonic() > deadline:
                print(f"processes of the run left: {len(alive)} of {len(self.seen)} seen")
                return alive
            time.sleep(0.5)

    def kill(self) -> None:
        """Test clean-up: SIGKILL everything the run had (its own process group and all it spawned)."""
        self.snapshot()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        kill_recorded(self.seen)
        self.proc.wait(timeout=30)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def processes(self, out: Path) -> dict | None:
        """The run's processes.json (pid of each role), once set-up has written it."""
        path = out / "processes.json"
        return json.loads(path.read_text()) if path.is_file() else None


def engine_state(url: str) -> dict:
    """The built-in engine's counters (/get_server_info internal_states), or {} if it does not answer."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/get_server_info", timeout=5) as reply:
            return json.loads(reply.read())["internal_states"][0]
    except (OSError, ValueError, KeyError):
        return {}


def assert_clean_stop(run: LaunchedRun, returncode: int, *phrases: str) -> str:
    """A clean stop: non-zero exit, one error line naming what failed, no traceback, nothing left."""
    err = run.stderr()
    assert returncode != 0, err[-3000:]
    assert "Traceback" not in err, err[-5000:]
    errors = [line for line in err.splitlines() if line.startswith("slime-ref: ")]
    assert len(errors) == 1, err[-3000:]
    for phrase in phrases:
        assert phrase in errors[0], errors[0]
    assert run.leftovers() == []
    return errors[0]
