"""Hooks for the embedded arithmetic task: a custom reward and a multi-turn generate function.

Put this package's parent folder (``examples/``) on PYTHONPATH and pass the hooks to slime or
slime-ref as dotted import paths, e.g. ``--custom-rm-path arith_task.reward.boxed_answer_reward``.
"""
