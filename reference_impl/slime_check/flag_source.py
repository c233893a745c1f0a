"""The flags of the user's own slime, read from its source checkout.

``registry_for_checkout(slime_dir, base)`` reads the user's slime the way slime builds its three
parsers, but without importing slime, torch, Megatron-LM or SGLang: each argument file is
executed with every non-standard-library import replaced by an inert stub (the derivation in
``slime_check.tools.gen_flag_registry``). It takes a few tens of milliseconds.

Read from the checkout:

* ``slime/utils/arguments.py``: slime's own flags (the ``main`` parser's provider and the
  ``preparse`` switches), and the defaults slime resets on Megatron-LM flags;
* ``slime/backends/sglang_utils/arguments.py``: slime's ``--sglang-*``/``--router-*`` additions,
  the SGLang flags slime hides (its skip list) and the router defaults it resets.

Optionally (``sglang_root``, e.g. ``installed_sglang_root()``) SGLang's own flags are read the
same way from an installed sglang's ``sglang/srt/server_args.py``, without importing sglang;
in slime's image that sglang already carries slime's patches.

Taken from the shipped registry ``base`` (``slime_common.registry.KNOWN_SLIMES``): every flag of
Megatron-LM (and slime's Megatron patches), of the router, and of SGLang when ``sglang_root``
is not given or cannot be read. Not read: the Megatron-LM on the script's ``PYTHONPATH`` (its
flags come from config dataclasses that need torch to build) and the Docker patches in the
checkout; so pick as ``base`` the known slime whose pins the user's image matches (main's pins
equal v0.3.1's: Megatron-LM 1dcf0da, SGLang 0.5.15.post1).

A file that is missing, or that cannot be run this way (a slime far from the known ones), is
not an error: that parser's flags come from ``base`` and the notes say so.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

from slime_common.errors import UserError
from slime_common.registry import KNOWN_SLIMES, Registry, registry_data

SLIME_ARGS = "slime/utils/arguments.py"
SGLANG_ARGS = "slime/backends/sglang_utils/arguments.py"


def installed_sglang_root() -> Path | None:
    """The folder holding the importable ``sglang`` package (site-packages), found without importing it."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


def registry_for_checkout(slime_dir: str | Path, base: str, label: str | None = None,
                          sglang_root: str | Path | None = None) -> tuple[Registry, list[str]]:
    """The flags of the slime checked out at ``slime_dir``, over the shipped registry ``base``.

    Returns the registry and notes saying, in words, what was read from where and what came from
    ``base``. ``label`` (default ``base``) becomes ``Registry.label``; ``Registry.flags_from``
    gives the provenance in one line. ``sglang_root``: a folder holding ``sglang/srt/server_args.py``
    whose flags replace the base's SGLang flags. UserError when ``slime_dir`` holds no slime source.
    """
    from slime_check.tools.upstream_sources import SourceTree

    if base not in KNOWN_SLIMES:
        raise ValueError(f"no flag registry for slime {base!r}; known: {', '.join(KNOWN_SLIMES)}")
    root = Path(slime_dir).expanduser()
    if not (root / SLIME_ARGS).is_file():
        raise UserError(f"--slime-dir {slime_dir}: no {SLIME_ARGS} there. Pass the root of a slime checkout "
                        f"(the folder holding train.py and slime/).")
    data = registry_data(base)
    base_records = data["flags"]
    tree = SourceTree(str(root))
    with _sys_modules_kept():
        add_server_flags, sglang_note = _sglang_reader(tree, sglang_root, base_records)
        records, read, notes = _read(tree, root, base, base_records, add_server_flags)
        if add_server_flags is not None and (SGLANG_ARGS not in read or not _enough_sglang(records, base_records)):
            why = "gave too few --sglang-* flags to trust" if SGLANG_ARGS in read else "could not be used"
            sglang_note = f"SGLang flags: {sglang_root} {why}; taken from the registry shipped for slime {base}"
            records, read, notes = _read(tree, root, base, base_records, None)
    if sglang_note:
        notes.append(sglang_note)
    if read:
        notes.insert(0, f"slime's own flags: read from {root} ({', '.join(read)})")
    pins = data["pins"]
    if sglang_note.startswith("SGLang flags: read from"):
        upstream = f"Megatron-LM and router flags (Megatron-LM {pins['megatron_lm'][:7]} and slime's patches to it)"
    else:
        upstream = (f"Megatron-LM, SGLang and router flags (Megatron-LM {pins['megatron_lm'][:7]}, SGLang "
                    f"{pins['sglang']} and slime's patches to them)")
    notes.append(f"{upstream}: from the registry shipped for slime {base}")
    records.sort(key=lambda r: (r["flags"][0], r["parser"]))
    meta = {k: v for k, v in data.items() if k != "flags"}
    meta["slime"] = {"version": None, "commit": None, "base": base, "read_from": str(root)}
    flags_from = (f"{', '.join(read)} read from {root}; upstream flags from the registry shipped for slime {base}"
                  if read else f"the registry shipped for slime {base} ({root} could not be read)")
    return Registry({**meta, "flags": records}, label=label or base, flags_from=flags_from), notes


def _sglang_reader(tree, sglang_root, base_records):
    """``(add_server_flags, note)``: a function adding an installed SGLang's flags, or None and why."""
    import types

    from slime_check.tools.upstream_sources import SourceTree, exec_source

    if sglang_root is None:
        return None, ""
    root = Path(sglang_root)
    source = SourceTree(str(root)) if root.is_dir() else None
    if source is None or not (root / "sglang" / "srt" / "server_args.py").is_file():
        return None, f"SGLang flags: no sglang/srt/server_args.py under {root}; taken from the shipped registry"
    version = "unknown version"
    version_file = root / "sglang" / "version.py"
    if version_file.is_file():
        import re

        match = re.search(r"""__version__\s*=\s*['"]([^'"]+)""", version_file.read_text())
        version = match.group(1) if match else version
    try:
        provided = {"sglang": types.ModuleType("sglang")}
        for name in ("arg_utils", "argparse_actions"):
            rel = f"sglang/srt/arg_groups/{name}.py"
            if (root / rel).is_file():
                provided[f"sglang.srt.arg_groups.{name}"] = exec_source(
                    f"sglang.srt.arg_groups.{name}", source.read(rel), str(root / rel), {})
        module = exec_source("sglang.srt.server_args", source.read("sglang/srt/server_args.py"),
                             str(root / "sglang/srt/server_args.py"), provided)
        server_args = module.ServerArgs
    except Exception as e:  # someone else's source run with stubs: any failure means "could not read it"
        return None, f"SGLang flags: could not read {root}/sglang/srt/server_args.py ({_why(e)}); taken from the " \
                     f"shipped registry"
    return (lambda parser: server_args.add_cli_args(parser)), \
        f"SGLang flags: read from sglang {version} at {root} (sglang/srt/server_args.py)"


def _enough_sglang(records: list[dict], base_records: list[dict]) -> bool:
    """A stub-run server_args.py that defines far fewer flags than the pinned SGLang is not trusted:
    a missing flag would be reported as unknown."""
    def count(rs):
        return sum(1 for r in rs if r["parser"] == "sglang" and r["source"].startswith("sglang"))
    return count(records) >= count(base_records) // 2


def _read(tree, root: Path, base: str, base_records: list[dict],
          add_server_flags=None) -> tuple[list[dict], list[str], list[str]]:
    from slime_check.tools.flag_records import action_record, option_actions
    from slime_check.tools.registry_derivation import derive_main_records, derive_sglang_records
    from slime_check.tools.upstream_sources import build_preparse_parser

    notes: list[str] = []
    records: list[dict] = []
    read: list[str] = []

    def carried(parser: str) -> list[dict]:
        return [r for r in base_records if r["parser"] == parser]

    try:
        records += derive_main_records(base_records, tree)
        records += [action_record(a, "preparse", "slime")
                    for a in option_actions(build_preparse_parser(tree))]
        read.append(SLIME_ARGS)
    except Exception as e:  # the user's file, run with stubs: any failure means "could not read it"
        records = carried("main") + carried("preparse")
        notes.append(f"slime's own flags: could not read {root / SLIME_ARGS} ({_why(e)}); "
                     f"taken from the registry shipped for slime {base}")
    if (root / SGLANG_ARGS).is_file():
        try:
            records += derive_sglang_records(base_records, tree, lambda parser: None, add_server_flags)
            read.append(SGLANG_ARGS)
        except Exception as e:
            records += carried("sglang")
            notes.append(f"--sglang-*/--router-* flags: could not read {root / SGLANG_ARGS} ({_why(e)}); "
                         f"taken from the registry shipped for slime {base}")
    else:
        records += carried("sglang")
        notes.append(f"--sglang-*/--router-* flags: {root / SGLANG_ARGS} is missing; taken from the registry "
                     f"shipped for slime {base}")
    return records, read, notes


def _why(error: Exception) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return text if len(text) <= 160 else text[:157] + "..."



@contextlib.contextmanager
def _sys_modules_kept() -> Iterator[None]:
    """Running a source file registers it in sys.modules (dataclasses need that); undo it, so a
    stub-run ``slime.utils.arguments`` never stands in for a real import later."""
    before = dict(sys.modules)
    try:
        with warnings.catch_warnings():
            # Compiling the user's files may warn (an invalid escape in a help string): not ours to print.
            warnings.simplefilter("ignore")
            yield
    finally:
        for name in set(sys.modules) - set(before):
            del sys.modules[name]
        for name, module in before.items():
            if sys.modules.get(name) is not module:
                sys.modules[name] = module
