"""The built-in engine's script mode: chosen prompts get given text, teacher-forced through the model."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from _engines import InProcessEngine
from _reference import hf_logprobs
from slime_ref.engine.script import (
    SCRIPT_ENV,
    STATS_ENV,
    Entry,
    Pick,
    Script,
    append_stats,
    continuation,
    load_script,
    match_entry,
    parse_script,
)
from slime_ref.errors import UserError
from slime_ref.rollout.sglang_client import SGLangClient

# ------------------------------------------------------------------------------------------------
# the choice (pure)


def entries(*pairs) -> list[Entry]:
    return [Entry(match, tuple((r,) if isinstance(r, str) else tuple(r) for r in responses))
            for match, responses in pairs]


def test_the_longest_match_wins_and_no_match_samples():
    es = entries(("=", ["a"]), ("3+5=", ["b"]), ("5=", ["c"]), ("3+5", ["d"]))
    assert match_entry(es, "user\n3+5=\nassistant\n") == 1
    assert match_entry(es, "user\n2+5=") == 2
    assert match_entry(es, "user\n2+4=") == 0
    assert match_entry(es, "user\n2+4") is None
    assert match_entry(entries(("ab", ["x"]), ("bc", ["y"])), "abc") == 0  # a tie: the earlier entry
    script = Script(es, every=1)
    assert script.pick("2+4") == Pick()
    assert script.pick("3+5=") == Pick("b", 1, 1)
    assert script.counts == [0, 1, 0, 0]


def test_every_scripts_each_nth_first_turn_and_cycles_the_responses():
    script = Script(entries(("q", ["r0", ["r1a", "r1b"], "r2"])), every=2)
    picks = [script.pick("prompt q") for _ in range(8)]
    assert picks == [Pick("r0", 0, 1), Pick(entry=0), Pick("r1a", 0, 1), Pick(entry=0),
                     Pick("r2", 0, 1), Pick(entry=0), Pick("r0", 0, 1), Pick(entry=0)]
    every3 = Script(entries(("q", ["x", "y"])), every=3)
    assert [every3.pick("q").text for _ in range(7)] == ["x", None, None, "y", None, None, "x"]
    every1 = Script(entries(("q", ["x", "y"]), ("p", ["z"])), every=1)
    assert [every1.pick(t).text for t in ("q", "p", "q", "q", "p")] == ["x", "z", "y", "x", "z"]
    assert every1.counts == [3, 2]  # counted per entry


def test_multi_turn_continuations_serve_the_next_turn_without_counting():
    script = Script(entries(("3+5=", ["plain", ["T1", "T2", "T3"], ["T1", "U2"]])), every=1)
    assert script.pick("3+5=") == Pick("plain", 0, 1)
    assert script.pick("3+5= T1 tool said 8") == Pick("T2", 0, 2)  # two responses hold T1: the first wins
    assert script.pick("3+5= T1 .. T2 ..") == Pick("T3", 0, 3)  # the one holding more turns wins
    # [T1, U2] is complete here; [T1, T2, T3] holds its turn 1
    assert script.pick("3+5= T1 .. U2") == Pick("T2", 0, 2)
    assert script.counts == [1]
    # a prompt holding every turn of every response is a first turn again, and counted
    assert script.pick("3+5= plain T1 T2 T3 U2") == Pick("T1", 0, 1)
    assert script.counts == [2]
    # turns count only in order and after the match
    assert continuation(script.entries[0], "T1 3+5=") is None
    assert continuation(script.entries[0], "3+5= T2 T1") == (1, 2)
    assert continuation(script.entries[0], "3+5= T2 T1 T3") == (1, 2)


def test_a_turn_is_recognised_as_the_engine_served_it():
    es = entries(("q", [["<call>", "done"]]))
    served = {"<call>": "<unk>call<unk>"}.get
    assert continuation(es[0], "q <unk>call<unk> result") is None
    assert continuation(es[0], "q <unk>call<unk> result", lambda t: served(t, t)) == (0, 2)
    assert continuation(es[0], "q <call> result", lambda t: served(t, t)) == (0, 2)


@pytest.mark.parametrize("data, problem", [
    ([], "top level must be a JSON object"),
    ({"entries": [{"match": "a", "responses": ["x"]}], "evry": 2}, "unknown key(s) ['evry']"),
    ({"entries": []}, '"entries" must be a non-empty list'),
    ({"entries": [{"match": "a", "responses": ["x"]}], "every": 0}, '"every" must be a positive integer'),
    ({"entries": [{"match": "a", "responses": ["x"]}], "every": True}, '"every" must be a positive integer'),
    ({"entries": [{"match": "", "responses": ["x"]}]}, "entries[0].match must be a non-empty string"),
    ({"entries": [{"match": "a", "responses": []}]}, "entries[0].responses must be a non-empty list"),
    ({"entries": [{"match": "a", "responses": ["x", [], "y"]}]}, "entries[0].responses[1] must be"),
    ({"entries": [{"match": "a", "responses": [["x", 3]]}]}, "entries[0].responses[0] must be"),
    ({"entries": [{"match": "a", "responses": ["x"]}, {"match": "a", "responses": ["y"]}]},
     "entries[1].match 'a' is also entries[0].match"),
    ({"entries": [{"match": "a", "response": ["x"]}]}, "entries[0]: unknown key(s) ['response']"),
])
def test_a_bad_script_is_one_line_naming_the_file_and_the_problem(tmp_path, data, problem):
    path = tmp_path / "script.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError) as err:
        load_script(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and problem in message


def test_script_file_defaults_and_unreadable_files(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"entries": [{"match": "m", "responses": ["x", ["y", "z"]]}]}))
    script = load_script(path)
    assert script.every == 2 and script.entries == [Entry("m", (("x",), ("y", "z")))]
    assert parse_script({"entries": [{"match": "m", "responses": ["x"]}], "every": 1}).every == 1
    path.write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        load_script(path)
    with pytest.raises(UserError, match="cannot read it"):
        load_script(tmp_path / "missing.json")


def test_stats_lines_are_appended(tmp_path):
    path = tmp_path / "stats.jsonl"
    append_stats(path, Pick("x", 0, 1).stats())
    append_stats(path, Pick(entry=2).stats())
    append_stats(path, Pick().stats())
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"scripted": True, "entry": 0, "turn": 1}, {"scripted": False, "entry": 2, "turn": None},
        {"scripted": False, "entry": None, "turn": None}]


# ------------------------------------------------------------------------------------------------
# the engine

LONG_ANSWER = "1+" * 150  # 300 tokens: long enough to pause or abort while it is being served
SCRIPT = {
    "entries": [
        {"match": "1+2=", "responses": ["\\boxed{3}", ["The answer", "is \\boxed{3}"]]},  # 0
        {"match": "4+4=", "responses": ["\\boxed{8}"]},  # 1
        {"match": "4=", "responses": ["wrong"]},  # 2: "4+4=" holds it too, but entry 1's match is longer
        {"match": "6+1=", "responses": ["The answer is \\boxed{7}"]},  # 3
        {"match": "5+3=", "responses": [["The answer", "is \\boxed{8}"], ["[calc 5+3]", "\\boxed{8}"]]},  # 4
        {"match": "9+9=", "responses": [LONG_ANSWER]},  # 5
    ],
    "every": 2,
}
EOS = 2  # <|im_end|> of the tiny tokenizer


@pytest.fixture(scope="module")
def tok(tiny):
    return AutoTokenizer.from_pretrained(tiny.model_dir)


@pytest.fixture(scope="module")
def hf(tiny):
    return AutoModelForCausalLM.from_pretrained(tiny.model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(tiny, tmp_path_factory):
    """An engine given its script and stats file the way a run gives them: environment variables."""
    folder = tmp_path_factory.mktemp("script")
    script, stats = folder / "script.json", folder / "stats.jsonl"
    script.write_text(json.dumps(SCRIPT))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SCRIPT_ENV, str(script))
        mp.setenv(STATS_ENV, str(stats))
        with InProcessEngine(tiny.model_dir, max_running_requests=16, random_seed=3) as e:
            e.stats = stats
            mp.delenv(SCRIPT_ENV)
            mp.delenv(STATS_ENV)
            yield e


def prompt(tok, question: str) -> list[int]:
    return tok.apply_chat_template([{"role": "user", "content": question}], tokenize=True,
                                   add_generation_prompt=True, return_dict=False)


def run(engine, coro_fn):
    """Run ``coro_fn(client)``; return its result and the stats lines the engine wrote meanwhile."""
    before = stats_lines(engine)

    async def main():
        async with SGLangClient(engine.url) as client:
            return await coro_fn(client)

    result = asyncio.run(main())
    return result, stats_lines(engine)[len(before):]


def stats_lines(engine) -> list[dict]:
    return [json.loads(line) for line in engine.stats.read_text().splitlines()] if engine.stats.exists() else []


def unordered(stats: list[dict]) -> list[str]:
    """Stats lines come in the order requests finish: compare those of a batch as a multiset."""
    return sorted(json.dumps(s, sort_keys=True) for s in stats)


def scripted_ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False) + [EOS]


def reference_logprobs(model, prompt_ids, response, temperature=1.0) -> list[float]:
    """What the trainer computes: log_softmax(logits / T) of each response token, fp32."""
    return hf_logprobs(model, prompt_ids + response, temperature)[len(prompt_ids) - 1:].tolist()


def test_scripted_answers_for_matching_prompts_carry_the_models_own_logprobs(engine, tok, hf):
    p, other, longest = prompt(tok, "1+2="), prompt(tok, "2+2="), prompt(tok, "4+4=")
    params = {"temperature": 0.7, "max_new_tokens": 16}

    async def go(c):
        group = await c.generate_batch([p] * 4, params)
        return group, await c.generate(other, params), await c.generate(longest, params)

    (group, unmatched, by_longest), stats = run(engine, go)
    assert [o.text for o in (group[0], group[2])] == ["\\boxed{3}", "The answer"]
    assert group[0].output_ids == scripted_ids(tok, "\\boxed{3}")
    assert group[2].output_ids == scripted_ids(tok, "The answer")
    for out in (group[0], group[2], by_longest):
        assert out.finish_reason == {"type": "stop", "matched": EOS}
    for out in (group[1], group[3], unmatched):  # sampled: never the scripted text
        assert out.text not in ("\\boxed{3}", "The answer")
    assert by_longest.text == "\\boxed{8}"
    for out, prompt_ids in ((group[0], p), (group[2], p), (by_longest, longest), (group[1], p)):
        expected = reference_logprobs(hf, prompt_ids, out.output_ids, 0.7)
        assert len(out.output_log_probs) == len(out.output_ids)
        assert max(abs(a - b) for a, b in zip(out.output_log_probs, expected)) < 1e-6
    assert unordered(stats[:4]) == unordered([{"scripted": True, "entry": 0, "turn": 1}] * 2
                                             + [{"scripted": False, "entry": 0, "turn": None}] * 2)
    assert stats[4:] == [{"scripted": False, "entry": None, "turn": None}, {"scripted": True, "entry": 1, "turn": 1}]


def test_length_stop_strings_and_stop_tokens_cut_a_scripted_answer(engine, tok, hf):
    p = prompt(tok, "6+1=")
    full = scripted_ids(tok, "The answer is \\boxed{7}")
    box = tok.convert_tokens_to_ids("\\boxed{")
    stop_at = full.index(box)
    # the first prefix whose text holds the stop string: SGLang stops on that token
    by_is = next(n for n in range(1, len(full)) if "is" in tok.decode(full[:n]))
    base = {"temperature": 1.0, "max_new_tokens": 32}
    params = [{**base, "max_new_tokens": 3}, base, {**base, "stop": ["is"]}, base,
              {**base, "stop_token_ids": [box]}, base, {**base, "max_new_tokens": len(full) - 1}, base, base]

    async def go(c):
        return await c.generate_batch([p] * len(params), params)

    outs, stats = run(engine, go)
    cut, by_string, by_token, no_eos, whole = outs[0], outs[2], outs[4], outs[6], outs[8]
    assert cut.output_ids == full[:3] and cut.finish_reason == {"type": "length", "length": 3}
    assert cut.text == tok.decode(full[:3])
    assert by_string.output_ids == full[:by_is] and by_string.finish_reason == {"type": "stop", "matched": "is"}
    assert by_string.text == "The answer "
    assert by_token.output_ids == full[: stop_at + 1]
    assert by_token.finish_reason == {"type": "stop", "matched": box} and by_token.text == "The answer is "
    assert no_eos.output_ids == full[:-1] and no_eos.finish_reason == {"type": "length", "length": len(full) - 1}
    assert whole.output_ids == full and whole.text == "The answer is \\boxed{7}"
    expected = reference_logprobs(hf, p, full)
    for out in (cut, by_string, by_token, no_eos, whole):
        assert max(abs(a - b) for a, b in zip(out.output_log_probs, expected)) < 1e-6
    assert sorted(s["scripted"] for s in stats) == [False] * 4 + [True] * 5  # lines come in finishing order


def test_turn_two_is_served_to_a_prompt_holding_turn_one(engine, tok):
    p = prompt(tok, "5+3=")
    tool = tok.encode("\nuser\n8\nassistant\n", add_special_tokens=False)
    params = {"temperature": 1.0, "max_new_tokens": 32}

    async def go(c):
        first = await c.generate(p, params)
        second = await c.generate(p + first.output_ids + tool, params)
        sampled = await c.generate(p, params)  # the entry's second first turn: sampled
        other = await c.generate(p, params)  # the third: the second response, whose turn 1 the tokenizer can't spell
        other_second = await c.generate(p + other.output_ids + tool, params)
        done = await c.generate(p + first.output_ids + tool + second.output_ids + tool, params)
        return first, second, sampled, other, other_second, done

    (first, second, sampled, other, other_second, done), stats = run(engine, go)
    assert first.text == "The answer" and second.text == "is \\boxed{8}"
    assert second.finish_reason == {"type": "stop", "matched": EOS}
    assert other.output_ids == scripted_ids(tok, "[calc 5+3]")
    assert other.text == tok.decode(other.output_ids, skip_special_tokens=True) == "al 5+3"  # <unk>s skipped
    assert other_second.text == "\\boxed{8}"
    assert stats == [{"scripted": True, "entry": 4, "turn": 1}, {"scripted": True, "entry": 4, "turn": 2},
                     {"scripted": False, "entry": 4, "turn": None}, {"scripted": True, "entry": 4, "turn": 1},
                     {"scripted": True, "entry": 4, "turn": 2},
                     {"scripted": False, "entry": 4, "turn": None}]  # every turn held: a first turn, sampled
    assert done.text != "The answer"


def test_a_scripted_answer_has_a_sampled_answers_fields(engine, tok):
    p = prompt(tok, "4+4=")
    body = {"input_ids": p, "sampling_params": {"max_new_tokens": 8}, "return_logprob": True, "logprob_start_len": 0}

    async def go(c):
        return [await c._call("POST", "/generate", body) for _ in range(2)]

    outs, stats = run(engine, go)  # two first turns in a row: one of them scripted (every 2)
    assert sorted(s["scripted"] for s in stats) == [False, True]
    scripted, sampled = outs if stats[0]["scripted"] else outs[::-1]
    assert scripted["text"] == "\\boxed{8}"
    assert set(scripted) == set(sampled) and set(scripted["meta_info"]) == set(sampled["meta_info"])
    assert len(scripted["meta_info"]["input_token_logprobs"]) == len(p)
    assert scripted["meta_info"]["completion_tokens"] == len(scripted["output_ids"]) == 4


class DecodeGate:
    """Holds the engine's scheduler thread before a decode step of a request that has output, until
    the test has queued its control (pause or abort): the control then lands mid-answer on any
    machine, with no race against decode speed."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.armed = threading.Event()
        self.reached = threading.Event()
        self.release = threading.Event()
        self._step = scheduler._step
        scheduler._step = self.step

    def step(self, batch):
        if self.armed.is_set() and any(r.output_ids for r in batch):
            self.armed.clear()
            self.reached.set()
            self.release.wait(timeout=120)
        return self._step(batch)

    async def hold(self, task):
        """Arm, and wait until the scheduler is held mid-answer for ``task``."""
        self.reached.clear()
        self.release.clear()
        self.armed.set()
        while not self.reached.is_set():
            assert not task.done(), "the request finished before the scheduler was held"
            await asyncio.sleep(0.01)

    async def release_after_queued(self):
        """Let the scheduler go on once the test's control is in its inbox."""
        while self.scheduler._inbox.empty():
            await asyncio.sleep(0.01)
        self.release.set()

    def close(self):
        self.release.set()
        self.scheduler._step = self._step


def test_pause_and_abort_work_on_a_scripted_answer(engine, tok, hf):
    p = prompt(tok, "9+9=")
    params = {"temperature": 1.0, "max_new_tokens": 400}
    filler = {"temperature": 1.0, "max_new_tokens": 1}
    gate = DecodeGate(engine.server.scheduler)

    async def go(c):
        reference = await c.generate(p, params)  # first turns 0, 2, 4 of the entry are scripted
        await c.generate(p, filler)
        task = asyncio.create_task(c.generate(p, params))
        await gate.hold(task)
        await asyncio.gather(c.pause_generation("retract"), gate.release_after_queued())
        await c.continue_generation()
        retracted = await task
        await c.generate(p, filler)
        task = asyncio.create_task(c.generate(p, params, rid="scripted-abort"))
        await gate.hold(task)
        await asyncio.gather(c.abort_request(rid="scripted-abort"), gate.release_after_queued())
        return reference, retracted, await task

    try:
        (reference, retracted, aborted), stats = run(engine, go)
    finally:
        gate.close()
    assert reference.output_ids == scripted_ids(tok, LONG_ANSWER) and reference.text == LONG_ANSWER
    assert retracted.meta_info["num_retractions"] == 1
    assert retracted.output_ids == reference.output_ids
    expected = reference_logprobs(hf, p, reference.output_ids)
    for out in (reference, retracted):
        assert max(abs(a - b) for a, b in zip(out.output_log_probs, expected)) < 1e-6
    assert aborted.finish_type == "abort" and 0 < len(aborted.output_ids) < len(reference.output_ids)
    assert aborted.output_ids == reference.output_ids[: len(aborted.output_ids)]
    assert [s["scripted"] for s in stats] == [True, False, True, False, True]


def test_a_bad_script_stops_the_engine_cli_in_one_line(tiny, tmp_path):
    bad = tmp_path / "script.json"
    bad.write_text(json.dumps({"entries": [{"match": "a", "responses": "x"}]}))
    proc = subprocess.run([sys.executable, "-m", "slime_ref.engine", "--model-path", str(tiny.model_dir),
                           "--host", "127.0.0.1", "--port", "9"], env={**os.environ, SCRIPT_ENV: str(bad)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert str(bad) in proc.stderr and "entries[0].responses must be a non-empty list" in proc.stderr


def test_a_launched_engine_reads_the_script_from_its_environment(tiny, tok, tmp_path, monkeypatch):
    """The launcher (rollout/servers.py, inside a Ray actor) hands its environment to the engine."""
    from slime_ref.rollout.servers import RolloutServers

    script, stats = tmp_path / "script.json", tmp_path / "stats.jsonl"
    script.write_text(json.dumps({"entries": [{"match": "1+2=", "responses": ["\\boxed{3}"]}], "every": 1}))
    monkeypatch.setenv(SCRIPT_ENV, str(script))
    monkeypatch.setenv(STATS_ENV, str(stats))
    with RolloutServers(tiny.model_dir, log_dir=tmp_path / "logs", with_router=False, num_threads=1) as servers:
        async def go():
            async with SGLangClient(servers.url) as c:
                return await c.generate(prompt(tok, "1+2="), {"max_new_tokens": 8})

        out = asyncio.run(go())
    assert out.text == "\\boxed{3}"
    assert [json.loads(line) for line in stats.read_text().splitlines()] == [{"scripted": True, "entry": 0, "turn": 1}]
