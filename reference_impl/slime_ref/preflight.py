"""What a run checks before Ray starts: it can write where it will write, and read what it will read.

Without these checks an unwritable ``--save`` shows at the first save (minutes in, or hours on a
cluster) and a bad prompt line once the engines are up. Each fault is one line naming the flag and
the path, a :class:`~slime_ref.errors.UserError` (exit 2).

- Writing: ``--output-dir``, ``--save``, the folder ``--save-hf`` is written into, and the folders
  of ``--save-debug-rollout-data`` / ``--save-debug-train-data``. Each is created if missing and a
  probe file is written there and removed; folders the probe created are removed again, except the
  output folder, which the run fills next.
- Reading: ``--prompt-data`` (with slime-ref's data source) and every ``--eval-prompt-data`` file,
  whole, through :func:`slime_ref.data.check.check_prompt_file`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from pathlib import Path

from slime_ref.errors import UserError

logger = logging.getLogger(__name__)


def preflight(args) -> None:
    """Every check below, in the order a user reads the flags; UserError on the first fault.
    Once per ``args``: a second call (the run's set-up, after the CLI's) does nothing."""
    if getattr(args, "_preflight_done", False):
        return
    start = time.perf_counter()
    check_output_paths(args)
    check_prompt_files(args)
    args._preflight_done = True
    logger.info("preflight: paths and prompt files checked in %.2f s", time.perf_counter() - start)


def output_paths(args) -> list[tuple[str, str, Path, bool]]:
    """(flag, its value, folder the run writes into, keep the folder) for each output the flags ask for."""
    paths = [("--output-dir", args.output_dir, Path(args.output_dir), True)]
    if getattr(args, "save", None):
        paths.append(("--save", args.save, Path(args.save), False))
    if getattr(args, "save_hf", None):
        try:
            target = args.save_hf.format(rollout_id=0)
        except (KeyError, IndexError, ValueError):
            raise UserError(f"--save-hf {args.save_hf}: the only field it may hold is {{rollout_id}}") from None
        # written as a sibling scratch folder renamed into place: its parent must take writes
        paths.append(("--save-hf", args.save_hf, Path(target).parent, False))
    for attr, fields in (("save_debug_rollout_data", {"rollout_id": 0}),
                         ("save_debug_train_data", {"rollout_id": 0, "rank": 0})):
        template = getattr(args, attr, None)
        if template:
            flag = "--" + attr.replace("_", "-")
            try:
                target = template.format(**fields)
            except (KeyError, IndexError, ValueError):
                raise UserError(f"{flag} {template}: the fields it may hold are "
                                f"{', '.join('{' + f + '}' for f in fields)}") from None
            paths.append((flag, template, Path(target).parent, False))
    return paths


def check_output_paths(args) -> None:
    for flag, value, folder, keep in output_paths(args):
        check_writable(folder, flag, value, keep=keep)


def check_writable(folder: Path, flag: str, value: str | None = None, *, keep: bool = False) -> None:
    """Create ``folder`` if missing and write a probe file in it; UserError naming ``flag`` and its
    ``value`` (default: the folder) if either fails. Folders the probe created are removed unless ``keep``."""
    folder = Path(os.path.abspath(folder))
    named = f"{flag} {value if value is not None else folder}"
    existing = folder
    while not existing.exists():
        if existing.is_symlink():
            raise UserError(f"{named}: {existing} is a broken symbolic link")
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{named}: {existing} is a file, not a directory; pass a path the run can create")
    created = []
    try:
        for missing in reversed([folder, *folder.parents][: len(folder.parts) - len(existing.parts)]):
            missing.mkdir()
            created.append(missing)
        fd, probe = tempfile.mkstemp(prefix=".slime-ref-write-check-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        where = e.filename if e.filename else folder
        raise UserError(f"{named}: cannot write there ({e.strerror}: {where}); "
                        f"pass a {flag} the run can create and write") from None
    finally:
        if not keep:
            for made in reversed(created):
                with contextlib.suppress(OSError):
                    made.rmdir()


def check_prompt_files(args) -> None:
    from slime_ref.data.check import check_prompt_file

    keys = {args.input_key: "--input-key"}
    if args.label_key is not None:
        keys[args.label_key] = "--label-key"
    own_source = str(getattr(args, "data_source_path", "")).startswith("slime_ref.data.source.")
    # a data source of the user's own may read --prompt-data its own way; slime-ref's reads it as below
    if args.rollout_global_dataset and args.prompt_data is not None and own_source:
        check_prompt_file(args.prompt_data, "--prompt-data", keys)
    for name, path in getattr(args, "eval_datasets", None) or []:
        check_prompt_file(path, f"--eval-prompt-data {name}", keys)
