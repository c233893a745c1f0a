"""Rewards (math grading, dapo, deepscaler, f1, boxed_, remote_rm, hooks) and dynamic sampling filters."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from aiohttp import web

from algo_args import make_args
from slime_ref.errors import UserError
from slime_ref.rollout.filters import (
    DynamicFilterOutput,
    call_dynamic_filter,
    check_reward_nonzero_std,
    check_reward_nonzero_std_with_fallback,
    drop_metrics,
    should_drop,
)
from slime_ref.rollout.rewards import (
    async_rm,
    batched_async_rm,
    dapo_reward,
    deepscaler_reward,
    f1_reward,
    math_reward,
    remote_rm,
    rule_based_reward,
)
from slime_ref.types import Sample
from slime_ref.utils.hooks import check_hook_path, load_function

# (response, label, reward): real-looking answers, right and wrong; the rewards are slime v0.3.1's
MATH_CASES = [
    ("The sum is 3 + 5, so the answer is \\boxed{8}.", "8", 1),
    ("\\boxed{8}", "8", 1),
    ("8", "8", 0),  # right but unboxed: slime's math needs \\boxed{}
    ("The answer is 8.", "8", 0),
    ("Answer: 8", "8", 0),
    ("\\boxed{9}", "8", 0),
    ("It looks like 8, but checking again gives \\boxed{9}", "8", 0),  # the last box counts
    ("First \\boxed{7}; correcting: \\boxed{8}", "8", 1),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1),
    ("\\boxed{1/2}", "\\frac{1}{2}", 1),
    ("\\boxed{0.5}", "1/2", 1),
    ("\\boxed{\\dfrac{1}{2}}", "1/2", 1),
    ("\\boxed{\\frac12}", "0.5", 1),
    ("0.5", "\\frac{1}{2}", 0),
    ("\\boxed{1/2}.", "0.5", 1),
    ("\\boxed{.5}", "1/2", 1),
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", 0),  # as slime: an unreduced fraction is wrong
    ("\\boxed{0.33}", "\\frac{1}{3}", 0),
    ("\\boxed{-\\frac{3}{4}}", "-0.75", 1),
    ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1),
    ("\\boxed{(2, 1)}", "(1, 2)", 0),
    ("\\boxed{x = 5}", "5", 1),
    ("\\boxed{5\\text{ cm}}", "5", 1),
    ("\\boxed{90^\\circ}", "90", 1),
    ("\\boxed{50\\%}", "50", 1),
    ("\\boxed{\\$1,000}", "1000", 1),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1),
    ("\\boxed{\\frac{\\pi}{2}}", "\\pi/2", 1),
    ("\\boxed{3\\pi}", "\\pi", 0),
    ("\\boxed{(x+1)^2}", "x^2+2x+1", 1),
    ("\\boxed{x^2+1}", "x^2+2x+1", 0),
    ("So $\\boxed{12}$.", "12", 1),
    ("\\boxed{12}", "21", 0),
    ("I do not know.", "8", 0),
    ("", "8", 0),
    ("\\boxed{8}", "The total is \\boxed{8}", 1),  # a boxed label is reduced to its box
    ("\\boxed{\\text{Yes}}", "yes", 1),
    ("\\boxed{}", "8", 0),
    ("\\boxed{8", "8", 0),  # a box that never closes is no answer
    ("The final answer is $\\boxed{\\frac{3}{2}}$.", "1.5", 1),
    ("\\boxed{8.0}", "8", 1),
    ("\\boxed{-8}", "8", 0),
    ("\\boxed{10^{3}}", "1000", 0),  # as slime: "^{" never reaches sympy (it could hang)
    ("\\boxed{8}<|im_end|>", "8", 1),  # an end-of-turn token left in the text
    ("\\boxed{__import__('os').getcwd()}", "0", 0),  # never evaluated as code
]


@pytest.mark.parametrize("response, label, expected", MATH_CASES)
def test_math_reward_grades_real_looking_answers(response, label, expected):
    assert math_reward(response, label) == expected


def test_math_cases_cover_right_and_wrong_answers():
    assert len(MATH_CASES) >= 30
    assert sum(e for _, _, e in MATH_CASES) >= 15 and sum(1 - e for _, _, e in MATH_CASES) >= 10


def test_boxed_math_on_the_tiny_task_format(tiny):
    row = json.loads(tiny.train_path.read_text().splitlines()[0])
    label = row["label"]
    wrong = str((int(label) + 1) % 10)
    assert rule_based_reward("boxed_math", f"\\boxed{{{label}}}", label) == 1
    assert rule_based_reward("boxed_math", f"{label}", label) == 0  # right but unboxed: the format counts
    assert rule_based_reward("boxed_math", f"The answer is {label}.", label) == 0
    assert rule_based_reward("boxed_math", f"\\boxed{{{wrong}}}", label) == 0
    # math grades the same rows the same way: it needs the box too
    for response in (f"\\boxed{{{label}}}", label, f"\\boxed{{{wrong}}}"):
        assert rule_based_reward("math", response, label) == rule_based_reward("boxed_math", response, label)
    assert tiny.manifest["rm_type"] == "math"


def test_boxed_prefix_grades_only_the_box_for_every_rule():
    assert rule_based_reward("boxed_f1", "blah \\boxed{the cat sat}", "cat sat") == pytest.approx(1.0)
    assert rule_based_reward("boxed_f1", "the cat sat", "cat sat") == 0
    assert rule_based_reward("boxed_deepscaler", "\\boxed{0.5}", "1/2") == 1  # no </think> needed in box form
    assert rule_based_reward("boxed_dapo", "\\boxed{34}", "34")["score"] == 1.0
    assert rule_based_reward("boxed_dapo", "34", "34")["score"] == -1.0


def test_deepscaler_reads_after_the_reasoning_and_needs_a_box():
    assert deepscaler_reward("<think>maybe \\boxed{3}</think> so \\boxed{1/2}", "0.5") == 1
    assert deepscaler_reward("<think>\\boxed{1/2}</think> so \\boxed{3}", "0.5") == 0
    assert deepscaler_reward("\\boxed{1/2}", "0.5") == 0  # no </think>: no answer
    assert deepscaler_reward("</think> the answer is 1/2", "0.5") == 0  # unboxed
    assert deepscaler_reward("###Response \\boxed{7}", "7") == 1


def test_dapo_reads_the_last_answer_line():
    assert dapo_reward("work...\nAnswer: 12\nmore\nAnswer: $34$", "34") == {"score": 1.0, "acc": True, "pred": "34"}
    assert dapo_reward("Answer: 1,000 dollars", "1000.0")["acc"] is True
    assert dapo_reward("Answer: x = 7", "7")["acc"] is True
    assert dapo_reward("Answer: 35", "34") == {"score": -1.0, "acc": False, "pred": "35"}
    assert dapo_reward("no final line", "34") == {"score": -1.0, "acc": False, "pred": "[INVALID]"}


def test_f1_by_hand():
    # pred [cat, sat] (the dropped), truth [cat, sat, down]: common 2, P = 1, R = 2/3, F1 = 0.8
    assert f1_reward("The cat sat.", "cat sat down") == pytest.approx(0.8)
    assert f1_reward("yes", "no") == 0.0
    assert f1_reward("Yes!", "yes") == 1.0
    assert f1_reward("dog", "cat") == 0.0


# ---------------------------------------------------------------------------------------------
# Dispatch and hooks
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def hook_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "async def length(args, sample, **kwargs):\n"
        "    return float(len(sample.response))\n"
        "def constant(args, sample, **kwargs):\n"
        "    return 0.25\n"
        "async def rank_group(args, samples, **kwargs):\n"
        "    order = sorted(range(len(samples)), key=lambda i: len(samples[i].response))\n"
        "    return [float(order.index(i)) for i in range(len(samples))]\n"
    )
    (tmp_path / "broken_rewards.py").write_text("import not_a_real_package_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_rm_type_from_metadata_wins_over_the_flag():
    args = make_args("--rm-type", "math")
    plain = Sample(response="the cat sat", label="cat sat")
    assert asyncio.run(async_rm(args, plain)) == 0
    per_sample = Sample(response="the cat sat", label="cat sat", metadata={"rm_type": "f1"})
    assert asyncio.run(async_rm(args, per_sample)) == pytest.approx(1.0)  # SQuAD F1 drops "the"


def test_custom_rm_hooks_async_sync_and_per_sample(hook_module):
    sample = Sample(response="abcd", label="x")
    assert asyncio.run(async_rm(make_args("--custom-rm-path", "my_rewards.length"), sample)) == 4.0
    assert asyncio.run(async_rm(make_args("--custom-rm-path", "my_rewards.constant"), sample)) == 0.25
    sample.custom_rm_path = "my_rewards.constant"  # per-sample path first
    assert asyncio.run(async_rm(make_args("--custom-rm-path", "my_rewards.length"), sample)) == 0.25


def test_group_rm_hook_gets_the_whole_group(hook_module):
    group = [Sample(response="aaa"), Sample(response="a"), Sample(response="aa")]
    args = make_args("--custom-rm-path", "my_rewards.rank_group", "--group-rm")
    assert asyncio.run(batched_async_rm(args, group)) == [2.0, 0.0, 1.0]
    builtin = make_args("--rm-type", "math")
    group = [Sample(response="\\boxed{8}", label="8"), Sample(response="\\boxed{9}", label="8")]
    assert asyncio.run(batched_async_rm(builtin, group)) == [1, 0]


def test_missing_or_unknown_reward_is_a_user_error():
    with pytest.raises(UserError, match="--rm-type, --custom-rm-path"):
        asyncio.run(async_rm(make_args(), Sample(response="8")))
    # slime's ifbench rule (it needs Google's instruction-following checkers) is not built in
    with pytest.raises(UserError, match="--rm-type ifbench"):
        asyncio.run(async_rm(make_args(), Sample(response="8", metadata={"rm_type": "ifbench"})))


@pytest.mark.parametrize(
    "path, failure",
    [
        ("my_rewards.py", "a file path, not an import path"),
        ("rewards/my_rewards.length", "a file path, not an import path"),
        ("length", "not a dotted import path"),
        ("no_such_module_xyz.fn", "importing 'no_such_module_xyz' failed \\(ModuleNotFoundError"),
        ("my_rewards.missing", "module 'my_rewards' has no attribute 'missing'"),
        ("broken_rewards.fn", "importing 'broken_rewards' failed \\(ModuleNotFoundError: No module named 'not_a_real"),
    ],
)
def test_bad_hook_paths_name_the_flag_the_failure_and_the_fix(hook_module, path, failure):
    with pytest.raises(UserError) as e:
        load_function(path, "--custom-rm-path")
    message = str(e.value)
    assert message.startswith(f"--custom-rm-path {path!r}: ") and "\n" not in message
    assert re.search(failure, message)
    # the dotted-path advice only where the path is not one
    dotted = path not in {"my_rewards.py", "rewards/my_rewards.length", "length"}
    assert ("use a dotted path like my_pkg.rewards.fn" in message) == (not dotted)


def test_parse_time_hook_check_finds_missing_packages():
    check_hook_path("slime_ref.rollout.filters.check_reward_nonzero_std", "--dynamic-sampling-filter-path")
    with pytest.raises(UserError, match="--dynamic-sampling-filter-path .*no module named 'slime'"):
        make_args("--dynamic-sampling-filter-path", "slime.rollout.filter_hub.dynamic_sampling_filters.check")


# ---------------------------------------------------------------------------------------------
# remote_rm against a real HTTP server on 127.0.0.1
# ---------------------------------------------------------------------------------------------


class RewardServer:
    """A reward service: /score answers; /flaky fails once with 500; /slow stalls once; /missing is 404."""

    def __init__(self):
        self.requests: list[tuple[str, dict]] = []
        self.calls: dict[str, int] = {}

    async def handle(self, request: web.Request) -> web.Response:
        route = request.match_info["route"]
        self.calls[route] = self.calls.get(route, 0) + 1
        self.requests.append((route, await request.json()))
        if route == "flaky" and self.calls[route] == 1:
            return web.Response(status=500, text="overloaded")
        if route == "slow" and self.calls[route] == 1:
            await asyncio.sleep(1.5)  # longer than the client timeout below
        if route == "missing":
            return web.Response(status=404, text="no such route")
        if route == "broken":
            return web.Response(status=503)
        return web.json_response({"score": 0.75})


async def _with_server(body):
    server = RewardServer()
    app = web.Application()
    app.router.add_post("/{route}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        return await body(server, f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()  # stops the server


def _rm_args(url):
    return make_args("--rm-type", "remote_rm", "--rm-url", url, "--reward-key", "score")


SAMPLE = Sample(prompt="3+5=", response="\\boxed{8}", label="8")
FAST = {"timeout_s": 1.0, "backoff_s": 0.01, "max_backoff_s": 0.05}


def test_remote_rm_posts_prompt_response_label():
    async def body(server, base):
        reward = await async_rm(_rm_args(f"{base}/score"), SAMPLE)
        return reward, server.requests

    reward, requests = asyncio.run(_with_server(body))
    assert reward == {"score": 0.75}
    assert requests == [("score", {"prompt": "3+5=", "response": "\\boxed{8}", "label": "8"})]


def test_remote_rm_retries_after_a_500_and_after_a_timeout():
    async def body(server, base):
        flaky = await remote_rm(_rm_args(f"{base}/flaky"), SAMPLE, **FAST)
        slow = await remote_rm(_rm_args(f"{base}/slow"), SAMPLE, **FAST)
        return flaky, slow, dict(server.calls)

    flaky, slow, calls = asyncio.run(_with_server(body))
    assert flaky == slow == {"score": 0.75}
    assert calls == {"flaky": 2, "slow": 2}


def test_remote_rm_gives_up_with_the_url_in_the_message():
    async def body(server, base):
        with pytest.raises(RuntimeError, match="--rm-url .*/broken: 3 attempts failed"):
            await remote_rm(_rm_args(f"{base}/broken"), SAMPLE, max_retries=3, **FAST)
        with pytest.raises(UserError, match="--rm-url .*/missing: HTTP 404"):
            await remote_rm(_rm_args(f"{base}/missing"), SAMPLE, **FAST)
        return dict(server.calls)

    assert asyncio.run(_with_server(body)) == {"broken": 3, "missing": 1}  # a 404 is not retried


# ---------------------------------------------------------------------------------------------
# Dynamic sampling filters
# ---------------------------------------------------------------------------------------------


def _group(*rewards):
    return [Sample(reward=r) for r in rewards]


def test_nonzero_std_filter_keeps_mixed_groups_and_names_the_dropped_ones():
    args = make_args()
    assert check_reward_nonzero_std(args, _group(1.0, 0.0, 1.0)) == DynamicFilterOutput(keep=True, reason=None)
    dropped = DynamicFilterOutput(keep=False, reason="zero_std_1.0")
    assert check_reward_nonzero_std(args, _group(1.0, 1.0, 1.0)) == dropped
    fallback = check_reward_nonzero_std_with_fallback(args, _group(0.0, 0.0))
    assert (fallback.keep, fallback.reason, fallback.keep_when_insufficient) == (False, "zero_std_0.0", True)


def test_filter_with_dict_rewards_uses_reward_key():
    args = make_args("--reward-key", "score")
    group = [Sample(reward={"score": s}) for s in (1.0, -1.0)]
    assert check_reward_nonzero_std(args, group).keep


def test_drop_decisions_and_metrics():
    rejected = DynamicFilterOutput(keep=False, reason="zero_std_0.0", keep_when_insufficient=True)
    assert should_drop(rejected, remaining_batch_size=9, target_data_size=8)
    assert not should_drop(rejected, remaining_batch_size=8, target_data_size=8)  # needed to fill the batch
    assert not should_drop(DynamicFilterOutput(keep=True), remaining_batch_size=99, target_data_size=1)
    assert call_dynamic_filter(None, None, []) == DynamicFilterOutput(keep=True)
    assert call_dynamic_filter(lambda args, samples: False, None, []) == DynamicFilterOutput(keep=False)
    assert drop_metrics(["zero_std_0.0", "zero_std_1.0", "zero_std_0.0", None]) == {
        "rollout/dynamic_filter/drop_zero_std_0.0": 2,
        "rollout/dynamic_filter/drop_zero_std_1.0": 1,
    }


def test_filter_flag_loads_the_builtin_filter():
    args = make_args("--dynamic-sampling-filter-path", "slime_ref.rollout.filters.check_reward_nonzero_std")
    fn = load_function(args.dynamic_sampling_filter_path, "--dynamic-sampling-filter-path")
    assert not call_dynamic_filter(fn, args, _group(0.0, 0.0)).keep


@pytest.mark.parametrize("slime_path", sorted(__import__("slime_ref.utils.hooks", fromlist=["x"]).SLIME_BUILTINS))
def test_slime_builtin_hook_paths_load_slime_refs_equivalent(slime_path):
    from slime_ref.utils.hooks import SLIME_BUILTINS

    check_hook_path(slime_path, "--rollout-function-path")
    ours = SLIME_BUILTINS[slime_path]
    module, _, attr = ours.rpartition(".")
    assert load_function(slime_path, "--rollout-function-path") is getattr(__import__(module, fromlist=[attr]), attr)
