"""Addresses and ports for every server and rendezvous a run opens: one allocator, as slime's.

slime hands out engine ports from a cursor that starts at 15000 on each node
(``slime/ray/rollout.py``), never from the OS's ephemeral range. That matters: SGLang derives more
ports from the one it is given and refuses a start when one of them is out of range. SGLang
0.5.15.post1 computes its gRPC port as ``port + 10000`` and checks it is at most 65535 even in HTTP
mode, so an engine handed an ephemeral port such as 59191 dies at start ("SGLANG_GRPC_PORT (69191)
must be between 1 and 65535"); on a default Linux range (32768-60999) about one start in five did.

:func:`allocate_port` is the one way a run gets a port: engines, the router and its metrics
endpoint, the Megatron (NCCL/gloo) rendezvous and the weight-sync group. It walks up from
``base`` (15000 unless ``SLIME_REF_PORT_BASE`` says otherwise), and takes a port only when the port
and every port derived from it are below 65536 and free. A port taken is held by a lock file for
the life of the process that took it, so two processes of one run (an engine actor and a train
actor, say) never pick the same port between the check and the server's bind.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

DEFAULT_PORT_BASE = 15000  # slime's
MAX_PORT = 65535
# Ports SGLang 0.5.15.post1 derives from --port (server_args.py): +1 the gRPC-mode HTTP sidecar,
# +13 the DP-attention handshake, +233 the DP-attention ZMQ rendezvous and the five ports after it,
# +10000 the gRPC port (range-checked at every start).
SGLANG_DERIVED_PORT_OFFSETS = (1, 13, *range(233, 240), 10000)


def node_address() -> str:
    """The address other nodes reach this one at: loopback on a private local cluster."""
    if not os.environ.get("RAY_ADDRESS"):
        return "127.0.0.1"
    import ray

    return ray.util.get_node_ip_address()


def is_port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if a TCP server could bind ``host:port`` now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class PortAllocator:
    """Hands out ports upward from ``base``; see the module docstring.

    ``lock_dir``: where the per-port lock files live (one directory per machine, shared by every
    process of every run on it). Locks are ``flock``s, so a crashed process frees its ports.
    """

    def __init__(self, base: int | None = None, lock_dir: str | os.PathLike | None = None):
        base = base if base is not None else int(os.environ.get("SLIME_REF_PORT_BASE", DEFAULT_PORT_BASE))
        if not 1024 <= base <= MAX_PORT:
            raise ValueError(f"port base {base} is outside 1024-{MAX_PORT}")
        self.base = base
        self.lock_dir = Path(lock_dir or Path(tempfile.gettempdir()) / "slime-ref-ports")
        self._cursor = base
        self._held: dict[int, int] = {}  # port -> open lock-file descriptor
        self._mutex = threading.Lock()

    def allocate(self, host: str = "127.0.0.1", derived: Iterable[int] = ()) -> int:
        """A free port on ``host`` whose ``port + offset`` for each of ``derived`` is free and < 65536."""
        offsets = tuple(derived)
        with self._mutex:
            for _ in range(2):  # a second pass from the base picks up ports freed since
                port = self._cursor
                while port + max(offsets, default=0) <= MAX_PORT:
                    wanted = [port, *(port + d for d in offsets)]
                    if all(p not in self._held for p in wanted) and self._lock_all(wanted):
                        if all(is_port_free(p, host) for p in wanted):
                            self._cursor = port + 1
                            return port
                        self._release(wanted)
                    port += 1
                self._cursor = self.base
        raise OSError(errno.EADDRNOTAVAIL, f"no free port from {self.base} up with ports +{offsets} free as well")

    def release(self, port: int, derived: Iterable[int] = ()) -> None:
        """Give back a port (and its derived ones) this allocator handed out."""
        with self._mutex:
            self._release([port, *(port + d for d in derived)])

    def _lock_all(self, ports: list[int]) -> bool:
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        taken = []
        for port in ports:
            fd = os.open(self.lock_dir / str(port), os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                self._release(taken)
                return False
            self._held[port] = fd
            taken.append(port)
        return True

    def _release(self, ports: list[int]) -> None:
        for port in ports:
            fd = self._held.pop(port, None)
            if fd is not None:
                os.close(fd)  # closing drops the flock


_allocator: PortAllocator | None = None
_allocator_mutex = threading.Lock()


def port_allocator() -> PortAllocator:
    """This process's allocator (created on first use)."""
    global _allocator
    with _allocator_mutex:
        if _allocator is None:
            _allocator = PortAllocator()
        return _allocator


def allocate_port(host: str = "127.0.0.1", derived: Iterable[int] = ()) -> int:
    """A port for a server or rendezvous on ``host``: see :class:`PortAllocator`."""
    return port_allocator().allocate(host, derived)
