"""The built-in engine: exact log-probs, sampling, stop conditions, pause/abort, memory, bad input."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from _engines import InProcessEngine
from _reference import hf_logprobs
from slime_ref.engine.model_runner import ModelRunner
from slime_ref.rollout.sglang_client import EngineError, SGLangClient

PROMPT = [1, 9, 12, 30, 4, 7]


@pytest.fixture(scope="module")
def engine(tiny):
    with InProcessEngine(tiny.model_dir, max_running_requests=32, random_seed=7) as e:
        yield e


@pytest.fixture(scope="module")
def hf(tiny):
    return AutoModelForCausalLM.from_pretrained(tiny.model_dir, dtype=torch.float32).eval()


def run(coro_fn, url, **client_kwargs):
    async def main():
        async with SGLangClient(url, **client_kwargs) as client:
            return await coro_fn(client)

    return asyncio.run(main())


def reference_logprobs(model, prompt, response, temperature=1.0):
    """What the trainer computes: log_softmax(logits / T) of each response token, fp32."""
    return hf_logprobs(model, prompt + response, temperature)[len(prompt) - 1:].tolist()


async def wait_until(client, predicate, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = (await client.get_server_info())["internal_states"][0]
        if predicate(state):
            return state
        await asyncio.sleep(0.02)
    raise AssertionError("engine never reached the expected state")


# ------------------------------------------------------------------------------------------------
# numbers


def _save_random(model_cls, config, path):
    torch.manual_seed(0)
    model_cls(config).save_pretrained(path)
    return path


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_forward_over_kv_slots_matches_transformers(tiny, tmp_path, arch):
    shape = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64)
    path = {
        "qwen3": lambda: tiny.model_dir,
        "qwen2": lambda: _save_random(Qwen2ForCausalLM, Qwen2Config(**shape), tmp_path / "qwen2"),
        "llama": lambda: _save_random(LlamaForCausalLM, LlamaConfig(**shape), tmp_path / "llama"),
    }[arch]()
    runner = ModelRunner(path, max_running_requests=4)
    # The pool is allocated uninitialised: whatever it holds (here NaN) must never reach the output,
    # also at the positions a shorter sequence masks while a longer one in its batch reads them.
    for pool in (*runner.k_pool, *runner.v_pool):
        pool.fill_(float("nan"))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    seqs = [[1, 5, 7, 9, 11, 3, 2], [4, 4, 4], [10, 20, 30, 40, 50, 60, 70, 80, 90]]
    # Requests in different slots, fed in uneven chunks: prefill, then two tokens, then the rest.
    cuts = [(4, 6), (1, 2), (6, 8)]
    first = runner.forward([3, 0, 2], [s[:a] for s, (a, _) in zip(seqs, cuts)], [0, 0, 0], [True] * 3)
    second = runner.forward([3, 0, 2], [s[a:b] for s, (a, b) in zip(seqs, cuts)], [a for a, _ in cuts], [True] * 3)
    third = runner.forward([3, 0, 2], [s[b:] for s, (_, b) in zip(seqs, cuts)], [b for _, b in cuts], [True] * 3)
    for i, seq in enumerate(seqs):
        with torch.inference_mode():
            ref = model(torch.tensor([seq])).logits[0].float()
        ours = torch.cat([first.chunk_logits[i], second.chunk_logits[i], third.chunk_logits[i]])
        assert (ours - ref).abs().max().item() < 1e-5
        assert (third.last_logits[i] - ref[-1]).abs().max().item() < 1e-5


@pytest.mark.parametrize("sampling", [
    {"temperature": 1.0},
    {"temperature": 0.7},
    {"temperature": 1.3, "top_p": 0.8},
    {"temperature": 0.9, "top_k": 5},
])
def test_sampled_logprobs_equal_what_the_trainer_computes(engine, hf, sampling):
    async def go(c):
        return await asyncio.gather(*[
            c.generate(PROMPT[: 2 + i], {**sampling, "max_new_tokens": 12, "ignore_eos": True, "sampling_seed": i},
                       logprob_start_len=0)
            for i in range(4)
        ])

    for i, out in enumerate(run(go, engine.url)):
        prompt = PROMPT[: 2 + i]
        assert len(out.output_ids) == 12 and out.finish_reason == {"type": "length", "length": 12}
        expected = reference_logprobs(hf, prompt, out.output_ids, sampling["temperature"])
        assert max(abs(a - b) for a, b in zip(out.output_log_probs, expected)) < 1e-5
        # Prompt log-probs are plain log_softmax(logits), whatever the temperature (SGLang's convention).
        prompt_lp = reference_logprobs(hf, prompt[:1], prompt[1:], 1.0)
        assert out.input_log_probs[0] is None
        assert max(abs(a - b) for a, b in zip(out.input_log_probs[1:], prompt_lp)) < 1e-5


def test_top_k_and_top_p_restrict_the_draw(engine, hf):
    async def go(c):
        return await asyncio.gather(*[
            c.generate(PROMPT, {"temperature": 1.0, "top_k": 3, "max_new_tokens": 8, "ignore_eos": True,
                                "sampling_seed": s}) for s in range(6)
        ] + [
            c.generate(PROMPT, {"temperature": 1.0, "top_p": 1e-6, "max_new_tokens": 8, "ignore_eos": True,
                                "sampling_seed": s}) for s in range(2)
        ])

    outs = run(go, engine.url)
    for out in outs[:6]:
        context = list(PROMPT)
        for tok in out.output_ids:
            with torch.inference_mode():
                top3 = hf(torch.tensor([context])).logits[0, -1].topk(3).indices.tolist()
            assert tok in top3
            context.append(tok)
    greedy = reference_greedy(hf, PROMPT, 8)
    assert outs[6].output_ids == outs[7].output_ids == greedy  # top_p -> only the most likely token


@torch.inference_mode()
def reference_greedy(model, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_greedy_is_argmax_with_unscaled_logprobs(engine, hf):
    out = run(lambda c: c.generate(PROMPT, {"temperature": 0.0, "max_new_tokens": 10, "ignore_eos": True}),
              engine.url)
    assert out.output_ids == reference_greedy(hf, PROMPT, 10)
    expected = reference_logprobs(hf, PROMPT, out.output_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(out.output_log_probs, expected)) < 1e-5


def test_seeded_sampling_does_not_depend_on_the_batch(engine):
    params = {"temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True}

    async def go(c):
        alone = await c.generate(PROMPT, {**params, "sampling_seed": 123})
        crowd = await asyncio.gather(
            c.generate(PROMPT, {**params, "sampling_seed": 123}),
            *[c.generate(PROMPT[:3], {**params, "max_new_tokens": 5 + i}) for i in range(12)],
        )
        other = await c.generate(PROMPT, {**params, "sampling_seed": 124})
        return alone, crowd[0], other

    alone, in_crowd, other = run(go, engine.url)
    assert alone.output_ids == in_crowd.output_ids
    assert alone.output_ids != other.output_ids


def test_identical_prompts_of_a_batch_share_their_prefill(engine, hf):
    """A group's n samples (one batched request) are prefilled once; each copy still samples on its
    own and gets exactly what it would have got alone."""
    seeds = [7, 8, 9]

    async def go(c):
        params = [{"temperature": 1.0, "max_new_tokens": 10, "ignore_eos": True, "sampling_seed": s} for s in seeds]
        batch = await c.generate_batch([PROMPT] * 3 + [PROMPT[:4]], params + [params[0]])
        alone = [await c.generate(PROMPT, p) for p in params]
        return batch, alone

    batch, alone = run(go, engine.url)
    for b, a in zip(batch, alone):
        assert b.output_ids == a.output_ids
        assert max(abs(x - y) for x, y in zip(b.output_log_probs, a.output_log_probs)) < 1e-5
        assert max(abs(x - y) for x, y in zip(b.output_log_probs, reference_logprobs(hf, PROMPT, b.output_ids))) < 1e-5
    assert len({tuple(b.output_ids) for b in batch[:3]}) == 3  # three draws, not one copied
    assert sorted(b.meta_info["cached_tokens"] for b in batch) == [0, 0, len(PROMPT), len(PROMPT)]


# ------------------------------------------------------------------------------------------------
# stop conditions (SGLang's order: length, then stop strings, then stop tokens)


def test_stop_tokens_strings_and_length(engine, tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny.model_dir)
    base = {"temperature": 1.0, "sampling_seed": 5, "max_new_tokens": 24}

    async def go(c):
        free = await c.generate(PROMPT, {**base, "ignore_eos": True})
        ids = free.output_ids
        k = next(i for i in range(3, len(ids)) if ids[i] not in ids[:i])  # first occurrence of a new token
        stop_tok = ids[k]
        by_token = await c.generate(PROMPT, {**base, "stop_token_ids": [stop_tok]})
        kept = await c.generate(PROMPT, {**base, "stop_token_ids": [stop_tok], "no_stop_trim": True})
        ignored = await c.generate(PROMPT, {**base, "stop_token_ids": [stop_tok], "ignore_eos": True})
        at_limit = await c.generate(PROMPT, {**base, "stop_token_ids": [stop_tok], "max_new_tokens": k + 1})
        return ids, k, stop_tok, by_token, kept, ignored, at_limit

    ids, k, stop_tok, by_token, kept, ignored, at_limit = run(go, engine.url)
    assert by_token.output_ids == ids[: k + 1]  # the stop token stays in output_ids ...
    assert by_token.finish_reason == {"type": "stop", "matched": stop_tok}
    assert by_token.text == tok.decode(ids[:k])  # ... but not in the text
    assert kept.text == tok.decode(ids[: k + 1])
    assert ignored.output_ids == ids and ignored.finish_type == "length"  # ignore_eos disables stop tokens
    assert at_limit.finish_reason == {"type": "length", "length": k + 1}

    full_text = tok.decode(ids)
    stop_str = full_text[len(full_text) // 2: len(full_text) // 2 + 2]
    cut = full_text.find(stop_str)

    async def go_str(c):
        return (await c.generate(PROMPT, {**base, "ignore_eos": True, "stop": [stop_str]}),
                await c.generate(PROMPT, {**base, "ignore_eos": True, "stop": stop_str, "no_stop_trim": True}))

    trimmed, untrimmed = run(go_str, engine.url)
    assert trimmed.finish_reason == {"type": "stop", "matched": stop_str}
    assert trimmed.text == full_text[:cut]
    assert untrimmed.text == full_text[: cut + len(stop_str)]
    assert trimmed.output_ids == ids[: len(trimmed.output_ids)] and len(trimmed.output_ids) < len(ids)


def test_eos_from_the_generation_config_stops_generation(tiny, hf, tmp_path):
    import shutil

    greedy = reference_greedy(hf, PROMPT, 8)
    k = next(i for i in range(2, 8) if greedy[i] not in greedy[:i])
    eos = greedy[k]
    model_dir = shutil.copytree(tiny.model_dir, tmp_path / "model")
    config = json.loads((model_dir / "generation_config.json").read_text())
    (model_dir / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": [eos]}))
    params = {"temperature": 0.0, "max_new_tokens": 8}
    with InProcessEngine(model_dir, max_running_requests=2) as e:
        out = run(lambda c: c.generate(PROMPT, params), e.url)
        keep = run(lambda c: c.generate(PROMPT, {**params, "ignore_eos": True}), e.url)
    assert out.output_ids == greedy[: k + 1] and out.finish_reason == {"type": "stop", "matched": eos}
    assert keep.output_ids == greedy


def test_max_new_tokens_zero_scores_the_prompt(engine, hf):
    out = run(lambda c: c.generate(PROMPT, {"max_new_tokens": 0}, logprob_start_len=2), engine.url)
    assert out.output_ids == [] and out.finish_reason == {"type": "length", "length": 0}
    expected = reference_logprobs(hf, PROMPT[:2], PROMPT[2:], 1.0)
    assert [e[1] for e in out.meta_info["input_token_logprobs"]] == PROMPT[2:]
    assert max(abs(a - b) for a, b in zip(out.input_log_probs, expected)) < 1e-5


# ------------------------------------------------------------------------------------------------
# pause, continue, abort, flush


LONG = {"temperature": 1.0, "max_new_tokens": 300, "ignore_eos": True}


def test_pause_abort_mode_ends_running_requests_and_holds_new_ones(engine):
    async def go(c):
        running = asyncio.create_task(c.generate(PROMPT, LONG))
        await wait_until(c, lambda s: s["num_running_reqs"] == 1)
        await c.pause_generation()  # SGLang's default mode: abort
        aborted = await running
        held = asyncio.create_task(c.generate(PROMPT, {"max_new_tokens": 4, "ignore_eos": True}))
        await wait_until(c, lambda s: s["num_waiting_reqs"] == 1)
        assert not held.done()
        await c.continue_generation()
        return aborted, await held

    aborted, held = run(go, engine.url)
    assert aborted.finish_type == "abort" and 0 < len(aborted.output_ids) < 300
    assert len(aborted.output_log_probs) == len(aborted.output_ids)
    assert held.finish_reason == {"type": "length", "length": 4}


def test_pause_in_place_freezes_and_continue_finishes(engine):
    async def go(c):
        running = asyncio.create_task(c.generate(PROMPT, LONG))
        await wait_until(c, lambda s: s["num_running_reqs"] == 1)
        await c.pause_generation("in_place")
        before = (await c.get_server_info())["internal_states"][0]["num_generated_tokens"]
        load = (await c.get_load())[0]
        # A negative check: paused, the engine generates nothing, however fast or slow the machine.
        await asyncio.sleep(0.2)
        after = (await c.get_server_info())["internal_states"][0]["num_generated_tokens"]
        with pytest.raises(EngineError) as refused:  # SGLang refuses to flush while requests are in flight
            await c._call("GET", "/flush_cache", retries=0, read="text")
        await c.continue_generation()
        out = await running
        await c.flush_cache()
        return before, after, load, refused.value.status, out

    before, after, load, status, out = run(go, engine.url)
    assert before == after and status == 400
    # SGLang's /get_load: the paused request holds its prompt's and output's keys/values
    assert load["num_reqs"] == 1 and load["num_waiting_reqs"] == 0 and load["num_pending_tokens"] == 0
    assert len(PROMPT) < load["num_tokens"] < len(PROMPT) + 300
    assert out.finish_reason == {"type": "length", "length": 300}


def test_pause_retract_recomputes_and_gives_the_same_tokens(engine, hf):
    params = {**LONG, "max_new_tokens": 60, "sampling_seed": 99}

    async def go(c):
        reference = await c.generate(PROMPT, params)
        running = asyncio.create_task(c.generate(PROMPT, params))
        await wait_until(c, lambda s: s["num_generated_tokens"] > 0 and s["num_running_reqs"] == 1)
        await c.pause_generation("retract")
        await c.continue_generation()
        return reference, await running

    reference, retracted = run(go, engine.url)
    assert retracted.meta_info["num_retractions"] == 1
    assert retracted.output_ids == reference.output_ids
    expected = reference_logprobs(hf, PROMPT, retracted.output_ids)
    assert max(abs(a - b) for a, b in zip(retracted.output_log_probs, expected)) < 1e-5


def test_abort_request_by_rid(engine):
    async def go(c):
        mine = asyncio.create_task(c.generate(PROMPT, LONG, rid="batch7-sample3"))
        other = asyncio.create_task(c.generate(PROMPT, {"max_new_tokens": 30, "ignore_eos": True}, rid="batch8-x"))
        await wait_until(c, lambda s: s["num_running_reqs"] == 2)
        await c.abort_request(rid="batch7")  # not an rid of any request: SGLang ignores it
        await wait_until(c, lambda s: s["num_running_reqs"] == 1)  # "other" finished, "mine" still runs
        assert not mine.done()
        await c.abort_request(rid="batch7-sample3")
        return await mine, await other

    mine, other = run(go, engine.url)
    assert mine.finish_type == "abort" and mine.meta_info["id"] == "batch7-sample3"
    assert other.finish_reason == {"type": "length", "length": 30}


def test_release_and_resume_memory(engine):
    async def go(c):
        await c.release_memory_occupation()
        assert not engine.server.runner.kv_pool_allocated
        held = asyncio.create_task(c.generate(PROMPT, {"max_new_tokens": 3, "ignore_eos": True}))
        await wait_until(c, lambda s: s["num_waiting_reqs"] == 1)
        await c.resume_memory_occupation()
        return await held

    out = run(go, engine.url)
    assert engine.server.runner.kv_pool_allocated and len(out.output_ids) == 3


def test_release_while_paused_recomputes_the_paused_requests(engine, hf):
    params = {"temperature": 1.0, "max_new_tokens": 80, "ignore_eos": True, "sampling_seed": 3}

    async def go(c):
        running = asyncio.create_task(c.generate(PROMPT, params))
        await wait_until(c, lambda s: s["num_generated_tokens"] > 0 and s["num_running_reqs"] == 1)
        await c.pause_generation("in_place")  # as colocated training does before offloading the engine
        await c.release_memory_occupation()
        await c.resume_memory_occupation()
        await c.continue_generation()
        return await running

    out = run(go, engine.url)
    assert out.meta_info["num_retractions"] == 1 and len(out.output_ids) == 80
    expected = reference_logprobs(hf, PROMPT, out.output_ids)
    assert max(abs(a - b) for a, b in zip(out.output_log_probs, expected)) < 1e-5


def test_an_update_waits_for_running_requests_unless_paused(engine, hf, tiny, tmp_path):
    from _reference import perturbed_model

    new = perturbed_model(tiny.model_dir, seed=4)
    new.save_pretrained(tmp_path / "new")
    params = {"temperature": 1.0, "max_new_tokens": 120, "ignore_eos": True}

    async def go(c):
        running = asyncio.create_task(c.generate(PROMPT, params))
        await wait_until(c, lambda s: s["num_generated_tokens"] > 0 and s["num_running_reqs"] == 1)
        update = asyncio.create_task(c.update_weights_from_disk(str(tmp_path / "new")))
        # the update has reached the scheduler (where it holds new requests back), or is done already
        await wait_until(c, lambda s: s["num_pending_controls"] > 0 or update.done())
        later = asyncio.create_task(c.generate(PROMPT, params))  # held until the update is done
        first = await running
        assert (await update)["success"]
        second = await later
        await c.update_weights_from_disk(str(tiny.model_dir))  # the module's other tests use the original
        return first, second

    first, second = run(go, engine.url)
    # Each sequence was generated by one set of weights from its first token to its last.
    old_expected = reference_logprobs(hf, PROMPT, first.output_ids)
    new_expected = reference_logprobs(new, PROMPT, second.output_ids)
    assert max(abs(a - b) for a, b in zip(first.output_log_probs, old_expected)) < 1e-5
    assert max(abs(a - b) for a, b in zip(second.output_log_probs, new_expected)) < 1e-5


# ------------------------------------------------------------------------------------------------
# bad input: a 400 that names the problem


@pytest.mark.parametrize("body, message", [
    ({"input_ids": [1, 2], "sampling_params": {"n": 2}}, "sampling parameter n=2 is not implemented"),
    ({"input_ids": [1, 2], "sampling_params": {"temperature": -1}}, "temperature must be a non-negative"),
    ({"input_ids": [1, 2], "sampling_params": {"top_p": 0}}, "top_p must be in (0, 1]"),
    ({"input_ids": [1, 2], "image_data": ["x"]}, "field 'image_data' is not implemented"),
    ({"input_ids": [1, 2], "stream": True}, "stream=true is not implemented"),
    ({"input_ids": [1, 100000]}, "outside the vocabulary"),
    ({"input_ids": list(range(3)) * 200}, "longer than the model's context length"),
    ({"sampling_params": {}}, "either input_ids or text is required"),
])
def test_bad_generate_requests_are_refused_by_name(engine, body, message):
    with pytest.raises(EngineError) as err:
        run(lambda c: c._call("POST", "/generate", body, retries=0), engine.url)
    assert err.value.status == 400 and message in str(err.value)


def test_text_and_batched_input(engine, tiny):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tiny.model_dir).encode("3+5=")
    greedy = {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True}

    async def go(c):
        by_text = await c._call("POST", "/generate", {"text": "3+5=", "sampling_params": greedy})
        by_ids = await c.generate(ids, greedy)
        batch = await c._call("POST", "/generate", {"input_ids": [ids, ids[:2]], "sampling_params": greedy,
                                                     "return_logprob": [True, False]})
        return by_text, by_ids, batch

    by_text, by_ids, batch = run(go, engine.url)
    assert by_text["output_ids"] == by_ids.output_ids == batch[0]["output_ids"]
    assert "output_token_logprobs" in batch[0]["meta_info"] and "output_token_logprobs" not in batch[1]["meta_info"]


def test_engine_cli_refuses_a_missing_model_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "slime_ref.engine", "--model-path", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--model-path" in proc.stderr and "config.json" in proc.stderr


def test_unsupported_architecture_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        ModelRunner(tmp_path)


def test_flattened_bucket_round_trips_mixed_dtypes_exactly():
    from slime_ref.engine.weight_receive import deserialize_flattened_bucket
    from slime_ref.weights.transfer import serialize_flattened_bucket

    named = [("a", torch.randn(3, 4)), ("b", torch.randn(6).to(torch.bfloat16)), ("c", torch.tensor([7, -2])),
             ("d", torch.randn(2, 2, dtype=torch.float64))]
    payload, keepalive = serialize_flattened_bucket(named)
    assert keepalive.dtype == torch.uint8 and keepalive.numel() == 48 + 12 + 4 + 16 + 32  # c and d start 16-aligned
    decoded = deserialize_flattened_bucket(payload)
    assert [n for n, _ in decoded] == ["a", "b", "c", "d"]
    for (_, sent), (_, got) in zip(named, decoded):
        assert got.dtype == sent.dtype and torch.equal(got, sent)


def test_flattened_bucket_from_slime_uses_sglang_metadata_class(monkeypatch):
    # slime pickles sglang's FlattenedTensorMetadata dataclass; the engine must take it without sglang
    import dataclasses
    import types

    from slime_ref.engine.weight_receive import deserialize_flattened_bucket
    from slime_ref.weights.transfer import _share_and_encode

    @dataclasses.dataclass
    class FlattenedTensorMetadata:
        name: str
        shape: torch.Size
        dtype: torch.dtype
        start_idx: int
        end_idx: int
        numel: int

    path = "sglang.srt.weight_sync.tensor_bucket"
    FlattenedTensorMetadata.__module__, FlattenedTensorMetadata.__qualname__ = path, "FlattenedTensorMetadata"
    for i in range(len(path.split("."))):
        module = types.ModuleType(".".join(path.split(".")[: i + 1]))
        monkeypatch.setitem(sys.modules, module.__name__, module)
    sys.modules[path].FlattenedTensorMetadata = FlattenedTensorMetadata
    weight = torch.randn(2, 3)
    payload = _share_and_encode({"flattened_tensor": weight.reshape(-1).view(torch.uint8).clone(),
                                 "metadata": [FlattenedTensorMetadata("w", weight.shape, torch.float32, 0, 24, 24)]})
    monkeypatch.delitem(sys.modules, path)  # decoding must not need it
    [(name, got)] = deserialize_flattened_bucket(payload)
    assert name == "w" and torch.equal(got, weight)


@pytest.mark.parametrize("start,end,message", [(0, 20, "do not hold a torch.float32 tensor of shape (2, 3)"),
                                               (8, 32, "of a 24-byte buffer")])
def test_flattened_bucket_with_wrong_offsets_is_refused(start, end, message):
    from types import SimpleNamespace

    from slime_ref.engine.weight_receive import deserialize_flattened_bucket
    from slime_ref.weights.transfer import _share_and_encode

    flat = torch.zeros(24, dtype=torch.uint8)
    meta = SimpleNamespace(name="w", shape=torch.Size([2, 3]), dtype=torch.float32, start_idx=start, end_idx=end,
                           numel=end - start)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        deserialize_flattened_bucket(_share_and_encode({"flattened_tensor": flat, "metadata": [meta]}))


def test_flattened_bucket_with_an_unaligned_tensor_still_decodes():
    from types import SimpleNamespace

    from slime_ref.engine.weight_receive import deserialize_flattened_bucket
    from slime_ref.weights.transfer import _share_and_encode

    weight = torch.randn(2, 3)
    flat = torch.cat([torch.zeros(2, dtype=torch.uint8), weight.reshape(-1).view(torch.uint8)])
    meta = SimpleNamespace(name="w", shape=weight.shape, dtype=torch.float32, start_idx=2, end_idx=26, numel=24)
    [(_, got)] = deserialize_flattened_bucket(_share_and_encode({"flattened_tensor": flat, "metadata": [meta]}))
    assert torch.equal(got, weight)
