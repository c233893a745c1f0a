"""The client contract against a live engine: real SGLang 0.5.15.post1 on a GPU, and the built-in engine.

The same tests run against both. ``sglang`` cases carry the ``gpu`` marker: they need CUDA and SGLang
(``pip install '.[sglang]'``, or the offline wheel set of bench/gpu/build_sglang_wheelset.sh on
PYTHONPATH) and skip cleanly elsewhere; ``builtin`` cases run on CPU. SGLang computes in bfloat16,
so its log-probs are compared with transformers (float32, on the same bf16-rounded weights) within
``SLIME_REF_GPU_LOGPROB_TOL`` (default 0.05); the built-in engine's within 1e-5.

Environment: ``SLIME_REF_GPU_LOG_DIR`` keeps the engine log; ``SLIME_REF_GPU_BROADCAST_BACKEND``
(default gloo, which works with one GPU) picks the weight-broadcast backend; nccl needs a second
GPU for the trainer side (cuda:1).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from _engines import wait_in_flight
from _reference import hf_logprobs, perturbed_model
from _sglang_source import SGLANG_META_INFO_KEYS
from slime_ref.rollout.servers import RolloutServers
from slime_ref.rollout.sglang_client import SGLangClient
from slime_ref.utils.net import allocate_port
from slime_ref.weights import transfer as weight_transfer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "gpu"))
from sglang_recipes import SGLANG_CUDA_GRAPH_FLAGS, SGLANG_OFFLINE_GPU_FLAGS  # noqa: E402

LONG = {"temperature": 1.0, "max_new_tokens": 400, "ignore_eos": True}


@dataclass
class LiveEngine:
    kind: str
    url: str
    model_dir: Path
    tol: float
    dtype: torch.dtype  # what the engine computes in; reference weights are rounded to it


@pytest.fixture(scope="module", params=["builtin", pytest.param("sglang", marks=pytest.mark.gpu)])
def live(request, tiny, tmp_path_factory):
    kind = request.param
    log_dir = Path(os.environ.get("SLIME_REF_GPU_LOG_DIR") or tmp_path_factory.mktemp("logs")) / kind
    if kind == "sglang":
        if importlib.util.find_spec("sglang") is None:
            pytest.skip("SGLang is not installed (pip install '.[sglang]', or the offline wheel set on PYTHONPATH)")
        flags = [*SGLANG_OFFLINE_GPU_FLAGS, *SGLANG_CUDA_GRAPH_FLAGS[False], "--sglang-dtype", "bfloat16"]
        tol, dtype = float(os.environ.get("SLIME_REF_GPU_LOGPROB_TOL", "0.05")), torch.bfloat16
    else:
        flags, tol, dtype = [], 1e-5, torch.float32
    with RolloutServers(tiny.model_dir, log_dir=log_dir, engine=kind, with_router=False, sglang_flags=flags,
                        startup_timeout_s=480) as servers:
        yield LiveEngine(kind, servers.url, tiny.model_dir, tol, dtype)


def call(live: LiveEngine, fn):
    async def main():
        async with SGLangClient(live.url) as client:
            return await fn(client)

    return asyncio.run(main())


def prompt_ids(live: LiveEngine, question: str = "3+5=") -> list[int]:
    tok = AutoTokenizer.from_pretrained(live.model_dir)
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                              tokenize=False))


def scores(live: LiveEngine, ids: list[int]) -> tuple[torch.Tensor, str]:
    """The engine's log-probs of ids[1:] (prompt scoring) and its weight version."""
    out = call(live, lambda c: c.generate(ids, {"max_new_tokens": 1}, logprob_start_len=0))
    assert out.meta_info["input_token_logprobs"][0] == [None, ids[0], None]
    return torch.tensor(out.input_log_probs[1:]), out.meta_info["weight_version"]


def test_health_and_info(live):
    async def go(c):
        return await c.health(), await c.health_generate(), await c.get_model_info(), await c.get_server_info()

    healthy, generates, model_info, server_info = call(live, go)
    assert healthy and generates
    assert model_info["model_path"] == str(live.model_dir) and model_info["architectures"] == ["Qwen3ForCausalLM"]
    assert {"model_path", "tp_size", "dp_size"} <= set(server_info)


def test_generate_with_logprobs_matches_transformers(live):
    ids = prompt_ids(live)
    out = call(live, lambda c: c.generate(ids, {"temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True},
                                          logprob_start_len=0))
    assert set(out.meta_info) >= SGLANG_META_INFO_KEYS
    assert len(out.output_ids) == len(out.output_log_probs) == out.meta_info["output_token_logprobs_length"] == 16
    assert out.finish_reason == {"type": "length", "length": 16}
    model = perturbed_model(live.model_dir, seed=0, scale=0.0, round_to=live.dtype)
    expected = hf_logprobs(model, ids + out.output_ids)
    assert (torch.tensor(out.output_log_probs) - expected[len(ids) - 1:]).abs().max().item() < live.tol
    assert (torch.tensor(out.input_log_probs[1:]) - expected[: len(ids) - 1]).abs().max().item() < live.tol


def test_stop_token_ends_generation_and_stays_in_output_ids(live):
    ids = prompt_ids(live)
    free = call(live, lambda c: c.generate(ids, {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}))
    # the first token not seen before (a tiny random model may repeat one token: then the first)
    k = next((i for i in range(1, 12) if free.output_ids[i] not in free.output_ids[:i]), 0)
    stop = free.output_ids[k]
    out = call(live, lambda c: c.generate(ids, {"temperature": 0.0, "max_new_tokens": 12, "stop_token_ids": [stop]}))
    assert out.output_ids == free.output_ids[: k + 1]
    assert out.finish_reason == {"type": "stop", "matched": stop}


async def _stopped_while_generating(c, ids, stop, *, rid=None, undo=None, attempts=3):
    """The answer to a LONG request that ``stop()`` ends while it generates.

    The request is started, waited on until the engine holds its prompt and some output, then
    stopped. A fast engine can still finish it between that check and ``stop()`` taking effect; its
    answer then says "length" and, after ``undo()``, it is tried again. A ``stop()`` that does not end
    running requests fails every attempt."""
    for attempt in range(attempts):
        running = asyncio.create_task(c.generate(ids, LONG, rid=rid))
        await wait_in_flight(c, len(ids) + 1)
        await stop()
        out = await running
        if out.finish_type != "length" or attempt == attempts - 1:
            return out
        if undo is not None:
            await undo()


def test_pause_continue_abort_and_flush(live):
    ids = prompt_ids(live)

    async def go(c):
        # mode "abort": in-flight requests end, new ones wait
        aborted = await _stopped_while_generating(c, ids, c.pause_generation, undo=c.continue_generation)
        held = asyncio.create_task(c.generate(ids, {"max_new_tokens": 4, "ignore_eos": True}))
        # A negative check: while paused, the request cannot finish, however fast or slow the machine
        # (real SGLang holds it before its scheduler, so there is no state to wait on).
        await asyncio.sleep(0.5)
        was_held = not held.done()
        await c.continue_generation()
        after = await held
        by_rid = await _stopped_while_generating(c, ids, lambda: c.abort_request(rid="rollout3-sample1"),
                                                 rid="rollout3-sample1")
        await c.flush_cache()
        return aborted, was_held, after, by_rid

    aborted, was_held, after, by_rid = call(live, go)
    assert aborted.finish_type == "abort" and len(aborted.output_ids) < 400, aborted.finish_reason
    assert was_held and after.finish_reason == {"type": "length", "length": 4}
    assert by_rid.finish_type == "abort", by_rid.finish_reason


def _check_update(live, ids, model, old, version):
    expected = hf_logprobs(model, ids)
    assert (expected - old).abs().max().item() > 4 * live.tol  # the new weights score differently ...
    got, weight_version = scores(live, ids)
    assert (got - expected).abs().max().item() < live.tol  # ... and the engine now scores like them
    assert weight_version == version
    return expected


def test_each_weight_update_is_seen_in_logprobs(live, tmp_path):
    ids = prompt_ids(live, "7+2=") + [5, 6, 7, 8]
    current = hf_logprobs(perturbed_model(live.model_dir, seed=0, scale=0.0, round_to=live.dtype), ids)

    # from disk
    model = perturbed_model(live.model_dir, seed=11, round_to=live.dtype)
    model.save_pretrained(tmp_path / "step1")
    AutoTokenizer.from_pretrained(live.model_dir).save_pretrained(tmp_path / "step1")

    async def disk(c):
        answer = await c.update_weights_from_disk(str(tmp_path / "step1"), weight_version="1")
        return answer, (await c.get_model_info())["model_path"]

    answer, model_path = call(live, disk)
    assert answer["success"] and model_path == str(tmp_path / "step1")
    current = _check_update(live, ids, model, current, "1")

    # tensor handles (CUDA IPC on a GPU, shared memory on CPU)
    model = perturbed_model(live.model_dir, seed=12, round_to=live.dtype)
    device = "cuda" if live.kind == "sglang" else "cpu"
    named = [(n, p.detach().to(device=device, dtype=live.dtype)) for n, p in model.named_parameters()]
    call(live, lambda c: weight_transfer.push_tensors([c], named, weight_version="2"))
    current = _check_update(live, ids, model, current, "2")

    # tensor handles as one flattened bucket (SGLang's flattened_bucket load format, what colocated sync sends)
    model = perturbed_model(live.model_dir, seed=14, round_to=live.dtype)
    named = [(n, p.detach().to(device=device, dtype=live.dtype)) for n, p in model.named_parameters()]
    payload, keepalive = weight_transfer.serialize_flattened_bucket(named)
    call(live, lambda c: weight_transfer.push_serialized([c], payload, load_format="flattened_bucket",
                                                         weight_version="2f"))
    current = _check_update(live, ids, model, current, "2f")

    # distributed broadcast from a trainer-side rank 0
    model = perturbed_model(live.model_dir, seed=13, round_to=live.dtype)
    backend = os.environ.get("SLIME_REF_GPU_BROADCAST_BACKEND", "gloo")
    device = "cuda:1" if backend == "nccl" else "cpu"
    named = [(n, p.detach().to(device=device, dtype=live.dtype)) for n, p in model.named_parameters()]

    async def broadcast(c):
        group = await weight_transfer.connect_engines([c], master_address="127.0.0.1", master_port=allocate_port(),
                                                      backend=backend)
        await weight_transfer.broadcast_named_tensors(group, [c], named, weight_version="3", bucket_bytes=1 << 20)
        await weight_transfer.disconnect_engines(group, [c])

    call(live, broadcast)
    _check_update(live, ids, model, current, "3")

    # back to the original checkpoint, for whatever runs next
    assert call(live, lambda c: c.update_weights_from_disk(str(live.model_dir)))["success"]


def test_reference_helpers_agree_with_a_plain_load(tiny):
    # perturbed_model(scale=0) must be the checkpoint itself, or the tests above compare nothing.
    plain = AutoModelForCausalLM.from_pretrained(tiny.model_dir, dtype=torch.float32)
    same = perturbed_model(tiny.model_dir, seed=0, scale=0.0)
    ids = [1, 9, 12, 30, 4]
    assert torch.equal(hf_logprobs(plain, ids), hf_logprobs(same, ids))
