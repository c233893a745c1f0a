"""slime compatibility module (slime.rollout.rm_hub.math_dapo_utils), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md.

DAPO's math check (slime's ``--rm-type dapo``): slime-ref's is slime_ref.rollout.rewards.dapo_reward.
``compute_score`` keeps slime's signature and result, ``{"score": 1.0 or -1.0, "acc": bool, "pred": str}``,
and like slime's raises ValueError for a ground truth that is not an integer."""

from slime_ref.rollout import rewards as _rewards
from slime_ref.rollout.rewards import dapo_reward
from slime_rehearse.compat._exports import exports


def normalize_final_answer(final_answer: str) -> str:
    """DAPO's normal form of an answer (Minerva's): the last ``=`` side, units and LaTeX stripped."""
    return _rewards.normalize_final_answer(final_answer)


def last_boxed_only_string(string: str) -> str | None:
    """The last ``\\boxed{...}`` of ``string`` with its balanced braces, or None (DAPO's form: only
    ``\\boxed{`` counts, no ``\\fbox``)."""
    start = string.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for end in range(start, len(string)):
        depth += {"{": 1, "}": -1}.get(string[end], 0)
        if depth == 0 and string[end] == "}":
            return string[start:end + 1]
    return None


def _strict_box(solution_str: str, ground_truth: str, pause_tokens_index) -> tuple[bool, str | None]:
    """The strict check: the boxed answer near the end, compared with the ground truth as written."""
    if pause_tokens_index is not None:
        if len(pause_tokens_index) != 4:
            raise ValueError(f"pause_tokens_index has {len(pause_tokens_index)} entries, DAPO's strict check needs 4")
        tail = solution_str[pause_tokens_index[-1] - 100:]
    else:
        tail = solution_str[-100:]
    span = last_boxed_only_string(tail)
    pred = span[len("\\boxed{"):-1] if span is not None else None
    return pred == ground_truth, pred


def compute_score(
    solution_str: str,
    ground_truth: str,
    strict_box_verify: bool = False,
    pause_tokens_index: list[int] | None = None,
) -> dict:
    """DAPO's reward: 1.0 if the last "Answer: ..." line of the response's last 300 characters is the
    (integer) ground truth, else -1.0; ``strict_box_verify`` compares the last ``\\boxed{}`` instead."""
    tail = solution_str[-300:]
    if strict_box_verify:
        correct, pred = _strict_box(tail, ground_truth, pause_tokens_index)
        return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
    truth = normalize_final_answer(ground_truth)
    try:
        int(float(truth))
    except ValueError:
        raise ValueError(f"DAPO's ground truth is an integer; got {ground_truth!r} (normalised {truth!r})") from None
    return dapo_reward(tail, ground_truth)


__all__, __getattr__ = exports(__name__, "compute_score", "last_boxed_only_string", "normalize_final_answer")
