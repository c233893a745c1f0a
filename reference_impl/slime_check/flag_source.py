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

Taken from the shipped registry ``base`` (``slime_common.registry.KNOWN_SLIMES``): every flag of
Megatron-LM (and slime's Megatron patches), of SGLang's ``ServerArgs`` (and slime's SGLang
patches) and of the router. Not read: the Megatron-LM on the script's ``PYTHONPATH``, the
installed sglang, and the Docker patches in the checkout; so pick as ``base`` the known slime
whose pins the user's image matches (main's pins equal v0.3.1's: Megatron-LM 1dcf0da, SGLang
0.5.15.post1).

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


def registry_for_checkout(slime_dir: str | Path, base: str, label: str | None = None) -> tuple[Registry, list[str]]:
    """The flags of the slime checked out at ``slime_dir``, over the shipped registry ``base``.

    Returns the registry and notes saying, in words, what was read from where and what came from
    ``base``. ``label`` (default ``base``) becomes ``Registry.label``; ``Registry.flags_from``
    gives the provenance in one line. UserError when ``slime_dir`` holds no slime source.
    """
    from slime_check.tools import gen_flag_registry as gen

    if base not in KNOWN_SLIMES:
        raise ValueError(f"no flag registry for slime {base!r}; known: {', '.join(KNOWN_SLIMES)}")
    root = Path(slime_dir).expanduser()
    if not (root / SLIME_ARGS).is_file():
        raise UserError(f"--slime-dir {slime_dir}: no {SLIME_ARGS} there. Pass the root of a slime checkout "
                        f"(the folder holding train.py and slime/).")
    data = registry_data(base)
    base_records = data["flags"]
    tree = gen.SourceTree(str(root))
    with _sys_modules_kept():
        records, read, notes = _read(gen, tree, root, base, base_records)
    if read:
        notes.insert(0, f"slime's own flags: read from {root} ({', '.join(read)})")
    notes.append(f"Megatron-LM, SGLang and router flags: from the registry shipped for slime {base} "
                 f"(Megatron-LM {data['pins']['megatron_lm'][:7]}, SGLang {data['pins']['sglang']} and "
                 f"slime's patches to them)")
    records.sort(key=lambda r: (r["flags"][0], r["parser"]))
    meta = {k: v for k, v in data.items() if k != "flags"}
    meta["slime"] = {"version": None, "commit": None, "base": base, "read_from": str(root)}
    flags_from = (f"{', '.join(read)} read from {root}; upstream flags from the registry shipped for slime {base}"
                  if read else f"the registry shipped for slime {base} ({root} could not be read)")
    return Registry({**meta, "flags": records}, label=label or base, flags_from=flags_from), notes


def _read(gen, tree, root: Path, base: str, base_records: list[dict]) -> tuple[list[dict], list[str], list[str]]:
    notes: list[str] = []
    records: list[dict] = []
    read: list[str] = []

    def carried(parser: str) -> list[dict]:
        return [r for r in base_records if r["parser"] == parser]

    try:
        records += gen.derive_main_records(base_records, tree)
        records += [gen.action_record(a, "preparse", "slime")
                    for a in gen.option_actions(gen.build_preparse_parser(tree))]
        read.append(SLIME_ARGS)
    except Exception as e:  # the user's file, run with stubs: any failure means "could not read it"
        records = carried("main") + carried("preparse")
        notes.append(f"slime's own flags: could not read {root / SLIME_ARGS} ({_why(e)}); "
                     f"taken from the registry shipped for slime {base}")
    if (root / SGLANG_ARGS).is_file():
        try:
            records += gen.derive_sglang_records(base_records, tree, lambda parser: None)
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
