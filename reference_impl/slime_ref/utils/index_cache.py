"""Index tensors built from Python lists, kept while a CUDA graph of the training step uses them.

The forward and the loss turn a micro-batch's lengths into index tensors (which packed row scores
which response token, which sample each token belongs to). Built on the host and copied to the
GPU, they cannot be part of a CUDA graph: a capture may not copy from the host, and a replay would
read a host buffer long since reused. Inside :func:`keep_indices` each such tensor is built once per
distinct list and kept in the given dict, which the captured graph holds on to; outside it they
are built every time, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from contextvars import ContextVar

import torch

_store: ContextVar[dict | None] = ContextVar("slime_ref_index_store", default=None)


@contextmanager
def keep_indices(store: dict):
    """Within the block, :func:`cached_index` builds each key once into ``store``."""
    token = _store.set(store)
    try:
        yield store
    finally:
        _store.reset(token)


def cached_index(key: tuple, build: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``build()``, or inside :func:`keep_indices` the tensor built for ``key`` before."""
    store = _store.get()
    if store is None:
        return build()
    if key not in store:
        store[key] = build()
    return store[key]
