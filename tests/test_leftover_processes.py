"""The test session's own check: a process a test leaves behind is named at the end with the test
that started it, and stopped, even when its parent has died (as a Ray worker outlives its raylet).
Helpers a library starts for the test process itself (torch's shared-memory manager, multiprocessing's
resource tracker, torch.compile's worker pool) end with that process and are not named."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psutil

INNER_TESTS = '''
import subprocess, sys

def test_leaves_an_orphan_behind():
    # the child starts a sleeper and exits without waiting: the sleeper is reparented
    subprocess.run([sys.executable, "-c", "import subprocess; subprocess.Popen(['sleep', '311'])"], check=True)

def test_stops_what_it_starts():
    proc = subprocess.Popen(["sleep", "312"])
    proc.kill()
    proc.wait()

def test_starts_a_helper_that_ends_with_the_test_process():
    from multiprocessing import resource_tracker
    resource_tracker.ensure_running()

def test_starts_the_compile_worker_pool_of_the_test_process():
    from torch._inductor.async_compile import AsyncCompile
    AsyncCompile.process_pool()  # what a torch.compile starts on its first compile
'''


def test_a_process_left_behind_is_named_with_its_test_and_stopped(tmp_path):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(INNER_TESTS)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # the inner session's output as asserted
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr  # reported, not failed
    assert "1 process(es) left behind by the tests, now killed" in out, out
    found = re.search(r"pid (\d+) 'sleep 311', started during test_inner.py::test_leaves_an_orphan_behind", out)
    assert found, out
    assert "'sleep 312'" not in out  # what a test stopped itself is not named
    assert "resource_tracker" not in out  # nor a helper of the test process, which ends with it
    assert "compile_worker" not in out
    pid = int(found.group(1))
    try:
        proc = psutil.Process(pid)
        assert "311" not in " ".join(proc.cmdline())  # the pid was reused by another process
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        pass
