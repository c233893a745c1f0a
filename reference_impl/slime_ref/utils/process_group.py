"""A torch.distributed group that lives beside (not instead of) a process's default group.

The weight-update group joins the trainer's rank 0 with every engine rank. The trainer already has
its default group (Megatron's), and an engine may have none, so the group is built the way SGLang's
``init_custom_process_group`` and slime's ``init_process_group`` build it: TCP rendezvous, a store
prefixed with the group name, and torch's group constructor. Because both sides build it the same
way, our trainer-side helper can broadcast to real SGLang engines as well as to the built-in one.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist
from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous


def tcp_init_method(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"tcp://{host}:{port}"


def init_custom_process_group(
    *,
    backend: str,
    init_method: str,
    world_size: int,
    rank: int,
    group_name: str,
    timeout: timedelta = timedelta(minutes=10),
) -> dist.ProcessGroup:
    """Join (or, as rank 0, host) the group at ``init_method``; blocks until all ranks joined."""
    store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    group, _ = _new_process_group_helper(
        world_size, rank, [], Backend(backend), store, group_name=group_name, timeout=timeout
    )
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group
