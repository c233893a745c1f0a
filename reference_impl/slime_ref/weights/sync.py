"""Trainer -> engines weight sync, the three transports of slime (ARCHITECTURE.md decision 4).

Every training rank runs :meth:`WeightSync.update` together: exporting the weights gathers TP shards
and PP stages (collective), and rank 0 (the sender) gets every tensor under its HF name, bucket by
bucket (``--update-weight-buffer-size`` bytes), and sends it on:

==================================  ========================================================
``--colocate``                      tensor handles: ``/update_weights_from_tensor``, one flattened
                                    buffer per bucket (shared memory on CPU, CUDA IPC on GPU), no
                                    copy through the network
``--update-weight-transport nccl``  a process group of trainer rank 0 + every engine rank, built
                                    once; per bucket ``/update_weights_from_distributed`` announces
                                    names/dtypes/shapes and rank 0 broadcasts (NCCL on GPU, gloo on CPU)
``--update-weight-transport disk``  an HF checkpoint under ``--update-weight-disk-dir``, then
                                    ``/update_weights_from_disk`` on every engine
==================================  ========================================================

Around the transfer, as slime does: pause generation, flush the KV cache, push, continue.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from datetime import timedelta
from pathlib import Path

from slime_ref.utils.async_loop import run

logger = logging.getLogger(__name__)


def transport(args) -> str:
    if args.colocate:
        return "tensor"
    return "disk" if args.update_weight_transport == "disk" else "distributed"


class WeightSync:
    def __init__(self, args, actor, *, is_sender: bool):
        self.args = args
        self.actor = actor
        self.is_sender = is_sender
        self.transport = transport(args)
        self._clients: dict[str, object] = {}
        self._group = None  # distributed: the weight-update group, joined once
        self._group_urls: tuple[str, ...] = ()

    def _client(self, url: str):
        from slime_ref.rollout.sglang_client import SGLangClient

        if url not in self._clients:
            self._clients[url] = SGLangClient(url, timeout_s=600.0, retries=2)
        return self._clients[url]

    async def _all(self, urls, method: str, *args, **kw):
        return await asyncio.gather(*(getattr(self._client(u), method)(*args, **kw) for u in urls))

    def update(self, engine_urls: list[str], version: int) -> dict:
        """Push the current weights to every engine; every rank calls it. Returns timing metrics."""
        start = time.perf_counter()
        clients = [self._client(u) for u in engine_urls] if self.is_sender else []
        weight_version = str(version)
        if self.is_sender:
            run(self._all(engine_urls, "pause_generation"))
            run(self._all(engine_urls, "flush_cache"))
        num_bytes = 0
        if self.transport == "disk":
            num_bytes = self._update_from_disk(engine_urls, weight_version)
        else:
            if self.transport == "distributed" and self.is_sender:
                self._connect(engine_urls)
            for bucket in self.actor.iter_hf_weights(self.args.update_weight_buffer_size):
                if not self.is_sender:
                    continue  # the export is collective; only rank 0 sends
                num_bytes += sum(t.numel() * t.element_size() for _, t in bucket)
                self._send(clients, bucket, weight_version)
        if self.is_sender:
            run(self._all(engine_urls, "continue_generation"))
        return {"perf/update_weights_time": time.perf_counter() - start, "perf/update_weights_bytes": num_bytes}

    def _send(self, clients, bucket, weight_version: str) -> None:
        from slime_ref.weights import transfer as wt

        if self.transport == "tensor":
            # copied and shared here, on the training thread: torch work stays off the event loop's
            # thread (see transfer.push_serialized)
            payload, keepalive = wt.serialize_flattened_bucket(bucket)
            run(wt.push_serialized(clients, payload, load_format="flattened_bucket", weight_version=weight_version))
            del keepalive  # the engines have copied the tensors
        else:
            run(wt.broadcast_named_tensors(self._group, clients, bucket, weight_version=weight_version,
                                           bucket_bytes=self.args.update_weight_buffer_size))

    def _connect(self, engine_urls: list[str]) -> None:
        """Build the trainer + engines group once (again only if the engine set changed)."""
        from slime_ref.utils.net import allocate_port, node_address
        from slime_ref.weights import transfer as wt

        if self._group is not None and self._group_urls == tuple(engine_urls):
            return
        self.close()
        import torch

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        address = node_address()
        clients = [self._client(u) for u in engine_urls]
        ranks = [self.args.rollout_num_gpus_per_engine] * len(clients)
        self._group = run(wt.connect_engines(
            clients, master_address=address, master_port=allocate_port(address), backend=backend,
            ranks_per_engine=ranks, timeout=timedelta(minutes=self.args.distributed_timeout_minutes)))
        self._group_urls = tuple(engine_urls)

    def _update_from_disk(self, engine_urls: list[str], weight_version: str) -> int:
        base = Path(self.args.update_weight_disk_dir or Path(self.args.output_dir) / "weight_sync")
        target = base / f"v{weight_version}"
        self.actor.save_hf(target)  # collective; rank 0 writes it atomically
        if not self.is_sender:
            return 0
        answers = run(self._all(engine_urls, "update_weights_from_disk", str(target),
                                weight_version=weight_version))
        for url, answer in zip(engine_urls, answers):
            if not answer.get("success"):
                raise RuntimeError(f"{url} refused the weights in {target}: {answer.get('message')}")
        for old in base.glob("v*"):  # the previous versions are no longer needed
            if old != target:
                shutil.rmtree(old, ignore_errors=True)
        return sum(f.stat().st_size for f in target.glob("*.safetensors"))

    def close(self) -> None:
        if self._group is not None and self.is_sender:
            from slime_ref.weights import transfer as wt

            try:
                run(wt.disconnect_engines(self._group, [self._client(u) for u in self._group_urls]), timeout=60)
            except Exception as e:  # engines may already be gone at shutdown
                logger.warning("weight-update group teardown: %s", e)
        self._group, self._group_urls = None, ()
        for client in self._clients.values():
            try:
                run(client.close(), timeout=10)
            except Exception:
                pass
        self._clients = {}

