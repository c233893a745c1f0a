"""End to end on CPU: built-in engines behind the real sglang-router, weight updates, dead engines."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from _engines import wait_in_flight
from _reference import hf_logprobs, perturbed_model
from slime_ref.errors import UserError
from slime_ref.rollout.servers import RolloutServers, passthrough_flags
from slime_ref.rollout.sglang_client import EngineError, SGLangClient
from slime_ref.utils.net import allocate_port
from slime_ref.weights import transfer as weight_transfer

SEQUENCE = [1, 9, 12, 30, 4, 7, 40, 41, 5, 3, 22, 17]


@pytest.fixture(scope="module")
def servers(tiny, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("logs")
    with RolloutServers(tiny.model_dir, log_dir=log_dir, num_engines=2) as s:
        pids = [p.pid for p in s.engines] + [s.router.pid]
        yield s
    assert not any(_alive(pid) for pid in pids)  # stop() ended every process it started


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def finished_per_engine(urls):
    async def go():
        counts = []
        for url in urls:
            async with SGLangClient(url) as c:
                counts.append((await c.get_server_info())["internal_states"][0]["num_finished_reqs"])
        return counts

    return asyncio.run(go())


def test_router_spreads_256_concurrent_requests_round_robin(servers, tiny):
    before = finished_per_engine(servers.engine_urls)

    async def go():
        async with SGLangClient(servers.router_url) as c:
            return await asyncio.gather(*[
                c.generate(SEQUENCE[: 3 + i % 5], {"temperature": 1.0, "max_new_tokens": 8, "ignore_eos": True,
                                                   "sampling_seed": i})
                for i in range(256)
            ])

    outs = asyncio.run(go())
    after = finished_per_engine(servers.engine_urls)
    assert [b - a for a, b in zip(before, after)] == [128, 128]
    assert all(len(o.output_ids) == len(o.output_log_probs) == 8 for o in outs)
    model = AutoModelForCausalLM.from_pretrained(tiny.model_dir, dtype=torch.float32)
    for i in (0, 1, 101, 255):  # both engines' answers equal the trainer's numbers
        prompt = SEQUENCE[: 3 + i % 5]
        expected = hf_logprobs(model, prompt + outs[i].output_ids)[len(prompt) - 1:]
        assert (torch.tensor(outs[i].output_log_probs) - expected).abs().max().item() < 1e-5


def _scores(urls, weight_version):
    """Each engine's log-probs of SEQUENCE (prompt scoring through /generate) and its weight version."""
    async def go():
        out = []
        for url in urls:
            async with SGLangClient(url) as c:
                res = await c.generate(SEQUENCE, {"max_new_tokens": 0}, logprob_start_len=0)
                assert res.meta_info["weight_version"] == weight_version
                out.append(torch.tensor(res.input_log_probs[1:]))
        return out

    return asyncio.run(go())


def _assert_engines_score_like(urls, model, old, weight_version):
    expected = hf_logprobs(model, SEQUENCE)
    assert (expected - old).abs().max().item() > 1e-2  # the update changes the numbers ...
    for scores in _scores(urls, weight_version):
        assert (scores - expected).abs().max().item() < 1e-5  # ... to exactly the new weights'


def test_three_weight_updates_reach_every_engine_exactly(servers, tiny, tmp_path):
    urls = servers.engine_urls
    original = AutoModelForCausalLM.from_pretrained(tiny.model_dir, dtype=torch.float32)
    current = hf_logprobs(original, SEQUENCE)

    async def on_engines(fn):
        clients = [SGLangClient(u) for u in urls]
        try:
            return await fn(clients)
        finally:
            for c in clients:
                await c.close()

    # 1. from disk: an HF safetensors directory
    model = perturbed_model(tiny.model_dir, seed=1)
    model.save_pretrained(tmp_path / "step1")

    async def disk(clients):
        for c in clients:
            assert (await c.update_weights_from_disk(str(tmp_path / "step1"), weight_version="1"))["success"]
            assert (await c.get_model_info())["model_path"] == str(tmp_path / "step1")

    asyncio.run(on_engines(disk))
    _assert_engines_score_like(urls, model, current, "1")
    current = hf_logprobs(model, SEQUENCE)

    # 2. distributed: trainer rank 0 broadcasts over a gloo group, in several buckets
    model = perturbed_model(tiny.model_dir, seed=2)

    async def distributed(clients):
        group = await weight_transfer.connect_engines(clients, master_address="127.0.0.1", master_port=allocate_port(),
                                                      backend="gloo")
        sent = await weight_transfer.broadcast_named_tensors(group, clients, model.named_parameters(),
                                                             weight_version="2", bucket_bytes=300_000)
        await weight_transfer.disconnect_engines(group, clients)
        return sent

    assert asyncio.run(on_engines(distributed)) == len(list(model.parameters()))
    _assert_engines_score_like(urls, model, current, "2")
    current = hf_logprobs(model, SEQUENCE)

    # 3. tensor handles: shared-memory tensors, only handles over HTTP
    model = perturbed_model(tiny.model_dir, seed=3)
    asyncio.run(on_engines(lambda clients: weight_transfer.push_tensors(clients, model.named_parameters(),
                                                                        weight_version="3")))
    _assert_engines_score_like(urls, model, current, "3")

    # Sampled tokens after the updates carry the new weights' log-probs too.
    async def sample():
        async with SGLangClient(servers.router_url) as c:
            return await c.generate(SEQUENCE[:4], {"temperature": 0.8, "max_new_tokens": 10, "ignore_eos": True})

    out = asyncio.run(sample())
    with torch.inference_mode():
        logits = model(torch.tensor([SEQUENCE[:4] + out.output_ids])).logits[0].float()
    expected = torch.log_softmax(logits / 0.8, dim=-1)[3:-1].gather(1, torch.tensor(out.output_ids)[:, None])[:, 0]
    assert (torch.tensor(out.output_log_probs) - expected).abs().max().item() < 1e-5


def test_a_flattened_bucket_loads_exactly_what_per_tensor_handles_load(servers, tiny):
    urls = servers.engine_urls
    named = [(n, p.detach()) for n, p in perturbed_model(tiny.model_dir, seed=4).named_parameters()]
    other = [(n, p.detach()) for n, p in perturbed_model(tiny.model_dir, seed=5).named_parameters()]

    def push(tensors, version, flattened):
        async def go():
            clients = [SGLangClient(u) for u in urls]
            try:
                if flattened:
                    payload, keepalive = weight_transfer.serialize_flattened_bucket(tensors)
                    await weight_transfer.push_serialized(clients, payload, load_format="flattened_bucket",
                                                          weight_version=version)
                else:
                    await weight_transfer.push_tensors(clients, tensors, weight_version=version)
            finally:
                for c in clients:
                    await c.close()

        asyncio.run(go())

    push(named, "per-tensor", flattened=False)
    per_tensor = _scores(urls, "per-tensor")
    push(other, "other", flattened=True)
    assert not torch.equal(_scores(urls, "other")[0], per_tensor[0])
    push(named, "flattened", flattened=True)
    for a, b in zip(per_tensor, _scores(urls, "flattened")):
        assert torch.equal(a, b)


def test_bad_weight_updates_are_refused_and_change_nothing(servers, tiny, tmp_path):
    url = servers.engine_urls[0]

    async def go():
        async with SGLangClient(url) as c:
            before = await c.generate(SEQUENCE, {"max_new_tokens": 0}, logprob_start_len=0)
            wrong = [("model.layers.0.mlp.up_proj.weight", torch.zeros(3, 3)), ("model.norm.weight", torch.ones(128))]
            errors = []
            payload, keepalive = weight_transfer.serialize_flattened_bucket(wrong)
            for call in (weight_transfer.push_tensors([c], wrong),
                         c.update_weights_from_disk(str(tmp_path / "missing")),
                         weight_transfer.push_serialized([c], payload, load_format="flattened_bucket")):
                with pytest.raises(EngineError) as err:
                    await call
                errors.append(str(err.value))
            after = await c.generate(SEQUENCE, {"max_new_tokens": 0}, logprob_start_len=0)
            return before, after, errors

    before, after, errors = asyncio.run(go())
    assert "has shape (3, 3), the model expects (384, 128)" in errors[0]
    assert "no *.safetensors files" in errors[1]
    assert "has shape (3, 3), the model expects (384, 128)" in errors[2]
    assert before.input_log_probs == after.input_log_probs


@pytest.mark.slow
def test_a_killed_engine_is_a_clear_error_not_a_hang(tiny, tmp_path):
    with RolloutServers(tiny.model_dir, log_dir=tmp_path, num_engines=2) as s:
        pids = [p.pid for p in s.engines] + [s.router.pid]
        dead_url = s.engine_urls[1]

        async def go():
            async with SGLangClient(dead_url, generate_timeout_s=30) as direct, SGLangClient(s.router_url) as router:
                long = {"temperature": 1.0, "max_new_tokens": 400, "ignore_eos": True}
                for _ in range(3):
                    on_engine = asyncio.create_task(direct.generate(SEQUENCE, long))
                    await wait_in_flight(direct, len(SEQUENCE) + 1)  # generating on the engine to be killed
                    await direct.pause_generation("in_place")  # frozen mid-generation: it cannot finish now
                    if (await direct.get_load())[0]["num_reqs"] == 1:
                        break
                    await direct.continue_generation()  # it finished before the pause: try again
                    await on_engine
                else:
                    raise AssertionError("the request always finished before the pause")
                via_router = [asyncio.create_task(router.generate(SEQUENCE, long)) for _ in range(4)]
                # round robin: two of them wait on the paused engine, to be rerouted when it dies
                deadline = time.monotonic() + 60
                while (await direct.get_load())[0]["num_reqs"] < 3:
                    assert time.monotonic() < deadline, "the router sent nothing to the second engine"
                    await asyncio.sleep(0.01)
                start = time.monotonic()
                s.kill_engine(1)
                with pytest.raises(EngineError) as err:
                    await asyncio.wait_for(on_engine, timeout=60)  # a hang would fail here, not pass
                failed_after = time.monotonic() - start
                # sglang-router retries a request whose worker died on another worker.
                rerouted = await asyncio.gather(*via_router)
                return err.value, failed_after, rerouted

        error, failed_after, rerouted = asyncio.run(go())
        assert error.url.startswith(dead_url) and "no answer" in str(error)
        assert failed_after < 30  # within the client's deadline
        assert all(o.finish_reason == {"type": "length", "length": 400} for o in rerouted)
    assert not any(_alive(pid) for pid in pids)


def test_launcher_reports_an_engine_that_dies_at_start_and_cleans_up(tiny, tmp_path):
    servers = RolloutServers(tiny.model_dir, log_dir=tmp_path, num_engines=2,
                             sglang_flags=["--sglang-context-length", "not-a-number"])
    with pytest.raises(RuntimeError) as err:
        servers.start()
    assert "engine-0 exited with code 2" in str(err.value) and str(tmp_path / "engine-0.log") in str(err.value)
    assert "--context-length" in str(err.value)  # the log tail shows why
    assert servers.engines == [] and servers.router is None


def test_flag_passthrough_follows_slime_names(tiny, tmp_path):
    assert passthrough_flags(["--sglang-mem-fraction-static", "0.3", "--sglang-enable-x"], "sglang") == [
        "--mem-fraction-static", "0.3", "--enable-x"]
    assert passthrough_flags({"sglang_attention_backend": "triton", "sglang_enable_x": True,
                              "sglang_off": False, "sglang_unset": None}, "sglang") == [
        "--attention-backend", "triton", "--enable-x"]
    assert passthrough_flags(["--router-policy", "cache_aware"], "router") == ["--policy", "cache_aware"]
    with pytest.raises(UserError, match="only --sglang-"):
        passthrough_flags(["--mem-fraction-static", "0.3"], "sglang")
    with pytest.raises(UserError, match="--sglang-port is set by the launcher"):
        RolloutServers(tiny.model_dir, log_dir=tmp_path, sglang_flags=["--sglang-port", "1"])
    s = RolloutServers(tiny.model_dir, log_dir=tmp_path, engine="sglang", num_engines=2,
                       sglang_flags=["--sglang-attention-backend", "triton"])
    command = s._engine_command(1, 30001)
    assert command[1:3] == ["-m", "sglang.launch_server"]
    assert command[command.index("--base-gpu-id") + 1] == "1" and command[command.index("--port") + 1] == "30001"
    assert command[-2:] == ["--attention-backend", "triton"]
    builtin = RolloutServers(tiny.model_dir, log_dir=tmp_path, sglang_flags=["--sglang-attention-backend", "triton",
                                                                             "--sglang-context-length", "64"])
    command = builtin._engine_command(0, 30001)
    assert "--attention-backend" not in command and command[-2:] == ["--context-length", "64"]
    # --rollout-num-threads reaches the built-in engine (colocated runs give it every core)
    threaded = RolloutServers(tiny.model_dir, log_dir=tmp_path, num_threads=7)
    command = threaded._engine_command(0, 30001)
    assert command[command.index("--num-threads") + 1] == "7"
    assert threaded.env["OMP_WAIT_POLICY"] == "PASSIVE"  # unless the user chose one
    assert RolloutServers(tiny.model_dir, log_dir=tmp_path, env={"OMP_WAIT_POLICY": "ACTIVE"}).env[
        "OMP_WAIT_POLICY"] == "ACTIVE"


def test_server_process_dies_with_the_process_that_started_it(tmp_path):
    """A server never outlives its starter, even one killed with SIGKILL (no cleanup code runs)."""
    import os
    import signal
    import subprocess
    import sys
    import textwrap
    import time

    starter = textwrap.dedent(f"""
        import sys, time
        from slime_ref.rollout.servers import spawn
        proc = spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"], {str(tmp_path)!r}, {{}})
        print(proc.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    child_pid = int(parent.stdout.readline())
    os.kill(child_pid, 0)  # running
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(child_pid, signal.SIGKILL)
    raise AssertionError("the server outlived the process that started it")
