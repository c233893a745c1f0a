"""Protocol conformance with SGLang 0.5.15.post1.

(a) Every route, HTTP method and request field the client sends exists in SGLang's source (read from
    its wheel with ast; nothing is imported).
(b) The built-in engine answers every route the client uses, with the response fields SGLang gives.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from pathlib import Path

import pytest

from _engines import InProcessEngine
from _sglang_source import SGLANG_META_INFO_KEYS, SGLANG_VERSION, fetch_wheel, parse_wheel
from slime_ref.engine.sampling import SamplingParams
from slime_ref.rollout.servers import RolloutServers
from slime_ref.rollout.sglang_client import SAMPLING_PARAM_NAMES, EngineError, SGLangClient

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "gpu"))
from sglang_recipes import SGLANG_CUDA_GRAPH_FLAGS, SGLANG_OFFLINE_GPU_FLAGS  # noqa: E402

# One call per public client method, with arguments that exercise every field it can send.
CLIENT_CALLS = {
    "generate": dict(input_ids=[1, 2, 3], sampling_params={n: None for n in SAMPLING_PARAM_NAMES},
                     return_logprob=True, logprob_start_len=0, rid="r1"),
    "generate_batch": dict(input_ids=[[1, 2, 3], [4, 5]], sampling_params={n: None for n in SAMPLING_PARAM_NAMES},
                           return_logprob=True),
    "abort_request": dict(rid="r1", abort_all=True),
    "pause_generation": dict(mode="retract"),
    "continue_generation": dict(),
    "flush_cache": dict(),
    "freeze_gc": dict(),
    "health": dict(),
    "health_generate": dict(),
    "wait_healthy": dict(timeout_s=5),
    "get_model_info": dict(),
    "get_server_info": dict(),
    "get_load": dict(),
    "start_profile": dict(output_dir="/tmp/profile", num_steps=40, activities=("CPU", "GPU")),
    "release_memory_occupation": dict(tags=["kv_cache"]),
    "resume_memory_occupation": dict(tags=["kv_cache"]),
    "update_weights_from_disk": dict(model_path="/m", load_format="auto", weight_version="2", flush_cache=True),
    "init_weights_update_group": dict(master_address="127.0.0.1", master_port=1, rank_offset=1, world_size=2,
                                      group_name="g", backend="gloo"),
    "destroy_weights_update_group": dict(group_name="g"),
    "update_weights_from_distributed": dict(names=["w"], dtypes=["float32"], shapes=[[1]], group_name="g",
                                            flush_cache=True, weight_version="2", load_format="flattened_bucket"),
    "update_weights_from_tensor": dict(serialized_named_tensors=["eA=="], load_format="direct", flush_cache=True,
                                       weight_version="2"),
}


@pytest.fixture(scope="module")
def sglang():
    wheel, why = fetch_wheel()
    if wheel is None:
        pytest.skip(f"cannot obtain the sglang {SGLANG_VERSION} wheel to read its source: {why}")
    return parse_wheel(wheel)


def _recorded_calls() -> list[tuple[str, str, dict]]:
    """Run every public client method against a recorder instead of the network."""
    calls: list[tuple[str, str, dict]] = []
    client = SGLangClient("http://engine.invalid")

    async def record(method, route, body=None, **_):
        calls.append((method, route, dict(body or {})))
        answer = {"success": True, "meta_info": {"finish_reason": {}}}
        batch = (body or {}).get("input_ids")
        return [answer] * len(batch) if batch and isinstance(batch[0], list) else answer  # one per batched entry

    client._call = record
    public = {name for name, fn in inspect.getmembers(SGLangClient, inspect.iscoroutinefunction)
              if not name.startswith("_") and name not in ("close",)}
    assert public == set(CLIENT_CALLS), f"cover every client method in CLIENT_CALLS: {public ^ set(CLIENT_CALLS)}"

    async def run_all():
        for name, kwargs in CLIENT_CALLS.items():
            await getattr(client, name)(**kwargs)

    asyncio.run(run_all())
    return calls


def test_client_routes_methods_and_fields_exist_in_sglang(sglang):
    calls = _recorded_calls()
    assert {route for _, route, _ in calls} == {
        "/generate", "/abort_request", "/pause_generation", "/continue_generation", "/flush_cache", "/health",
        "/health_generate", "/model_info", "/server_info", "/get_load", "/release_memory_occupation",
        "/resume_memory_occupation", "/update_weights_from_disk", "/init_weights_update_group",
        "/destroy_weights_update_group", "/update_weights_from_distributed", "/update_weights_from_tensor",
        "/start_profile", "/freeze_gc",
    }
    for method, route, body in calls:
        assert route in sglang.routes, f"{route} is not a route of SGLang {SGLANG_VERSION}"
        spec = sglang.routes[route]
        assert method in spec.methods, f"{method} {route}: SGLang accepts {sorted(spec.methods)}"
        if body:
            assert spec.request_class, f"{route} takes no body in SGLang"
            unknown = set(body) - sglang.classes[spec.request_class]
            assert not unknown, f"{route}: {sorted(unknown)} not in SGLang's {spec.request_class}"


def test_sampling_params_exist_in_sglang_and_the_builtin_engine(sglang):
    assert set(SAMPLING_PARAM_NAMES) <= sglang.sampling_fields
    # The built-in engine accepts each of them (a value that changes nothing is enough here).
    params = SamplingParams.from_request({n: None for n in SAMPLING_PARAM_NAMES})
    assert params.max_new_tokens is None and params.top_k == -1
    # ... and refuses by name what SGLang has but it does not implement.
    with pytest.raises(ValueError, match="frequency_penalty"):
        SamplingParams.from_request({"frequency_penalty": 0.5})
    with pytest.raises(ValueError, match="unknown sampling parameter"):
        SamplingParams.from_request({"temprature": 0.5})


def test_flags_the_launcher_gives_real_sglang_are_server_args(sglang, tiny, tmp_path):
    flags = [*SGLANG_OFFLINE_GPU_FLAGS, *SGLANG_CUDA_GRAPH_FLAGS[True], *SGLANG_CUDA_GRAPH_FLAGS[False],
             "--sglang-dtype", "bfloat16", "--sglang-skip-tokenizer-init"]
    servers = RolloutServers(tiny.model_dir, log_dir=tmp_path, engine="sglang", sglang_flags=flags)
    command = servers._engine_command(0, 30000)
    names = [token[2:].replace("-", "_") for token in command[3:] if token.startswith("--")]
    unknown = sorted(set(names) - sglang.server_args)
    assert not unknown, f"not SGLang {SGLANG_VERSION} server arguments: {unknown}"


def test_router_probe_routes_exist_in_sglang(sglang):
    # sglang-router calls these on registration (cpu-feasibility notes, section 4).
    for route in ("/health", "/health_generate", "/model_info", "/get_model_info", "/server_info", "/get_server_info"):
        assert "GET" in sglang.routes[route].methods


@pytest.fixture(scope="module")
def engine(tiny):
    with InProcessEngine(tiny.model_dir, max_running_requests=8) as e:
        yield e


def test_builtin_engine_answers_with_sglang_fields(sglang, engine, tiny):
    keys = sglang.handler_dict_keys

    async def run():
        async with SGLangClient(engine.url, retries=0) as c:
            out = await c.generate([1, 5, 7], {"max_new_tokens": 3, "temperature": 1.0}, logprob_start_len=0)
            assert set(out.meta_info) >= SGLANG_META_INFO_KEYS
            assert out.meta_info["output_token_logprobs_length"] == len(out.output_ids) == 3
            assert [e[1] for e in out.meta_info["input_token_logprobs"]] == [1, 5, 7]
            assert out.meta_info["input_token_logprobs"][0] == [None, 1, None]
            raw = await c._call("POST", "/generate", {"input_ids": [1, 5], "sampling_params": {"max_new_tokens": 2}})
            assert set(raw) == {"text", "output_ids", "meta_info"} and "output_token_logprobs" not in raw["meta_info"]

            assert set(await c.get_model_info()) == keys["model_info"]
            assert set(await c._call("GET", "/get_model_info")) == keys["model_info"]
            info = await c.get_server_info()
            assert set(info) - {"internal_states", "version", "kv_events"} <= sglang.server_args
            assert {"model_path", "tp_size", "dp_size", "served_model_name"} <= set(info)  # what the router reads
            load = await c.get_load()
            assert [set(rank) for rank in load] == [keys["get_load"]] and load[0]["num_reqs"] == 0
            assert await c.health() and await c.health_generate()
            await c.flush_cache()
            assert set(await c.pause_generation("in_place")) == keys["pause_generation"]
            assert set(await c.continue_generation()) == keys["continue_generation"]
            await c.abort_request(rid="nothing-running")
            await c.release_memory_occupation()
            await c.resume_memory_occupation()

            answer = await c.update_weights_from_disk(str(tiny.model_dir), weight_version="w2")
            assert set(answer) == keys["update_weights_from_disk"] and answer["success"]
            # Failures carry SGLang's {"success": false, "message": ...} with HTTP 400.
            for call, route_keys in [
                (c.init_weights_update_group("127.0.0.1", 1, 1, 2, backend="nccl"), "init_weights_update_group"),
                (c.update_weights_from_distributed(["x"], ["float32"], [[1]], group_name="none"),
                 "update_weights_from_distributed"),
                (c.destroy_weights_update_group("none"), "destroy_weights_update_group"),
                (c.update_weights_from_tensor(["eA=="]), "update_weights_from_tensor"),
            ]:
                with pytest.raises(EngineError) as err:
                    await call
                assert err.value.status == 400 and '"success": false' in str(err.value)
                assert keys[route_keys] >= {"success", "message"}

    asyncio.run(run())


def test_builtin_engine_freezes_its_garbage_collector_as_sglang_does(engine, monkeypatch):
    """/freeze_gc answers as SGLang's does; the engine here runs in pytest's process, so the freeze
    itself is recorded rather than done."""
    import gc

    frozen = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(True))

    async def run():
        async with SGLangClient(engine.url, retries=0) as c:
            await c.freeze_gc()
            return await c._call("GET", "/freeze_gc", read="text")

    assert asyncio.run(run()) == "Garbage collection frozen.\n" and frozen == [True, True]
