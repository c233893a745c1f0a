"""Trainer side of the two in-memory weight transports to engines (SGLang's protocol).

Distributed broadcast, as slime's ``update_weight_from_distributed`` does it:

1. :func:`connect_engines`: the trainer's rank 0 hosts a dedicated group (rank 0 = trainer, engine
   ``i`` at ``rank_offset`` = 1 + the ranks of the engines before it); each engine joins it through
   ``/init_weights_update_group``.
2. :func:`broadcast_named_tensors`: per bucket of HF-named tensors, every engine is told the names,
   dtypes and shapes (``/update_weights_from_distributed``), and rank 0 broadcasts the tensors.
3. :func:`disconnect_engines`: ``/destroy_weights_update_group`` and the local group is destroyed.

Tensor handles (colocated engines): :func:`serialize_named_tensors` makes the base64 payload SGLang's
``MultiprocessingSerializer`` makes (one shared tensor per weight), :func:`serialize_flattened_bucket`
the one of SGLang's ``flattened_bucket`` load format (one shared buffer per bucket, what slime sends);
:func:`push_serialized` sends either with ``/update_weights_from_tensor`` (:func:`push_tensors`
serializes per weight and sends).

Backend: ``nccl`` between GPUs, ``gloo`` on CPU (the built-in engine accepts only gloo).
"""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Iterable, Iterator, Sequence
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist

from slime_ref.rollout.sglang_client import DEFAULT_GROUP_NAME, EngineError, SGLangClient
from slime_ref.utils.process_group import init_custom_process_group, tcp_init_method

DEFAULT_BUCKET_BYTES = 512 * 1024**2  # slime's --update-weight-buffer-size default
_BUCKET_ALIGN = 16  # bytes; a multiple of every dtype's size


def _check_success(client: SGLangClient, route: str, answer: dict) -> None:
    if not (isinstance(answer, dict) and answer.get("success")):
        message = answer.get("message") if isinstance(answer, dict) else answer
        raise EngineError(f"{client.base_url}{route}", f"refused: {message}")


async def connect_engines(
    clients: Sequence[SGLangClient],
    *,
    master_address: str,
    master_port: int,
    backend: str,
    group_name: str = DEFAULT_GROUP_NAME,
    ranks_per_engine: Sequence[int] | None = None,
    timeout: timedelta = timedelta(minutes=10),
) -> dist.ProcessGroup:
    """Create the weight-update group as its rank 0 and have every engine join; returns the group.

    ``ranks_per_engine``: GPUs (TP ranks) of each engine, 1 each by default.
    """
    ranks = list(ranks_per_engine or [1] * len(clients))
    world_size = 1 + sum(ranks)
    offsets = [1 + sum(ranks[:i]) for i in range(len(clients))]
    joins = [
        asyncio.create_task(client.init_weights_update_group(
            master_address, master_port, offset, world_size, group_name=group_name, backend=backend,
            timeout_s=timeout.total_seconds()))
        for client, offset in zip(clients, offsets)
    ]
    group = await asyncio.to_thread(
        init_custom_process_group, backend=backend, init_method=tcp_init_method(master_address, master_port),
        world_size=world_size, rank=0, group_name=group_name, timeout=timeout,
    )
    for client, answer in zip(clients, await asyncio.gather(*joins)):
        _check_success(client, "/init_weights_update_group", answer)
    return group


def buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group tensors in order into lists of at most ``bucket_bytes`` (a larger tensor goes alone)."""
    bucket, size = [], 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def _broadcast(group: dist.ProcessGroup, tensors: list[torch.Tensor]) -> None:
    works = [dist.broadcast(t.contiguous(), src=0, group=group, async_op=True) for t in tensors]
    for work in works:
        work.wait()


async def broadcast_named_tensors(
    group: dist.ProcessGroup,
    clients: Sequence[SGLangClient],
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    group_name: str = DEFAULT_GROUP_NAME,
    weight_version: str | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> int:
    """Send HF-named tensors to every engine of ``group``, bucket by bucket. Returns the tensor count.

    Each engine's ``/update_weights_from_distributed`` call returns once it has received and loaded
    the bucket; an engine that refuses is reported at once (the broadcast it left then runs into the
    group's timeout)."""
    count = 0
    for bucket in buckets(named_tensors, bucket_bytes):
        names = [name for name, _ in bucket]
        dtypes = [str(t.dtype).replace("torch.", "") for _, t in bucket]
        shapes = [list(t.shape) for _, t in bucket]
        announces = [
            asyncio.create_task(client.update_weights_from_distributed(
                names, dtypes, shapes, group_name=group_name, weight_version=weight_version))
            for client in clients
        ]
        sending = asyncio.create_task(asyncio.to_thread(_broadcast, group, [t for _, t in bucket]))
        done, _ = await asyncio.wait([sending, *announces], return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                raise task.exception()
        await sending
        for client, answer in zip(clients, await asyncio.gather(*announces)):
            _check_success(client, "/update_weights_from_distributed", answer)
        count += len(bucket)
    return count


async def disconnect_engines(group: dist.ProcessGroup, clients: Sequence[SGLangClient],
                             group_name: str = DEFAULT_GROUP_NAME) -> None:
    """Every engine leaves the group, and so does the trainer, even if an engine is gone (it died and
    is restarted with --use-fault-tolerance): the group's name must be free for the next group."""
    answers = await asyncio.gather(*(c.destroy_weights_update_group(group_name) for c in clients),
                                   return_exceptions=True)
    dist.destroy_process_group(group)
    for client, answer in zip(clients, answers):
        if isinstance(answer, BaseException):
            raise answer
        _check_success(client, "/destroy_weights_update_group", answer)


def serialize_named_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> tuple[str, list[torch.Tensor]]:
    """Pickle ``[(name, tensor), ...]`` with torch's tensor sharing and base64 it, as SGLang's
    ``MultiprocessingSerializer.serialize(..., output_str=True)`` does.

    Each tensor is copied first, so the caller's tensors are never moved into shared memory. CPU
    copies are shared through named shared-memory files (torch's ``file_system`` strategy, which an
    unrelated process can open); CUDA copies travel as CUDA IPC handles. Returns the payload and the
    copies: keep the copies alive until the engine has answered.
    """
    copies = [(name, tensor.detach().clone()) for name, tensor in named_tensors]
    return _share_and_encode(copies), [t for _, t in copies]


def serialize_flattened_bucket(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> tuple[str, torch.Tensor]:
    """The payload of ``/update_weights_from_tensor`` with ``load_format="flattened_bucket"``, as slime
    sends it: one buffer with every tensor's bytes back to back (SGLang's ``FlattenedTensorBucket``
    layout, any mix of dtypes, each tensor starting 16-byte aligned), so one shared-memory file or
    CUDA IPC handle carries the whole bucket.

    The payload decodes to ``{"flattened_tensor": uint8 [total bytes], "metadata": [...]}``, one
    metadata entry per tensor with SGLang's fields (``name``, ``shape``, ``dtype``, ``start_idx``,
    ``end_idx``, ``numel``, offsets and counts in bytes). The entries are ``types.SimpleNamespace``
    objects, which SGLang's restricted unpickler admits and reads by attribute, so the trainer does
    not need SGLang installed. Returns the payload and the buffer: keep it alive until the engines
    have answered.
    """
    metadata, parts, offset = [], [], 0
    for name, tensor in named_tensors:
        data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        gap = -offset % _BUCKET_ALIGN  # each tensor starts aligned, so the receiver can view its bytes as its dtype
        if gap:
            parts.append(data.new_zeros(gap))
            offset += gap
        metadata.append(SimpleNamespace(name=name, shape=tensor.shape, dtype=tensor.dtype, start_idx=offset,
                                        end_idx=offset + data.numel(), numel=data.numel()))
        parts.append(data)
        offset += data.numel()
    if not parts:
        raise ValueError("a flattened bucket needs at least one tensor")
    flat = torch.cat(parts)  # a new buffer: the caller's tensors are never moved into shared memory
    return _share_and_encode({"flattened_tensor": flat, "metadata": metadata}), flat


def _share_and_encode(obj) -> str:
    """``obj`` pickled with torch's tensor sharing (CPU: ``file_system`` shared memory), base64."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing as mp

    previous = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_system")
    try:
        buffer = io.BytesIO()
        ForkingPickler(buffer).dump(obj)
    finally:
        mp.set_sharing_strategy(previous)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


async def push_tensors(clients: Sequence[SGLangClient], named_tensors: Iterable[tuple[str, torch.Tensor]], *,
                       weight_version: str | None = None) -> None:
    """Load HF-named tensors into every engine through ``/update_weights_from_tensor`` (TP 1 each)."""
    payload, keepalive = serialize_named_tensors(named_tensors)
    await push_serialized(clients, payload, weight_version=weight_version)
    del keepalive  # the engines have copied the tensors


async def push_serialized(clients: Sequence[SGLangClient], payload: str, *, load_format: str | None = None,
                          weight_version: str | None = None) -> None:
    """Send one payload of :func:`serialize_named_tensors` (``load_format`` None) or
    :func:`serialize_flattened_bucket` (``"flattened_bucket"``) to every engine; returns once all
    have loaded it.

    The trainer serializes on its own thread and only awaits this on the event loop: a torch op on a
    second thread gives the process a second OpenMP team, and with more OpenMP threads than cores
    libgomp stops spin-waiting, which makes every later training step markedly slower on CPU."""
    answers = await asyncio.gather(*(c.update_weights_from_tensor([payload], load_format=load_format,
                                                                  weight_version=weight_version)
                                     for c in clients))
    for client, answer in zip(clients, answers):
        _check_success(client, "/update_weights_from_tensor", answer)
