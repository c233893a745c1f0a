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
# summary with the test that was running when it started, then stopped by pid.

LEFTOVER_GRACE_S = 15  # a process told to stop by the last test's teardown may still be exiting
# psutil's create_time counts from the boot time in whole seconds (/proc/stat's btime); this shift
# puts it on time.time()'s clock to within a clock tick, to tell which test started a process
_CREATE_TIME_SHIFT = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME) - psutil.boot_time()
# helpers that a library starts for the test process itself, which end with it, not with a test
_OWN_HELPERS = ("torch_shm_manager", "multiprocessing.resource_tracker", "multiprocessing.forkserver")
_test_spans: list[tuple[str, float, float]] = []  # (test, start, end), wall clock
_leftovers: list[str] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = time.time()
    yield
    _test_spans.append((item.nodeid, start, time.time()))


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


def _started_during(create_time: float) -> str:
    """The test that was running when a process started (a start time is rounded down to a clock
    tick, 10 ms: the middle of the tick is taken)."""
    created = create_time + _CREATE_TIME_SHIFT + 0.005
    before = [(test, end) for test, start, end in _test_spans if start <= created]
    if not before:
        return "no test (before the first)"
    test, end = before[-1]
    return test if created <= end else f"no test (between {test} and the next)"


def pytest_sessionfinish(session):
    _, alive = psutil.wait_procs(_marked_processes(), timeout=LEFTOVER_GRACE_S)
    for proc in alive:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:  # exited; its parent, if left too, is named
                continue
            line = (f"pid {proc.pid} {' '.join(proc.cmdline())[:120]!r}, started during "
                    f"{_started_during(proc.create_time())}")
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
