"""``slime-check smoke``, running and stopping: the run's environment, the run in a session of its own
(:class:`Launched`: streamed log, process tree remembered, stopped by PID only), and a Ray head of our
own for a real slime run. A Ray cluster the rehearsal did not start is never stopped."""

from __future__ import annotations

import importlib.util
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from slime_common.process_tree import kill_recorded, record_tree, start_in_session, stop_groups
from slime_rehearse.smoke_assets import SMOKE_SITE
from slime_rehearse.smoke_job import Job, SmokeOptions

# ---------------------------------------------------------------------------------------------
# running and stopping


def slime_importable() -> bool:
    return importlib.util.find_spec("slime") is not None


class Launched:
    """A command in its own session; output streamed to a file and a callback; every process of its tree
    remembered, so that exactly those are stopped."""

    def __init__(self, cmd: list[str], env: dict, log_path: Path, cwd: str | None = None, echo=None):
        self.log_path = log_path
        self.echo = echo
        self.proc = start_in_session(cmd, stdout=subprocess.PIPE, env=env, cwd=cwd)
        self.seen: dict[int, float] = {}
        self.peak_rss = 0
        self.lines: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        with open(self.log_path, "wb") as log:
            for raw in iter(self.proc.stdout.readline, b""):
                log.write(raw)
                log.flush()
                self.lines.put(raw.decode(errors="replace").rstrip("\n"))
        self.lines.put(None)

    def snapshot(self) -> None:
        import psutil

        rss = 0
        for proc in record_tree(self.proc.pid, self.seen):
            try:
                rss += proc.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        self.peak_rss = max(self.peak_rss, rss)

    def wait(self, timeout_s: float) -> tuple[int | None, bool]:
        """(exit status, timed out). Streams lines to ``echo`` while waiting."""
        deadline = time.monotonic() + timeout_s
        last_snap = 0.0
        done_reading = False
        while True:
            if time.monotonic() - last_snap > 0.5:
                self.snapshot()
                last_snap = time.monotonic()
            try:
                line = self.lines.get(timeout=0.2)
                if line is None:
                    done_reading = True
                elif self.echo:
                    self.echo(line)
            except queue.Empty:
                pass
            if done_reading and self.proc.poll() is not None:
                return self.proc.returncode, False
            if time.monotonic() > deadline:
                self.stop()
                return self.proc.returncode, True

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGINT to its group (it tears down what it started), then SIGKILL to whatever of its tree is left,
        in its group or not (a process that started a session of its own, as Ray's do)."""
        self.snapshot()
        stop_groups([self.proc], interrupt_s=grace_s, terminate_s=None)
        kill_recorded(self.seen)
        self._reader.join(timeout=5)


def run_env(opts: SmokeOptions, job: Job, hooks_config: Path | None, compat: bool) -> dict:
    """The run's environment: the job's, with the counted hooks (and the coverage start-up) first on
    PYTHONPATH, the slime compatibility layer when slime is missing, and every cache under OUT."""
    env = {**os.environ, **job.env, **opts.env}
    paths = [str(SMOKE_SITE)] if hooks_config else []
    if hooks_config:
        env["SLIME_SMOKE_HOOKS_CONFIG"] = str(hooks_config)
    if compat:
        from slime_rehearse.compat import ROOT

        paths.append(str(ROOT))
    if opts.target:  # the compat layer serves that slime's module names (compat/layouts.py)
        from slime_rehearse.compat import TARGET_ENV

        env[TARGET_ENV] = opts.target
    import slime_ref

    paths.append(str(Path(slime_ref.__file__).resolve().parent.parent))
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update({
        "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1", "COLUMNS": "200",
        "WANDB_MODE": "offline", "WANDB_DIR": str(opts.out / "wandb"),
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "PYTHONPYCACHEPREFIX": str(opts.out / "pycache"),  # no __pycache__ next to the user's hooks
        "MPLCONFIGDIR": str(opts.out / "cache" / "matplotlib"),  # the run's plots: font cache under OUT
        "XDG_CACHE_HOME": str(opts.out / "cache"),
    })
    (opts.out / "wandb").mkdir(parents=True, exist_ok=True)
    env["RAY_TMPDIR"] = str(ray_temp_dir(opts.out))
    return env


# Ray puts its sockets at RAY_TMPDIR/ray/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store: 68
# characters after RAY_TMPDIR with a 7-digit pid, and a Unix socket path holds at most 107.
RAY_SOCKET_SUFFIX = len("/ray/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store")
UNIX_PATH_MAX = 107


def ray_temp_dir(out: Path) -> Path:
    """OUT/ray where Ray's socket paths fit under it; else a short private folder in /tmp, which
    :func:`remove_ray_temp_dir` removes after the run."""
    ray_tmp = out / "ray"
    if len(str(ray_tmp.resolve())) + RAY_SOCKET_SUFFIX > UNIX_PATH_MAX:
        import tempfile

        ray_tmp = Path(tempfile.mkdtemp(prefix="slime-smoke-ray-", dir="/tmp"))
    ray_tmp.mkdir(parents=True, exist_ok=True)
    return ray_tmp


def remove_ray_temp_dir(env: dict, out: Path) -> None:
    path = Path(env.get("RAY_TMPDIR", ""))
    if path.name.startswith("slime-smoke-ray-") and path.parent == Path("/tmp"):
        import shutil

        shutil.rmtree(path, ignore_errors=True)


def slime_ref_cmd(entry: str, argv: list[str]) -> list[str]:
    command = "train-async" if entry == "train_async.py" else "train"
    return [sys.executable, "-c", "from slime_ref.cli import main; main()", command, *argv]


def slime_cmd(slime_dir: Path, entry: str, argv: list[str]) -> list[str]:
    return [sys.executable, str(slime_dir / entry), *argv]


class RayHead:
    """A Ray head of our own on free loopback ports, for the real slime run; stopped by its PIDs only.
    ``client_env`` is what a process needs to join it: RAY_ADDRESS, and RAY_AUTH_MODE when it has one."""

    def __init__(self, launched: Launched, address: str, auth: dict):
        self.launched, self.address = launched, address
        self.client_env = {"RAY_ADDRESS": address, **auth}

    def stop(self):
        self.launched.stop(grace_s=10)


def _free_port() -> int:
    """A free loopback port outside Ray's default worker range (10002-19999)."""
    import socket

    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if not 10000 <= port < 20000:
            return port


def ray_auth_env(env: dict) -> dict:
    """The RAY_AUTH_MODE that our head and slime's train.py, joining it by RAY_ADDRESS, must share."""
    from slime_common.ray_auth import ray_auth_mode

    mode = ray_auth_mode(env)
    return {"RAY_AUTH_MODE": mode} if mode else {}


def start_ray_head(out: Path, env: dict) -> RayHead:
    import socket

    from slime_common.errors import RunError

    port = _free_port()
    cmd = [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
           "--port", str(port), "--dashboard-port", str(_free_port()), "--include-dashboard", "false",
           "--ray-client-server-port", str(_free_port()), "--dashboard-agent-listen-port", str(_free_port()),
           "--disable-usage-stats"]
    if "RAY_TMPDIR" in env:
        cmd += ["--temp-dir", env["RAY_TMPDIR"]]
    auth = ray_auth_env(env)
    launched = Launched(cmd, {**env, **auth}, out / "ray-head.log")
    deadline = time.monotonic() + 90
    up = False
    while not up and time.monotonic() < deadline and launched.proc.poll() is None:  # GCS listening: the head is up
        launched.snapshot()
        with socket.socket() as sock:
            sock.settimeout(1)
            up = sock.connect_ex(("127.0.0.1", port)) == 0
        if not up:
            time.sleep(0.5)
    if not up:
        launched.stop(grace_s=10)
        raise RunError(f"the Ray head for the smoke run did not start; see {out / 'ray-head.log'} "
                       "(or set RAY_ADDRESS to a cluster of yours)")
    return RayHead(launched, f"127.0.0.1:{port}", auth)
