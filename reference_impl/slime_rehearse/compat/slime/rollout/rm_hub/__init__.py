"""slime compatibility package (slime.rollout.rm_hub), backed by slime-ref.
Used by `slime-check smoke --with slime-ref` when slime is not importable.
Its names are listed in skill/references/smoke.md."""

from slime_rehearse.compat._exports import exports

# slime's own names for its submodules' functions, exported through __all__
from .math_dapo_utils import compute_score as compute_score_dapo  # noqa: F401
from .math_utils import extract_answer as extract_boxed_answer  # noqa: F401
from .math_utils import grade_answer_verl  # noqa: F401

__all__, __getattr__ = exports(__name__, "compute_score_dapo", "extract_boxed_answer", "grade_answer_verl")
