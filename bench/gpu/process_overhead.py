"""What one GPU process holds outside torch's allocator, step by step, as NVML reads it for the process:
the CUDA context, a cuBLAS matmul's workspace, a Triton-free SDPA call, and the NCCL communicators that
Megatron's groups open on their first collective (slime opens them even on one GPU and, colocated,
destroys and makes them again around every sleep). Prints JSON; one process a run.

    python3 bench/gpu/process_overhead.py [--groups 3]
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "reference_impl"))

from slime_rehearse.gpu_memory import Nvml  # noqa: E402

GIB = 1 << 30


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=3, help="process groups beside WORLD, each with one collective")
    a = p.parse_args()
    import torch
    import torch.distributed as dist

    nvml = Nvml.open()
    if nvml is None or not torch.cuda.is_available():
        p.exit(2, "process_overhead.py: needs a CUDA GPU and NVML (run it on the GPU machine)\n")
    me = os.getpid()
    steps = []

    def read(what: str) -> None:
        torch.cuda.synchronize()
        time.sleep(0.2)  # NVML's per-process figure follows the driver's bookkeeping
        used = (nvml.processes() or [{}])[0].get(me, 0)
        steps.append({"after": what, "process_gib": round(used / GIB, 4),
                      "torch_reserved_gib": round(torch.cuda.memory_reserved() / GIB, 4)})

    torch.cuda.set_device(0)
    x = torch.ones(1024, device="cuda")
    read("CUDA context and a 4 KiB tensor")
    a16 = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a16 @ a16).sum().item()
    read("a bf16 matmul (cuBLAS handle and workspace)")
    q = torch.randn(1, 16, 1024, 128, device="cuda", dtype=torch.bfloat16)
    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().item()
    read("scaled_dot_product_attention")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    read("init_process_group (nccl, world size 1)")
    dist.all_reduce(x)
    read("the first all_reduce on WORLD")
    groups = []
    for i in range(a.groups):
        groups.append(dist.new_group([0]))
        dist.all_reduce(x, group=groups[-1])
        read(f"group {i + 1}: new_group and its first all_reduce")
    for g in groups:
        dist.destroy_process_group(g)
    read("the groups destroyed")
    dist.destroy_process_group()
    read("WORLD destroyed")
    torch.cuda.empty_cache()
    read("empty_cache")
    print(json.dumps({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                      "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                      "env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}, "steps": steps}, indent=1))


if __name__ == "__main__":
    main()
