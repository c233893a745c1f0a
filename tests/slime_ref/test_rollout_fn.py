"""The default rollout function against a built-in engine behind the real sglang-router: what it
sends (one batched /generate per group of fresh samples), and what comes back per sample."""

from __future__ import annotations

import pytest

from slime_ref.arguments import parse_args
from slime_ref.data.source import load_tokenizer, make_data_source
from slime_ref.rollout import sglang_rollout
from slime_ref.rollout.servers import RolloutServers
from slime_ref.rollout.sglang_client import SGLangClient
from slime_ref.types import Sample


@pytest.fixture(scope="module")
def servers(tiny, tmp_path_factory):
    with RolloutServers(tiny.model_dir, log_dir=tmp_path_factory.mktemp("logs"), num_engines=1) as s:
        yield s


def rollout_args(tiny, servers, tmp_path, *extra):
    args = parse_args(
        [
            "--hf-checkpoint",
            str(tiny.model_dir),
            "--prompt-data",
            str(tiny.train_path),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--apply-chat-template",
            "--rm-type",
            "math",
            "--num-rollout",
            "1",
            "--rollout-batch-size",
            "3",
            "--n-samples-per-prompt",
            "4",
            "--global-batch-size",
            "12",
            "--rollout-max-response-len",
            "6",
            "--actor-num-gpus-per-node",
            "1",
            "--output-dir",
            str(tmp_path),
            *extra,
        ]
    )
    host, port = servers.router_url.removeprefix("http://").rsplit(":", 1)
    args.sglang_router_ip, args.sglang_router_port = host, int(port)
    args.rollout_engine_urls = list(servers.engine_urls)
    return args


@pytest.fixture
def requests(monkeypatch):
    """Every /generate the rollout sends, as the number of samples it carries."""
    sent = []
    batch, single = SGLangClient.generate_batch, SGLangClient.generate

    async def generate_batch(self, input_ids, *a, **kw):
        sent.append(len(input_ids))
        return await batch(self, input_ids, *a, **kw)

    async def generate(self, input_ids, *a, **kw):
        sent.append(1)
        return await single(self, input_ids, *a, **kw)

    monkeypatch.setattr(SGLangClient, "generate_batch", generate_batch)
    monkeypatch.setattr(SGLangClient, "generate", generate)
    return sent


def test_a_group_of_fresh_samples_is_one_request(tiny, servers, tmp_path, requests):
    args = rollout_args(tiny, servers, tmp_path)
    source = make_data_source(args, load_tokenizer(args))
    out = sglang_rollout.generate_rollout(args, 0, source)
    assert requests == [4, 4, 4]
    assert [len(g) for g in out.samples] == [4, 4, 4]
    tokenizer = load_tokenizer(args)
    for group in out.samples:
        prompt_ids = tokenizer.encode(group[0].prompt, add_special_tokens=False)
        for s in group:
            assert s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
            assert 1 <= s.response_length <= 6 and s.tokens == prompt_ids + s.tokens[len(prompt_ids):]
            assert len(s.tokens) == len(prompt_ids) + s.response_length
            assert len(s.rollout_log_probs) == len(s.loss_mask) == s.response_length
            assert s.reward in (0, 1)
    # the four samples of a group are drawn independently (their own seeds), not copies of one
    assert any(len({tuple(s.tokens) for s in g}) > 1 for g in out.samples)


def test_a_hook_changes_the_rollouts_sampling_params_through_generate_state(tiny, servers, tmp_path, requests,
                                                                             monkeypatch):
    """slime's GenerateState(args).sampling_params is the dict every group of the default rollout is
    sent with: a hook that sets ignore_eos there gets full-length responses, still one request a group;
    another run's args start again from the flags."""
    from slime_rehearse.compat.slime.rollout.sglang_rollout import GenerateState

    params = []
    batch = SGLangClient.generate_batch

    async def generate_batch(self, input_ids, sampling_params, *a, **kw):
        params.append(dict(sampling_params))
        return await batch(self, input_ids, sampling_params, *a, **kw)

    monkeypatch.setattr(SGLangClient, "generate_batch", generate_batch)
    args = rollout_args(tiny, servers, tmp_path)
    GenerateState(args).sampling_params["ignore_eos"] = True
    out = sglang_rollout.generate_rollout(args, 0, make_data_source(args, load_tokenizer(args)))
    assert requests == [4, 4, 4] and [p.get("ignore_eos") for p in params] == [True] * 3
    assert [s.response_length for g in out.samples for s in g] == [6] * 12

    params.clear()
    fresh = rollout_args(tiny, servers, tmp_path)
    sglang_rollout.generate_rollout(fresh, 0, make_data_source(fresh, load_tokenizer(fresh)))
    assert params == [sglang_rollout.sampling_params(fresh)] * 3 and "ignore_eos" not in params[0]


def test_a_hooks_sampling_params_outlive_new_engine_urls(tiny, servers, tmp_path):
    """--use-fault-tolerance re-lists the engines after a restart, which makes a new rollout state; a
    hook's change to the sampling parameters carries over, as with slime's one GenerateState."""
    args = rollout_args(tiny, servers, tmp_path)
    state = sglang_rollout.generation_state(args)
    state.sampling_params["ignore_eos"] = True
    args.rollout_engine_urls = [*args.rollout_engine_urls, "http://127.0.0.1:9"]
    again = sglang_rollout.generation_state(args)
    assert again is not state and again.sampling_params["ignore_eos"] is True


def test_the_gpu_benchs_rollout_forces_full_lengths_one_request_a_group(tiny, servers, tmp_path, requests,
                                                                        monkeypatch):
    """grpo_step.py --gpu's --rollout-function-path: every response runs to --rollout-max-response-len
    (as TRL's min_new_tokens), and a group still goes as one request, as a user's default rollout."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    import grpo_step

    monkeypatch.setattr(sglang_rollout, "_STATE", None)  # the state is made here, outside the rollout's loop
    args = rollout_args(tiny, servers, tmp_path)
    out = grpo_step.generate_rollout_ignore_eos(args, 0, make_data_source(args, load_tokenizer(args)))
    assert requests == [4, 4, 4]
    assert [s.response_length for g in out.samples for s in g] == [6] * 12


def test_batches_respect_the_in_flight_limit(tiny, servers, tmp_path, requests):
    args = rollout_args(tiny, servers, tmp_path, "--sglang-server-concurrency", "3")
    out = sglang_rollout.generate_rollout(args, 0, make_data_source(args, load_tokenizer(args)))
    assert sorted(requests) == [1, 1, 1, 3, 3, 3] and len(out.samples) == 3


def test_custom_generate_and_unfinished_samples_go_one_by_one(tiny, servers, tmp_path, requests):
    args = rollout_args(tiny, servers, tmp_path)
    source = make_data_source(args, load_tokenizer(args))
    group = source.get_samples(1)[0]
    tokenizer = load_tokenizer(args)
    # A half-done sample (an aborted rollout's, kept by --partial-rollout) continues on its own
    # with the rest of its budget; a finished one is not generated again.
    half = group[0]
    half.tokens = tokenizer.encode(half.prompt, add_special_tokens=False)
    half.append_response_tokens(args, tokens=[10, 11], log_probs=[-1.0, -1.0],
                                meta_info={"finish_reason": {"type": "abort"}})
    done = group[1]
    done.tokens = tokenizer.encode(done.prompt, add_special_tokens=False) + [5]
    done.response_length, done.loss_mask, done.rollout_log_probs = 1, [1], [-0.5]
    done.status, done.reward = Sample.Status.COMPLETED, 0
    result = sglang_rollout.run(sglang_rollout.generate_and_rm_group(
        args, group, sglang_rollout.sampling_params(args)))
    assert sorted(requests) == [1, 2]  # the half-done one alone, the two fresh ones together
    assert result[0].response_length > 2 and result[0].response_length <= 6
    assert result[0].tokens[len(result[0].tokens) - result[0].response_length:][:2] == [10, 11]
    assert result[1].response_length == 1 and result[1].rollout_log_probs == [-0.5]

    requests.clear()
    hooked = rollout_args(tiny, servers, tmp_path, "--custom-generate-function-path",
                          "slime_ref.rollout.sglang_rollout.generate")
    sglang_rollout.generate_rollout(hooked, 0, make_data_source(hooked, load_tokenizer(hooked)))
    assert requests == [1] * 12


def test_an_aborted_rollout_marks_the_batch_aborted(tiny, servers, tmp_path, requests):
    args = rollout_args(tiny, servers, tmp_path)
    group = make_data_source(args, load_tokenizer(args)).get_samples(1)[0]

    async def aborted_then_generate():
        state = sglang_rollout.generation_state(args)
        state.reset()
        state.aborted = True
        try:
            return await sglang_rollout._generate_and_rm_fresh(args, group, sglang_rollout.sampling_params(args))
        finally:
            state.reset()

    result = sglang_rollout.run(aborted_then_generate())
    assert requests == [] and all(s.status == Sample.Status.ABORTED and s.reward is None for s in result)
