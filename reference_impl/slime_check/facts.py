"""Parsers that turn probe output into facts. Pure functions on text: each returns None (or an
empty result) when the text is not what it should be, never raises on odd input."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
MIB = 1024**2
GIB = 1024**3


def version_tuple(text: str | None) -> tuple[int, ...]:
    """Leading numeric parts of a version: ``"2.11.0+cu130"`` -> ``(2, 11, 0)``; ``()`` if none."""
    if not text:
        return ()
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", text)
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()


def _int(text: str | None) -> int | None:
    match = re.search(r"-?\d+", text or "")
    return int(match.group(0)) if match else None


# ---------------------------------------------------------------------------------------------
# GPUs
# ---------------------------------------------------------------------------------------------


@dataclass
class Gpu:
    index: int
    name: str
    memory_mib: int | None = None
    used_mib: int | None = None
    cc: str | None = None  # "9.0"
    arch: str | None = None  # "Hopper"
    mig: str | None = None  # "Enabled" / "Disabled" / "N/A"
    ecc: str | None = None
    ecc_uncorrectable: int | None = None
    row_remap_pending: bool | None = None
    processes: list[str] = field(default_factory=list)


@dataclass
class GpuInventory:
    driver: str | None
    cuda: str | None
    gpus: list[Gpu]
    source: str


def parse_nvsmi_xml(text: str) -> GpuInventory | None:
    start = text.find("<nvidia_smi_log")
    if start < 0:
        return None
    body = re.sub(r"<!DOCTYPE[^>]*>", "", text[start:])
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return None

    def get(node, path):
        found = node.find(path)
        return found.text.strip() if found is not None and found.text else None

    gpus = []
    for i, node in enumerate(root.findall("gpu")):
        uncorrectable = [
            _int(get(node, f"ecc_errors/volatile/{key}"))
            for key in (
                "dram_uncorrectable",
                "sram_uncorrectable",
                "sram_uncorrectable_parity",
                "sram_uncorrectable_secded",
            )
        ]
        known = [u for u in uncorrectable if u is not None]
        gpus.append(
            Gpu(
                index=_int(get(node, "minor_number")) if get(node, "minor_number") not in (None, "N/A") else i,
                name=get(node, "product_name") or "unknown",
                memory_mib=_int(get(node, "fb_memory_usage/total")),
                used_mib=_int(get(node, "fb_memory_usage/used")),
                arch=get(node, "product_architecture"),
                mig=get(node, "mig_mode/current_mig"),
                ecc=get(node, "ecc_mode/current_ecc"),
                ecc_uncorrectable=sum(known) if known else None,
                row_remap_pending=(get(node, "remapped_rows/remapped_row_pending") == "Yes")
                if get(node, "remapped_rows/remapped_row_pending") in ("Yes", "No")
                else None,
                processes=[get(p, "process_name") or "?" for p in node.findall("processes/process_info")],
            )
        )
    driver, cuda = get(root, "driver_version"), get(root, "cuda_version")
    if not gpus and not driver:
        return None
    return GpuInventory(driver, cuda, gpus, "nvidia-smi -q -x")


def parse_nvsmi_csv(text: str) -> GpuInventory | None:
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or "index" not in lines[0] or "name" not in lines[0]:
        return None
    header = [h.strip().split(" [")[0] for h in lines[0].split(",")]
    gpus, driver = [], None
    for line in lines[1:]:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(header):
            return None
        row = dict(zip(header, cells))
        index = _int(row.get("index"))
        if index is None:
            return None
        driver = row.get("driver_version") or driver
        cc = row.get("compute_cap")
        gpus.append(
            Gpu(
                index=index,
                name=row.get("name", "unknown"),
                memory_mib=_int(row.get("memory.total")),
                used_mib=_int(row.get("memory.used")),
                cc=cc if cc and re.fullmatch(r"\d+\.\d+", cc) else None,
                mig=row.get("mig.mode.current"),
                ecc=row.get("ecc.mode.current"),
            )
        )
    if not gpus:
        return None
    return GpuInventory(driver, None, gpus, "nvidia-smi query csv")


TABLE_HEADER = re.compile(r"Driver Version:\s*([\d.]+).*?CUDA Version:\s*([\d.]+)")
TABLE_ROW = re.compile(r"^\|\s+(\d+)\s+(.+?)\s{2,}(?:On|Off)\s+\|")
TABLE_MEM = re.compile(r"(\d+)MiB\s*/\s*(\d+)MiB")


def parse_nvsmi_table(text: str) -> GpuInventory | None:
    header = TABLE_HEADER.search(text)
    if not header:
        return None
    gpus = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        row = TABLE_ROW.match(line)
        if row:
            mem = TABLE_MEM.search(lines[i + 1]) if i + 1 < len(lines) else None
            gpus.append(
                Gpu(
                    index=int(row.group(1)),
                    name=row.group(2).strip(),
                    used_mib=int(mem.group(1)) if mem else None,
                    memory_mib=int(mem.group(2)) if mem else None,
                )
            )
    return GpuInventory(header.group(1), header.group(2), gpus, "nvidia-smi")


def parse_driver_file(text: str) -> str | None:
    """Driver version from /proc/driver/nvidia/version."""
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else None


# Compute capability by product name, when no probe reports it.
CC_BY_NAME = [
    (r"\bG?B300\b", "10.3"),
    (r"\bG?B200\b|\bB100\b", "10.0"),
    (r"\bGB10\b", "12.1"),
    (r"RTX 50\d\d|RTX PRO 6000", "12.0"),
    (r"\bG?H100\b|\bH200\b|\bH800\b|\bH20\b|\bGH200\b", "9.0"),
    (r"\bL40S?\b|\bL4\b|RTX 40\d\d|RTX 6000 Ada", "8.9"),
    (r"\bA100\b|\bA800\b|\bA30\b", "8.0"),
    (r"\bA10G?\b|\bA40\b|\bA6000\b|RTX 30\d\d", "8.6"),
    (r"\bV100\b", "7.0"),
    (r"\bT4\b|RTX 20\d\d", "7.5"),
    (r"\bP100\b", "6.0"),
]


def cc_from_name(name: str) -> str | None:
    for pattern, cc in CC_BY_NAME:
        if re.search(pattern, name):
            return cc
    return None


def parse_torch_props(text: str) -> tuple[list[dict], bool | None] | None:
    """``torch cuda props``: a JSON list of ``{name, cc, mem}``, then ``bf16 cudnn nccl``."""
    import json

    lines = [line for line in text.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.lstrip().startswith("["):
            try:
                devices = json.loads(line)
            except ValueError:
                return None
            if not isinstance(devices, list) or not all(isinstance(d, dict) for d in devices):
                return None
            bf16 = None
            if i + 1 < len(lines):
                bf16 = {"True": True, "False": False}.get(lines[i + 1].split()[0])
            return devices, bf16
    return None


def parse_topology(text: str) -> dict[tuple[int, int], str] | None:
    """``nvidia-smi topo -m``: the link between each pair of GPUs (``NV18``, ``PIX``, ``SYS``...)."""
    lines = [ANSI.sub("", line).rstrip() for line in text.splitlines()]
    header = next(
        (line for line in lines if re.search(r"\bGPU0\b", line) and not line.lstrip().startswith("GPU0 ")), None
    )
    if header is None:
        return None
    columns = [c for c in header.split() if re.fullmatch(r"GPU\d+", c)]
    links: dict[tuple[int, int], str] = {}
    for line in lines:
        cells = line.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        row = int(cells[0][3:])
        for col, cell in zip(columns, cells[1:]):
            links[(row, int(col[3:]))] = cell
    return links if links else None


# ---------------------------------------------------------------------------------------------
# Container, limits, memory, disk
# ---------------------------------------------------------------------------------------------


def parse_df(text: str) -> tuple[int, int] | None:
    """``df -B1 PATH``: (size, available) in bytes of the filesystem."""
    for line in text.splitlines()[1:]:
        cells = line.split()
        if len(cells) >= 4 and cells[1].isdigit() and cells[3].isdigit():
            return int(cells[1]), int(cells[3])
    return None


SIZE_UNITS = {"k": 1024, "m": MIB, "g": GIB, "": 1}


def parse_mountinfo_shm(text: str) -> tuple[str, int | None] | None:
    """The mount at /dev/shm (the last one wins, as the kernel shows it): (source, size bytes)."""
    found = None
    for line in text.splitlines():
        pre, sep, post = line.partition(" - ")
        fields = pre.split()
        if sep and len(fields) >= 5 and fields[4] == "/dev/shm":
            parts = post.split()
            source = parts[1] if len(parts) > 1 else "?"
            size = re.search(r"(?:^|,)size=(\d+)([kmg]?)", parts[2] if len(parts) > 2 else "")
            found = (source, int(size.group(1)) * SIZE_UNITS[size.group(2)] if size else None)
    return found


def parse_ulimits(line_text: str | None, all_text: str | None) -> dict[str, int | str]:
    """memlock and stack in KiB, nofile as a count; ``"unlimited"`` where so."""
    limits: dict[str, int | str] = {}
    for key, value in re.findall(r"(memlock|stack|nofile)=(\S+)", line_text or ""):
        limits[key] = value if value == "unlimited" else _int(value)
    patterns = {"memlock": r"max locked memory.*-l\)\s+(\S+)", "stack": r"stack size.*-s\)\s+(\S+)",
                "nofile": r"open files.*-n\)\s+(\S+)"}
    for key, pattern in patterns.items():
        match = re.search(pattern, all_text or "")
        if key not in limits and match:
            limits[key] = match.group(1) if match.group(1) == "unlimited" else _int(match.group(1))
    return {k: v for k, v in limits.items() if v is not None}


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo in bytes."""
    values = {}
    for key, number, unit in re.findall(r"^(\w+):\s+(\d+)\s*(kB)?", text, re.MULTILINE):
        values[key] = int(number) * (1024 if unit else 1)
    return values


def parse_cgroup_runtime(text: str) -> str | None:
    """Container runtime named in a cgroup path, if any."""
    for pattern, kind in ((r"kubepods", "kubernetes"), (r"libpod|podman", "podman"), (r"docker", "docker"),
                          (r"containerd|cri-o|crio", "container")):
        if re.search(pattern, text):
            return kind
    return None


# ---------------------------------------------------------------------------------------------
# Python packages
# ---------------------------------------------------------------------------------------------


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_packages(text: str) -> dict[str, str]:
    """``name==version`` lines, ``pip list`` columns, or collect_env's ``[pip3] name==version``."""
    packages = {}
    for line in text.splitlines():
        line = re.sub(r"^\[(pip3?|conda)\]\s*", "", line.strip())
        if not line or line.startswith(("-", "Package ")):
            continue
        if "==" in line:
            name, _, version = line.partition("==")
        else:
            cells = line.split()
            if len(cells) < 2 or not re.match(r"\d", cells[1]):
                continue
            name, version = cells[0], cells[1]
        packages[normalise(name.strip())] = version.strip().split()[0] if version.strip() else ""
    return packages


def parse_torch_build(text: str) -> tuple[str | None, str | None]:
    """(torch version, CUDA it was built with; None for a CPU build) from our ``torch build``
    section or from ``python -m torch.utils.collect_env``."""
    version = re.search(r"^(?:version=|PyTorch version:\s*)(\S+)", text, re.MULTILINE)
    cuda = re.search(r"^(?:cuda=|CUDA used to build PyTorch:\s*)(\S+)", text, re.MULTILINE)
    cuda_value = cuda.group(1) if cuda else None
    if cuda_value in ("None", "N/A", "Could"):
        cuda_value = None
    return (version.group(1) if version else None), cuda_value


def parse_python_version(text: str) -> str | None:
    match = re.search(r"^(?:Python version:\s*)?(\d+\.\d+\.\d+)", text, re.MULTILINE)
    return match.group(1) if match else None


def parse_megatron(text: str) -> dict[str, str]:
    """Our ``megatron`` section: ``key=value`` words per line (``checkout`` may repeat)."""
    facts: dict[str, str] = {}
    for line in text.splitlines():
        for key, value in re.findall(r"([\w.]+)=(\S+)", line):
            facts.setdefault(key, value)
    return facts


# ---------------------------------------------------------------------------------------------
# Ports and processes
# ---------------------------------------------------------------------------------------------


def parse_ss_listening(text: str) -> set[int] | None:
    ports = set()
    header = False
    for line in text.splitlines():
        if line.startswith("State"):
            header = True
            continue
        cells = line.split()
        if len(cells) >= 4 and cells[0] == "LISTEN":
            match = re.search(r":(\d+)$", cells[3])
            if match:
                ports.add(int(match.group(1)))
    return ports if header else None


def parse_proc_net_tcp(text: str) -> set[int] | None:
    """Listening ports (state 0A) in /proc/net/tcp or tcp6."""
    lines = text.splitlines()
    if not lines or "local_address" not in lines[0]:
        return None
    ports = set()
    for line in lines[1:]:
        cells = line.split()
        if len(cells) > 3 and cells[3] == "0A" and ":" in cells[1]:
            ports.add(int(cells[1].rsplit(":", 1)[1], 16))
    return ports


def parse_processes(text: str) -> list[tuple[int, str]] | None:
    lines = text.splitlines()
    if not lines or "PID" not in lines[0]:
        return None
    found = []
    for line in lines[1:]:
        pid, _, args = line.strip().partition(" ")
        if pid.isdigit():
            found.append((int(pid), args.strip()))
    return found
