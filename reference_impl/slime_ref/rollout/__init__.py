"""Rollout side: rewards (:mod:`.rewards`, :mod:`.math_grading`) and dynamic sampling filters (:mod:`.filters`)."""
