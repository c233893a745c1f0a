"""Engine side of the two in-memory weight transports.

Tensor handles (``/update_weights_from_tensor``): each entry of ``serialized_named_tensors`` is what
SGLang's ``MultiprocessingSerializer.serialize(named_tensors, output_str=True)`` makes: the base64 of
a ``ForkingPickler`` dump of ``[(hf_name, tensor), ...]``. The tensors stay in the sender's memory
(CUDA IPC handles on a GPU; on CPU, shared-memory files, torch's ``file_system`` sharing strategy)
and only handles travel over HTTP. Entry ``i`` is for TP rank ``i``; the built-in engine is TP 1.
With ``load_format="flattened_bucket"`` the entry is instead SGLang's ``FlattenedTensorBucket`` dict:
one uint8 buffer holding every tensor's bytes plus per-tensor metadata (what slime sends). Unpickling
is restricted to torch's tensor-rebuild functions and those metadata entries, as SGLang restricts it.

Distributed broadcast (``/init_weights_update_group`` + ``/update_weights_from_distributed``): the
trainer is rank 0 of a dedicated group and broadcasts each tensor; the engine allocates empty
tensors of the announced names, dtypes and shapes and receives them.
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
import threading
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist

from slime_ref.utils.process_group import init_custom_process_group, tcp_init_method


class _TensorHandleUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _BUCKET_METADATA_CLASSES:
            return SimpleNamespace  # read by attribute, as SGLang reads it
        allowed = (
            (module == "torch.multiprocessing.reductions" and name.startswith("rebuild_"))
            or (module == "torch.storage" and name in ("UntypedStorage", "TypedStorage"))
            or (
                module == "torch"
                and (name in ("Tensor", "Size") or isinstance(getattr(torch, name, None), torch.dtype))
            )
        )
        if not allowed:
            raise pickle.UnpicklingError(
                f"serialized_named_tensors refers to {module}.{name}, which is not a tensor handle; "
                "send [(name, tensor), ...] pickled with ForkingPickler (CPU tensors with torch's "
                "'file_system' sharing strategy)"
            )
        return super().find_class(module, name)


# the metadata entries of a flattened bucket: slime sends SGLang's dataclass, slime-ref a SimpleNamespace
_BUCKET_METADATA_CLASSES = {("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata"),
                            ("types", "SimpleNamespace")}


def _load_payload(payload: str):
    import torch.multiprocessing  # noqa: F401  (registers the rebuild functions the payload names)

    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError, TypeError) as e:
        raise ValueError(f"serialized_named_tensors entries must be base64 strings: {e}") from None
    return _TensorHandleUnpickler(io.BytesIO(data)).load()


def deserialize_flattened_bucket(payload: str) -> list[tuple[str, torch.Tensor]]:
    """Decode one entry sent with ``load_format="flattened_bucket"`` (SGLang's ``FlattenedTensorBucket``:
    ``{"flattened_tensor": uint8 buffer, "metadata": [name, shape, dtype, start_idx, end_idx, numel]}``,
    offsets in bytes) into ``[(hf_name, tensor), ...]``: views of the shared buffer, no copy (unless
    a tensor's bytes are not aligned to its dtype)."""
    bucket = _load_payload(payload)
    if not (isinstance(bucket, dict) and isinstance(bucket.get("flattened_tensor"), torch.Tensor)
            and isinstance(bucket.get("metadata"), (list, tuple))):
        raise ValueError("a flattened bucket must decode to {'flattened_tensor': tensor, 'metadata': [...]}")
    flat = bucket["flattened_tensor"]
    if flat.dtype != torch.uint8 or flat.dim() != 1:
        raise ValueError(f"flattened_tensor must be a 1-D uint8 buffer, got {flat.dtype} {tuple(flat.shape)}")
    named = []
    for meta in bucket["metadata"]:
        try:
            name, shape, dtype = meta.name, torch.Size(meta.shape), meta.dtype
            start, end = int(meta.start_idx), int(meta.end_idx)
        except (AttributeError, TypeError, ValueError) as e:
            raise ValueError(f"flattened bucket metadata entry {meta!r}: {e}") from None
        if not isinstance(name, str) or not isinstance(dtype, torch.dtype):
            raise ValueError(f"flattened bucket metadata entry {meta!r}: name must be a str and dtype a torch dtype")
        if not 0 <= start <= end <= flat.numel() or end - start != shape.numel() * dtype.itemsize:
            raise ValueError(f"weight {name!r}: bytes [{start}, {end}) of a {flat.numel()}-byte buffer do not hold "
                             f"a {dtype} tensor of shape {tuple(shape)}")
        data = flat[start:end]
        if start % dtype.itemsize:
            data = data.clone()  # a sender that did not align this tensor: view a copy of its bytes
        named.append((name, data.view(dtype).reshape(shape)))
    return named


def deserialize_named_tensors(payload: str) -> list[tuple[str, torch.Tensor]]:
    """Decode one ``serialized_named_tensors`` entry into ``[(hf_name, tensor), ...]``."""
    named = _load_payload(payload)
    if not isinstance(named, (list, tuple)) or not all(
        isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)
        and isinstance(item[1], torch.Tensor) for item in named
    ):
        raise ValueError("serialized_named_tensors must decode to a list of (name, tensor) pairs")
    return [(name, tensor) for name, tensor in named]


class WeightUpdateGroups:
    """The engine's weight-update groups by name (SGLang keeps the same dict in its model runner)."""

    def __init__(self, tp_rank: int = 0):
        self.tp_rank = tp_rank
        self._groups: dict[str, dist.ProcessGroup] = {}
        self._lock = threading.Lock()

    def init(self, *, master_address: str, master_port: int, rank_offset: int, world_size: int,
             group_name: str, backend: str, timeout: timedelta = timedelta(minutes=10)) -> None:
        if not group_name:
            raise ValueError("group_name cannot be empty")
        with self._lock:
            if group_name in self._groups:
                raise ValueError(f"weight-update group {group_name!r} already exists; destroy it first")
        group = init_custom_process_group(
            backend=backend, init_method=tcp_init_method(master_address, master_port), world_size=world_size,
            rank=rank_offset + self.tp_rank, group_name=group_name, timeout=timeout,
        )
        with self._lock:
            self._groups[group_name] = group

    def destroy(self, group_name: str) -> None:
        with self._lock:
            group = self._groups.pop(group_name, None)
        if group is None:
            raise ValueError("The group to be destroyed does not exist.")
        dist.destroy_process_group(group)

    def receive(self, names: list[str], dtypes: list[str], shapes: list[list[int]], group_name: str):
        """Receive one broadcast per tensor from rank 0, in order; returns ``[(name, tensor), ...]``."""
        with self._lock:
            group = self._groups.get(group_name)
        if group is None:
            raise ValueError(f"Group {group_name} not in {sorted(self._groups)}. "
                             "Please call `init_weights_update_group` first.")
        if not len(names) == len(dtypes) == len(shapes):
            raise ValueError("names, dtypes and shapes must have the same length")
        torch_dtypes = []
        for name, dtype in zip(names, dtypes):  # check all before the first receive: never half a broadcast
            torch_dtype = getattr(torch, str(dtype).replace("torch.", ""), None)
            if not isinstance(torch_dtype, torch.dtype):
                raise ValueError(f"unknown dtype {dtype!r} for weight {name!r}")
            torch_dtypes.append(torch_dtype)
        received, works = [], []
        for name, torch_dtype, shape in zip(names, torch_dtypes, shapes):
            tensor = torch.empty(shape, dtype=torch_dtype)
            works.append(dist.broadcast(tensor, src=0, group=group, async_op=True))
            received.append((name, tensor))
        for work in works:
            work.wait()
        return received
