"""Probes: how checks look at a machine, either this one or a captured one.

Every check asks a :class:`Probe` three kinds of question: run a named command, read a file, read
the environment. :class:`LiveProbe` answers on this machine; :class:`CaptureProbe` answers from a
capture file, so a check runs the same against a user's machine we cannot reach.

A capture is UTF-8 text made of sections (see ``tests/fixtures/env/README.md``)::

    === <what was captured, usually the exact command or file path>
    <its output, stdout and stderr together, verbatim>
    === rc=<exit code>

A section a capture lacks reads as ``missing`` and the checks that need it report SKIP.
``slime-check capture`` writes the sections in :data:`SECTIONS` for the machine it runs on.
Nothing here changes the machine: commands only query.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import resource
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

COMMAND_TIMEOUT_S = 20.0
NOT_CAPTURED = None  # rc of a section the capture does not have

# Section names (capture headers). The first group is the documented capture format.
NVSMI_XML = "nvidia-smi -q -x"
NVSMI_CSV = "nvidia-smi query csv"
NVSMI_TOPO = "nvidia-smi topo -m"
NVSMI_NVLINK = "nvidia-smi nvlink -s"
NVSMI = "nvidia-smi"
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
NVCC = "nvcc --version"
DOCKERENV = "/.dockerenv"
CGROUP_1 = "/proc/1/cgroup"
CGROUP_SELF = "/proc/self/cgroup"
MOUNTINFO = "/proc/self/mountinfo"
DF_SHM = "df -B1 /dev/shm"
ULIMIT_ALL = "ulimit -a"
ULIMIT_LSN = "ulimit -l -s -n"
MEMINFO = "/proc/meminfo"
NPROC = "nproc"
UNAME = "uname -a"
OS_RELEASE = "/etc/os-release"
ENV = "env (filtered)"
DF_ROOT = "df -B1 /"
COLLECT_ENV = "python3 collect_env"
TORCH_CUDA_PROPS = "torch cuda props"
SS = "ss -ltn"
PIP_LIST = "pip list"
# Added by slime-check's own captures; older captures simply lack them.
CONTAINERENV = "/run/.containerenv"
PYTHON = "python"
TORCH_BUILD = "torch build"
PACKAGES = "python packages"
MEGATRON = "megatron"
MODULE_VERSIONS = "module versions"
PROCESSES = "ps -eo pid,args"
HOST_ADDRESS = "host address"
PROC_NET_TCP = "/proc/net/tcp"
PROC_NET_TCP6 = "/proc/net/tcp6"

NVSMI_QUERY_FIELDS = (
    "index,name,uuid,driver_version,memory.total,memory.used,memory.free,compute_cap,mig.mode.current,"
    "persistence_mode,ecc.mode.current,pcie.link.gen.current,pcie.link.width.current,power.limit,clocks.max.sm"
)

# Environment variables a capture keeps (the fixture README's filter, plus slime's own).
ENV_KEEP = re.compile(r"CUDA|NCCL|NVIDIA|TORCH|LD_LIBRARY|PATH|HF_|RAY|SGL|MASTER|NV|SLIME|GLOO|KUBERNETES|MEGATRON")
ENV_SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
SECRET_ARG = re.compile(r"(--[\w-]*(?:key|token|secret|password)[\w-]*)[ =]\S+", re.IGNORECASE)


@dataclass(frozen=True)
class Output:
    """What one probe saw: the exit status and the text (stdout and stderr together)."""

    rc: int | None  # None: the capture has no such section
    text: str

    @property
    def missing(self) -> bool:
        return self.rc is NOT_CAPTURED

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def reason(self, what: str) -> str:
        """Why this output cannot be used, in one line."""
        if self.missing:
            return f"the capture has no '{what}' section"
        first = next((line.strip() for line in self.text.splitlines() if line.strip()), "")
        if self.rc == 127:
            return f"'{what}' is not installed (command not found)"
        return f"'{what}' failed (rc={self.rc}): {first[:160]}" if first else f"'{what}' failed (rc={self.rc})"


class Probe(Protocol):
    origin: str  # where the answers come from, for report titles

    def run(self, name: str) -> Output: ...

    def read_file(self, path: str) -> Output: ...

    def environ(self) -> dict[str, str] | None: ...


# ---------------------------------------------------------------------------------------------
# A capture file
# ---------------------------------------------------------------------------------------------

SECTION_END = re.compile(r"^=== rc=(-?\d+)\s*$")


def parse_capture(text: str) -> dict[str, Output]:
    """Sections of a capture by header. The first of two same-named sections wins; a section
    cut off before its ``=== rc=`` line keeps its text with rc -1."""
    sections: dict[str, Output] = {}
    header: str | None = None
    body: list[str] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if header is None:
            if line.startswith("=== ") and not SECTION_END.match(line):
                header, body = line[4:].strip(), []
            continue
        end = SECTION_END.match(line)
        if end:
            sections.setdefault(header, Output(int(end.group(1)), "\n".join(body)))
            header = None
        else:
            body.append(line)
    if header is not None:
        sections.setdefault(header, Output(-1, "\n".join(body)))
    return sections


class CaptureProbe:
    def __init__(self, path: str | Path):
        from slime_common.errors import UserError

        self.path = Path(path)
        self.origin = f"capture {self.path}"
        what = ("a capture is UTF-8 text of sections, each a line '=== <command or file>', its output, then "
                "'=== rc=<exit code>'; make one on the machine with `slime-check capture --out FILE`")
        try:
            data = self.path.read_bytes()
        except OSError as e:
            raise UserError(f"--fixture {path}: {e.strerror or e}") from e
        self.sections = parse_capture(data.decode("utf-8", errors="replace"))
        if not self.sections:  # a capture's sections may hold garbled bytes; a file with none is no capture
            kind = "empty" if not data.strip() else "a binary file" if b"\0" in data else "not a capture (no sections)"
            raise UserError(f"--fixture {path} is {kind}: {what}")

    def run(self, name: str) -> Output:
        return self.sections.get(name, Output(NOT_CAPTURED, ""))

    def read_file(self, path: str) -> Output:
        return self.run(path)

    def environ(self) -> dict[str, str] | None:
        out = self.run(ENV)
        if not out.ok:
            return None
        env = {}
        for line in out.text.splitlines():
            key, sep, value = line.partition("=")
            if sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                env[key] = value
        return env


# ---------------------------------------------------------------------------------------------
# This machine
# ---------------------------------------------------------------------------------------------


def run_command(argv: list[str], timeout: float = COMMAND_TIMEOUT_S) -> Output:
    """Run a query command; a missing binary, a timeout or a permission error becomes an Output."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, errors="replace")
    except FileNotFoundError:
        return Output(127, f"{argv[0]}: command not found")
    except PermissionError as e:
        return Output(126, f"{argv[0]}: {e}")
    except subprocess.TimeoutExpired:
        return Output(124, f"{' '.join(argv)}: timed out after {timeout:.0f} s")
    except OSError as e:
        return Output(126, f"{argv[0]}: {e}")
    return Output(done.returncode, (done.stdout + done.stderr).rstrip("\n"))


def read_text_file(path: str) -> Output:
    try:
        return Output(0, Path(path).read_text(errors="replace").rstrip("\n"))
    except FileNotFoundError:
        return Output(1, f"cat: {path}: No such file or directory")
    except PermissionError:
        return Output(1, f"cat: {path}: Permission denied")
    except OSError as e:
        return Output(1, f"cat: {path}: {e}")


def _limit_kib(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value // 1024)


def ulimit_line() -> Output:
    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    files = "unlimited" if nofile == resource.RLIM_INFINITY else str(nofile)
    return Output(0, f"memlock={_limit_kib(memlock)} stack={_limit_kib(stack)} nofile={files}")


def filtered_env() -> Output:
    lines = []
    for key in sorted(os.environ):
        if ENV_KEEP.search(key):
            value = "<redacted>" if ENV_SECRET.search(key) else os.environ[key]
            lines.append(f"{key}={value}")
    return Output(0, "\n".join(lines))


def python_version() -> Output:
    return Output(0, f"{sys.version.split()[0]}\n{sys.executable}")


def torch_build() -> Output:
    """torch's version and CUDA build, read from torch/version.py without importing torch."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return Output(1, "torch is not installed")
    version_py = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    text = read_text_file(str(version_py))
    if not text.ok:
        return text
    fields = dict(
        re.findall(r"^(__version__|cuda|hip)\s*(?::\s*\S+)?\s*=\s*['\"]?([^'\"\n]*)['\"]?", text.text, re.MULTILINE)
    )
    return Output(0, f"version={fields.get('__version__', '?')}\ncuda={fields.get('cuda', 'None') or 'None'}")


def installed_packages() -> Output:
    seen = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name")
        if name:
            seen.setdefault(name, dist.version)
    return Output(0, "\n".join(f"{n}=={v}" for n, v in sorted(seen.items(), key=lambda kv: kv[0].lower())))


def _git_commit(start: Path) -> str | None:
    """HEAD commit of the git checkout holding ``start`` (read from .git, no git binary needed)."""
    for folder in (start, *start.parents):
        git = folder / ".git"
        if git.is_file():  # a worktree: "gitdir: PATH"
            target = git.read_text().partition("gitdir:")[2].strip()
            git = (folder / target).resolve()
        if git.is_dir():
            head = (git / "HEAD").read_text().strip()
            if not head.startswith("ref:"):
                return head
            ref = head[4:].strip()
            if (git / ref).is_file():
                return (git / ref).read_text().strip()
            packed = git / "packed-refs"
            if packed.is_file():
                for line in packed.read_text().splitlines():
                    if line.endswith(" " + ref):
                        return line.split()[0]
            return None
    return None


MEGATRON_CHECKOUT_GUESSES = ("/root/Megatron-LM", "~/Megatron-LM")


def megatron_location(search_path: tuple[str, ...] = ()) -> Output:
    """Where ``megatron`` imports from (without importing it), its version, and checkouts on disk.
    ``search_path``: folders a job puts before this Python's own (its PYTHONPATH, as slime's scripts
    name Megatron-LM's checkout); they are looked in first, as the job's processes will."""
    lines = []
    roots = [m for m in (Path(p).expanduser() / "megatron" for p in search_path) if m.is_dir()]
    try:
        spec = None if roots else importlib.util.find_spec("megatron")
    except (ImportError, ValueError):
        spec = None
    roots += [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    core = next((r for r in roots if (r / "core").is_dir()), None)
    training = next((r for r in roots if (r / "training" / "arguments.py").is_file()), None)
    lines.append(f"megatron={','.join(map(str, roots)) or 'missing'}")
    version = None
    if core is not None:
        info = read_text_file(str(core / "core" / "package_info.py"))
        parts = dict(re.findall(r"^(MAJOR|MINOR|PATCH|PRE_RELEASE)\s*=\s*['\"]?([^'\"\n]*)", info.text, re.MULTILINE))
        if parts:
            version = f"{parts.get('MAJOR')}.{parts.get('MINOR')}.{parts.get('PATCH')}{parts.get('PRE_RELEASE', '')}"
    lines.append(f"megatron.core={'present' if core else 'missing'}" + (f" version={version}" if version else ""))
    lines.append(f"megatron.training={'present' if training else 'missing'}")
    commit = _git_commit(training.parent) if training else None
    if commit:
        lines.append(f"commit={commit}")
    for guess in MEGATRON_CHECKOUT_GUESSES:
        folder = Path(guess).expanduser()
        if (folder / "megatron" / "training").is_dir():
            lines.append(f"checkout={folder} commit={_git_commit(folder) or 'unknown'}")
    return Output(0, "\n".join(lines))


def module_versions() -> Output:
    """``__version__`` of modules whose dist version hides what matters (slime's sglang_router
    build says so only in the module), read from their version.py without importing them."""
    lines = []
    for module in ("sglang_router", "sglang"):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            lines.append(f"{module}=missing")
            continue
        text = read_text_file(str(Path(next(iter(spec.submodule_search_locations))) / "version.py")).text
        match = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", text)
        lines.append(f"{module}={match.group(1) if match else 'unknown'}")
    return Output(0, "\n".join(lines))


def process_list() -> Output:
    """``PID ARGS`` for every process, read from /proc (what ``ps -eo pid,args`` prints)."""
    lines = ["    PID COMMAND"]
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        args = SECRET_ARG.sub(r"\1 <redacted>", raw.replace(b"\0", b" ").decode(errors="replace").strip())
        if args:
            lines.append(f"{int(entry.name):7d} {args}")
    return Output(0, "\n".join(lines))


def _resolve(hostname: str, timeout: float = 1.0) -> str:
    """IPv4 addresses of ``hostname``; bounded so a broken DNS cannot stall the checks."""
    result: list[str] = []

    def work():
        try:
            infos = socket.getaddrinfo(hostname, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
            result.extend(dict.fromkeys(info[4][0] for info in infos))
        except OSError as e:
            result.append(f"error: {e}")

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(timeout)
    return ",".join(result) if result else f"error: no answer in {timeout:.0f} s"


def host_address() -> Output:
    """The hostname, what it resolves to, and the address slime would pick by default (a UDP
    connect probe, which sends nothing)."""
    hostname = socket.gethostname()
    route = "none"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("8.8.8.8", 80))
            route = s.getsockname()[0]
    except OSError:
        pass
    return Output(0, f"hostname={hostname}\nresolved={_resolve(hostname)}\nroute={route}")


TORCH_PROPS_SCRIPT = Path(__file__).resolve().with_name("torch_props.py")  # run by path, in another interpreter


def _python(argv: list[str], timeout: float) -> Callable[[], Output]:
    return lambda: run_command([sys.executable, *argv], timeout)


def _cmd(*argv: str) -> Callable[[], Output]:
    return lambda: run_command(list(argv))


def _file(path: str) -> Callable[[], Output]:
    return lambda: read_text_file(path)


# Every section this machine can answer, in capture order.
SECTIONS: dict[str, Callable[[], Output]] = {
    NVSMI_XML: _cmd("nvidia-smi", "-q", "-x"),
    NVSMI_CSV: _cmd("nvidia-smi", f"--query-gpu={NVSMI_QUERY_FIELDS}", "--format=csv"),
    NVSMI_TOPO: _cmd("nvidia-smi", "topo", "-m"),
    NVSMI_NVLINK: _cmd("nvidia-smi", "nvlink", "-s"),
    NVSMI: _cmd("nvidia-smi"),
    DRIVER_VERSION_FILE: _file(DRIVER_VERSION_FILE),
    NVCC: _cmd("nvcc", "--version"),
    DOCKERENV: _cmd("ls", "-la", "/.dockerenv"),
    CONTAINERENV: _cmd("ls", "-la", "/run/.containerenv"),
    CGROUP_1: _file(CGROUP_1),
    CGROUP_SELF: _file(CGROUP_SELF),
    MOUNTINFO: _file(MOUNTINFO),
    DF_SHM: _cmd("df", "-B1", "/dev/shm"),
    ULIMIT_ALL: _cmd("bash", "-c", "ulimit -a"),
    ULIMIT_LSN: ulimit_line,
    MEMINFO: _file(MEMINFO),
    NPROC: _cmd("nproc"),
    UNAME: _cmd("uname", "-a"),
    OS_RELEASE: _file(OS_RELEASE),
    ENV: filtered_env,
    DF_ROOT: _cmd("df", "-B1", "/"),
    PYTHON: python_version,
    TORCH_BUILD: torch_build,
    TORCH_CUDA_PROPS: _python([str(TORCH_PROPS_SCRIPT)], 120),
    COLLECT_ENV: _python(["-m", "torch.utils.collect_env"], 120),
    PACKAGES: installed_packages,
    PIP_LIST: _python(["-m", "pip", "list", "--disable-pip-version-check"], 60),
    MEGATRON: megatron_location,
    MODULE_VERSIONS: module_versions,
    SS: _cmd("ss", "-ltn"),
    PROC_NET_TCP: _file(PROC_NET_TCP),
    PROC_NET_TCP6: _file(PROC_NET_TCP6),
    PROCESSES: process_list,
    HOST_ADDRESS: host_address,
}


DF_PREFIX = "df -B1 "


def nearest_existing(path: str) -> Path:
    """``path`` or its nearest parent that exists (a checkpoint folder may not exist yet)."""
    folder = Path(path).expanduser().absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


class LiveProbe:
    """Answers on this machine; each answer is computed once, when a check first asks."""

    origin = "this machine"

    def __init__(self, pythonpath: str = ""):
        self._cache: dict[str, Output] = {}
        # a job's PYTHONPATH (e.g. Megatron-LM's checkout, which slime's scripts add for Ray's workers)
        self.search_path = tuple(p for p in pythonpath.split(os.pathsep) if p)

    def run(self, name: str) -> Output:
        if name not in self._cache:
            make = SECTIONS.get(name)
            if name == MEGATRON and self.search_path:
                make = partial(megatron_location, self.search_path)
            if make is None and name.startswith(DF_PREFIX):
                make = _cmd("df", "-B1", str(nearest_existing(name[len(DF_PREFIX):])))
            self._cache[name] = make() if make else Output(NOT_CAPTURED, "")
        return self._cache[name]

    def read_file(self, path: str) -> Output:
        if path not in self._cache:
            self._cache[path] = SECTIONS[path]() if path in SECTIONS else read_text_file(path)
        return self._cache[path]

    def environ(self) -> dict[str, str] | None:
        return dict(os.environ)


def write_capture(
    probe: LiveProbe, sections: list[str] | None = None, progress: Callable[[str], None] | None = None
) -> str:
    """The capture text for this machine: every section in :data:`SECTIONS`, in order."""
    parts = []
    for name in sections or list(SECTIONS):
        if progress:
            progress(name)
        out = probe.run(name)
        parts.append(f"=== {name}\n{out.text}\n=== rc={out.rc}\n" if out.text else f"=== {name}\n=== rc={out.rc}\n")
    return "".join(parts)
