"""``slime-check prereqs`` gpu checks: driver, count, memory, compute capability, MIG, ECC,
topology, and whether torch's CUDA build runs on this driver.

A check that needs the GPU inventory SKIPs when ``nvidia-smi`` listed none (``gpu.driver`` says why).
"""

from __future__ import annotations

import functools

from slime_check import facts
from slime_check import probes as P
from slime_check.facts import version_tuple
from slime_check.findings import FAQ, Finding, Status, slime_doc
from slime_check.prereqs_machine import (
    DOCKER_DOC,
    FAQ_DOC,
    HARDWARE_DOC,
    IMAGE_DOC,
    PIN_TORCH,
    Check,
    Machine,
)

MIN_DRIVER_CUDA = (12, 9)  # slimerl/slime:latest is CUDA 12.9 (cu129); latest-cu130 needs 13.0


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
