"""Start rollout engines and sglang-router in front of them; stop every process we started.

``engine="sglang"`` runs real SGLang (``python -m sglang.launch_server``) on a GPU machine;
``engine="builtin"`` runs ``python -m slime_ref.engine`` (CPU, tests). Either way each engine gets a
free port, the launcher waits (with a deadline) until ``/health_generate`` answers, and then starts
the real router (``python -m sglang_router.launch_router --worker-urls ... --policy ...``) with the
local tokenizer, so it never reaches for a model hub, and waits until it lists every engine healthy.

Flags pass through as slime passes them: ``--sglang-foo-bar V`` becomes the engine's ``--foo-bar V``
and ``--router-foo V`` the router's ``--foo V``. The launcher sets the model path, host, port, seed
and GPU id itself and refuses those if passed through.

Every child runs in its own process group (a new session, :mod:`slime_common.process_tree`) and gets
SIGTERM when the process that started it dies. :meth:`RolloutServers.stop` (also run by the context
manager on error or Ctrl-C, and at interpreter exit) sends SIGTERM to each group it created, then
SIGKILL to what is left after a grace period; processes are never looked up by name. Each child's
output goes to ``log_dir`` (``engine-<i>.log``, ``router.log``).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime_common.process_tree import start_logged, stop_groups
from slime_ref.errors import UserError
from slime_ref.utils.net import SGLANG_DERIVED_PORT_OFFSETS, allocate_port, port_allocator

logger = logging.getLogger(__name__)

ENGINES = ("builtin", "sglang")
# Set by the launcher per engine; passing them through would break the port/seed/GPU bookkeeping.
_LAUNCHER_OWNED = {"model-path", "host", "port", "random-seed", "base-gpu-id", "tokenizer-path"}
# SGLang flags the built-in engine implements (the rest only tune GPU execution and are dropped).
_BUILTIN_FLAGS = {"context-length", "max-running-requests", "dtype", "weight-version", "skip-server-warmup"}
_ROUTER_OWNED = {"host", "port", "worker-urls", "prometheus-port"}


def passthrough_flags(values: Sequence[str] | Mapping[str, Any], prefix: str) -> list[str]:
    """Rename prefixed flags for the target program: ``--sglang-mem-fraction-static 0.3`` ->
    ``--mem-fraction-static 0.3`` (prefix ``sglang``).

    ``values`` is either command-line tokens or a mapping of slime-style attribute names
    (``{"sglang_mem_fraction_static": 0.3}``; True is a bare flag, None/False are left out, a list
    gives several values).
    """
    out: list[str] = []
    if isinstance(values, Mapping):
        for key, value in values.items():
            name = key.lstrip("-").replace("_", "-")
            if not name.startswith(f"{prefix}-"):
                raise UserError(f"{key}: expected a {prefix}_* setting")
            if value is None or value is False:
                continue
            out.append(f"--{name[len(prefix) + 1:]}")
            if value is not True:
                out.extend(str(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
        return out
    for token in values:
        if token.startswith("--"):
            if not token.startswith(f"--{prefix}-"):
                raise UserError(f"{token}: only --{prefix}-* flags pass through to the {prefix} process")
            out.append(f"--{token[len(prefix) + 3:]}")
        else:
            out.append(token)
    return out


def _flag_names(flags: list[str]) -> list[str]:
    return [f[2:].split("=", 1)[0] for f in flags if f.startswith("--")]


def _drop_flags(flags: list[str], keep: set[str]) -> tuple[list[str], list[str]]:
    """Split ``flags`` into those whose name is in ``keep`` (with their values) and the dropped names."""
    kept, dropped, keeping = [], [], False
    for token in flags:
        if token.startswith("--"):
            name = token[2:].split("=", 1)[0]
            keeping = name in keep
            if not keeping:
                dropped.append(token)
        if keeping:
            kept.append(token)
    return kept, dropped


def http_get(url: str, timeout: float) -> tuple[int, str]:
    """(status, body) of a GET; status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""


@dataclass
class ManagedProcess:
    name: str
    popen: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class RolloutServers:
    """N engines behind one sglang-router. Use as a context manager, or call start() and stop()."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        log_dir: str | os.PathLike,
        num_engines: int = 1,
        engine: str = "builtin",
        host: str = "127.0.0.1",
        advertise_host: str | None = None,
        tokenizer_path: str | os.PathLike | None = None,
        sglang_flags: Sequence[str] | Mapping[str, Any] = (),
        router_flags: Sequence[str] | Mapping[str, Any] = (),
        router_policy: str = "round_robin",
        with_router: bool = True,
        random_seed: int = 0,
        gpus_per_engine: int = 1,
        startup_timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        num_threads: int | None = None,
        log_name: str = "engine",
    ):
        if engine not in ENGINES:
            raise UserError(f"engine {engine!r} is not one of {ENGINES}")
        if num_engines < 1:
            raise UserError(f"num_engines must be >= 1, got {num_engines}")
        if not Path(model_path, "config.json").is_file():
            raise UserError(f"--hf-checkpoint {model_path} has no config.json; pass an HF checkpoint directory")
        self.model_path = str(model_path)
        self.tokenizer_path = str(tokenizer_path or model_path)
        self.log_dir = Path(log_dir)
        self.num_engines = num_engines
        self.engine = engine
        self.host = host
        self.advertise_host = advertise_host or (socket.gethostbyname(socket.gethostname())
                                                 if host in ("0.0.0.0", "::") else host)
        self.sglang_flags = passthrough_flags(sglang_flags, "sglang")
        self.router_flags = passthrough_flags(router_flags, "router")
        for flags, owned, prefix in ((self.sglang_flags, _LAUNCHER_OWNED, "sglang"),
                                     (self.router_flags, _ROUTER_OWNED | {"policy"}, "router")):
            clash = sorted(set(_flag_names(flags)) & owned)
            if clash:
                raise UserError(f"--{prefix}-{clash[0]} is set by the launcher (or its own argument); remove it")
        self.router_policy = router_policy
        self.with_router = with_router
        self.random_seed = random_seed
        self.gpus_per_engine = gpus_per_engine
        self.startup_timeout_s = startup_timeout_s or (900.0 if engine == "sglang" else 120.0)
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})}
        if engine == "builtin":
            # Idle OpenMP threads sleep instead of spinning: the built-in engine's steps are many small
            # ops, and spinning threads starve the router, the rollout client and a colocated trainer
            # on the same cores (a 2-thread engine on a busy 2-core machine: 5x slower rollouts).
            self.env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        self.num_threads = num_threads
        self.log_name = log_name
        self.engines: list[ManagedProcess] = []
        self.engine_urls: list[str] = []
        self.router: ManagedProcess | None = None
        self.router_url: str | None = None
        self._atexit_registered = False
        self._ports: list[int] = []
        self._router_ports: list[int] = []

    # ------------------------------------------------------------------------------------------

    def __enter__(self) -> RolloutServers:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Where rollouts send /generate: the router, or the single engine without one."""
        return self.router_url or self.engine_urls[0]

    def start(self) -> RolloutServers:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        try:
            for i in range(self.num_engines):
                # from slime's port range, with every port SGLang derives from it free and valid
                port = allocate_port(self.host, derived=SGLANG_DERIVED_PORT_OFFSETS)
                self._ports.append(port)
                name = self.log_name if self.num_engines == 1 else f"{self.log_name}-{i}"
                self.engines.append(spawn(name, self._engine_command(i, port), self.log_dir, self.env))
                self.engine_urls.append(f"http://{self._url_host()}:{port}")
            deadline = time.monotonic() + self.startup_timeout_s
            for proc, url in zip(self.engines, self.engine_urls):
                wait_ready(proc, f"{url}/health_generate", deadline, lambda status, _: status == 200)
            if self.with_router:
                router = start_router(self.engine_urls, log_dir=self.log_dir, tokenizer_path=self.tokenizer_path,
                                      policy=self.router_policy, host=self.host, router_flags=self.router_flags,
                                      advertise_host=self._url_host(), env=self.env)
                self.router, self.router_url = router.process, router.url
                self._router_ports = [router.port, router.metrics_port]
        except BaseException:
            self.stop()
            raise
        return self

    def _url_host(self) -> str:
        return f"[{self.advertise_host}]" if ":" in self.advertise_host else self.advertise_host

    def _engine_command(self, index: int, port: int) -> list[str]:
        common = ["--model-path", self.model_path, "--host", self.host, "--port", str(port),
                  "--random-seed", str(self.random_seed + index)]
        if self.engine == "sglang":
            return [sys.executable, "-m", "sglang.launch_server", *common, "--tokenizer-path", self.tokenizer_path,
                    "--base-gpu-id", str(index * self.gpus_per_engine), "--skip-server-warmup", *self.sglang_flags]
        flags, dropped = _drop_flags(self.sglang_flags, _BUILTIN_FLAGS)
        if dropped and index == 0:
            logger.info("the built-in engine ignores GPU-only SGLang flags: %s", " ".join(dropped))
        # By default share the cores, keeping one for the router, the rollout client and the driver.
        threads = self.num_threads or max(1, ((os.cpu_count() or 1) - 1) // self.num_engines)
        return [sys.executable, "-m", "slime_ref.engine", *common, "--tokenizer-path", self.tokenizer_path,
                "--num-threads", str(threads), *flags]

    # ------------------------------------------------------------------------------------------

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop the router, then the engines: SIGTERM to each process group, SIGKILL after ``grace_s``."""
        stop_processes(([self.router] if self.router else []) + list(reversed(self.engines)), grace_s)
        self.router, self.router_url = None, None
        self.engines, self.engine_urls = [], []
        for port in self._ports:
            port_allocator().release(port, SGLANG_DERIVED_PORT_OFFSETS)
        for port in self._router_ports:
            port_allocator().release(port)
        self._ports, self._router_ports = [], []
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False

    def kill_engine(self, index: int) -> None:
        """SIGKILL one engine's process group (one that failed, or in failure tests); it stays listed until stop()."""
        stop_groups([self.engines[index].popen], terminate_s=None)


# ------------------------------------------------------------------------------------------------
# processes: spawn with a log file, wait until ready, the router on its own


def spawn(name: str, command: list[str], log_dir: Path, env: Mapping[str, str]) -> ManagedProcess:
    """Start ``command`` in its own process group, output to ``log_dir/<name>.log``; it dies with us."""
    log_path = Path(log_dir) / f"{name}.log"
    popen = start_logged(command, log_path, env=env, with_parent=True)
    logger.info("started %s (pid %d), log %s", name, popen.pid, log_path)
    return ManagedProcess(name=name, popen=popen, log_path=log_path)


def wait_ready(proc: ManagedProcess, url: str, deadline: float, ready) -> None:
    """Poll ``url`` until ``ready(status, body)``; a clear error if the process dies or time runs out."""
    while True:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited with code {proc.popen.returncode} before {url} answered; "
                               f"log {proc.log_path}:\n{proc.log_tail()}")
        status, body = http_get(url, timeout=max(1.0, min(30.0, deadline - time.monotonic())))
        if ready(status, body):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name} did not become ready at {url} before the deadline; "
                               f"log {proc.log_path}:\n{proc.log_tail()}")
        time.sleep(0.5)


def stop_processes(procs: Sequence[ManagedProcess], grace_s: float = 10.0) -> None:
    """SIGTERM each process group, then SIGKILL what is left after ``grace_s`` (the leaders, and
    leftovers of a group whose leader exited: SGLang's scheduler processes)."""
    names = {proc.pid: proc.name for proc in procs}

    def warn(popen: subprocess.Popen, sig: int) -> None:
        logger.warning("%s (pid %d) ignored %s; killing it", names[popen.pid], popen.pid, signal.Signals(sig).name)

    stop_groups([proc.popen for proc in procs], terminate_s=grace_s, on_ignored=warn)


@dataclass
class Router:
    process: ManagedProcess
    host: str
    port: int
    metrics_port: int | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        stop_processes([self.process])
        for port in (self.port, self.metrics_port):
            if port is not None:
                port_allocator().release(port)


def start_router(engine_urls: Sequence[str], *, log_dir: str | os.PathLike, tokenizer_path: str | os.PathLike,
                 policy: str = "round_robin", host: str = "127.0.0.1", router_flags: Sequence[str] = (),
                 advertise_host: str | None = None, env: Mapping[str, str] | None = None,
                 timeout_s: float = 60.0) -> Router:
    """Start the real sglang-router in front of ``engine_urls`` and wait until it lists them all healthy."""
    port, metrics_port = allocate_port(host), allocate_port(host)
    command = [
        sys.executable, "-m", "sglang_router.launch_router", "--host", host, "--port", str(port),
        "--worker-urls", *engine_urls, "--policy", policy,
        # The default metrics port (29000) would collide between routers on one machine.
        "--prometheus-port", str(metrics_port), "--prometheus-host", host,
        "--tokenizer-path", str(tokenizer_path), "--log-level", "warn",
        # As slime launches it: engines that are paused, syncing weights or have released their memory
        # (colocated) answer slowly or not at all for a while; the router's own health checks and circuit
        # breaker would then mark them dead and refuse every request with 503 "no_available_workers".
        # slime-ref tracks engine health itself (start-up waits, client retries with deadlines).
        "--disable-circuit-breaker", "--disable-health-check",
        *router_flags,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})}
    proc = spawn("router", command, Path(log_dir), env)
    router = Router(proc, advertise_host or host, port, metrics_port)

    def all_registered(status: int, body: str) -> bool:
        if status != 200:
            return False
        workers = json.loads(body).get("workers", [])
        return len(workers) == len(engine_urls) and all(w.get("is_healthy") for w in workers)

    # Workers register in the background after the router starts; wait until all are in.
    try:
        wait_ready(proc, f"{router.url}/workers", time.monotonic() + timeout_s, all_registered)
    except BaseException:
        router.stop()
        raise
    return router


def router_remove_worker(router_url: str, worker_url: str, timeout_s: float = 10.0) -> bool:
    """Take ``worker_url`` out of the router's rotation (``DELETE /workers/{id}``, as slime does)."""
    status, body = http_get(f"{router_url}/workers", timeout_s)
    if status != 200:
        return False
    for worker in json.loads(body).get("workers", []):
        if worker.get("url") == worker_url and worker.get("id") is not None:
            request = urllib.request.Request(f"{router_url}/workers/{worker['id']}", method="DELETE")
            try:
                with urllib.request.urlopen(request, timeout=timeout_s):
                    return True
            except (urllib.error.URLError, OSError):
                return False
    return False


def router_add_worker(router_url: str, worker_url: str, timeout_s: float = 60.0) -> None:
    """Put ``worker_url`` behind the router (``POST /workers``, as slime does) and wait until it is listed healthy."""
    payload = json.dumps({"url": worker_url, "worker_type": "regular"}).encode()
    request = urllib.request.Request(f"{router_url}/workers", data=payload, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s):
        pass
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status, body = http_get(f"{router_url}/workers", 5.0)
        if status == 200 and any(w.get("url") == worker_url and w.get("is_healthy")
                                 for w in json.loads(body).get("workers", [])):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the router at {router_url} did not list {worker_url} as healthy within {timeout_s:g} s")
