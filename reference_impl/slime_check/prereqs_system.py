"""``slime-check prereqs`` system checks: host RAM, disk for checkpoints, the ports Ray and SGLang
take, processes left over from an earlier run, and the address other nodes reach this one on.
"""

from __future__ import annotations

import ipaddress
import re

from slime_check import facts
from slime_check import probes as P
from slime_check.facts import GIB
from slime_check.findings import Finding, Status
from slime_check.prereqs_machine import (
    FAQ_DOC,
    MULTINODE_DOC,
    Machine,
)

RAM_FLOOR = 64 * GIB
DISK_FLOOR = 50 * GIB
DISK_FAIL = 5 * GIB
BYTES_PER_PARAM_CPU = 4  # CPU copies of the reference and actor weights, bf16 each
BYTES_PER_PARAM_CKPT = 14  # torch_dist checkpoint: bf16 weights + fp32 main params + Adam moments
RAY_PORTS = {6379: "Ray GCS (ray start --head)", 8265: "Ray dashboard (ray job submit)", 10001: "Ray client"}
ENGINE_PORTS = range(15000, 16000)  # slime allocates SGLang engine ports upward from 15000
LEFTOVER = re.compile(r"sglang::|sglang\.launch_server|sglang_router|\braylet\b|gcs_server|\bray::|default_worker\.py")


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
