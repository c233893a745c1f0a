"""slime compatibility package (slime.rollout.rm_hub), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md."""

from slime_ref.rollout.rewards import async_rm, batched_async_rm, remote_rm
from slime_rehearse.compat._missing import package_getattr

from .math_dapo_utils import compute_score as compute_score_dapo
from .math_utils import extract_answer as extract_boxed_answer
from .math_utils import grade_answer_verl

__all__ = ["async_rm", "batched_async_rm", "compute_score_dapo", "extract_boxed_answer", "grade_answer_verl",
           "remote_rm"]


def __getattr__(name: str):
    return package_getattr(__name__, name)
