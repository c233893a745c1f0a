"""``slime-check prereqs`` container checks: the runtime, ``/dev/shm``, the IPC namespace and the
memlock, stack and open-file limits that slime's ``docker run`` line sets.
"""

from __future__ import annotations

import math

from slime_check import facts
from slime_check import probes as P
from slime_check.facts import GIB
from slime_check.findings import Finding, Status
from slime_check.prereqs_machine import (
    CONDA_DOC,
    DOCKER_DOC,
    Machine,
)

SHM_WANTED = 16 * GIB  # --shm-size=16g
SHM_FLOOR = 1 * GIB
STACK_WANTED_KIB = 64 * 1024  # --ulimit stack=67108864: Docker takes bytes, so 64 MiB
NOFILE_WANTED = 65535  # SGLang raises its soft limit to this at start-up


def container_runtime(m: Machine) -> Finding:
    id_ = "container.runtime"
    kind = m.in_container
    if kind is None:
        return Finding(id_, Status.SKIP, "No container markers could be read.")
    if kind is False:
        return Finding(id_, Status.PASS, "Not in a container (bare host). slime's supported setup is the "
                       "slimerl/slime image; a bare host follows build_conda.sh.", "", CONDA_DOC)
    marker = {"docker": "/.dockerenv or a docker cgroup", "podman": "/run/.containerenv or a libpod cgroup",
              "kubernetes": "KUBERNETES_SERVICE_HOST or a kubepods cgroup"}.get(kind, "its cgroup")
    return Finding(id_, Status.PASS, f"Inside a {kind} container ({marker}). slime's docs start it with "
                   "--gpus all --ipc=host --shm-size=16g --ulimit memlock=-1 --ulimit stack=67108864.", "", DOCKER_DOC)


def _shm(m: Machine) -> tuple[int | None, str | None]:
    """(/dev/shm size in bytes, its mount source)."""
    mounts = m.probe.read_file(P.MOUNTINFO)
    shm = facts.parse_mountinfo_shm(mounts.text) if mounts.ok else None
    df = m.probe.run(P.DF_SHM)
    sized = facts.parse_df(df.text) if df.ok else None
    size = sized[0] if sized else (shm[1] if shm else None)
    return size, (shm[0] if shm else None)


def container_shm(m: Machine) -> Finding:
    id_ = "container.shm"
    size, _ = _shm(m)
    if size is None:
        return Finding(id_, Status.SKIP, "The size of /dev/shm could not be read.")
    text = f"/dev/shm is {size / GIB:.1f} GiB" if size >= GIB else f"/dev/shm is {size / 1024**2:.0f} MiB"
    fix = "Start the container with --shm-size=16g (or --ipc=host)."
    if size < SHM_FLOOR:
        return Finding(id_, Status.FAIL, text + ": NCCL, Ray's object store and SGLang need far more "
                       "(64 MiB is Docker's default).", fix, DOCKER_DOC)
    if size < SHM_WANTED:
        return Finding(id_, Status.WARN, text + "; slime's docs ask for 16 GiB.", fix, DOCKER_DOC)
    return Finding(id_, Status.PASS, text + " (16 GiB wanted).")


def container_ipc(m: Machine) -> Finding:
    id_ = "container.ipc"
    kind = m.in_container
    if kind is False:
        return Finding(id_, Status.PASS, "Bare host: the host's IPC namespace.")
    if kind is None:
        return Finding(id_, Status.SKIP, "Container state unknown.")
    size, source = _shm(m)
    if source is None:
        return Finding(id_, Status.SKIP, "The /dev/shm mount could not be read.")
    if source == "shm":
        private = "/dev/shm is the container's private mount: it was started without --ipc=host"
        if size is not None and size >= SHM_WANTED:
            return Finding(id_, Status.PASS, private + ", but its 16 GiB+ /dev/shm serves the processes inside it.")
        return Finding(id_, Status.WARN, private + " and with a small /dev/shm.",
                       "Start it with --ipc=host as slime's docs do (or at least --shm-size=16g).", DOCKER_DOC)
    return Finding(id_, Status.PASS, f"/dev/shm is not Docker's private shm mount (source '{source}'), as with "
                                     f"--ipc=host.")


def _limits(m: Machine) -> dict:
    line = m.probe.run(P.ULIMIT_LSN)
    everything = m.probe.run(P.ULIMIT_ALL)
    return facts.parse_ulimits(line.text if line.ok else None, everything.text if everything.ok else None)


def _ulimit(m: Machine, id_: str, key: str, what: str, wanted: float, why: str, fix: str) -> Finding:
    """One ``ulimit`` value against what slime's docs ask for."""
    letter = {"memlock": "l", "stack": "s", "nofile": "n"}[key]
    value = _limits(m).get(key)
    if value is None:
        return Finding(id_, Status.SKIP, f"`ulimit -{letter}` could not be read.")
    unit = " KiB" if key != "nofile" and value != "unlimited" else ""
    shown = f"ulimit -{letter} ({what}) is {value}{unit}"
    if value == "unlimited" or value >= wanted:
        return Finding(id_, Status.PASS, shown + ".")
    return Finding(id_, Status.WARN, shown + why, fix, DOCKER_DOC)


def container_memlock(m: Machine) -> Finding:
    return _ulimit(m, "container.memlock", "memlock", "locked memory", math.inf,
                   ": pinned host memory and RDMA registration (NCCL over InfiniBand) can fail.",
                   "Start the container with --ulimit memlock=-1.")


def container_stack(m: Machine) -> Finding:
    return _ulimit(m, "container.stack", "stack", "stack", STACK_WANTED_KIB,
                   "; slime's docs ask for --ulimit stack=67108864, which Docker reads as bytes: 64 MiB, "
                   "`ulimit -s` 65536.", "Start the container with --ulimit stack=67108864.")


def container_nofile(m: Machine) -> Finding:
    return _ulimit(m, "container.nofile", "nofile", "open files", NOFILE_WANTED,
                   f"; SGLang raises it to {NOFILE_WANTED} when the hard limit allows, and busy engines, the router "
                   "and Ray hold many sockets.",
                   "Raise it: `--ulimit nofile=1048576` for Docker, or `ulimit -n 1048576` before starting Ray.")


# ---------------------------------------------------------------------------------------------
