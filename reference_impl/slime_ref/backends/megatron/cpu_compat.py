"""Run megatron-core on a machine without CUDA (the CPU build of torch, gloo collectives).

megatron-core assumes CUDA in a handful of places that have nothing to do with the maths: it asks
``torch.cuda.current_device()`` for the device of every buffer it allocates, synchronises the CUDA
stream around pipeline sends, keeps a CUDA RNG state per tensor-parallel rank, creates small
optimizer and schedule tensors with a literal ``device="cuda"``, and asserts that gradients are
``torch.cuda.FloatTensor``. Verified against megatron-core 0.16.1 (0.19.2 behaves the same).

:func:`apply` patches exactly those assumptions, process-wide, and only when CUDA is unavailable:

1. ``torch.cuda.current_device()`` returns the CPU device and ``torch.cuda.synchronize()`` does
   nothing (model buffers, rotary tables, pipeline p2p).
2. The model-parallel RNG tracker keeps CPU generator states, so dropout still uses one seeded
   stream per tensor-parallel rank, as on GPU.
3. A :class:`~torch.overrides.TorchFunctionMode` maps ``device="cuda"`` factories, ``.cuda()`` and
   ``.to("cuda")`` to the CPU, and makes ``Tensor.type()`` report ``torch.cuda.*`` (optimizer,
   gradient clipping and schedule code).

On a CUDA machine :func:`apply` does nothing: GPU runs use megatron-core unpatched. The patches are
process-wide and the mode is per thread, so call :func:`apply` in every process (and thread) that
runs megatron, before building the model.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch.overrides import TorchFunctionMode

_patched = False
_mode_by_thread = threading.local()


def needed() -> bool:
    """True when this process has no CUDA, so megatron-core needs the patches below."""
    return not torch.cuda.is_available()


def apply() -> bool:
    """Patch megatron-core's CUDA assumptions when CUDA is unavailable. Idempotent.

    Returns True when the patches are active in this thread.
    """
    global _patched
    if not needed():
        return False
    if not _patched:
        torch.cuda.current_device = lambda: torch.device("cpu")
        torch.cuda.synchronize = lambda *args, **kwargs: None
        _install_cpu_rng_tracker()
        _patched = True
    if getattr(_mode_by_thread, "mode", None) is None:
        mode = _CudaToCpuMode()
        mode.__enter__()
        _mode_by_thread.mode = mode
    return True


def _install_cpu_rng_tracker() -> None:
    from megatron.core.tensor_parallel import random as mrandom

    class CPURNGStatesTracker(mrandom.CudaRNGStatesTracker):
        """Megatron's tracker with CPU generator states instead of CUDA ones."""

        def add(self, name, seed):
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            self.seeds_.add(seed)
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            saved = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(saved)

        @contextlib.contextmanager
        def fork(self, name=mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            saved = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(saved)

    mrandom._CUDA_RNG_STATE_TRACKER = CPURNGStatesTracker()
    # model_parallel_cuda_manual_seed() then reseeds this tracker instead of building a CUDA one
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True


def _is_cuda(device) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    # a bare int is a CUDA ordinal in torch's device arguments
    return isinstance(device, int) and not isinstance(device, bool)


_REDIRECTED = frozenset({torch.Tensor.cuda, torch.Tensor.to, torch.Tensor.type})


class _CudaToCpuMode(TorchFunctionMode):
    """Send CUDA placements to the CPU; report ``torch.cuda.*`` types for megatron's asserts."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # every torch call of the process comes through here: the common case returns at once
        if func not in _REDIRECTED and not (kwargs and ("device" in kwargs or kwargs.get("pin_memory"))):
            return func(*args, **(kwargs or {}))
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if kwargs.get("device") is not None and _is_cuda(kwargs["device"]):
            kwargs["device"] = "cpu"
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False  # pinned memory needs CUDA
        if (
            func is torch.Tensor.to
            and len(args) > 1
            and not isinstance(args[1], (torch.dtype, torch.Tensor))
            and _is_cuda(args[1])
        ):
            args = (args[0], "cpu", *args[2:])
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if name.startswith("torch.cuda.") else name.replace("torch.", "torch.cuda.", 1)
        return func(*args, **kwargs)
