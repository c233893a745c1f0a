"""The built-in engine served from a thread of the test process (fast to start; 127.0.0.1, free port),
and waits on an engine's state that work with real SGLang as well.

Tests that need the engine in another process (weight transports, killing it) use
``slime_ref.rollout.servers.RolloutServers`` instead.
"""

from __future__ import annotations

import asyncio
import threading
import time

from aiohttp import web

from slime_ref.engine.http_server import EngineConfig, EngineServer
from slime_ref.utils.net import allocate_port


class InProcessEngine:
    def __init__(self, model_dir, **config):
        self.config = EngineConfig(model_path=str(model_dir), host="127.0.0.1", port=allocate_port(), **config)
        self.url = f"http://127.0.0.1:{self.config.port}"
        self.server: EngineServer | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    def __enter__(self) -> InProcessEngine:
        self.server = EngineServer(self.config)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=60)
        return self

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.server.app())
        await self._runner.setup()
        await web.TCPSite(self._runner, self.config.host, self.config.port).start()

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


async def wait_in_flight(client, min_tokens: int, timeout_s: float = 60.0) -> dict:
    """Poll ``/get_load`` until a DP rank has a running request and holds at least ``min_tokens`` KV
    tokens; its load entry. With one request, ``min_tokens = len(prompt) + 1`` means: admitted,
    prefilled and generating (real SGLang and the built-in engine count the same way)."""
    deadline = time.monotonic() + timeout_s
    while True:
        load = await client.get_load()
        for rank in load:
            if rank["num_reqs"] > rank["num_waiting_reqs"] and rank["num_tokens"] >= min_tokens:
                return rank
        if time.monotonic() > deadline:
            raise AssertionError(f"no request in flight with {min_tokens} tokens after {timeout_s:.0f}s: {load}")
        await asyncio.sleep(0.01)
