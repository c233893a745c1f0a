"""Processes we start and stop ourselves: the engines and the router, a smoke run, a Ray head.

Each starts in a session of its own, so it leads a process group (pgid == pid) that also holds
whatever it starts without a session of its own (SGLang's scheduler processes, say). Stopping works
on that group, by its id, never by looking processes up by name: an optional SIGINT first (for
programs that tear down what they started on Ctrl-C), then SIGTERM, then SIGKILL to whatever of the
group is left after the grace periods, then the leader is waited for so that no zombie stays.

A process that left the group (one that started a session of its own) is out of reach of the group's
signals; :func:`kill_recorded` stops such processes from a record of pids and start times.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # linux/prctl.h
REAP_S = 10.0  # how long to wait for a SIGKILLed leader to be gone


def die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the process that started us dies (Linux), so a
    server never outlives a Ray actor or a run that was killed without a chance to clean up."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def start_in_session(command: Sequence[str], *, stdout: IO | int | None,
                     stderr: IO | int | None = subprocess.STDOUT,
                     env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
                     with_parent: bool = False) -> subprocess.Popen:
    """Start ``command`` in a session (and process group) of its own, with no standard input.

    ``stdout``/``stderr`` are what :class:`subprocess.Popen` takes (a file, ``PIPE``, None for this
    process's own; stderr defaults to the same place as stdout). ``with_parent``: the child gets
    SIGTERM when this process dies."""
    return subprocess.Popen(list(command), stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                            env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
                            preexec_fn=die_with_parent if with_parent else None)


def start_logged(command: Sequence[str], log_path: str | os.PathLike, *, env: Mapping[str, str] | None = None,
                 cwd: str | os.PathLike | None = None, with_parent: bool = False) -> subprocess.Popen:
    """:func:`start_in_session` with stdout and stderr appended to ``log_path``, after a ``$ command`` line."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:  # the child holds its own copy of the descriptor
        log.write(f"$ {' '.join(command)}\n".encode())
        log.flush()
        return start_in_session(command, stdout=log, env=env, cwd=cwd, with_parent=with_parent)


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the process group ``pgid``; False when no process of it is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # only what is not ours is left (a pid reused by another user's process)
        return False
    return True


def group_alive(pgid: int) -> bool:
    """Whether any process of the group ``pgid`` still exists (an unreaped zombie counts)."""
    return signal_group(pgid, 0)


def _wait_all(procs: Sequence[subprocess.Popen], deadline: float) -> list[subprocess.Popen]:
    """Wait for each leader until ``deadline``; the ones still running."""
    running = []
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            running.append(proc)
    return running


def stop_groups(procs: Sequence[subprocess.Popen], *, interrupt_s: float | None = None,
                terminate_s: float | None = 10.0,
                on_ignored: Callable[[subprocess.Popen, int], None] | None = None) -> None:
    """Stop process groups that :func:`start_in_session` started, all at once.

    With ``interrupt_s``: SIGINT to each group and up to that long for their leaders to exit. With
    ``terminate_s``: SIGTERM to each group whose leader still runs (or to the whole group, the first
    polite signal) and up to that long. Then SIGKILL to every group, for what is left of it even when
    its leader exited, and the leaders are waited for. ``on_ignored(proc, sig)`` hears of each leader
    that outlived a polite signal's grace."""
    steps = [(sig, grace) for sig, grace in ((signal.SIGINT, interrupt_s), (signal.SIGTERM, terminate_s))
             if grace is not None]
    waiting = list(procs)
    for index, (sig, grace_s) in enumerate(steps):
        # The first polite signal goes to every group, leftovers of an exited leader included.
        targets = list(procs) if index == 0 else waiting
        for proc in targets:
            signal_group(proc.pid, sig)
        waiting = _wait_all(targets, time.monotonic() + grace_s)
        for proc in waiting:
            if on_ignored is not None:
                on_ignored(proc, sig)
        if not waiting:
            break
    for proc in procs:
        signal_group(proc.pid, signal.SIGKILL)
        try:
            proc.wait(timeout=REAP_S)
        except subprocess.TimeoutExpired:
            logger.warning("pid %d still runs %g s after SIGKILL", proc.pid, REAP_S)


def record_tree(root_pid: int, seen: dict[int, float], *, with_root: bool = True,
                skip: Collection[int] = ()) -> list:
    """Add the process ``root_pid`` (``with_root``) and every process below it, but those in ``skip``,
    to ``seen`` (pid -> start time, as :func:`kill_recorded` takes it); the psutil processes recorded,
    none when the root is gone."""
    import psutil

    try:
        root = psutil.Process(root_pid)
        procs = [root] * with_root + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    recorded = []
    for proc in procs:
        if proc.pid in skip:
            continue
        try:
            seen.setdefault(proc.pid, proc.create_time())
        except psutil.NoSuchProcess:
            continue
        recorded.append(proc)
    return recorded


def kill_recorded(seen: Mapping[int, float]) -> int:
    """SIGKILL each recorded process (pid -> start time, as psutil reports it) that still runs, matched by
    pid and start time so that a reused pid is never touched; how many there were."""
    import psutil

    killed = 0
    for pid, created in seen.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created:
                proc.kill()
                killed += 1
        except psutil.NoSuchProcess:
            continue
    return killed


def ended(returncode: int) -> str:
    """How a process that has ended ended, in words: ``exited with code 1``, ``was killed by SIGKILL``
    (a negative :attr:`subprocess.Popen.returncode` is the signal that killed it)."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"
