"""``slime-check``: verify a machine and a slime launch config before spending GPU hours."""

from __future__ import annotations

import click

from slime_check import __version__
from slime_check.skill_install import skill
from slime_ref.errors import run_cli

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="slime-check")
def cli() -> None:
    """slime-check: catch a broken slime job before it burns GPU hours.

    It reads, probes and reports. It never installs, kills or edits anything.
    """


cli.add_command(skill)


def main() -> None:
    run_cli(cli, "slime-check")


if __name__ == "__main__":
    main()
