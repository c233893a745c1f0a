"""Shared test setup: offline, loopback-only, and one embedded tiny model per session."""

from __future__ import annotations

import os
import time

# Before anything imports transformers or ray: never reach a hub, keep Ray on 127.0.0.1, no telemetry.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Every process the tests start inherits this mark (Ray's workers and the engines included), so one
# left behind is found at the end of the session even after its parent has died.
SESSION_MARK = "SLIME_SKILL_TEST_SESSION"
os.environ[SESSION_MARK] = f"{os.getpid()}-{time.time_ns()}"

import psutil  # noqa: E402
import pytest  # noqa: E402


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (gpu marker); this machine has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """The embedded default (seed 0), built once per test session."""
    from slime_ref.assets import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny") / "assets", seed=0)


# -- processes left behind --------------------------------------------------------------------------
# A test stops what it starts. Whatever still runs at the end of the session is listed in the
# summary with the test at whose end it was first seen running, then stopped by pid.

LEFTOVER_GRACE_S = 15  # a process told to stop by the last test's teardown may still be exiting
# helpers that a library starts for the test process itself, which end with it, not with a test
# (torch.compile's worker pool is kept for the process's later compiles and stopped at its exit)
_OWN_HELPERS = ("torch_shm_manager", "multiprocessing.resource_tracker", "multiprocessing.forkserver",
                "torch/_inductor/compile_worker")
_pids_running = set(psutil.pids())  # as the last test ended
_first_seen_after: dict[int, str] = {}  # pid -> the test at whose end it was new
_leftovers: list[str] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _pids_running
    yield
    running = set(psutil.pids())  # a listing of /proc: about a millisecond
    for pid in running - _pids_running:
        _first_seen_after[pid] = item.nodeid
    _pids_running = running


def _marked_processes() -> list[psutil.Process]:
    mark, found = os.environ[SESSION_MARK], []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE or proc.environ().get(SESSION_MARK) != mark:
                continue
            if proc.ppid() == os.getpid() and any(h in " ".join(proc.cmdline()) for h in _OWN_HELPERS):
                continue
            found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def pytest_sessionfinish(session):
    _, alive = psutil.wait_procs(_marked_processes(), timeout=LEFTOVER_GRACE_S)
    for proc in alive:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:  # exited; its parent, if left too, is named
                continue
            started = _first_seen_after.get(proc.pid, "no test (after the last one ended)")
            line = f"pid {proc.pid} {' '.join(proc.cmdline())[:120]!r}, started during {started}"
            proc.kill()
        except psutil.NoSuchProcess:
            continue
        _leftovers.append(line)


def pytest_terminal_summary(terminalreporter):
    if _leftovers:
        terminalreporter.write_sep("=", f"{len(_leftovers)} process(es) left behind by the tests, now killed",
                                   yellow=True)
        for line in _leftovers:
            terminalreporter.write_line(line)
