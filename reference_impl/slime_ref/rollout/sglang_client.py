"""Async client for SGLang's native HTTP API, the routes slime's rollout and weight sync use.

The same client talks to a real SGLang server, to the built-in engine (``slime_ref.engine``) and to
sglang-router in front of either. Route and field names are SGLang 0.5.15.post1's; a test checks
them against that release's source.

Timeouts and retries are explicit. Every call has a deadline (``timeout_s``) that covers all its
attempts. A connection that cannot be opened is retried (the request never left); a request that
was sent and then lost (engine died, connection reset) is retried only when repeating it is safe.
When the deadline or the attempts run out, :class:`EngineError` says which URL and route failed and
why, so a dead engine is a clear error, never a hang.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

DEFAULT_GROUP_NAME = "weight_update_group"  # SGLang's default group_name

# The sampling parameters slime's rollout sends in /generate (SGLang's names). Real SGLang and the
# built-in engine both implement them; a test checks them against SGLang's source.
SAMPLING_PARAM_NAMES = (
    "temperature", "top_p", "top_k", "max_new_tokens", "stop", "stop_token_ids", "skip_special_tokens",
    "no_stop_trim", "spaces_between_special_tokens", "ignore_eos", "sampling_seed", "custom_params",
)


class EngineError(RuntimeError):
    """An engine or router failed to answer, or answered with an error. ``url`` names it."""

    def __init__(self, url: str, message: str, status: int | None = None):
        super().__init__(f"{url}: {message}")
        self.url = url
        self.message = message
        self.status = status

    def __reduce__(self):  # Ray pickles an actor's exception to hand it to the caller
        return (EngineError, (self.url, self.message, self.status))


@dataclass
class GenerateOutput:
    """One ``/generate`` answer.

    output_ids: response token ids (a matched stop token included, as SGLang returns them).
    output_log_probs: log-prob of each response token (``meta_info.output_token_logprobs``), or None
        when the request did not ask for log-probs.
    finish_reason: SGLang's dict, e.g. ``{"type": "length", "length": 32}``, ``{"type": "stop",
        "matched": 2}`` or ``{"type": "abort", "message": ...}``.
    """

    output_ids: list[int]
    output_log_probs: list[float] | None
    finish_reason: dict[str, Any]
    text: str
    meta_info: dict[str, Any]

    @property
    def finish_type(self) -> str:
        return self.finish_reason.get("type", "")

    @property
    def input_log_probs(self) -> list[float | None]:
        """Prompt-token log-probs from ``logprob_start_len`` on (None for the first token)."""
        return [item[0] for item in self.meta_info.get("input_token_logprobs", [])]


def parse_generate_response(data: dict[str, Any]) -> GenerateOutput:
    meta = data.get("meta_info") or {}
    if "output_token_logprobs" in meta:
        ids = [int(item[1]) for item in meta["output_token_logprobs"]]
        log_probs = [float(item[0]) for item in meta["output_token_logprobs"]]
    else:
        ids, log_probs = [int(t) for t in data.get("output_ids", [])], None
    return GenerateOutput(output_ids=ids, output_log_probs=log_probs, finish_reason=meta.get("finish_reason") or {},
                          text=data.get("text", ""), meta_info=meta)


class SGLangClient:
    """One engine or router at ``base_url`` (``http://host:port``).

    timeout_s: default deadline of a call, all attempts included (generation: ``generate_timeout_s``).
    connect_timeout_s: how long opening a connection may take.
    retries: extra attempts after the first, with ``backoff_s`` doubling between them, up to ``max_backoff_s``.
    max_connections: concurrent connections to this URL (slime sizes it to the rollout concurrency).
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 60.0,
        generate_timeout_s: float = 3600.0,
        connect_timeout_s: float = 5.0,
        retries: int = 3,
        backoff_s: float = 0.25,
        max_backoff_s: float = 30.0,
        max_connections: int = 1024,
    ):
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.generate_timeout_s = generate_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> SGLangClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is not None and not self._session.closed and self._session_loop is not loop:
            raise RuntimeError(f"SGLangClient({self.base_url}) is bound to another event loop; "
                               "create one client per event loop (e.g. inside each asyncio.run)")
        if self._session is None or self._session.closed:
            self._session_loop = loop
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections),
                trust_env=False,  # engine traffic is internal; never through a proxy
            )
        return self._session

    async def _call(
        self,
        method: str,
        route: str,
        body: dict[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        retries: int | None = None,
        resend_safe: bool = True,
        read: str = "json",
    ) -> Any:
        """One HTTP call with a deadline and retries; returns parsed JSON, text, or None."""
        url = f"{self.base_url}{route}"
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        attempts = 1 + (self.retries if retries is None else retries)
        last_error = "no attempt made"
        for attempt in range(1, attempts + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            timeout = aiohttp.ClientTimeout(total=remaining, sock_connect=min(self.connect_timeout_s, remaining))
            try:
                async with self._get_session().request(method, url, json=body, timeout=timeout) as resp:
                    raw = await resp.read()
                    if resp.status >= 500:
                        last_error = f"HTTP {resp.status}: {_text(raw)[:500]}"
                    elif resp.status >= 400:
                        raise EngineError(url, f"HTTP {resp.status}: {_text(raw)[:2000]}", status=resp.status)
                    else:
                        if read == "text":
                            return raw.decode("utf-8", errors="replace")
                        if read == "none" or not raw.strip():
                            return None
                        return _json(url, raw)
            except aiohttp.ClientConnectorError as e:  # never connected: the request did not leave
                last_error = f"cannot connect ({e.os_error or e})"
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                kind = (
                    "timed out" if isinstance(e, asyncio.TimeoutError) else f"connection lost ({type(e).__name__}: {e})"
                )
                if not resend_safe:
                    raise EngineError(url, f"{kind}; not retried because repeating {route} is not safe") from e
                last_error = kind
            if attempt < attempts:
                backoff = min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)
                await asyncio.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
        waited = (self.timeout_s if timeout_s is None else timeout_s) - max(0.0, deadline - time.monotonic())
        raise EngineError(url, f"no answer after {attempt} attempt(s) in {waited:.1f}s: {last_error}")

    # ------------------------------------------------------------------------------------------
    # generation

    async def generate(
        self,
        input_ids: list[int],
        sampling_params: dict[str, Any],
        *,
        return_logprob: bool = True,
        logprob_start_len: int | None = None,
        rid: str | None = None,
        timeout_s: float | None = None,
    ) -> GenerateOutput:
        """POST /generate with token ids; ``sampling_params`` uses SGLang's names (temperature, top_p,
        top_k, max_new_tokens, stop, stop_token_ids, no_stop_trim, skip_special_tokens, ignore_eos,
        sampling_seed, ...). ``logprob_start_len=0`` also returns the prompt tokens' log-probs."""
        body: dict[str, Any] = {"input_ids": list(input_ids), "sampling_params": sampling_params,
                                "return_logprob": return_logprob}
        if logprob_start_len is not None:
            body["logprob_start_len"] = logprob_start_len
        if rid is not None:
            body["rid"] = rid
        data = await self._call("POST", "/generate", body,
                                timeout_s=self.generate_timeout_s if timeout_s is None else timeout_s)
        return parse_generate_response(data)

    async def generate_batch(
        self,
        input_ids: list[list[int]],
        sampling_params: dict[str, Any] | list[dict[str, Any]],
        *,
        return_logprob: bool = True,
        timeout_s: float | None = None,
    ) -> list[GenerateOutput]:
        """POST /generate with a batch of token-id lists (SGLang's batched form): one answer per entry,
        in order. ``sampling_params`` is shared, or one dict per entry. One request instead of many
        saves the per-request work of client, router and engine."""
        if not input_ids:
            return []
        body: dict[str, Any] = {"input_ids": [list(ids) for ids in input_ids], "sampling_params": sampling_params,
                                "return_logprob": return_logprob}
        data = await self._call("POST", "/generate", body,
                                timeout_s=self.generate_timeout_s if timeout_s is None else timeout_s)
        if not isinstance(data, list) or len(data) != len(input_ids):
            raise EngineError(f"{self.base_url}/generate", f"a batch of {len(input_ids)} got an answer that is not "
                              f"a list of {len(input_ids)} results")
        return [parse_generate_response(item) for item in data]

    async def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        await self._call("POST", "/abort_request", {"rid": rid, "abort_all": abort_all}, read="none")

    async def pause_generation(self, mode: str = "abort") -> dict:
        """Stop generating. ``abort`` (SGLang's default) ends running requests with finish type
        "abort"; ``retract`` and ``in_place`` keep them for :meth:`continue_generation`."""
        return await self._call("POST", "/pause_generation", {"mode": mode})

    async def continue_generation(self) -> dict:
        return await self._call("POST", "/continue_generation", {})

    async def flush_cache(self, timeout_s: float = 60.0) -> None:
        """Flush the prefix cache. SGLang refuses (400) while requests are in flight, so this retries
        every second until it succeeds or ``timeout_s`` passes (as slime does)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                await self._call("GET", "/flush_cache", timeout_s=max(1.0, deadline - time.monotonic()), read="text")
                return
            except EngineError as e:
                if e.status != 400 or time.monotonic() + 1.0 > deadline:
                    raise
            await asyncio.sleep(1.0)

    async def start_profile(self, output_dir: str, num_steps: int,
                            activities: tuple[str, ...] = ("CPU", "GPU")) -> None:
        """POST /start_profile: SGLang's torch profiler over the next ``num_steps`` forward passes; the
        scheduler writes the trace (``*.trace.json.gz``) into ``output_dir`` after the last one."""
        await self._call("POST", "/start_profile",
                         {"output_dir": output_dir, "num_steps": num_steps, "activities": list(activities)},
                         read="text", resend_safe=False)

    async def freeze_gc(self) -> None:
        """POST /freeze_gc: each of the server's processes (SGLang's tokenizer manager, scheduler and
        detokenizer) takes what it holds out of Python's garbage collector's walks; SGLang suggests it
        after a few warm-up requests."""
        await self._call("POST", "/freeze_gc", read="none")

    # ------------------------------------------------------------------------------------------
    # health and info

    async def health(self, timeout_s: float = 5.0) -> bool:
        """GET /health: True on 200, False on any other answer or none."""
        return await self._probe("/health", timeout_s)

    async def health_generate(self, timeout_s: float = 30.0) -> bool:
        """GET /health_generate (the server generates one token): True on 200."""
        return await self._probe("/health_generate", timeout_s)

    async def _probe(self, route: str, timeout_s: float) -> bool:
        try:
            await self._call("GET", route, timeout_s=timeout_s, retries=0, read="none")
            return True
        except EngineError:
            return False

    async def wait_healthy(self, timeout_s: float, route: str = "/health_generate", poll_s: float = 1.0) -> None:
        """Poll ``route`` until it answers 200; EngineError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if await self._probe(route, max(1.0, min(30.0, deadline - time.monotonic()))):
                return
            await asyncio.sleep(poll_s)
        raise EngineError(f"{self.base_url}{route}", f"not healthy after {timeout_s:.0f}s")

    async def get_model_info(self) -> dict:
        return await self._call("GET", "/model_info")

    async def get_server_info(self) -> dict:
        return await self._call("GET", "/server_info")

    async def get_load(self) -> list[dict]:
        """GET /get_load: one dict per DP rank with ``num_reqs`` (running + waiting),
        ``num_waiting_reqs``, ``num_tokens`` (KV tokens in use plus the waiting requests' tokens) and
        ``num_pending_tokens``."""
        return await self._call("GET", "/get_load")

    # ------------------------------------------------------------------------------------------
    # memory (colocated training offloads the engine while it trains)

    async def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        await self._call("POST", "/release_memory_occupation", {"tags": tags}, read="none")

    async def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        await self._call("POST", "/resume_memory_occupation", {"tags": tags}, read="none")

    # ------------------------------------------------------------------------------------------
    # weight updates (each returns SGLang's {"success": ..., "message": ...})

    async def update_weights_from_disk(self, model_path: str, *, load_format: str | None = None,
                                       weight_version: str | None = None, flush_cache: bool = True,
                                       timeout_s: float = 600.0) -> dict:
        body: dict[str, Any] = {"model_path": str(model_path), "flush_cache": flush_cache}
        if load_format is not None:
            body["load_format"] = load_format
        if weight_version is not None:
            body["weight_version"] = weight_version
        return await self._call("POST", "/update_weights_from_disk", body, timeout_s=timeout_s)

    async def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                        world_size: int, *, group_name: str = DEFAULT_GROUP_NAME,
                                        backend: str = "nccl", timeout_s: float = 600.0) -> dict:
        """Ask the engine to join the trainer's weight-update group (it blocks until rank 0 joins)."""
        body = {"master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
                "world_size": world_size, "group_name": group_name, "backend": backend}
        return await self._call("POST", "/init_weights_update_group", body, timeout_s=timeout_s, resend_safe=False)

    async def destroy_weights_update_group(self, group_name: str = DEFAULT_GROUP_NAME) -> dict:
        return await self._call("POST", "/destroy_weights_update_group", {"group_name": group_name})

    async def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]], *,
                                              group_name: str = DEFAULT_GROUP_NAME, flush_cache: bool = False,
                                              weight_version: str | None = None, load_format: str | None = None,
                                              timeout_s: float = 600.0) -> dict:
        """Announce one bucket; the engine then receives each tensor by broadcast from rank 0.
        ``dtypes`` are torch names without the prefix ("float32", "bfloat16")."""
        body: dict[str, Any] = {"names": list(names), "dtypes": [str(d).replace("torch.", "") for d in dtypes],
                                "shapes": [list(s) for s in shapes], "group_name": group_name,
                                "flush_cache": flush_cache}
        if weight_version is not None:
            body["weight_version"] = weight_version
        if load_format is not None:
            body["load_format"] = load_format
        return await self._call("POST", "/update_weights_from_distributed", body, timeout_s=timeout_s,
                                resend_safe=False)

    async def update_weights_from_tensor(self, serialized_named_tensors: list[str], *, load_format: str | None = None,
                                         flush_cache: bool = False, weight_version: str | None = None,
                                         timeout_s: float = 600.0) -> dict:
        """``serialized_named_tensors``: one base64 payload per TP rank (see
        :func:`slime_ref.weights.transfer.serialize_named_tensors`)."""
        body: dict[str, Any] = {"serialized_named_tensors": list(serialized_named_tensors),
                                "load_format": load_format, "flush_cache": flush_cache}
        if weight_version is not None:
            body["weight_version"] = weight_version
        return await self._call("POST", "/update_weights_from_tensor", body, timeout_s=timeout_s)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace").strip()


def _json(url: str, raw: bytes) -> Any:
    """The answer's JSON. orjson first: a rollout's answers (11 MB for 512 x 512 tokens with log-probs)
    are parsed one after another on the rollout's event loop, and orjson takes about half the json
    module's time. Python's json reads what orjson refuses: NaN and Infinity, which the built-in
    engine's server can write."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise EngineError(url, f"answered with non-JSON: {_text(raw)[:200]!r}") from None
