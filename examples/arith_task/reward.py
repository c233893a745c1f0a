"""A custom reward for the embedded arithmetic task, written as a slime ``--custom-rm-path`` hook.

The reward is 1.0 when the last non-empty ``\\boxed{...}`` in the response equals the label, else
0.0. A correct answer reached only after environment feedback (see ``multi_turn.py``) earns 0.5,
so the policy still prefers answering in the right format the first time.

Launch flag (a dotted import path, not a file name)::

    --custom-rm-path arith_task.reward.boxed_answer_reward

The folder that holds ``arith_task/`` must be on PYTHONPATH of the process that runs rollouts (with
slime: the ``PYTHONPATH`` in ``ray job submit --runtime-env-json``).
"""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")

FEEDBACK_TURN_WEIGHT = 0.5


def last_boxed_answer(text: str) -> str | None:
    """The content of the last non-empty ``\\boxed{...}`` in ``text``, stripped; None if there is none."""
    answers = [a.strip() for a in _BOXED.findall(text) if a.strip()]
    return answers[-1] if answers else None


def _same_number(answer: str, label: str) -> bool:
    try:
        return int(answer) == int(label)
    except ValueError:
        return answer == label.strip()


def score(response: str, label: str | None, feedback_turns: int = 0) -> float:
    """Reward of one finished response: 1.0, 0.5 after feedback, or 0.0."""
    answer = last_boxed_answer(response)
    if answer is None or label is None or not _same_number(answer, str(label)):
        return 0.0
    return 1.0 if feedback_turns == 0 else FEEDBACK_TURN_WEIGHT


async def boxed_answer_reward(args, sample, **kwargs) -> float:
    """slime's custom reward signature: ``async def f(args, sample: Sample, **kwargs) -> float``.

    It is called once per finished sample (without ``--group-rm``). ``sample.metadata`` carries
    what the generate step recorded; the multi-turn example stores ``feedback_turns`` there.
    """
    return score(sample.response, sample.label, (sample.metadata or {}).get("feedback_turns", 0))
