"""``slime-check prereqs``: is this machine (or a captured one) ready for slime v0.3.1?

Four groups of checks: gpu, container, packages, system. Each check asks the probe, parses what it
got with :mod:`slime_check.facts` and returns findings. A probe that fails or a capture that lacks
a section gives SKIP or WARN with the reason; no check raises on odd input.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from slime_check import facts
from slime_check import probes as P
from slime_check.facts import GIB, version_tuple
from slime_check.findings import DOCKERFILE, FAQ, QUICK_START, Finding, Status, slime_doc

GROUPS = ("gpu", "container", "packages", "system")

HARDWARE_DOC = slime_doc(QUICK_START, "hardware-support")
DOCKER_DOC = slime_doc(QUICK_START, "pull-and-start-docker-container")
IMAGE_DOC = slime_doc(DOCKERFILE)
CONDA_DOC = slime_doc("build_conda.sh")
MULTINODE_DOC = slime_doc(QUICK_START, "multi-node-training-for-large-scale-moe-models")
FAQ_DOC = slime_doc(FAQ)

# slime v0.3.1's pins (docker/Dockerfile, build_conda.sh, requirements.txt, setup.py, and the
# requirements of sglang 0.5.15.post1, which its image is built on).
PIN_PYTHON = "3.12"
PIN_TORCH = "2.11.0"
PIN_SGLANG = "0.5.15.post1"
PIN_ROUTER = "0.3.2"
PIN_MEGATRON = "1dcf0dafa884ad52ffb243625717a3471643e087"
PIN_TE = "2.16.1"
PIN_FLASH_ATTN = "2.8.3"
PIN_NUMPY = "1.26.4"
PIN_SCIPY = "1.17.1"
PIN_TRANSFORMERS = "5.12.1"
MIN_DRIVER_CUDA = (12, 9)  # slimerl/slime:latest is CUDA 12.9 (cu129); latest-cu130 needs 13.0

SHM_WANTED = 16 * GIB  # --shm-size=16g
SHM_FLOOR = 1 * GIB
STACK_WANTED_KIB = 64 * 1024  # --ulimit stack=67108864: Docker takes bytes, so 64 MiB
NOFILE_WANTED = 65535  # SGLang raises its soft limit to this at start-up
RAM_FLOOR = 64 * GIB
DISK_FLOOR = 50 * GIB
DISK_FAIL = 5 * GIB
BYTES_PER_PARAM_CPU = 4  # CPU copies of the reference and actor weights, bf16 each
BYTES_PER_PARAM_CKPT = 14  # torch_dist checkpoint: bf16 weights + fp32 main params + Adam moments

RAY_PORTS = {6379: "Ray GCS (ray start --head)", 8265: "Ray dashboard (ray job submit)", 10001: "Ray client"}
ENGINE_PORTS = range(15000, 16000)  # slime allocates SGLang engine ports upward from 15000
LEFTOVER = re.compile(r"sglang::|sglang\.launch_server|sglang_router|\braylet\b|gcs_server|\bray::|default_worker\.py")


@dataclass
class Options:
    gpus: int | None = None
    ckpt_dir: str = "."
    model_params_b: float | None = None


class Machine:
    """The facts checks share, read once from the probe."""

    def __init__(self, probe: P.Probe, options: Options):
        self.probe = probe
        self.options = options

    @cached_property
    def env(self) -> dict[str, str] | None:
        return self.probe.environ()

    @cached_property
    def nvsmi(self) -> P.Output:
        return self.probe.run(P.NVSMI_XML)

    @cached_property
    def inventory(self) -> facts.GpuInventory | None:
        """GPUs from the XML query, topped up from the CSV query (compute capability) and the
        default table (CUDA version); whichever exists."""
        xml = facts.parse_nvsmi_xml(self.nvsmi.text) if self.nvsmi.ok else None
        csv_out = self.probe.run(P.NVSMI_CSV)
        csv = facts.parse_nvsmi_csv(csv_out.text) if csv_out.ok else None
        inventory = xml or csv
        table = None
        if inventory is None or inventory.cuda is None:
            table_out = self.probe.run(P.NVSMI)
            table = facts.parse_nvsmi_table(table_out.text) if table_out.ok else None
            inventory = inventory or table
        if inventory is None:
            return None
        if csv is not None and inventory is not csv:
            by_index = {g.index: g for g in csv.gpus}
            for gpu in inventory.gpus:
                if gpu.index in by_index and gpu.cc is None:
                    gpu.cc = by_index[gpu.index].cc
        if inventory.cuda is None and table is not None:
            inventory.cuda = table.cuda
        return inventory

    @cached_property
    def torch_build(self) -> tuple[str | None, str | None]:
        out = self.probe.run(P.TORCH_BUILD)
        if not out.ok:
            collect = self.probe.run(P.COLLECT_ENV)
            out = collect if collect.ok and "PyTorch version" in collect.text else out
        return facts.parse_torch_build(out.text) if out.ok else (None, None)

    @cached_property
    def packages(self) -> dict[str, str] | None:
        for name in (P.PACKAGES, P.PIP_LIST):
            out = self.probe.run(name)
            if out.ok:
                found = facts.parse_packages(out.text)
                if found:
                    return found
        collect = self.probe.run(P.COLLECT_ENV)
        return facts.parse_packages(collect.text) or None if collect.ok else None

    @cached_property
    def in_container(self) -> str | None | bool:
        """"docker", "podman", "kubernetes" or "container" when inside one, False on a bare host,
        None when nothing could be read."""
        known = False
        if self.probe.run(P.CONTAINERENV).ok:
            return "podman"
        env = self.env or {}
        if "KUBERNETES_SERVICE_HOST" in env:
            return "kubernetes"
        for name in (P.CGROUP_1, P.CGROUP_SELF):
            out = self.probe.read_file(name)
            known |= out.ok
            kind = facts.parse_cgroup_runtime(out.text) if out.ok else None
            if kind:
                return kind
        dockerenv = self.probe.run(P.DOCKERENV)
        if dockerenv.ok:
            return "docker"
        known |= not dockerenv.missing
        return False if known else None


Check = Callable[[Machine], "Finding | list[Finding]"]


# ---------------------------------------------------------------------------------------------
# gpu
# ---------------------------------------------------------------------------------------------


def gpu_driver(m: Machine) -> Finding:
    id_ = "gpu.driver"
    driver_file = m.probe.read_file(P.DRIVER_VERSION_FILE)
    loaded = facts.parse_driver_file(driver_file.text) if driver_file.ok else None
    out = m.nvsmi
    if m.inventory is None:
        if out.rc == 127 or (out.missing and m.probe.run(P.NVSMI).rc == 127):
            if loaded:
                return Finding(id_, Status.WARN, f"nvidia-smi is not installed; driver {loaded} is loaded "
                               f"({P.DRIVER_VERSION_FILE}). GPU checks are skipped.",
                               "Run the container with --gpus all (the NVIDIA container toolkit mounts nvidia-smi), "
                               "or install the driver utilities.", DOCKER_DOC)
            if driver_file.missing:
                return Finding(id_, Status.WARN, "nvidia-smi is not installed and the capture does not show "
                               "the driver; GPU checks are skipped.", "Run where nvidia-smi works.", HARDWARE_DOC)
            return Finding(id_, Status.FAIL, "No NVIDIA driver: nvidia-smi is not installed and "
                           f"{P.DRIVER_VERSION_FILE} does not exist. slime needs NVIDIA GPUs (H100/H200 have CI).",
                           "Run on a machine with NVIDIA GPUs and their driver; in Docker pass --gpus all.",
                           HARDWARE_DOC)
        if out.missing:
            return Finding(id_, Status.SKIP, out.reason(P.NVSMI_XML), "", HARDWARE_DOC)
        if "couldn't communicate with the NVIDIA driver" in out.text:
            return Finding(id_, Status.FAIL, "nvidia-smi cannot talk to the NVIDIA driver.",
                           "Load or reinstall the driver (a reboot after a driver update often does it); "
                           "in Docker pass --gpus all.", HARDWARE_DOC)
        first = next((line.strip() for line in out.text.splitlines() if line.strip()), "(no output)")
        return Finding(id_, Status.WARN, f"Could not read nvidia-smi's output (rc={out.rc}): {first[:120]}",
                       "Run `nvidia-smi -q -x` by hand and check the driver installation.", HARDWARE_DOC)
    inv = m.inventory
    cuda = version_tuple(inv.cuda)
    text = f"Driver {inv.driver or loaded or 'unknown'}, CUDA {inv.cuda or 'unknown'} (from {inv.source})."
    if not cuda:
        return Finding(id_, Status.WARN, text + " The driver's CUDA version is unknown.",
                       "Check `nvidia-smi` shows 'CUDA Version'.", HARDWARE_DOC)
    if cuda[0] < 12:
        return Finding(id_, Status.FAIL, text + " slime's images are built for CUDA 12.9 and 13.0.",
                       "Update the NVIDIA driver to r575 or newer (r580+ for the cu130 image).", HARDWARE_DOC)
    if cuda < MIN_DRIVER_CUDA:
        return Finding(id_, Status.WARN, text + " slimerl/slime:latest is built with CUDA 12.9; an older driver "
                       "runs it only through minor-version compatibility (no PTX JIT).",
                       "Update the NVIDIA driver to r575 or newer.", HARDWARE_DOC)
    return Finding(id_, Status.PASS, text)


def needs_gpus(check: Check) -> Check:
    """A check that reads the GPU inventory SKIPs when there is none (gpu.driver says why)."""
    id_ = check.__name__.replace("_", ".", 1)

    @functools.wraps(check)
    def wrapper(m: Machine):
        if m.inventory is None:
            return Finding(id_, Status.SKIP, "No GPU inventory (see gpu.driver).")
        if not m.inventory.gpus:
            return Finding(id_, Status.SKIP, "No GPUs listed.")
        return check(m)

    return wrapper


def gpu_count(m: Machine) -> Finding:
    id_ = "gpu.count"
    if m.inventory is None:
        if m.options.gpus:
            return Finding(id_, Status.FAIL, f"--gpus {m.options.gpus} expected, but no GPU could be listed.",
                           "Fix gpu.driver first.", HARDWARE_DOC)
        return Finding(id_, Status.SKIP, "No GPU inventory (see gpu.driver).")
    gpus = m.inventory.gpus
    names: dict[str, int] = {}
    for g in gpus:
        names[g.name] = names.get(g.name, 0) + 1
    listing = ", ".join(f"{n}x {name}" for name, n in names.items()) or "none"
    memory = {g.memory_mib for g in gpus if g.memory_mib}
    mem_text = f" ({', '.join(f'{mib / 1024:.1f} GiB' for mib in sorted(memory))} each)" if memory else ""
    text = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}: {listing}{mem_text}."
    if not gpus:
        return Finding(id_, Status.FAIL, "The driver lists no GPUs.", "Check `nvidia-smi -L`; in Docker pass --gpus "
                                                                      "all.",
                       HARDWARE_DOC)
    if m.options.gpus and len(gpus) < m.options.gpus:
        return Finding(id_, Status.FAIL, text + f" --gpus {m.options.gpus} expected.",
                       "Run on a machine with enough GPUs, or lower --actor-num-gpus-per-node / --rollout-num-gpus "
                       "(colocate needs actor GPUs; otherwise actor + rollout GPUs).", slime_doc(FAQ))
    if len(names) > 1:
        return Finding(id_, Status.WARN, text + " Mixed GPU models: the slowest sets the pace.",
                       "Use identical GPUs, or set CUDA_VISIBLE_DEVICES to one model.", HARDWARE_DOC)
    return Finding(id_, Status.PASS, text)


@needs_gpus
def gpu_memory(m: Machine) -> Finding:
    id_ = "gpu.memory"
    busy = [g for g in m.inventory.gpus if (g.used_mib or 0) > 1024 or g.processes]
    if any(g.used_mib is None for g in m.inventory.gpus) and not busy:
        return Finding(id_, Status.SKIP, "GPU memory use was not reported.")
    if busy:
        listing = "; ".join(
            f"GPU {g.index}: {g.used_mib} MiB used" + (f" by {', '.join(g.processes[:3])}" if g.processes else "")
            for g in busy
        )
        return Finding(id_, Status.WARN, f"GPU memory is already in use ({listing}).",
                       "Find the owner with `nvidia-smi` and stop it yourself if it is a leftover engine or trainer; "
                       "--sglang-mem-fraction-static is a fraction of the whole GPU.", slime_doc(FAQ))
    return Finding(id_, Status.PASS, "No GPU memory in use by other processes.")


def _cc(m: Machine) -> tuple[list[str], str]:
    """Compute capabilities, and where they came from."""
    gpus = m.inventory.gpus
    if all(g.cc for g in gpus):
        return [g.cc for g in gpus], "nvidia-smi"
    out = m.probe.run(P.TORCH_CUDA_PROPS)
    props = facts.parse_torch_props(out.text) if out.ok else None
    if props and len(props[0]) == len(gpus):
        try:
            return [f"{d['cc'][0]}.{d['cc'][1]}" for d in props[0]], "torch"
        except (KeyError, IndexError, TypeError):
            pass
    by_name = [facts.cc_from_name(g.name) for g in gpus]
    if all(by_name):
        return by_name, "the product name"
    return [], ""


@needs_gpus
def gpu_compute_capability(m: Machine) -> Finding:
    id_ = "gpu.compute_capability"
    ccs, source = _cc(m)
    if not ccs:
        return Finding(id_, Status.SKIP, "Compute capability not reported and not known for "
                       f"{m.inventory.gpus[0].name}.")
    lowest = min(ccs, key=version_tuple)
    text = f"Compute capability {', '.join(sorted(set(ccs), key=version_tuple))} (from {source})"
    cc = version_tuple(lowest)
    if cc < (8, 0):
        return Finding(id_, Status.FAIL, text + ": below 8.0, so no bf16, which slime trains in.",
                       "Use Ampere (8.0) or newer; H100/H200 are what slime tests on.", HARDWARE_DOC)
    if cc < (8, 9):
        return Finding(id_, Status.PASS, text + ": bf16 yes; no FP8 tensor cores below 8.9 (SGLang runs FP8 weights "
                       "by Marlin weight-only emulation); DeepGEMM's block FP8 needs 9.0 or newer.")
    if cc < (9, 0):
        return Finding(id_, Status.PASS, text + ": bf16 and FP8 (Ada); DeepGEMM's block FP8 needs 9.0 or newer.")
    if cc >= (10, 0):
        return Finding(id_, Status.PASS, text + ": bf16 and FP8. Blackwell has no CI in slime; the "
                       "latest-cu130 image tag is built for it.")
    return Finding(id_, Status.PASS, text + ": bf16 and FP8.")


@needs_gpus
def gpu_mig(m: Machine) -> Finding:
    id_ = "gpu.mig"
    modes = {g.index: g.mig for g in m.inventory.gpus}
    if all(v is None for v in modes.values()):
        return Finding(id_, Status.SKIP, "MIG mode not reported.")
    enabled = [i for i, v in modes.items() if v and v.lower() == "enabled"]
    if enabled:
        return Finding(id_, Status.FAIL, f"MIG is enabled on GPU {', '.join(map(str, enabled))}. slime places whole "
                       "GPUs and syncs weights with NCCL and CUDA IPC, which MIG slices do not support.",
                       "Disable MIG: `sudo nvidia-smi -i N -mig 0` and reset the GPU.", HARDWARE_DOC)
    return Finding(id_, Status.PASS, "MIG is off (or not supported).")


@needs_gpus
def gpu_ecc(m: Machine) -> Finding:
    id_ = "gpu.ecc"
    gpus = m.inventory.gpus
    bad = [g for g in gpus if (g.ecc_uncorrectable or 0) > 0 or g.row_remap_pending]
    if bad:
        return Finding(id_, Status.WARN, "Uncorrectable ECC errors or pending row remaps on GPU "
                       f"{', '.join(str(g.index) for g in bad)}: results on it can be wrong.",
                       "Reset the GPU (`nvidia-smi -r` when idle) or have it serviced; avoid it with "
                       "CUDA_VISIBLE_DEVICES.",
                       FAQ_DOC)
    modes = {(g.ecc or "").lower() for g in gpus}
    if modes <= {"", "n/a", "[n/a]"}:
        return Finding(id_, Status.PASS, "ECC not supported or not reported (consumer GPU).")
    if "disabled" in modes:
        return Finding(id_, Status.WARN, "ECC is disabled: GPU memory errors go undetected.",
                       "Enable it: `sudo nvidia-smi -e 1` and reboot.", HARDWARE_DOC)
    return Finding(id_, Status.PASS, "ECC is enabled, no uncorrectable errors.")


@needs_gpus
def gpu_topology(m: Machine) -> Finding:
    id_ = "gpu.topology"
    n = len(m.inventory.gpus)
    if n == 1:
        return Finding(id_, Status.PASS, "Single GPU: no GPU-to-GPU links involved.")
    out = m.probe.run(P.NVSMI_TOPO)
    if not out.ok:
        return Finding(id_, Status.SKIP, out.reason(P.NVSMI_TOPO))
    links = facts.parse_topology(out.text)
    if links is None:
        return Finding(id_, Status.WARN, "Could not read `nvidia-smi topo -m`.", "Run it by hand.", HARDWARE_DOC)
    pairs = {(i, j): v for (i, j), v in links.items() if i != j}
    slow = sorted({v for v in pairs.values() if not v.startswith("NV")})
    nv = sorted({v for v in pairs.values() if v.startswith("NV")})
    if pairs and not slow:
        return Finding(id_, Status.PASS, f"NVLink between all {n} GPUs ({', '.join(nv)}); slime's scripts then set "
                       "NCCL_NVLS_ENABLE=1.")
    text = f"Some GPU pairs connect only over PCIe or the CPU ({', '.join(slow)})"
    return Finding(id_, Status.WARN, text + ": tensor-parallel and weight-sync traffic crosses PCIe.",
                   "Keep tensor parallel groups inside NVLink islands; expect slower weight sync.", HARDWARE_DOC)


def gpu_torch_cuda(m: Machine) -> Finding:
    id_ = "gpu.torch_cuda"
    version, cuda = m.torch_build
    if version is None:
        return Finding(id_, Status.SKIP, "torch not found (see packages.torch).")
    if m.inventory is None or not m.inventory.gpus:
        build = f"CUDA {cuda}" if cuda else "CPU-only"
        return Finding(id_, Status.SKIP, f"No GPUs to check torch {version} ({build} build) against.")
    n = len(m.inventory.gpus)
    if cuda is None:
        return Finding(id_, Status.FAIL, f"torch {version} is a CPU-only build on a machine with {n} GPUs.",
                       f"Install a CUDA build (slime's image: torch {PIN_TORCH}+cu129).", IMAGE_DOC)
    driver = version_tuple(m.inventory.cuda)
    build = version_tuple(cuda)
    text = f"torch {version} is built for CUDA {cuda}; the driver supports CUDA {m.inventory.cuda or 'unknown'}"
    if driver and build[:1] > driver[:1]:
        return Finding(id_, Status.FAIL, text + ": torch cannot start CUDA with this driver.",
                       "Update the driver, or install a torch build for the driver's CUDA major version.", HARDWARE_DOC)
    props_out = m.probe.run(P.TORCH_CUDA_PROPS)
    props = facts.parse_torch_props(props_out.text) if props_out.ok else None
    if props is None:
        why = props_out.reason(P.TORCH_CUDA_PROPS) if not props_out.ok else "its output could not be read"
        return Finding(id_, Status.WARN, text + f". Whether torch sees the GPUs is unknown: {why}.",
                       "Run `python -c 'import torch; print(torch.cuda.device_count())'`.", HARDWARE_DOC)
    seen = len(props[0])
    visible = (m.env or {}).get("CUDA_VISIBLE_DEVICES")
    note = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    if seen == 0:
        return Finding(id_, Status.FAIL, text + f"; torch sees none of the {n} GPUs{note}.",
                       "Check CUDA_VISIBLE_DEVICES and that torch's CUDA matches the driver.", HARDWARE_DOC)
    if driver and build > driver:
        return Finding(id_, Status.WARN, text + f"; torch sees {seen}/{n} GPUs but runs on minor-version "
                       "compatibility (no PTX JIT for newer kernels).", "Update the driver.", HARDWARE_DOC)
    if seen < n:
        return Finding(id_, Status.WARN, text + f"; torch sees {seen} of {n} GPUs{note}.",
                       "Unset or widen CUDA_VISIBLE_DEVICES if slime should use them all.", HARDWARE_DOC)
    return Finding(id_, Status.PASS, text + f"; torch sees {seen}/{n} GPUs.")


# ---------------------------------------------------------------------------------------------
# container
# ---------------------------------------------------------------------------------------------


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
# packages
# ---------------------------------------------------------------------------------------------


def _pkg(m: Machine, *names: str) -> tuple[str, str] | None:
    """(name, version) of the first of ``names`` installed."""
    for name in names:
        if m.packages and facts.normalise(name) in m.packages:
            return name, m.packages[facts.normalise(name)]
    return None


def _no_packages(id_: str) -> Finding:
    return Finding(id_, Status.SKIP, "The installed Python packages could not be listed.")


def packages_python(m: Machine) -> Finding:
    id_ = "packages.python"
    out = m.probe.run(P.PYTHON)
    version = facts.parse_python_version(out.text) if out.ok else None
    if version is None:
        collect = m.probe.run(P.COLLECT_ENV)
        version = facts.parse_python_version(collect.text) if collect.ok else None
    if version is None:
        return Finding(id_, Status.SKIP, "The Python version could not be read.")
    v = version_tuple(version)
    if v < (3, 10):
        return Finding(id_, Status.FAIL, f"Python {version}: slime needs 3.10 or newer.",
                       f"Use Python {PIN_PYTHON} (slime's image and build_conda.sh).", CONDA_DOC)
    if v[:2] > (3, 12):
        return Finding(id_, Status.WARN, f"Python {version}: slime v0.3.1 is tested on 3.10-3.12 (its image uses "
                                         f"3.12).",
                       f"Use Python {PIN_PYTHON}.", CONDA_DOC)
    return Finding(id_, Status.PASS, f"Python {version} (slime's image: {PIN_PYTHON}).")


def packages_torch(m: Machine) -> Finding:
    id_ = "packages.torch"
    version, cuda = m.torch_build
    if version is None and m.packages is None:
        return _no_packages(id_)
    if version is None:
        found = _pkg(m, "torch")
        version = found[1] if found else None
    if version is None:
        return Finding(id_, Status.FAIL, "torch is not installed.", f"Use slime's image (torch {PIN_TORCH}+cu129).",
                       IMAGE_DOC)
    if cuda:
        build = f"CUDA {cuda}"
    else:  # our own section states a CPU build outright; a pip list cannot tell
        build = "CPU-only" if "+cpu" in version or m.probe.run(P.TORCH_BUILD).ok else "CUDA unknown"
    text = f"torch {version} ({build} build); slime v0.3.1 pins {PIN_TORCH} (cu129, or cu130 for Blackwell)"
    if version_tuple(version)[:2] != version_tuple(PIN_TORCH)[:2]:
        return Finding(id_, Status.WARN, text + ".", f"Install torch {PIN_TORCH} as slime's image does.", CONDA_DOC)
    if build == "CPU-only":
        return Finding(
            id_, Status.WARN, text + ": slime needs a CUDA build.", f"Install torch {PIN_TORCH}+cu129.", CONDA_DOC
        )
    return Finding(id_, Status.PASS, text + ".")


def packages_megatron(m: Machine) -> Finding:
    id_ = "packages.megatron"
    pin = f"slime v0.3.1 pins Megatron-LM {PIN_MEGATRON[:7]} with docker/patch/v0.5.15.post1/megatron.patch"
    fix_install = (f"git clone https://github.com/NVIDIA/Megatron-LM && git checkout {PIN_MEGATRON[:7]}, apply slime's "
                   "megatron.patch, `pip install -e .`, and put it on PYTHONPATH as slime's scripts do.")
    out = m.probe.run(P.MEGATRON)
    if out.ok:
        info = facts.parse_megatron(out.text)
        version = info.get("version")
        if info.get("megatron.training") == "present":
            commit = info.get("commit")
            text = f"Megatron-LM at {info.get('megatron', '?')}" + (f", megatron-core {version}" if version else "")
            if commit and not PIN_MEGATRON.startswith(commit[:7]):
                return Finding(id_, Status.WARN, f"{text}, commit {commit[:7]}; {pin}.", fix_install, IMAGE_DOC)
            return Finding(id_, Status.PASS, f"{text}" + (f", commit {commit[:7]}" if commit else "") + ".")
        checkout = info.get("checkout")
        if checkout:
            return Finding(
                id_,
                Status.WARN,
                f"megatron.training is not importable from this Python, but a Megatron-LM "
                f"checkout exists at {checkout}.",
                "slime's scripts add it with PYTHONPATH=/root/Megatron-LM "
                "in the Ray runtime env; make sure yours does.",
                IMAGE_DOC,
            )
        if info.get("megatron.core") == "present":
            return Finding(
                id_,
                Status.FAIL,
                "Only the megatron-core wheel is installed: slime imports megatron.training, "
                "which lives in a Megatron-LM checkout.",
                fix_install,
                IMAGE_DOC,
            )
        return Finding(id_, Status.FAIL, f"Megatron-LM is not installed; {pin}.", fix_install, IMAGE_DOC)
    if m.packages is None:
        return _no_packages(id_)
    found = _pkg(m, "megatron-core")
    pythonpath = (m.env or {}).get("PYTHONPATH", "")
    if "megatron" in pythonpath.lower():
        return Finding(id_, Status.WARN, f"PYTHONPATH names Megatron ({pythonpath}); the capture cannot tell its "
                                         f"commit.",
                       "Capture with `slime-check capture` to include the Megatron checkout.", IMAGE_DOC)
    if found:
        return Finding(id_, Status.WARN, f"megatron-core {found[1]} is installed; whether a Megatron-LM checkout "
                       "(megatron.training) is importable is unknown.", fix_install, IMAGE_DOC)
    return Finding(id_, Status.FAIL, f"Megatron-LM is not installed (not in the package list, not on PYTHONPATH); "
                                     f"{pin}.",
                   fix_install, IMAGE_DOC)


def _pinned(m: Machine, id_: str, names: tuple[str, ...], pin: str, what: str, missing: Status,
            missing_fix: str, same=lambda v, pin: v == pin) -> Finding:
    """A package against its pin: missing gives ``missing``; another version WARNs."""
    if m.packages is None:
        return _no_packages(id_)
    found = _pkg(m, *names)
    if found is None:
        return Finding(id_, missing, f"{names[0]} is not installed: {what}.", missing_fix, IMAGE_DOC)
    name, version = found
    if not same(version, pin):
        return Finding(id_, Status.WARN, f"{name} {version}; slime v0.3.1's image has {pin}.",
                       f"Install {names[0]}=={pin}.", IMAGE_DOC)
    return Finding(id_, Status.PASS, f"{name} {version} (pinned {pin}).")


def packages_sglang(m: Machine) -> Finding:
    return _pinned(m, "packages.sglang", ("sglang",), PIN_SGLANG, "slime's rollout engines are SGLang servers",
                   Status.FAIL, f"Use slime's image (SGLang {PIN_SGLANG} with slime's patches).")


def packages_sglang_router(m: Machine) -> Finding:
    id_ = "packages.sglang_router"
    found = _pinned(m, id_, ("sglang-router",), PIN_ROUTER, "slime starts its engines behind sglang-router",
                    Status.FAIL, f"pip install sglang-router=={PIN_ROUTER} (slime's image installs its own build).",
                    same=lambda v, pin: version_tuple(v) >= (0, 3, 0))
    if found.status is not Status.PASS:
        return found
    module = m.probe.run(P.MODULE_VERSIONS)
    versions = facts.parse_megatron(module.text) if module.ok else {}
    router_version = versions.get("sglang_router")
    if router_version and "slime" not in router_version:
        return Finding(
            id_,
            Status.WARN,
            f"sglang_router.__version__ is {router_version}, not slime's build "
            "(slime's Dockerfile asserts 'slime' in it).",
            "Install the sglang_router 0.3.2 wheel slime's Dockerfile names (zhuzilin/sgl-router).",
            IMAGE_DOC,
        )
    return found


def packages_ray(m: Machine) -> Finding:
    if m.packages is None:
        return _no_packages("packages.ray")
    found = _pkg(m, "ray")
    if found is None:
        return Finding("packages.ray", Status.FAIL, "ray is not installed: slime places every engine and trainer with "
                                                    "Ray.",
                       "pip install 'ray[default]' (slime's requirements.txt).", IMAGE_DOC)
    return Finding("packages.ray", Status.PASS, f"ray {found[1]} (slime does not pin it).")


def packages_transformer_engine(m: Machine) -> Finding:
    return _pinned(m, "packages.transformer_engine", ("transformer-engine", "transformer-engine-torch",
                   "transformer-engine-cu12", "transformer-engine-cu13"), PIN_TE,
                   "Megatron's default --transformer-impl is transformer_engine, and slime v0.3.1's Qwen, Llama and "
                   "GLM-4 weight converters know only its layer names (--transformer-impl local does not load them)",
                   Status.FAIL, f"pip install --no-build-isolation 'transformer_engine[pytorch]=={PIN_TE}'",
                   same=lambda v, pin: version_tuple(v)[:2] == version_tuple(pin)[:2])


def packages_flash_attn(m: Machine) -> Finding:
    return _pinned(m, "packages.flash_attn", ("flash-attn",), PIN_FLASH_ATTN,
                   "slime's scripts pass --attention-backend flash", Status.WARN,
                   f"pip install flash-attn=={PIN_FLASH_ATTN} --no-build-isolation",
                   same=lambda v, pin: (2, 7, 4) <= version_tuple(v) <= (2, 8, 3))


def packages_numpy(m: Machine) -> Finding:
    return _pinned(
        m,
        "packages.numpy",
        ("numpy",),
        PIN_NUMPY,
        "Megatron and SGLang need it",
        Status.FAIL,
        f"pip install numpy=={PIN_NUMPY} scipy=={PIN_SCIPY}",
        same=lambda v, pin: version_tuple(v)[:1] == (1,),
    )


def packages_transformers(m: Machine) -> Finding:
    return _pinned(m, "packages.transformers", ("transformers",), PIN_TRANSFORMERS,
                   "slime reads HF configs and tokenizers with it", Status.FAIL,
                   f"pip install transformers=={PIN_TRANSFORMERS}")


def packages_known_bad(m: Machine) -> Finding:
    """Combinations slime's build files call out, or that sglang 0.5.15.post1's pins forbid."""
    id_ = "packages.known_bad"
    if m.packages is None:
        return _no_packages(id_)
    get = {name: _pkg(m, name) for name in ("numpy", "scipy", "sglang", "torch", "kernels", "flash-attn-4",
                                            "transformers", "megatron-core")}
    ver = {k: version_tuple(v[1]) if v else None for k, v in get.items()}
    megatron = m.probe.run(P.MEGATRON)
    has_megatron = bool(get["megatron-core"]) or (megatron.ok and "megatron.core=present" in megatron.text)
    problems = []
    if ver["numpy"] and ver["numpy"][0] >= 2 and has_megatron:
        # slime's own start-up check, not Megatron's: Megatron-LM 1dcf0da's pyproject asks only for "numpy"
        problems.append(f"numpy {get['numpy'][1]}: slime stops at start-up on NumPy 2 (its Megatron set-up, "
                        "slime/backends/megatron_utils/initialize.py, asserts \"Megatron does not support numpy "
                        "2.x\"), though megatron-core itself installs and runs with it (slime-ref trains on it); "
                        f"pin numpy=={PIN_NUMPY}")
    if ver["scipy"] and ver["numpy"] and ver["scipy"] >= (1, 18) and ver["numpy"][0] < 2:
        problems.append(f"scipy {get['scipy'][1]} with numpy {get['numpy'][1]}: SciPy 1.18+ needs NumPy 2 (pin "
                        f"scipy=={PIN_SCIPY})")
    if (
        get["sglang"]
        and ver["torch"]
        and ver["torch"][:2] != version_tuple(PIN_TORCH)[:2]
        and get["sglang"][1] == PIN_SGLANG
    ):
        problems.append(f"torch {get['torch'][1]} with sglang {PIN_SGLANG}, which requires torch=={PIN_TORCH}")
    if get["sglang"] and ver["kernels"] and ver["kernels"] >= (0, 15):
        problems.append(f"kernels {get['kernels'][1]}: 0.15+ breaks `import sglang` (pin kernels<0.15)")
    if get["flash-attn-4"]:
        problems.append(f"flash-attn-4 {get['flash-attn-4'][1]} is installed: slime's image removes it so TE 2.16 "
                        f"picks FA2/FA3")
    if (
        get["sglang"]
        and get["transformers"]
        and get["sglang"][1] == PIN_SGLANG
        and get["transformers"][1] != PIN_TRANSFORMERS
    ):
        problems.append(f"transformers {get['transformers'][1]} with sglang {PIN_SGLANG}, which requires "
                        f"{PIN_TRANSFORMERS}")
    if problems:
        return Finding(id_, Status.FAIL, "; ".join(problems) + ".",
                       "Use slime's image, or match its pins (docker/Dockerfile, build_conda.sh).", CONDA_DOC)
    return Finding(id_, Status.PASS, "None of the known-bad combinations.")


# ---------------------------------------------------------------------------------------------
# system
# ---------------------------------------------------------------------------------------------


def system_ram(m: Machine) -> Finding:
    id_ = "system.ram"
    out = m.probe.read_file(P.MEMINFO)
    mem = facts.parse_meminfo(out.text) if out.ok else {}
    total, available = mem.get("MemTotal"), mem.get("MemAvailable", mem.get("MemFree"))
    if not total:
        return Finding(id_, Status.SKIP, "/proc/meminfo could not be read.")
    text = f"{total / GIB:.0f} GiB RAM, {(available or 0) / GIB:.0f} GiB available"
    why = "slime keeps CPU copies of the reference and actor weights (about 4 bytes per parameter per node)"
    params = m.options.model_params_b
    if params:
        need = params * 1e9 * BYTES_PER_PARAM_CPU
        if total < need:
            return Finding(id_, Status.FAIL, f"{text}; a {params:g}B model needs about {need / GIB:.0f} GiB: {why}.",
                           "Use a machine with more RAM, more nodes, or a smaller model.", FAQ_DOC)
        if available is not None and available < need:
            return Finding(id_, Status.WARN, f"{text}; a {params:g}B model needs about {need / GIB:.0f} GiB free.",
                           "Free memory (other jobs, page cache pinned by tmpfs) before the run.", FAQ_DOC)
        return Finding(id_, Status.PASS, f"{text}; enough for a {params:g}B model's CPU weight copies.")
    if total < RAM_FLOOR:
        return Finding(id_, Status.WARN, f"{text}: small for slime ({why}; Ray's object store takes 30% more).",
                       "Pass --model-params B for an exact estimate, or use a larger machine.", FAQ_DOC)
    return Finding(id_, Status.PASS, f"{text} ({why}; pass --model-params B to check a model).")


def system_disk(m: Machine) -> Finding:
    id_ = "system.disk"
    path = m.options.ckpt_dir
    out = m.probe.run(P.DF_PREFIX + path)
    where = path
    if not out.ok:
        out, where = m.probe.run(P.DF_ROOT), "/"
    sized = facts.parse_df(out.text) if out.ok else None
    if sized is None:
        return Finding(id_, Status.SKIP, f"Free disk at {path} could not be read.")
    free = sized[1]
    text = f"{free / GIB:.0f} GiB free at {where}" + ("" if where == path else f" (the capture has no data for {path})")
    params = m.options.model_params_b
    fix = "Point --save at a larger filesystem (--ckpt-dir here), or keep fewer checkpoints."
    if params:
        need = params * 1e9 * BYTES_PER_PARAM_CKPT
        if free < need:
            return Finding(id_, Status.FAIL, f"{text}; one {params:g}B checkpoint with optimizer state takes about "
                           f"{need / GIB:.0f} GiB.", fix, FAQ_DOC)
        return Finding(id_, Status.PASS, f"{text}; room for a {params:g}B checkpoint ({need / GIB:.0f} GiB).")
    if free < DISK_FAIL:
        return Finding(id_, Status.FAIL, text + ": too little for any checkpoint.", fix, FAQ_DOC)
    if free < DISK_FLOOR:
        return Finding(id_, Status.WARN, text + ": checkpoints with optimizer state take about 14 bytes per parameter.",
                       fix, FAQ_DOC)
    return Finding(id_, Status.PASS, text + ".")


def _listening(m: Machine) -> set[int] | None:
    ss = m.probe.run(P.SS)
    ports = facts.parse_ss_listening(ss.text) if ss.ok else None
    if ports is not None:
        return ports
    found = None
    for name in (P.PROC_NET_TCP, P.PROC_NET_TCP6):
        out = m.probe.read_file(name)
        parsed = facts.parse_proc_net_tcp(out.text) if out.ok else None
        if parsed is not None:
            found = (found or set()) | parsed
    return found


def system_ports(m: Machine) -> Finding:
    id_ = "system.ports"
    ports = _listening(m)
    if ports is None:
        return Finding(id_, Status.SKIP, "Listening ports could not be read (no `ss -ltn`, no /proc/net/tcp).")
    taken = [f"{port} ({what})" for port, what in RAY_PORTS.items() if port in ports]
    engines = sorted(p for p in ports if p in ENGINE_PORTS)
    engine_note = (
        f" {len(engines)} port(s) in 15000-15999 are taken; slime picks engine ports there, skipping busy ones."
        if engines
        else ""
    )
    if taken:
        return Finding(id_, Status.WARN, f"In use: {', '.join(taken)}. A Ray head is probably running already; "
                       f"`ray start --head` in slime's scripts will fail or join it.{engine_note}",
                       "Check with `ray status`; stop it yourself (`ray stop`) if it is a leftover.", FAQ_DOC)
    return Finding(id_, Status.PASS, f"Ray's ports {', '.join(map(str, RAY_PORTS))} are free.{engine_note}")


def system_leftover_processes(m: Machine) -> Finding:
    id_ = "system.leftover_processes"
    out = m.probe.run(P.PROCESSES)
    procs = facts.parse_processes(out.text) if out.ok else None
    if procs is None:
        return Finding(id_, Status.SKIP, out.reason(P.PROCESSES) if not out.ok else "The process list could not be "
                                                                                    "read.")
    left = [(pid, args) for pid, args in procs if LEFTOVER.search(args)]
    if left:
        shown = "; ".join(f"{pid} {args[:60]}" for pid, args in left[:5])
        more = f" and {len(left) - 5} more" if len(left) > 5 else ""
        return Finding(
            id_,
            Status.WARN,
            f"{len(left)} SGLang/Ray process(es) still running: {shown}{more}. "
            "slime-check reports them and never stops them.",
            "If they are leftovers of an earlier run, stop them yourself: `ray stop`, then `kill PID`.",
            FAQ_DOC,
        )
    return Finding(id_, Status.PASS, "No SGLang or Ray processes running.")


def system_host_ip(m: Machine) -> Finding:
    id_ = "system.host_ip"
    env = m.env or {}
    chosen = env.get("SLIME_HOST_IP")
    if chosen:
        try:
            ipaddress.ip_address(chosen.strip("[]"))
        except ValueError:
            return Finding(
                id_,
                Status.FAIL,
                f"SLIME_HOST_IP={chosen} is not an IP address; slime advertises it to "
                "the other nodes as this node's address.",
                "Set SLIME_HOST_IP to this node's IP.",
                MULTINODE_DOC,
            )
        return Finding(id_, Status.PASS, f"SLIME_HOST_IP={chosen}: slime advertises it as this node's address.")
    out = m.probe.run(P.HOST_ADDRESS)
    if not out.ok:
        return Finding(id_, Status.SKIP, out.reason(P.HOST_ADDRESS))
    info = facts.parse_megatron(out.text)
    addresses = [a for a in (info.get("route"), *(info.get("resolved", "").split(","))) if a and a not in ("none",)]
    usable = [a for a in addresses if re.fullmatch(r"[\d.]+", a) and not a.startswith("127.")]
    host = info.get("hostname", "?")
    if usable:
        return Finding(id_, Status.PASS, f"Host {host}: slime will advertise {usable[0]} (set SLIME_HOST_IP to "
                                         f"override).")
    return Finding(
        id_,
        Status.WARN,
        f"Host {host} has no non-loopback address slime can find, so it falls back to "
        "127.0.0.1: fine on one node, wrong for multi-node.",
        "For multi-node runs set SLIME_HOST_IP (and GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME).",
        MULTINODE_DOC,
    )


CHECKS: dict[str, list[Check]] = {
    "gpu": [gpu_driver, gpu_count, gpu_memory, gpu_compute_capability, gpu_mig, gpu_ecc, gpu_topology, gpu_torch_cuda],
    "container": [
        container_runtime,
        container_shm,
        container_ipc,
        container_memlock,
        container_stack,
        container_nofile,
    ],
    "packages": [
        packages_python,
        packages_torch,
        packages_megatron,
        packages_sglang,
        packages_sglang_router,
        packages_ray,
        packages_transformer_engine,
        packages_flash_attn,
        packages_numpy,
        packages_transformers,
        packages_known_bad,
    ],
    "system": [system_ram, system_disk, system_ports, system_leftover_processes, system_host_ip],
}


def run_prereqs(probe: P.Probe, options: Options | None = None, only: list[str] | None = None) -> list[Finding]:
    machine = Machine(probe, options or Options())
    findings: list[Finding] = []
    for group in GROUPS:
        if only and group not in only:
            continue
        for check in CHECKS[group]:
            result = check(machine)
            findings.extend(result if isinstance(result, list) else [result])
    return findings
