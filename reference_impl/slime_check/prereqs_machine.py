"""What every ``slime-check prereqs`` check shares: the machine's facts, slime's pins and doc links.

:class:`Machine` reads each fact from the probe once (the GPU inventory from ``nvidia-smi``'s XML,
CSV or table, the torch build, the installed packages, whether this is a container) and caches it
for the checks in :mod:`slime_check.prereqs_gpu`, :mod:`slime_check.prereqs_container`,
:mod:`slime_check.prereqs_packages` and :mod:`slime_check.prereqs_system`. The ``PIN_*`` versions
are what slime v0.3.1 builds its image with; checks compare the machine against them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from slime_check import facts
from slime_check import probes as P
from slime_check.findings import DOCKERFILE, FAQ, QUICK_START, Finding, slime_doc

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
