"""The smoke verdict's parts on made-up results, and the hook runtime's pure parts: the label probe's
answer shapes and labels, cause chains, crashes read from a log, SFT jobs, the dynamic filter's counts,
line coverage by function, the stand-in's context refusals, --responses files. No run (seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slime_check.findings import Status
from slime_rehearse.smoke_assets import read_responses, stand_in_context, write_engine_script
from slime_rehearse.smoke_job import FULL_LENGTH_HOOK, Shrunk, SmokeOptions
from slime_rehearse.smoke_runtime import ANSWER_SHAPES, answer_text, describe, probe_reward, prompt_text
from slime_rehearse.smoke_verdict import (
    coverage_findings,
    filter_counts,
    filter_findings,
    functions_by_line,
    hook_findings,
    last_traceback,
    line_ranges,
    probe_findings,
    verdict,
)

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def _verdict(result: dict, argv: list[str] | None = None, user_len: int | None = 512) -> dict:
    shrunk = Shrunk(argv or [], [], {}, [], user_len, {})
    return {f.id: f for f in verdict({"returncode": 0, "timed_out": False, "log": "", "hooks": {}, **result},
                                     shrunk, SmokeOptions(out=Path("/tmp/x")))}


# ---------------------------------------------------------------------------------------------
# the label probe (defect E, and item 4: no false FAIL)


@pytest.mark.parametrize("label, answer", [
    ("8", "8"), (8, "8"), (2.5, "2.5"),
    ({"ground_truth": {"target": ["Paris", "paris"]}}, "Paris"),  # slime's search-r1 examples
    ({"answer": "B", "choices": ["A", "B"]}, "B"),
    (["42", "forty-two"], "42"),
    ({"whatever": {"deep": "x"}}, "x"),
    (None, None), ({}, None), (True, None),
])
def test_the_reference_answer_is_read_from_plain_and_structured_labels(label, answer):
    assert answer_text(label) == answer


def test_prompt_text_is_the_last_user_message_or_the_string():
    assert prompt_text([{"role": "system", "content": "s"}, {"role": "user", "content": " 3+5= "}]) == "3+5="
    assert prompt_text("Question: 3+5?") == "Question: 3+5?"
    assert prompt_text([{"role": "assistant", "content": "x"}]) is None


def _probe(tmp_path, reward_source: str, rows: list[dict], responses=(), argv=()):
    """probe_reward on a reward hook written to a module of its own."""
    package = tmp_path / f"rw{abs(hash(reward_source)) % 10**8}"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "reward.py").write_text(textwrap.dedent(reward_source))
    sys.path.insert(0, str(tmp_path))
    try:
        from slime_rehearse.smoke_runtime import parse_args

        args = parse_args(["--rollout-batch-size", "1", "--input-key", "prompt", "--label-key", "label", *argv])
        hooks = {"h0": ("--custom-rm-path", f"{package.name}.reward.fn")}
        return probe_reward(args, hooks, rows, list(responses), real_slime=False)
    finally:
        sys.path.remove(str(tmp_path))


ANSWER_TAGS = """
import re

async def fn(args, sample, **kwargs):
    found = re.findall(r"<answer>(.*?)</answer>", sample.response)
    target = sample.label["ground_truth"]["target"]
    return 1.0 if found and found[-1] in target else 0.0
"""


def test_a_reward_that_wants_answer_tags_is_learned_and_passes(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "Capital of France?"}],
             "label": {"ground_truth": {"target": ["Paris"]}}}]
    probe = _probe(tmp_path, ANSWER_TAGS, rows)
    assert probe["shapes"]["answer_tags"] == 1.0
    assert all(probe["shapes"][s] == 0.0 for s in ANSWER_SHAPES if s != "answer_tags")
    assert probe["calls"] == len(ANSWER_SHAPES)
    found = {f.id: f for f in probe_findings(probe)}
    assert found["smoke.reward_format"].status is Status.PASS
    assert "answer_tags" in found["smoke.reward_format"].finding
    assert f"{len(ANSWER_SHAPES)} extra calls" in found["smoke.reward_format"].finding


def test_a_reward_no_shape_pleases_is_a_warning_that_asks_for_responses(tmp_path):
    rows = [{"prompt": "3+5=", "label": "8"}]
    probe = _probe(tmp_path, "def fn(args, sample, **kw):\n    return float(sample.response == 'EIGHT!')\n", rows)
    (finding,) = probe_findings(probe)
    assert finding.status is Status.WARN and "--responses" in finding.fix
    assert all(shape in finding.finding for shape in ANSWER_SHAPES)


def test_only_a_response_marked_correct_that_scores_0_is_a_fail(tmp_path):
    rows = [{"prompt": "3+5=", "label": "8"}]
    source = "def fn(args, sample, **kw):\n    return float(sample.response.strip().endswith('8'))\n"
    good = _probe(tmp_path, source, rows, responses=[{"response": "so it is 8", "correct": True}])
    assert not [f for f in probe_findings(good) if f.status is Status.FAIL]
    bad = _probe(tmp_path, source, rows, responses=[{"response": "8 is it", "correct": True},
                                                    {"response": "nine", "correct": False}])
    fails = [f for f in probe_findings(bad) if f.status is Status.FAIL]
    assert len(fails) == 1 and "'8 is it'" in fails[0].finding


def test_a_dict_reward_is_read_at_its_reward_key(tmp_path):
    rows = [{"prompt": "3+5=", "label": "8"}]
    source = "def fn(args, sample, **kw):\n    return {'acc': float('8' in sample.response), 'pred': 1}\n"
    probe = _probe(tmp_path, source, rows, argv=["--reward-key", "acc"])
    assert probe["shapes"]["bare"] == 1.0


# ---------------------------------------------------------------------------------------------
# causes and crashes (defects G and I)


def test_an_error_is_described_with_its_causes():
    try:
        try:
            import slime_missing_module_xyz  # noqa: F401
        except ImportError as e:
            raise ImportError("MathDapo is not installed") from e
    except ImportError as e:
        text = describe(e)
    assert text.startswith("ImportError: MathDapo is not installed (from ModuleNotFoundError: No module named")
    assert "'slime_missing_module_xyz'" in text


RAY_CRASH = """\
(RolloutManager pid=4242) Traceback (most recent call last):
(RolloutManager pid=4242)   File "/x/slime_ref/ray/rollout_manager.py", line 210, in generate
(RolloutManager pid=4242)     raw, rewards = post_process_rewards(self.args, samples)
(RolloutManager pid=4242)   File "/home/u/hooks/post.py", line 12, in post_process
(RolloutManager pid=4242)     return torch.stack(rewards)
(RolloutManager pid=4242) RuntimeError: stack expects a non-empty TensorList
some later line
"""


def test_a_crash_is_reported_with_its_exception_and_where_it_was_raised():
    crash = last_traceback(RAY_CRASH)
    assert crash["exception"] == "RuntimeError: stack expects a non-empty TensorList"
    assert crash["frame"] == {"file": "/home/u/hooks/post.py", "line": 12, "function": "post_process"}
    run = _verdict({"returncode": 1, "log": RAY_CRASH})["smoke.run"]
    assert run.status is Status.FAIL
    assert "RuntimeError: stack expects a non-empty TensorList (raised in post_process at /home/u/hooks/post.py:12)" \
        in run.finding


def test_a_run_without_a_traceback_keeps_the_exit_status():
    assert "exit status 3" in _verdict({"returncode": 3, "log": "nothing useful"})["smoke.run"].finding


# ---------------------------------------------------------------------------------------------
# SFT jobs get no reward verdicts (defect J)


def _rollouts(zero_std=1.0, truncated=1.0):
    return [{"rollout/raw_reward": 0.0, "rollout/truncated_ratio": truncated, "rollout/zero_std_ratio": zero_std,
             "rollout/response_length": 30.0}]


def test_an_sft_job_is_not_judged_on_rewards_or_truncation():
    argv = ["--loss-type", "sft_loss", "--disable-compute-advantages-and-returns", "--debug-train-only"]
    found = _verdict({"metrics": _rollouts()}, argv, user_len=8)
    assert found["smoke.reward"].status is Status.PASS and "not applicable" in found["smoke.reward"].finding
    assert "smoke.truncation" not in found
    grpo = _verdict({"metrics": _rollouts()}, ["--advantage-estimator", "grpo"], user_len=8)
    assert grpo["smoke.reward"].status is Status.WARN and grpo["smoke.truncation"].status is Status.FAIL


def test_truncation_by_the_rehearsals_own_cap_says_so():
    found = _verdict({"metrics": _rollouts(truncated=1.0)}, [], user_len=4096)["smoke.truncation"]
    assert found.status is Status.PASS and "the rehearsal's cap" in found.finding
    own = _verdict({"metrics": _rollouts(truncated=0.5)}, [], user_len=16)["smoke.truncation"]
    assert "cap" not in own.finding


# ---------------------------------------------------------------------------------------------
# the dynamic filter (defect M, and the starvation guard's verdict)


def _filter_metrics(seen, dropped, spread, starved, filled, reasons):
    return [{"rollout/raw_reward": 0.5, "rollout/dynamic_filter/groups_seen": seen,
             "rollout/dynamic_filter/groups_dropped": dropped, "rollout/dynamic_filter/dropped_with_spread": spread,
             "rollout/dynamic_filter/starved": starved, "rollout/dynamic_filter/filled": filled,
             **{f"rollout/dynamic_filter/drop_{k}": v for k, v in reasons.items()}}]


def test_a_starved_filter_explained_by_equal_rewards_is_a_warning_with_its_counts():
    counts = filter_counts(_filter_metrics(12, 11, 0, 1, 1, {"zero_std_0.0": 11}) * 2)
    assert counts["groups_seen"] == 24 and counts["reasons"] == {"zero_std_0.0": 22}
    (finding,) = filter_findings(counts)
    assert finding.id == "smoke.filter_starved" and finding.status is Status.WARN
    assert "22 of 24 groups (92%" in finding.finding and "zero_std_0.0 x22" in finding.finding
    assert "equal rewards" in finding.finding and "2 of 2 rollouts" in finding.finding


def test_a_filter_that_drops_groups_with_spread_too_is_a_fail():
    (finding,) = filter_findings(filter_counts(_filter_metrics(16, 16, 9, 1, 2, {"not_perfect": 16})))
    assert finding.id == "smoke.filter" and finding.status is Status.FAIL and "the 9 whose rewards differed" \
        in finding.finding


def test_a_filter_that_keeps_groups_passes_and_no_filter_says_nothing():
    (finding,) = filter_findings(filter_counts(_filter_metrics(5, 1, 0, 0, 0, {"zero_std_1.0": 1})))
    assert finding.status is Status.PASS and "kept 4 of 5" in finding.finding
    assert filter_counts([{"rollout/raw_reward": 1.0}]) is None and filter_findings(None) == []


# ---------------------------------------------------------------------------------------------
# line coverage by function (item 3)


HOOK = '''\
import re


def helper(x):
    return x + 1


async def generate(args, sample):
    text = sample.response
    if "<tool>" in text:
        result = helper(1)
        text += str(result)
    return text
'''


def test_lines_belong_to_the_function_whose_body_holds_them(tmp_path):
    path = tmp_path / "hook.py"
    path.write_text(HOOK)
    owner = functions_by_line(str(path))
    assert owner.get(4) is None and owner[5] == "helper"  # the def line runs at import
    assert [owner[n] for n in range(9, 14)] == ["generate"] * 5


def test_missed_lines_are_joined_across_non_statements():
    assert line_ranges([11, 12, 15], [9, 10, 11, 12, 15, 16]) == [(11, 15)]
    assert line_ranges([11, 16], [9, 10, 11, 12, 15, 16]) == [(11, 11), (16, 16)]


def test_a_branch_never_run_is_a_warning_with_its_lines():
    report = [{"file": "/h/hook.py", "statements": 9, "run": 6, "functions_run": ["generate"],
               "missing": [{"lines": [5, 5], "function": "helper"}, {"lines": [11, 12], "function": "generate"}]}]
    found = coverage_findings(report)
    assert [f.status for f in found] == [Status.PASS, Status.WARN]
    assert "6 of 9 lines ran" in found[0].finding
    assert "generate (hook.py) ran, but lines 11-12 never did" in found[1].finding
    assert "--responses" in found[1].fix  # helper never ran at all: not a branch of a function that ran


def test_coverage_measures_a_hook_on_a_thread_started_before_the_hooks_import(tmp_path):
    """The real mechanism: importing the counted hooks starts coverage.py; a thread started before that
    import (as an event loop may be) is measured from the hook's first call; the wrapper saves the
    data without an exit handler."""
    from slime_check.hook_check import write_hooks
    from slime_rehearse.smoke_assets import SMOKE_SITE, write_coverage_config
    from slime_rehearse.smoke_verdict import hook_coverage

    (tmp_path / "hook.py").write_text(HOOK)
    out = tmp_path / "out"
    config = write_hooks({"h0": ("--custom-generate-function-path", "hook.generate")}, out)
    cov_config = write_coverage_config(out, [str(tmp_path / "hook.py")])
    code = textwrap.dedent("""
        import asyncio, os, threading, time
        from types import SimpleNamespace
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        import slime_smoke_hooks
        fn = slime_smoke_hooks.h0
        done = asyncio.run_coroutine_threadsafe(fn(None, SimpleNamespace(response="<tool>")), loop).result()
        import coverage
        data_dir = os.path.join(os.environ["OUT"], "coverage")

        def saved():
            for name in os.listdir(data_dir):
                data = coverage.CoverageData(os.path.join(data_dir, name))
                try:
                    data.read()
                except Exception:  # being written
                    continue
                if data.measured_files():
                    return True
            return False

        while not saved():  # the wrapper saves about a second after the call
            time.sleep(0.1)
        os._exit(0)  # as Ray may end a worker: no exit handler runs
    """)
    env = {**os.environ, "OUT": str(out), "SLIME_SMOKE_HOOKS_CONFIG": str(config),
           "COVERAGE_PROCESS_START": str(cov_config), "PYTHONPATH": os.pathsep.join(
               [str(SMOKE_SITE), str(tmp_path), str(REPO / "reference_impl")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    (entry,) = hook_coverage(out / "coverage", cov_config, [str(tmp_path / "hook.py")])
    assert entry["missing"] == [] and entry["functions_run"] == ["generate", "helper"], entry
    assert (out / "hooks" / "calls").is_dir() and sum(
        p.stat().st_size for p in (out / "hooks" / "calls").glob("h0.calls.*")) == 1


# ---------------------------------------------------------------------------------------------
# the stand-in model (defect F) and the engine's script


def test_the_stand_in_context_covers_the_jobs_lengths():
    assert stand_in_context([]) == 4096
    assert stand_in_context([("--rollout-max-context-len", ["16384"])]) == 16384
    assert stand_in_context([("--rollout-max-prompt-len", ["3000"]), ("--rollout-max-response-len", ["8192"])]) \
        == 11192


def test_a_context_refusal_by_the_stand_in_is_not_blamed_on_the_hook():
    hooks = {"h0": {"flag": "--custom-generate-function-path", "path": "search.generate", "calls": 8, "errors": 4,
                    "first_error": "RuntimeError: HTTP 400: the input (4200 tokens) is longer than the model's "
                                   "context (4096 tokens)"}}
    (finding,) = hook_findings(hooks, 1)
    assert finding.id == "smoke.stand_in_context" and finding.status is Status.WARN and "not your hook" \
        in finding.finding


def test_the_stand_in_tokenizer_spells_any_text(tmp_path):
    from slime_rehearse.smoke_assets import stand_in_tokenizer

    tok = stand_in_tokenizer(["3+5=", "<answer>8</answer>"])
    for text in ("<tool_call>{\"name\": \"calc\"}</tool_call>", "Ünïcödé · 数学 \\boxed{8}", "#### 42"):
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "3+5="}], tokenize=False, add_generation_prompt=True)
    assert "3+5=" in chat and chat.endswith("assistant\n")


def test_the_engine_script_gives_the_users_responses_then_the_label_in_the_learned_shapes(tmp_path):
    (tmp_path / "data").mkdir()
    rows = [{"prompt": [{"role": "user", "content": "3+5="}], "label": "8"},
            {"prompt": [{"role": "user", "content": "2+2="}], "label": "4"},
            {"prompt": [{"role": "user", "content": "3+5="}], "label": "8"}]  # a repeated prompt: one entry
    (tmp_path / "data" / "prompt.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    items = [("--input-key", ["prompt"]), ("--label-key", ["label"])]
    probe = {"shapes": {"boxed": 1.0, "answer_tags": 0.0, "bare": 0.5}}
    responses = [{"response": ["<tool>calc</tool>", "done"]}, {"prompt": "2+2", "response": "four"}]
    script = json.loads(write_engine_script(tmp_path, items, probe, responses).read_text())
    assert script == {"every": 2, "entries": [
        {"match": "3+5=", "responses": [["<tool>calc</tool>", "done"], "\\boxed{8}", "8"]},
        {"match": "2+2=", "responses": [["<tool>calc</tool>", "done"], "four", "\\boxed{4}", "4"]}]}
    assert write_engine_script(tmp_path, items, {"shapes": {"boxed": 0.0}}, []) is None


@pytest.mark.parametrize("text, message", [
    ("not json\n", ":1: not JSON"),
    ('{"response": ""}\n', ':1: "response" must be a non-empty string'),
    ('{"response": ["a", 3]}\n', ':1: "response" must be a non-empty string or a list'),
    ('{"response": "a", "correct": "yes"}\n', ':1: "prompt" must be a string and "correct" true or false'),
    ("\n\n", "no responses in it"),
])
def test_a_bad_responses_file_names_the_file_and_line(tmp_path, text, message):
    from slime_common.errors import UserError

    path = tmp_path / "r.jsonl"
    path.write_text(text)
    with pytest.raises(UserError) as e:
        read_responses(path)
    assert str(e.value).startswith(f"--responses {path}") and message in str(e.value)


def test_the_probe_gives_the_reward_the_prompt_as_the_run_does(tmp_path):
    """With --apply-chat-template a Sample's prompt is the rendered chat (a plain string becomes one user
    message, as slime's data loader makes it): a reward that joins prompt and response must not raise."""
    from slime_ref.assets import make_tiny

    tiny = make_tiny(tmp_path / "tiny")
    source = ("def fn(args, sample, **kw):\n    text = sample.prompt + sample.response\n"
              "    return float(text.startswith('<|im_start|>user') and text.endswith(str(sample.label)))\n")
    rows = [{"prompt": [{"role": "user", "content": "3+5="}], "label": "8"}, {"prompt": "2+2=", "label": "4"}]
    probe = _probe(tmp_path, source, rows, argv=["--apply-chat-template", "--hf-checkpoint", str(tiny.model_dir)])
    assert probe["errors"] == {} and probe["shapes"]["bare"] == 1.0


def test_coverage_measures_the_users_modules_beside_the_hook_files(tmp_path):
    from slime_rehearse.smoke_assets import users_files

    (tmp_path / "agent").mkdir()
    for name in ("__init__.py", "rollout.py", "agent_system.py", "tools.py"):
        (tmp_path / "agent" / name).write_text("")
    ours = str(REPO / "reference_impl" / "slime_ref" / "rollout" / "filters.py")
    found = users_files({"h0": str(tmp_path / "agent" / "rollout.py"), "h1": ours})
    assert found == sorted(str(tmp_path / "agent" / n) for n in ("agent_system.py", "rollout.py", "tools.py"))
    # slime's own generate, named only by the memory-faithful smoke's full-length wrapper, is not the user's
    (tmp_path / "slime_rollout").mkdir()
    (tmp_path / "slime_rollout" / "sglang_rollout.py").write_text("")
    (tmp_path / "slime_rollout" / "data_source.py").write_text("")
    wrapped = users_files({"h0": str(tmp_path / "agent" / "rollout.py"),
                           FULL_LENGTH_HOOK: str(tmp_path / "slime_rollout" / "sglang_rollout.py")})
    assert wrapped == found


def test_the_stand_in_tokenizer_learns_the_responses_and_the_cap_covers_the_longest(tmp_path):
    from slime_rehearse.smoke_assets import build_model, scripted_tokens

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "prompt.jsonl").write_text(json.dumps({"prompt": "3+5=", "label": "8"}) + "\n")
    call = '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(3 + 5)"}}</tool_call>'
    responses = [{"response": [call, "\\boxed{8}"]}, {"response": "8"}]
    model_dir, _ = build_model([], tmp_path, responses)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    turns = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in (call, "\\boxed{8}")]
    assert scripted_tokens(model_dir, responses) == sum(turns) + 2  # each turn ends with eos
    assert tok.decode(tok(call, add_special_tokens=False)["input_ids"]) == call
