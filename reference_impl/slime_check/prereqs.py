"""``slime-check prereqs``: is this machine (or a captured one) ready for slime v0.3.1?

Four groups of checks: gpu, container, packages, system. Each check asks the probe, parses what it
got with :mod:`slime_check.facts` and returns findings. A probe that fails or a capture that lacks
a section gives SKIP or WARN with the reason; no check raises on odd input.
"""

from __future__ import annotations

from slime_check import probes as P
from slime_check.findings import Finding
from slime_check.prereqs_container import (
    container_ipc,
    container_memlock,
    container_nofile,
    container_runtime,
    container_shm,
    container_stack,
)
from slime_check.prereqs_gpu import (
    gpu_compute_capability,
    gpu_count,
    gpu_driver,
    gpu_ecc,
    gpu_memory,
    gpu_mig,
    gpu_topology,
    gpu_torch_cuda,
)
from slime_check.prereqs_machine import Check, Machine, Options
from slime_check.prereqs_packages import (
    packages_flash_attn,
    packages_known_bad,
    packages_megatron,
    packages_numpy,
    packages_python,
    packages_ray,
    packages_sglang,
    packages_sglang_router,
    packages_torch,
    packages_transformer_engine,
    packages_transformers,
)
from slime_check.prereqs_system import (
    system_disk,
    system_host_ip,
    system_leftover_processes,
    system_ports,
    system_ram,
)

GROUPS = ("gpu", "container", "packages", "system")


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
