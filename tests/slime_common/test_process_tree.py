"""Starting and stopping process groups (slime_common.process_tree), on real processes: a polite
signal a program ignores is followed by the next one, every process of the group is gone afterwards,
output lands in the log, and a child started to die with its parent does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from slime_common.process_tree import (
    ended,
    group_alive,
    kill_recorded,
    record_tree,
    signal_group,
    start_in_session,
    start_logged,
    stop_groups,
)

DEADLINE_S = 60.0  # generous: the machine may be busy; every wait below ends as soon as its condition holds


def wait_until(condition, what: str, timeout_s: float = DEADLINE_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s:g} s: {what}")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def ignoring(*names: str) -> str:
    """A program that ignores the named signals, says so, and then sleeps."""
    return textwrap.dedent(f"""
        import signal, time
        for name in {list(names)!r}:
            signal.signal(getattr(signal, name), signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(600)
    """)


def said(log: Path, line: str) -> int:
    """How many times the program said ``line`` (the log's first line, the command, does not count)."""
    return log.read_text().splitlines()[1:].count(line)


def start_ready(code: str, log: Path) -> subprocess.Popen:
    proc = start_logged(python(code), log)
    wait_until(lambda: said(log, "ready"), f"{log.name} says ready")
    return proc


def stop_recording(procs, **steps) -> list[int]:
    ignored: list[int] = []
    stop_groups(procs, on_ignored=lambda proc, sig: ignored.append(sig), **steps)
    return ignored


def test_the_log_holds_the_command_line_and_the_output(tmp_path):
    log = tmp_path / "logs" / "child.log"
    log.parent.mkdir()
    log.write_text("an earlier run\n")
    command = python("import sys; print('to stdout'); print('to stderr', file=sys.stderr)")
    proc = start_logged(command, log)
    assert proc.wait(timeout=DEADLINE_S) == 0
    lines = log.read_text().splitlines()
    assert lines[0] == "an earlier run"  # appended, as a restarted server's log is
    assert lines[1] == f"$ {' '.join(command)}"
    assert sorted(lines[2:]) == ["to stderr", "to stdout"]


def test_each_start_leads_a_process_group_of_its_own(tmp_path):
    proc = start_ready(ignoring(), tmp_path / "child.log")
    try:
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
        assert os.getsid(proc.pid) == proc.pid
        assert proc.stdin is None and group_alive(proc.pid)
    finally:
        stop_groups([proc], terminate_s=DEADLINE_S)
    assert proc.returncode == -signal.SIGTERM and not group_alive(proc.pid)


def test_a_program_that_ignores_sigint_is_stopped_by_sigterm(tmp_path):
    proc = start_ready(ignoring("SIGINT"), tmp_path / "child.log")
    ignored = stop_recording([proc], interrupt_s=0.5, terminate_s=DEADLINE_S)
    assert ignored == [signal.SIGINT]
    assert proc.returncode == -signal.SIGTERM


def test_a_program_that_ignores_sigint_and_sigterm_is_killed_after_the_grace(tmp_path):
    proc = start_ready(ignoring("SIGINT", "SIGTERM"), tmp_path / "child.log")
    started = time.monotonic()
    ignored = stop_recording([proc], interrupt_s=0.3, terminate_s=0.7)
    assert ignored == [signal.SIGINT, signal.SIGTERM]
    assert proc.returncode == -signal.SIGKILL
    assert time.monotonic() - started >= 1.0  # both graces were given in full


def test_a_program_that_stops_on_sigint_gets_no_other_signal(tmp_path):
    code = """
        import signal, sys, time
        signal.signal(signal.SIGINT, lambda *_: (print("tearing down", flush=True), sys.exit(3)))
        print("ready", flush=True)
        time.sleep(600)
    """
    log = tmp_path / "child.log"
    proc = start_ready(code, log)
    ignored = stop_recording([proc], interrupt_s=DEADLINE_S, terminate_s=DEADLINE_S)
    assert ignored == [] and proc.returncode == 3
    assert said(log, "tearing down") == 1


def test_without_sigterm_a_program_that_ignores_sigint_is_killed(tmp_path):
    proc = start_ready(ignoring("SIGINT"), tmp_path / "child.log")
    ignored = stop_recording([proc], interrupt_s=0.3, terminate_s=None)
    assert ignored == [signal.SIGINT] and proc.returncode == -signal.SIGKILL


def test_what_the_group_started_is_gone_afterwards_even_when_its_leader_had_exited(tmp_path):
    """The leader starts a worker in its group that ignores SIGTERM (as SGLang's schedulers may), one
    more that does not, and exits: stopping the group still reaches both."""
    code = f"""
        import subprocess, sys
        stubborn = subprocess.Popen([sys.executable, "-c", {ignoring("SIGINT", "SIGTERM")!r}])
        plain = subprocess.Popen([sys.executable, "-c", {ignoring()!r}])
        print("workers", stubborn.pid, plain.pid, flush=True)
    """
    log = tmp_path / "leader.log"
    proc = start_logged(python(code), log)
    assert proc.wait(timeout=DEADLINE_S) == 0
    workers = [int(pid) for pid in next(line for line in log.read_text().splitlines()
                                        if line.startswith("workers")).split()[1:]]
    wait_until(lambda: said(log, "ready") == 2, "both workers ignore what they should")
    assert all(not gone(pid) and os.getpgid(pid) == proc.pid for pid in workers)

    stop_groups([proc], terminate_s=0.5)
    wait_until(lambda: all(gone(pid) for pid in workers), "the leader's workers are gone")
    wait_until(lambda: not group_alive(proc.pid), "the process group is empty")


def test_several_groups_stop_together_within_one_grace(tmp_path):
    """Each program notes when SIGTERM reached it and carries on: all three are told before the first
    grace is over (stopped one after another, the last would be told two graces later)."""
    code = """
        import signal, time
        signal.signal(signal.SIGTERM, lambda *_: print("sigterm", time.monotonic(), flush=True))
        print("ready", flush=True)
        while True:
            time.sleep(600)
    """
    grace_s = 4.0
    logs = [tmp_path / f"child-{i}.log" for i in range(3)]
    procs = [start_ready(code, log) for log in logs]
    started = time.monotonic()
    ignored = stop_recording(procs, terminate_s=grace_s)
    assert ignored == [signal.SIGTERM] * 3
    assert [p.returncode for p in procs] == [-signal.SIGKILL] * 3
    told = [float(line.split()[1]) for log in logs for line in log.read_text().splitlines()
            if line.startswith("sigterm")]
    assert len(told) == 3 and max(told) < started + grace_s


def test_a_child_started_to_die_with_its_parent_does_and_only_that_one(tmp_path):
    starter = f"""
        import sys, time
        from slime_common.process_tree import start_logged
        bound = start_logged([sys.executable, "-c", "import time; time.sleep(600)"], {str(tmp_path / "bound.log")!r},
                             with_parent=True)
        free = start_logged([sys.executable, "-c", "import time; time.sleep(600)"], {str(tmp_path / "free.log")!r})
        print(bound.pid, free.pid, flush=True)
        time.sleep(600)
    """
    parent = subprocess.Popen(python(starter), stdout=subprocess.PIPE, text=True)
    bound, free = (int(pid) for pid in parent.stdout.readline().split())
    try:
        assert not gone(bound) and not gone(free)
        parent.kill()  # no clean-up code runs
        parent.wait(timeout=DEADLINE_S)
        wait_until(lambda: gone(bound), "the child bound to its parent is gone")
        assert not gone(free)  # the other one is only told by its own group being stopped
    finally:
        parent.stdout.close()
        for pid in (bound, free):
            signal_group(pid, signal.SIGKILL)
    wait_until(lambda: gone(free), "the free child is gone after SIGKILL to its group")


def test_a_pipe_for_output_and_a_working_directory(tmp_path):
    proc = start_in_session(python("import os; print(os.getcwd()); print(os.environ['SOME_SETTING'])"),
                            stdout=subprocess.PIPE, cwd=tmp_path, env={**os.environ, "SOME_SETTING": "given"})
    out, _ = proc.communicate(timeout=DEADLINE_S)
    assert out.decode().splitlines() == [str(tmp_path), "given"] and proc.returncode == 0


def test_recorded_processes_are_killed_by_pid_and_start_time_only(tmp_path):
    procs = [start_ready(ignoring(), tmp_path / f"child-{i}.log") for i in range(2)]
    try:
        recorded = {p.pid: psutil.Process(p.pid).create_time() for p in procs}
        recorded[procs[1].pid] += 1.0  # as if the pid had been reused by a later process
        assert kill_recorded(recorded) == 1
        assert procs[0].wait(timeout=DEADLINE_S) == -signal.SIGKILL
        assert procs[1].poll() is None  # not the process that was recorded
    finally:
        stop_groups(procs, terminate_s=DEADLINE_S)
    assert kill_recorded(recorded) == 0  # nothing of them is left


def test_a_tree_is_recorded_with_its_start_times_and_skips_what_it_is_told(tmp_path):
    code = f"""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", {ignoring()!r}])
        print("child-pid", child.pid, flush=True)
        child.wait()
    """
    log = tmp_path / "root.log"
    root = start_logged(python(code), log)
    try:
        child = int(wait_until(lambda: next((line.split()[1] for line in log.read_text().splitlines()
                                             if line.startswith("child-pid ")), None), "the root names its child"))
        seen: dict[int, float] = {}
        recorded = record_tree(root.pid, seen)
        assert [p.pid for p in recorded] == [root.pid, child]
        assert seen == {pid: psutil.Process(pid).create_time() for pid in (root.pid, child)}
        below: dict[int, float] = {}
        assert [p.pid for p in record_tree(root.pid, below, with_root=False, skip=(child,))] == [] and below == {}
    finally:
        stop_groups([root], terminate_s=DEADLINE_S)
    assert record_tree(root.pid, {}) == []  # a root that is gone


def test_how_a_process_ended_in_words():
    assert ended(0) == "exited with code 0"
    assert ended(2) == "exited with code 2"
    assert ended(-signal.SIGKILL) == "was killed by SIGKILL"
    assert ended(-signal.SIGTERM) == "was killed by SIGTERM"
    assert ended(-200) == "was killed by signal 200"
