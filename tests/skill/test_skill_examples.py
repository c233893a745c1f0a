"""The skill's runnable parts: the example hooks (reward, multi-turn episode), the log summary script,
and the example launch scripts under slime-ref once `slime-ref train` exists."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from skill_docs import REPO

LOG_SUMMARY = REPO / "skill" / "scripts" / "slime_log_summary.py"


@pytest.fixture
def arith_task(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    import arith_task.multi_turn
    import arith_task.reward

    return arith_task


# ----------------------------------------------------------------------------- custom reward


@pytest.mark.parametrize(
    ("response", "label", "feedback_turns", "expected"),
    [
        ("\\boxed{8}", "8", 0, 1.0),
        ("The answer is \\boxed{ 08 }", "8", 0, 1.0),
        ("8", "8", 0, 0.0),  # right number, not boxed
        ("\\boxed{7}", "8", 0, 0.0),
        ("7\nWrite the answer as \\boxed{}.\n\\boxed{8}", "8", 1, 0.5),  # the empty box of the feedback is skipped
        ("\\boxed{8} then \\boxed{9}", "8", 0, 0.0),  # the last answer counts
        ("\\boxed{8}", None, 0, 0.0),
    ],
)
def test_reward_scores(arith_task, response, label, feedback_turns, expected):
    assert arith_task.reward.score(response, label, feedback_turns) == expected


def test_reward_hook_has_slimes_signature_and_reads_metadata(arith_task):
    sample = SimpleNamespace(response="\\boxed{5}", label="5", metadata={"feedback_turns": 1})
    assert asyncio.run(arith_task.reward.boxed_answer_reward(SimpleNamespace(), sample)) == 0.5
    sample.metadata = {}
    assert asyncio.run(arith_task.reward.boxed_answer_reward(SimpleNamespace(), sample, evaluation=True)) == 1.0


# ----------------------------------------------------------------------------- multi-turn episode


def scripted_policy(turns, calls):
    """The model side of an episode: hands out the given turns in order, records what it was asked."""

    async def policy(input_ids, max_new_tokens):
        calls.append((list(input_ids), max_new_tokens))
        return turns[len(calls) - 1]

    return policy


def feedback(turn):
    return [90, 91, 92], "<fb>"


def test_a_boxed_first_answer_ends_the_episode(arith_task):
    mt = arith_task.multi_turn
    calls = []
    turn = mt.Turn(tokens=[5, 6], log_probs=[-0.1, -0.2], text="\\boxed{8}", finish="stop")
    episode = asyncio.run(mt.run_episode([1, 2], scripted_policy([turn], calls), feedback, max_new_tokens=10))
    assert calls == [([1, 2], 10)]
    assert (episode.tokens, episode.loss_mask, episode.log_probs) == ([5, 6], [1, 1], [-0.1, -0.2])
    assert (episode.feedback_turns, episode.finish, episode.text) == (0, "stop", "\\boxed{8}")


def test_feedback_tokens_are_masked_and_the_budget_covers_them(arith_task):
    mt = arith_task.multi_turn
    calls = []
    turns = [
        mt.Turn(tokens=[5], log_probs=[-0.5], text="8", finish="stop"),
        mt.Turn(tokens=[7, 8], log_probs=[-0.25, -0.75], text="\\boxed{8}", finish="stop"),
    ]
    episode = asyncio.run(mt.run_episode([1, 2], scripted_policy(turns, calls), feedback, max_new_tokens=10))
    assert calls == [([1, 2], 10), ([1, 2, 5, 90, 91, 92], 6)]
    assert episode.tokens == [5, 90, 91, 92, 7, 8]
    assert episode.loss_mask == [1, 0, 0, 0, 1, 1]
    assert episode.log_probs == [-0.5, 0.0, 0.0, 0.0, -0.25, -0.75]
    assert (episode.text, episode.feedback_turns, episode.finish) == ("8<fb>\\boxed{8}", 1, "stop")


@pytest.mark.parametrize(
    ("first_finish", "budget", "max_feedback_turns"),
    [("length", 10, 1), ("abort", 10, 1), ("stop", 4, 1), ("stop", 10, 0)],
)
def test_no_feedback_after_a_cut_an_abort_no_budget_or_no_turns_left(
    arith_task, first_finish, budget, max_feedback_turns
):
    mt = arith_task.multi_turn
    calls = []
    turn = mt.Turn(tokens=[5], log_probs=[-0.5], text="8", finish=first_finish)
    episode = asyncio.run(mt.run_episode([1], scripted_policy([turn], calls), feedback, budget, max_feedback_turns))
    assert len(calls) == 1 and episode.tokens == [5] and episode.feedback_turns == 0
    assert episode.finish == first_finish


def test_feedback_stops_after_max_feedback_turns(arith_task):
    mt = arith_task.multi_turn
    calls = []
    turns = [mt.Turn(tokens=[5], log_probs=[-0.5], text="8", finish="stop")] * 3
    episode = asyncio.run(mt.run_episode([1], scripted_policy(turns, calls), feedback, max_new_tokens=100))
    assert len(calls) == 2 and episode.feedback_turns == 1 and episode.loss_mask == [1, 0, 0, 0, 1]


def test_fill_sample_writes_slimes_fields(arith_task):
    from slime_ref import types
    mt = arith_task.multi_turn
    for finish, status in (("stop", "COMPLETED"), ("length", "TRUNCATED"), ("abort", "ABORTED")):
        episode = mt.Episode(tokens=[5, 90, 7], loss_mask=[1, 0, 1], log_probs=[-0.5, 0.0, -0.25], text="a<fb>b",
                             finish=finish, feedback_turns=1)
        sample = mt.fill_sample(types.Sample(prompt="1+1=", metadata={"k": "v"}), [1, 2], episode)
        assert sample.tokens == [1, 2, 5, 90, 7] and sample.response_length == 3 and sample.response == "a<fb>b"
        assert sample.loss_mask == [1, 0, 1] and sample.rollout_log_probs == [-0.5, 0.0, -0.25]
        assert sample.metadata == {"k": "v", "feedback_turns": 1, "round_number": 2}
        assert sample.status == getattr(types.Sample.Status, status)


def test_generate_refuses_partial_rollout(arith_task):
    args = SimpleNamespace(partial_rollout=True)
    with pytest.raises(ValueError, match="--partial-rollout"):
        asyncio.run(arith_task.multi_turn.generate_with_feedback(args, SimpleNamespace(), {"max_new_tokens": 8}))


# ----------------------------------------------------------------------------- log summary script

HEALTHY = """\
(MegatronTrainRayActor pid=11) [2026-08-10 10:00:00] data.py:193 - rollout 0: {'rollout/raw_reward': 0.25, 'rollout/log_probs': -0.5, 'rollout/ref_log_probs': -0.5}
perf 0: {'rollout/response_len/mean': 100.0, 'rollout/truncated_ratio': 0.0}
step 0: {'train/pg_loss': 0.01, 'train/ppo_kl': 0.0, 'train/pg_clipfrac': 0.0, 'train/grad_norm': 0.3, 'train/train_rollout_logprob_abs_diff': 0.01}
step 1: {'train/pg_loss': 0.02, 'train/ppo_kl': 0.003, 'train/grad_norm': 0.4}
rollout 1: {'rollout/raw_reward': 0.5}
perf 1: {'rollout/response_len/mean': 120.0, 'rollout/truncated_ratio': 0.1}
step 2: {'train/pg_loss': 0.0, 'train/ppo_kl': 0.0, 'train/grad_norm': 0.2}
unrelated line
"""  # noqa: E501 (slime's log lines as they are)


def summarise(tmp_path, text, *extra):
    log = tmp_path / "job.log"
    log.write_text(text)
    return subprocess.run(
        [sys.executable, str(LOG_SUMMARY), str(log), *extra], capture_output=True, text=True, timeout=60
    )


def test_log_summary_of_a_healthy_run(tmp_path):
    result = summarise(tmp_path, HEALTHY, "--json")
    assert result.returncode == 0, result.stdout
    report = json.loads(result.stdout)
    assert report["warnings"] == []
    assert report["rollouts"]["0"]["rollout/raw_reward"] == 0.25
    # a rollout's first step keeps its own ppo_kl; later steps of the same rollout do not overwrite it
    assert (
        report["rollouts"]["0"]["train/ppo_kl@first_step"] == 0.0 and report["rollouts"]["0"]["train/ppo_kl"] == 0.003
    )
    assert report["rollouts"]["1"]["train/grad_norm"] == 0.2
    table = summarise(tmp_path, HEALTHY).stdout.splitlines()
    assert table[0].split()[:3] == ["rollout", "reward", "resp_len"] and table[1].split()[:2] == ["0", "0.25"]


@pytest.mark.parametrize(
    ("bad_line", "warning"),
    [
        ("rollout 0: {'rollout/log_probs': -0.5, 'rollout/ref_log_probs': -0.7}", "log_probs and ref_log_probs differ"),
        ("step 0: {'train/ppo_kl': 0.01}", "train/ppo_kl = 0.01 at its first step"),
        ("step 0: {'train/train_rollout_logprob_abs_diff': 0.3}", "differ by 0.3"),
        ("perf 0: {'rollout/truncated_ratio': 0.9}", "90% of responses hit the length limit"),
        ("step 0: {'train/grad_norm': nan}", "train/grad_norm is nan"),
    ],
)
def test_log_summary_flags_known_bad_signs(tmp_path, bad_line, warning):
    result = summarise(tmp_path, bad_line + "\n")
    assert result.returncode == 1 and warning in result.stdout, result.stdout


def test_log_summary_flat_reward_and_empty_and_missing_logs(tmp_path):
    flat = "".join(f"rollout {i}: {{'rollout/raw_reward': 0.0}}\n" for i in range(6))
    assert "stayed at 0" in summarise(tmp_path, flat).stdout
    assert "no slime metric lines" in summarise(tmp_path, "hello\n").stdout
    missing = subprocess.run(
        [sys.executable, str(LOG_SUMMARY), str(tmp_path / "nope.log")], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr


# ----------------------------------------------------------------------------- examples under slime-ref


@pytest.fixture(scope="module")
def warm_env(tiny, tmp_path_factory):
    """The quick start's stage 1 (run-tiny-sft-warmup.sh), run once: every GRPO example starts from
    its checkpoint (WARM, which they only read), each writing under an OUT of its own."""
    out = tmp_path_factory.mktemp("warmup")
    env = {**os.environ, "TINY": str(tiny.model_dir.parent), "OUT": str(out), "NUM_ROLLOUT": "2", "SFT_STEPS": "2"}
    warmup = subprocess.run(["bash", str(REPO / "examples/run-tiny-sft-warmup.sh")], capture_output=True, text=True,
                            timeout=900, env=env, cwd=out)
    assert warmup.returncode == 0, warmup.stdout[-3000:] + warmup.stderr[-3000:]
    assert (out / "sft" / "latest_checkpointed_iteration.txt").is_file(), "the warm-up saved no checkpoint"
    return {**env, "WARM": str(out / "sft")}


@pytest.mark.slow
@pytest.mark.parametrize(
    "script",
    ["run-tiny-grpo.sh", "run-tiny-grpo-realistic.sh", "run-tiny-custom-reward.sh", "run-tiny-multi-turn.sh"],
)
def test_examples_run_with_slime_ref(script, warm_env, tmp_path):
    env = {**warm_env, "OUT": str(tmp_path)}
    result = subprocess.run(["bash", str(REPO / "examples" / script)], capture_output=True, text=True, timeout=900,
                            env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
