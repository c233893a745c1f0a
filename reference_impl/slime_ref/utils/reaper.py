"""Stops what a run started when its driver dies without tearing down (SIGKILL, the OOM killer).

A run's driver starts a private Ray cluster, and Ray's processes, the engines and the router are
all its descendants. Killed outright, the driver cannot stop them: Ray's workers and the servers go
with their parents, but Ray's per-node agents outlive it for a minute or more. So the driver starts
this reaper in a session of its own, with a pipe on its standard input. While the driver lives,
the reaper records the driver's process tree once a second (a process whose parent dies is
reparented, and could no longer be found from the driver afterwards). When the pipe closes without
the word ``done`` (the driver died), it SIGKILLs every recorded process still alive, matched by pid
and start time, so it never touches a process that merely reused a pid.

Only the driver's own descendants are recorded: a Ray cluster the user started (``RAY_ADDRESS``)
is never a descendant of the run, and is never touched.

    python -m slime_ref.utils.reaper DRIVER_PID
"""

from __future__ import annotations

import os
import select
import subprocess
import sys

import psutil

from slime_common.process_tree import kill_recorded, record_tree

DONE = b"done\n"
SNAPSHOT_S = 1.0


def start(driver_pid: int | None = None) -> subprocess.Popen:
    """Start the reaper for ``driver_pid`` (this process by default); write :data:`DONE` to its stdin
    (and close it) once the run has stopped everything itself."""
    return subprocess.Popen([sys.executable, "-m", "slime_ref.utils.reaper", str(driver_pid or os.getpid())],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def stop(reaper: subprocess.Popen) -> None:
    """The run tore down cleanly: let the reaper go without touching anything."""
    try:
        reaper.stdin.write(DONE)
        reaper.stdin.close()
    except (BrokenPipeError, ValueError):
        pass
    try:
        reaper.wait(timeout=10)
    except subprocess.TimeoutExpired:
        reaper.kill()


def main(driver_pid: int) -> None:
    if not psutil.pid_exists(driver_pid):
        return
    seen: dict[int, float] = {}
    received = b""
    stdin = sys.stdin.buffer.raw
    while True:
        record_tree(driver_pid, seen, with_root=False, skip=(os.getpid(),))  # the reaper is the driver's child too
        readable, _, _ = select.select([stdin], [], [], SNAPSHOT_S)
        if readable:
            chunk = os.read(stdin.fileno(), 64)
            received += chunk
            if DONE in received:
                return  # the run stopped everything itself
            if not chunk:  # the pipe closed: the driver is gone
                kill_recorded(seen)
                return


if __name__ == "__main__":
    main(int(sys.argv[1]))
