"""Errors a user can fix, and how the command-line tools report them (defined in
:mod:`slime_common.errors`, shared with slime-check; the same classes)."""

from slime_common.errors import USAGE_EXIT_CODE, RunError, UserError, fail, run_cli

__all__ = ["USAGE_EXIT_CODE", "RunError", "UserError", "fail", "run_cli"]
