"""The client's deadlines and retries against small misbehaving servers (no engine needed)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from slime_ref.rollout.sglang_client import EngineError, SGLangClient, parse_generate_response
from slime_ref.utils.net import allocate_port


async def serve(handler, path="/{tail:.*}"):
    """Start an aiohttp app on 127.0.0.1:<free port> in this loop; returns (url, runner)."""
    app = web.Application()
    app.router.add_route("*", path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = allocate_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return f"http://127.0.0.1:{port}", runner


def test_nothing_listening_is_a_named_error_after_the_retries():
    url = f"http://127.0.0.1:{allocate_port()}"

    async def go():
        async with SGLangClient(url, retries=2, backoff_s=0.01) as c:
            await c.generate([1], {"max_new_tokens": 1})

    with pytest.raises(EngineError) as err:
        asyncio.run(go())
    assert err.value.url == f"{url}/generate"
    assert "no answer after 3 attempt(s)" in str(err.value) and "cannot connect" in str(err.value)


def test_a_server_that_never_answers_fails_at_the_deadline():
    async def go():
        hung = await asyncio.start_server(lambda r, w: asyncio.sleep(3600), "127.0.0.1", 0)
        port = hung.sockets[0].getsockname()[1]
        try:
            async with SGLangClient(f"http://127.0.0.1:{port}", retries=5) as c:
                with pytest.raises(EngineError) as err:  # wait_for turns a hang into a failure
                    await asyncio.wait_for(c._call("GET", "/model_info", timeout_s=1.0), timeout=30)
                return err.value
        finally:
            hung.close()

    error = asyncio.run(go())
    assert "timed out" in str(error) and "/model_info" in str(error)


def test_server_errors_are_retried_client_errors_are_not():
    hits = {"/generate": 0, "/model_info": 0}

    async def handler(request):
        hits[request.path] += 1
        if request.path == "/generate" and hits["/generate"] < 3:
            return web.Response(status=503, text="busy")
        if request.path == "/model_info":
            return web.json_response({"error": {"message": "bad field"}}, status=400)
        return web.json_response({"text": "", "output_ids": [4], "meta_info": {
            "finish_reason": {"type": "length", "length": 1}, "output_token_logprobs": [[-0.5, 4, None]]}})

    async def go():
        url, runner = await serve(handler)
        try:
            async with SGLangClient(url, retries=3, backoff_s=0.01) as c:
                out = await c.generate([1], {"max_new_tokens": 1})
                with pytest.raises(EngineError) as err:
                    await c.get_model_info()
                return out, err.value
        finally:
            await runner.cleanup()

    out, error = asyncio.run(go())
    assert hits == {"/generate": 3, "/model_info": 1}
    assert out.output_ids == [4] and out.output_log_probs == [-0.5] and out.finish_type == "length"
    assert error.status == 400 and "bad field" in str(error)


def test_a_lost_distributed_update_is_not_sent_twice():
    hits = []

    async def handler(request):
        hits.append(request.path)
        request.transport.close()  # the engine died while handling it
        return web.Response()

    async def go():
        url, runner = await serve(handler)
        try:
            async with SGLangClient(url, retries=3, backoff_s=0.01) as c:
                with pytest.raises(EngineError) as err:
                    await c.update_weights_from_distributed(["w"], ["float32"], [[1]])
                return err.value
        finally:
            await runner.cleanup()

    error = asyncio.run(go())
    assert hits == ["/update_weights_from_distributed"] and "not retried" in str(error)


def test_flush_cache_waits_out_in_flight_requests():
    answers = iter([400, 400, 200])

    async def handler(request):
        return web.Response(status=next(answers), text="x")

    async def go():
        url, runner = await serve(handler)
        try:
            async with SGLangClient(url) as c:
                await c.flush_cache(timeout_s=10)
        finally:
            await runner.cleanup()

    asyncio.run(go())
    assert next(answers, None) is None


def test_start_profile_sends_sglangs_profile_request_once():
    """SGLang's ProfileReq fields; a start that got no answer is not sent again (a second start
    while the profiler runs is refused by SGLang)."""
    bodies = []

    async def handler(request):
        bodies.append((request.path, await request.json()))
        return web.Response(text="Start profiling.")

    async def go():
        url, runner = await serve(handler)
        try:
            async with SGLangClient(url) as c:
                await c.start_profile("/tmp/profile", 40)
        finally:
            await runner.cleanup()

    asyncio.run(go())
    assert bodies == [("/start_profile", {"output_dir": "/tmp/profile", "num_steps": 40,
                                          "activities": ["CPU", "GPU"]})]


def test_answers_are_read_as_the_servers_wrote_them():
    """orjson reads the answers; what it refuses (NaN and -Infinity, as Python's json and so the
    built-in engine's server write them) still arrives as floats, and a body that is not JSON at all
    is a named error, not a retry."""
    import math

    answers = {
        "/generate": web.Response(text='{"text": "", "output_ids": [4, 5], "meta_info": {"finish_reason": '
                                  '{"type": "length", "length": 2}, "output_token_logprobs": '
                                  '[[-Infinity, 4, null], [NaN, 5, null]]}}', content_type="application/json"),
        "/model_info": web.Response(body=b'{"model_path": "/m/\xc3\xa9", "weight_version": "3"}'),
        "/server_info": web.Response(text="<html>proxy error</html>"),
        "/get_load": web.Response(body=b"\xff\xfe not utf-8"),
    }
    hits = []

    async def handler(request):
        hits.append(request.path)
        return answers[request.path]

    async def go():
        url, runner = await serve(handler)
        try:
            async with SGLangClient(url, retries=2, backoff_s=0.01) as c:
                out = await c.generate([1], {"max_new_tokens": 2})
                info = await c.get_model_info()
                errors = []
                for call in (c.get_server_info, c.get_load):
                    with pytest.raises(EngineError) as err:
                        await call()
                    errors.append(err.value)
                return url, out, info, errors
        finally:
            await runner.cleanup()

    url, out, info, errors = asyncio.run(go())
    assert out.output_ids == [4, 5] and out.output_log_probs[0] == -math.inf and math.isnan(out.output_log_probs[1])
    assert info == {"model_path": "/m/\u00e9", "weight_version": "3"}
    assert errors[0].url == f"{url}/server_info" and "non-JSON: '<html>proxy error</html>'" in str(errors[0])
    assert errors[1].url == f"{url}/get_load" and "non-JSON" in str(errors[1])
    assert hits == ["/generate", "/model_info", "/server_info", "/get_load"]  # a 200 is not retried


def test_a_client_belongs_to_one_event_loop():
    client = SGLangClient(f"http://127.0.0.1:{allocate_port()}", retries=0)
    asyncio.run(client.health())
    with pytest.raises(RuntimeError, match="another event loop"):
        asyncio.run(client._call("GET", "/health"))


def test_parse_generate_response_without_logprobs():
    out = parse_generate_response({"text": "hi", "output_ids": [5, 6], "meta_info": {"finish_reason": {
        "type": "stop", "matched": 6}}})
    assert out.output_ids == [5, 6] and out.output_log_probs is None and out.finish_type == "stop"


def test_engine_error_survives_pickling():
    """Ray pickles an actor's exception to hand it to the caller: the engine's URL must arrive intact."""
    import pickle

    error = pickle.loads(pickle.dumps(EngineError("http://127.0.0.1:15007/pause_generation", "cannot connect", 503)))
    assert isinstance(error, EngineError)
    assert (error.url, error.message, error.status) == ("http://127.0.0.1:15007/pause_generation",
                                                        "cannot connect", 503)
    assert str(error) == "http://127.0.0.1:15007/pause_generation: cannot connect"
