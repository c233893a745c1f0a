"""Process-group setup for the Megatron backend: torch.distributed, parallel_state and seeds.

One code path: NCCL when CUDA is available, gloo otherwise (with :mod:`cpu_compat` applied).
Ranks are laid out by megatron's ``parallel_state``: tensor-parallel ranks are adjacent, then
data-parallel, then pipeline stages (the default order "tp-cp-ep-dp-pp").
"""

from __future__ import annotations

import os
import random
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from slime_ref.backends.megatron import cpu_compat
from slime_ref.errors import UserError


def init_distributed(rank: int | None, world_size: int | None, master_addr: str = "127.0.0.1",
                     master_port: int | None = None, timeout_minutes: int = 10) -> None:
    """Join the default process group, unless this process already has (then rank/world_size may be None).

    Applies :mod:`cpu_compat` first on machines without CUDA.
    """
    cpu_compat.apply()
    if dist.is_initialized():
        return
    if rank is None or world_size is None:
        raise ValueError("rank and world_size are needed to join the process group")
    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    os.environ.setdefault("MASTER_ADDR", master_addr)
    if master_port is not None:
        os.environ["MASTER_PORT"] = str(master_port)
    dist.init_process_group(
        backend="nccl" if torch.cuda.is_available() else "gloo",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(minutes=timeout_minutes),
    )


def init_model_parallel(args) -> None:
    """Create megatron's TP/PP/DP groups from ``args`` and seed every RNG from ``args.seed``."""
    from megatron.core import parallel_state as ps

    world = dist.get_world_size()
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if world % (tp * pp):
        raise UserError(
            f"--tensor-model-parallel-size {tp} x --pipeline-model-parallel-size {pp} must divide the "
            f"number of training processes ({world})"
        )
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    set_seed(args.seed)


def set_seed(seed: int) -> None:
    """Megatron's seeding: the same base on every rank, offset by the pipeline stage for layer init.

    The model-parallel RNG (dropout inside TP regions) gets megatron's per-TP-rank stream.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    seed = seed + 100 * ps.get_pipeline_model_parallel_rank()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)


def destroy() -> None:
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
