"""One long-lived asyncio loop per process, on a background thread.

Rollout functions keep the synchronous signature slime uses (``generate_rollout(args, rollout_id,
data_source)``) but do their HTTP work with asyncio. Running every coroutine on one persistent loop
keeps HTTP connection pools (and their sessions) alive from one rollout to the next instead of
reconnecting each time.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_lock = threading.Lock()


def get_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread
    with _lock:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            _thread = threading.Thread(target=_loop.run_forever, name="slime-ref-async", daemon=True)
            _thread.start()
        return _loop


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the shared loop and wait for its result (re-raising its exception)."""
    loop = get_loop()
    if threading.current_thread() is _thread:
        raise RuntimeError("run() called from the shared loop itself; await the coroutine instead")
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)


def cancel_all() -> None:
    """Cancel every task on the shared loop: the run is stopping and its requests are moot. A thread
    waiting in :func:`run` then gets ``concurrent.futures.CancelledError``."""
    loop = _loop
    if loop is None or loop.is_closed():
        return

    def cancel() -> None:
        for task in asyncio.all_tasks(loop):
            task.cancel()

    loop.call_soon_threadsafe(cancel)
