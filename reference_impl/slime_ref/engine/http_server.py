"""The built-in engine's HTTP server: SGLang 0.5.15.post1's routes, request fields and responses.

Only what slime's trainer and sglang-router use is served. A request field the built-in engine does
not implement is refused by name (HTTP 400) when it is set to anything but its "off" value, so a
client never gets a silently different answer than real SGLang would give.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from slime_ref import __version__
from slime_ref.engine.model_runner import ModelRunner
from slime_ref.engine.sampling import SamplingParams
from slime_ref.engine.scheduler import Request, Scheduler, new_rid
from slime_ref.engine.script import SCRIPT_ENV, STATS_ENV, Pick, append_stats, load_script
from slime_ref.engine.weight_receive import WeightUpdateGroups, deserialize_flattened_bucket, deserialize_named_tensors

logger = logging.getLogger(__name__)

HEALTH_CHECK_TIMEOUT_S = 20.0  # SGLang's HEALTH_CHECK_TIMEOUT
HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK"
FLUSH_OK = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)

# Per route: request fields the built-in engine implements. Fields that only tune GPU behaviour and
# change nothing here (cache flushing, CUDA graphs, empty_cache) are accepted as well.
_GENERATE_FIELDS = {"rid", "text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len",
                    "top_logprobs_num", "stream", "log_metrics", "return_text_in_logprobs"}
_NO_EFFECT = {"flush_cache", "torch_empty_cache", "recapture_cuda_graph", "disable_draft_model", "http_worker_ipc"}


@dataclass
class EngineConfig:
    model_path: str
    tokenizer_path: str | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    dtype: str = "float32"
    context_length: int | None = None
    max_running_requests: int = 256
    random_seed: int = 0
    weight_version: str = "default"
    script_path: str | None = None  # scripted answers (engine.script); default: $SLIME_REF_ENGINE_SCRIPT
    script_stats_path: str | None = None  # one JSON line per finished request; default: $..._SCRIPT_STATS


class RouteError(Exception):
    """An HTTP error answer: status and message (SGLang's ``{"error": {"message": ...}}`` body)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _check_fields(body: dict[str, Any], implemented: set[str], route: str) -> None:
    for name, value in body.items():
        if name in implemented or name in _NO_EFFECT:
            continue
        if value in (None, False, 0, "", [], {}):
            continue  # a field at its "off" value changes nothing
        raise RouteError(f"{route}: field {name!r} is not implemented by the built-in engine")


def _require(body: dict[str, Any], route: str, *names: str) -> None:
    missing = [n for n in names if body.get(n) is None]
    if missing:
        raise RouteError(f"{route}: missing required field(s) {missing}")


class EngineServer:
    def __init__(self, config: EngineConfig):
        from transformers import AutoTokenizer, GenerationConfig

        from slime_ref.engine.model_runner import resolve_dtype

        self.config = config
        self.started = time.time()
        script_path = config.script_path or os.environ.get(SCRIPT_ENV) or None
        self.script = load_script(script_path) if script_path else None  # a bad file fails before the model loads
        self.script_stats_path = config.script_stats_path or os.environ.get(STATS_ENV) or None
        self._script_ids: dict[str, list[int]] = {}
        self.model_path = str(config.model_path)
        self.tokenizer_path = str(config.tokenizer_path or config.model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        self.runner = ModelRunner(config.model_path, dtype=resolve_dtype(config.dtype),
                                  max_running_requests=config.max_running_requests,
                                  context_length=config.context_length)
        eos = set()
        try:
            gen_eos = GenerationConfig.from_pretrained(config.model_path).eos_token_id
        except OSError:
            gen_eos = getattr(self.runner.config, "eos_token_id", None)
        eos.update(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.scheduler = Scheduler(self.runner, self.tokenizer, random_seed=config.random_seed,
                                   weight_version=config.weight_version, eos_token_ids=eos)
        if self.script is not None:
            self.script.served_as = self._served_as
            for entry in self.script.entries:
                for turn in {t for response in entry.responses for t in response}:
                    if self._served_as(turn) != turn:
                        logger.warning("script turn %r comes out as %r: the tokenizer cannot spell it", turn,
                                       self._served_as(turn))
        # what ends a scripted answer: the tokenizer's eos, else one the generation config names
        self.script_eos = self.tokenizer.eos_token_id
        if self.script_eos is None:
            self.script_eos = min(eos, default=None)
        self.groups = WeightUpdateGroups()

    # ------------------------------------------------------------------------------------------
    # app

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30)
        routes: list[tuple[tuple[str, ...], str, Callable[[web.Request], Awaitable[web.StreamResponse]]]] = [
            (("POST", "PUT"), "/generate", self.generate),
            (("GET",), "/health", self.health),
            (("GET",), "/health_generate", self.health_generate),
            (("GET",), "/model_info", self.model_info),
            (("GET",), "/get_model_info", self.model_info),
            (("GET",), "/server_info", self.server_info),
            (("GET",), "/get_server_info", self.server_info),
            (("GET",), "/get_load", self.get_load),
            (("GET", "POST"), "/flush_cache", self.flush_cache),
            (("GET", "POST"), "/freeze_gc", self.freeze_gc),
            (("POST",), "/abort_request", self.abort_request),
            (("POST",), "/pause_generation", self.pause_generation),
            (("POST",), "/continue_generation", self.continue_generation),
            (("GET", "POST"), "/release_memory_occupation", self.release_memory_occupation),
            (("GET", "POST"), "/resume_memory_occupation", self.resume_memory_occupation),
            (("POST",), "/update_weights_from_disk", self.update_weights_from_disk),
            (("POST",), "/init_weights_update_group", self.init_weights_update_group),
            (("POST",), "/destroy_weights_update_group", self.destroy_weights_update_group),
            (("POST",), "/update_weights_from_distributed", self.update_weights_from_distributed),
            (("POST",), "/update_weights_from_tensor", self.update_weights_from_tensor),
        ]
        for methods, path, handler in routes:
            for method in methods:
                app.router.add_route(method, path, self._guarded(handler))
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self.loop = asyncio.get_running_loop()
        self.scheduler.start()
        logger.info("built-in engine serving %s at http://%s:%d", self.model_path, self.config.host,
                    self.config.port)

    async def _on_cleanup(self, app: web.Application) -> None:
        self.scheduler.stop()

    @staticmethod
    def _guarded(handler):
        async def wrapped(request: web.Request) -> web.StreamResponse:
            try:
                return await handler(request)
            except RouteError as e:
                return web.json_response({"error": {"message": str(e)}}, status=e.status)
        return wrapped

    @staticmethod
    async def _body(request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as e:
            raise RouteError(f"{request.path}: the body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise RouteError(f"{request.path}: the body must be a JSON object")
        return body

    async def _on_scheduler(self, fn: Callable[[], Any], *, exclusive: bool = False) -> Any:
        """Run ``fn`` on the scheduler thread between steps and await its result."""
        future = self.loop.create_future()

        def done(result, error):
            def settle():
                if future.done():
                    return
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(result)
            self.loop.call_soon_threadsafe(settle)

        self.scheduler.control(fn, done, exclusive=exclusive)
        return await future

    # ------------------------------------------------------------------------------------------
    # generation

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        _check_fields(body, _GENERATE_FIELDS, "/generate")
        if body.get("stream"):
            raise RouteError("/generate: stream=true is not implemented by the built-in engine")
        if body.get("top_logprobs_num") or body.get("return_text_in_logprobs"):
            raise RouteError("/generate: top_logprobs_num and return_text_in_logprobs are not implemented "
                             "by the built-in engine")
        prompts = self._prompts(body)
        batched = isinstance(prompts, list) and prompts and isinstance(prompts[0], list)
        items = prompts if batched else [prompts]

        def pick(name, i, default=None):
            value = body.get(name, default)
            return value[i] if batched and isinstance(value, list) and name != "input_ids" else value

        requests = [self._request(ids, pick("sampling_params", i), bool(pick("return_logprob", i, False)),
                                  pick("logprob_start_len", i), pick("rid", i))
                    for i, ids in enumerate(items)]
        self.scheduler.submit_many([req for req, _ in requests])  # a batch is admitted together
        outs = await asyncio.gather(*(self._result(req, future) for req, future in requests))
        for out in outs:
            reason = out.get("meta_info", {}).get("finish_reason") or {}
            if reason.get("type") == "abort" and reason.get("status_code") in (500, 503):
                raise RouteError(reason["message"], status=reason["status_code"])
        return web.json_response(outs if batched else outs[0])

    def _prompts(self, body: dict[str, Any]):
        if body.get("input_ids") is not None and body.get("text") is not None:
            raise RouteError("/generate: give either input_ids or text, not both")
        if body.get("input_ids") is not None:
            return body["input_ids"]
        if body.get("text") is not None:
            text = body["text"]
            if isinstance(text, list):
                return [self.tokenizer.encode(t) for t in text]
            return self.tokenizer.encode(text)
        raise RouteError("/generate: either input_ids or text is required")

    async def _generate_one(self, input_ids, raw_params, return_logprob, logprob_start_len, rid) -> dict:
        req, future = self._request(input_ids, raw_params, return_logprob, logprob_start_len, rid)
        self.scheduler.submit(req)
        return await self._result(req, future)

    def _request(self, input_ids, raw_params, return_logprob, logprob_start_len, rid) -> tuple[Request, asyncio.Future]:
        """A checked scheduler request and the future its result lands in (RouteError if invalid)."""
        if not isinstance(input_ids, list) or not input_ids or not all(isinstance(t, int) for t in input_ids):
            raise RouteError("/generate: input_ids must be a non-empty list of token ids")
        bad = [t for t in input_ids if not 0 <= t < self.runner.vocab_size]
        if bad:
            raise RouteError(f"/generate: token id(s) {bad[:5]} are outside the vocabulary (size "
                             f"{self.runner.vocab_size})")
        try:
            params = SamplingParams.from_request(raw_params)
        except (ValueError, TypeError) as e:
            raise RouteError(f"/generate: {e}") from None
        future = self.loop.create_future()
        rid = rid or new_rid()
        pick = self._script_pick(input_ids, params, rid)

        def on_finish(result):
            if pick is not None and self.script_stats_path and "error" not in result:
                append_stats(self.script_stats_path, pick.stats())
            self.loop.call_soon_threadsafe(lambda: None if future.done() else future.set_result(result))

        req = Request(
            rid=rid, input_ids=list(input_ids), params=params, return_logprob=return_logprob,
            logprob_start_len=-1 if logprob_start_len is None else int(logprob_start_len),
            rng=self.scheduler.new_rng(params.sampling_seed), on_finish=on_finish,
            forced_ids=self._scripted_ids(pick.text) if pick is not None and pick.scripted else None,
        )
        return req, future

    def _script_pick(self, input_ids: list[int], params: SamplingParams, rid: str) -> Pick | None:
        """The script's choice for a request (engine.script); None for requests the script and its
        stats leave alone (health checks, or no script and no stats file)."""
        if rid.startswith(HEALTH_CHECK_RID_PREFIX) or (self.script is None and not self.script_stats_path):
            return None
        if self.script is None or params.max_new_tokens == 0:  # prompt scoring has nothing to answer
            return Pick()
        return self.script.pick(self.tokenizer.decode(input_ids, skip_special_tokens=False))

    def _served_as(self, text: str) -> str:
        """A scripted turn's text as a prompt holds it once served: its tokens decoded."""
        return self.tokenizer.decode(self.tokenizer.encode(text, add_special_tokens=False), skip_special_tokens=False)

    def _scripted_ids(self, text: str) -> list[int]:
        """The tokens a scripted turn is forced as: the text without special tokens, then eos."""
        if text not in self._script_ids:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            self._script_ids[text] = ids + ([self.script_eos] if self.script_eos is not None else [])
        return self._script_ids[text]

    async def _result(self, req: Request, future: asyncio.Future) -> dict:
        try:
            result = await future
        except asyncio.CancelledError:  # the client went away: stop generating for it
            self.scheduler.abort(req.rid)
            raise
        if "error" in result:
            raise RouteError(f"/generate: {result['error']}")
        return result

    async def abort_request(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        _check_fields(body, {"rid", "abort_all", "finished_reason", "abort_message"}, "/abort_request")
        if not body.get("abort_all") and not body.get("rid"):
            return web.Response(status=200)  # SGLang ignores an empty rid without abort_all
        self.scheduler.abort(body.get("rid") or "", bool(body.get("abort_all")))
        return web.Response(status=200)

    async def pause_generation(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        _check_fields(body, {"mode", "rid"}, "/pause_generation")
        mode = body.get("mode") or "abort"
        try:
            await self._on_scheduler(lambda: self.scheduler.pause(mode))
        except ValueError as e:
            raise RouteError(f"/pause_generation: {e}") from None
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        _check_fields(body, {"rid"}, "/continue_generation")
        await self._on_scheduler(self.scheduler.resume)
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def freeze_gc(self, request: web.Request) -> web.StreamResponse:
        # SGLang's route: what this process holds leaves the garbage collector's walks
        gc.freeze()
        return web.Response(text="Garbage collection frozen.\n", status=200)

    async def flush_cache(self, request: web.Request) -> web.StreamResponse:
        def check_idle():
            load = self.scheduler.load()
            return load["num_running_reqs"] + load["num_waiting_reqs"]

        pending = await self._on_scheduler(check_idle)
        if pending:
            return web.Response(text=f"Cache not flushed: {pending} requests are running or waiting.\n", status=400)
        return web.Response(text=FLUSH_OK, status=200)

    # ------------------------------------------------------------------------------------------
    # health and info

    async def health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.StreamResponse:
        try:
            await asyncio.wait_for(
                self._generate_one([0], {"max_new_tokens": 1, "temperature": 0.0}, False, None,
                                   f"{HEALTH_CHECK_RID_PREFIX}_{new_rid()}"),
                timeout=HEALTH_CHECK_TIMEOUT_S,
            )
        except (asyncio.TimeoutError, RouteError):
            return web.Response(status=503)
        return web.Response(status=200)

    async def model_info(self, request: web.Request) -> web.StreamResponse:
        cfg = self.runner.config
        return web.json_response({
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.scheduler.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": getattr(cfg, "model_type", None),
            "architectures": getattr(cfg, "architectures", None),
        })

    async def server_info(self, request: web.Request) -> web.StreamResponse:
        c = self.config
        load = self.scheduler.load()
        return web.json_response({
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path,
            "host": c.host,
            "port": c.port,
            "dtype": c.dtype,
            "context_length": self.runner.context_length,
            "max_running_requests": c.max_running_requests,
            "random_seed": c.random_seed,
            "weight_version": self.scheduler.weight_version,
            "tp_size": 1,
            "dp_size": 1,
            "pp_size": 1,
            "skip_tokenizer_init": False,
            "served_model_name": self.model_path,
            "internal_states": [{
                **load,
                # The built-in engine's own counters (tests use them to see where requests went).
                "num_finished_reqs": self.scheduler.num_finished,
                "num_generated_tokens": self.scheduler.num_generated_tokens,
                "paused": self.scheduler.paused,
            }],
            "version": f"slime-ref-builtin-{__version__}",
            "kv_events": None,
        })

    async def get_load(self, request: web.Request) -> web.StreamResponse:
        """SGLang's /get_load (deprecated there in favour of /v1/loads, still served): one entry per DP
        rank. ``num_tokens`` counts the KV tokens the running requests hold plus the waiting requests'
        tokens, so it grows by one with each token a running request generates."""
        load = self.scheduler.load()
        pending = load["num_pending_tokens"]
        return web.json_response([{
            "dp_rank": 0,
            "num_reqs": load["num_running_reqs"] + load["num_waiting_reqs"],
            "num_waiting_reqs": load["num_waiting_reqs"],
            "num_tokens": load["num_used_tokens"] + pending,
            "num_pending_tokens": pending,
            "ts_tic": time.perf_counter(),
        }])

    # ------------------------------------------------------------------------------------------
    # memory

    async def release_memory_occupation(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        _check_fields(body, {"tags", "rid"}, "/release_memory_occupation")
        tags = body.get("tags")

        def release():
            self.scheduler.retract_running()  # paused in-place requests lose their keys: recompute later
            self.runner.free_kv_pool()

        if tags is None or "kv_cache" in tags:
            await self._on_scheduler(release, exclusive=True)
        return web.json_response(None)

    async def resume_memory_occupation(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        _check_fields(body, {"tags", "rid"}, "/resume_memory_occupation")
        tags = body.get("tags")

        def resume():
            if (tags is None or "kv_cache" in tags) and not self.runner.kv_pool_allocated:
                self.runner.allocate_kv_pool()

        await self._on_scheduler(resume, exclusive=True)
        return web.json_response(None)

    # ------------------------------------------------------------------------------------------
    # weight updates

    async def _apply_update(self, body: dict[str, Any], load: Callable[[], Any], ok_message: str,
                            extra: dict[str, Any] | None = None) -> web.StreamResponse:
        """Abort (if asked), run ``load`` on the idle model, bump the weight version; SGLang's answer."""
        if body.get("abort_all_requests"):
            self.scheduler.abort("", abort_all=True)

        def update():
            load()
            if body.get("weight_version") is not None:
                self.scheduler.weight_version = str(body["weight_version"])

        try:
            await self._on_scheduler(update, exclusive=True)
        except Exception as e:
            logger.error("weight update failed: %s", e)
            return web.json_response({"success": False, "message": f"Failed to update weights: {e}", **(extra or {})},
                                     status=400)
        return web.json_response({"success": True, "message": ok_message, **(extra or {})})

    async def update_weights_from_disk(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        _check_fields(body, {"model_path", "load_format", "abort_all_requests", "weight_version", "keep_pause"},
                      "/update_weights_from_disk")
        _require(body, "/update_weights_from_disk", "model_path")
        if body.get("load_format") not in (None, "auto", "safetensors"):
            raise RouteError(f"/update_weights_from_disk: load_format {body['load_format']!r} is not implemented "
                             "by the built-in engine (it reads safetensors)")
        path = str(body["model_path"])

        def load():
            self.runner.load_from_disk(path)
            self.model_path = path

        message = "Succeeded to update model weights."
        if body.get("weight_version") is not None:
            message += f" Weight version updated to {body['weight_version']}."
        return await self._apply_update(body, load, message, extra={"num_paused_requests": 0})

    async def init_weights_update_group(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        fields = {"master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"}
        _check_fields(body, fields, "/init_weights_update_group")
        _require(body, "/init_weights_update_group", "master_address", "master_port", "rank_offset", "world_size")
        backend = body.get("backend") or "nccl"
        if backend != "gloo":
            return web.json_response({"success": False, "message": f"Failed to initialize custom process group: "
                                      f"backend {backend!r} needs GPUs; the built-in engine runs on CPU, use 'gloo'."},
                                     status=400)
        try:
            await asyncio.to_thread(
                self.groups.init, master_address=str(body["master_address"]), master_port=int(body["master_port"]),
                rank_offset=int(body["rank_offset"]), world_size=int(body["world_size"]),
                group_name=body.get("group_name") or "weight_update_group", backend=backend,
            )
        except Exception as e:
            return web.json_response({"success": False, "message": f"Failed to initialize custom process group: {e}."},
                                     status=400)
        return web.json_response({"success": True, "message": "Succeeded to initialize custom process group."})

    async def destroy_weights_update_group(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        _check_fields(body, {"group_name", "rid"}, "/destroy_weights_update_group")
        try:
            await asyncio.to_thread(self.groups.destroy, body.get("group_name") or "weight_update_group")
        except Exception as e:
            return web.json_response({"success": False, "message": str(e)}, status=400)
        return web.json_response({"success": True, "message": "Succeeded to destroy custom process group."})

    async def update_weights_from_distributed(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        fields = {"names", "dtypes", "shapes", "group_name", "abort_all_requests", "weight_version", "load_format"}
        _check_fields(body, fields, "/update_weights_from_distributed")
        _require(body, "/update_weights_from_distributed", "names", "dtypes", "shapes")
        if body.get("load_format") is not None:
            raise RouteError(f"/update_weights_from_distributed: load_format {body['load_format']!r} is not "
                             "implemented by the built-in engine (send one broadcast per tensor)")
        group_name = body.get("group_name") or "weight_update_group"

        def load():
            named = self.groups.receive(body["names"], body["dtypes"], body["shapes"], group_name)
            self.runner.load_named_tensors(named)

        return await self._apply_update(body, load, "Succeeded to update parameter online.")

    async def update_weights_from_tensor(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        fields = {"serialized_named_tensors", "load_format", "abort_all_requests", "weight_version"}
        _check_fields(body, fields, "/update_weights_from_tensor")
        _require(body, "/update_weights_from_tensor", "serialized_named_tensors")
        payloads = body["serialized_named_tensors"]
        if not isinstance(payloads, list) or not payloads:
            raise RouteError("/update_weights_from_tensor: serialized_named_tensors must be a list with one "
                             "entry per TP rank")
        load_format = body.get("load_format")
        if load_format not in (None, "flattened_bucket"):
            raise RouteError(f"/update_weights_from_tensor: load_format {load_format!r} is not implemented by the "
                             "built-in engine (send [(name, tensor), ...] or a flattened bucket)")
        decode = deserialize_flattened_bucket if load_format == "flattened_bucket" else deserialize_named_tensors

        def load():
            self.runner.load_named_tensors(decode(payloads[0]))  # the built-in engine is TP 1

        return await self._apply_update(body, load, "Success")


class _QuietHttp2Probes(logging.Filter):
    """sglang-router opens two HTTP/2 prior-knowledge connections per worker on registration (to
    detect gRPC workers). aiohttp answers them with 400 and closes, which is what the router expects;
    this keeps each from logging a traceback at ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and "PRI" in str(error):
            logger.debug("refused an HTTP/2 prior-knowledge probe (HTTP/1.1 only)")
            return False
        return True


def serve(config: EngineConfig) -> None:
    """Build the engine and serve until SIGINT/SIGTERM."""
    logging.getLogger("aiohttp.server").addFilter(_QuietHttp2Probes())
    server = EngineServer(config)
    web.run_app(server.app(), host=config.host, port=config.port, print=None, access_log=None,
                handle_signals=True, shutdown_timeout=5.0)
