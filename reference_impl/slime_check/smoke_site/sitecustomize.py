"""Starts coverage.py in every Python process of a ``slime-check smoke`` run.

``smoke`` puts this folder first on the run's PYTHONPATH and sets COVERAGE_PROCESS_START to a config
that measures only the user's hook files. Python imports ``sitecustomize`` at start-up, before any
thread exists, so the lines a hook runs are measured wherever it runs: the rollout manager and its
event-loop thread, the training ranks, the engines' callers. A ``sitecustomize`` further down the
path (a distribution's own) still runs after this one.
"""

import importlib.machinery
import importlib.util
import os
import sys

if os.environ.get("COVERAGE_PROCESS_START"):
    try:
        import coverage

        coverage.process_startup()
    except Exception as e:  # measuring must never stop the rehearsal
        print(f"slime-check smoke: coverage of the hooks is off in this process: {e}", file=sys.stderr)

_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.origin and os.path.dirname(os.path.abspath(_spec.origin)) != _here:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
