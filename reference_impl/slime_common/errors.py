"""Errors a user can fix, and how the command-line tools report them.

A :class:`UserError` names the flag or file at fault and the fix. The CLIs print it as one line and
exit with status 2, never with a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

USAGE_EXIT_CODE = 2


class UserError(Exception):
    """A bad flag, file or configuration. The message says what is wrong and how to fix it."""


class RunError(Exception):
    """A part of a running job failed (an engine, the router, a training rank). The message names the
    part, what happened and where its log is; the CLIs print it as one line and exit with status 1."""


def fail(message: str) -> NoReturn:
    raise UserError(message)


def run_cli(main: Callable[..., object], prog: str) -> None:
    """Run a click entry point; turn UserError into a one-line message and exit status 2."""
    import click

    try:
        main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(USAGE_EXIT_CODE if isinstance(e, click.UsageError) else e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except UserError as e:
        click.echo(f"{prog}: error: {e}", err=True)
        sys.exit(USAGE_EXIT_CODE)
    except RunError as e:
        click.echo(f"{prog}: run failed: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
