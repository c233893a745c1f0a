"""Which ``slime.*`` module names each known slime has, where the two differ.

slime's main moved its observability helpers out of ``slime.utils`` into a new ``slime.observability``
package (slime #2298), without leaving shims behind, so a hook written for one slime fails to import
on the other. :data:`MODULES` is the one table of those differences; from it come

* the layout of the compatibility namespace (``slime_rehearse/compat/slime``): its finder
  (``slime_rehearse.compat.layouts.LayoutFinder``) serves a module under the name the target slime
  gives it and refuses the other name with the reason (:func:`explain`);
* the message smoke's preflight gives when a hook's import of such a module fails on a real slime
  (:func:`explain_import_error`);
* the static check of the hook files' imports, :func:`layout_findings`, which reads the files
  without running them.

The target is one of :data:`TARGETS` (the slimes ``slime_common.registry.KNOWN_SLIMES`` knows),
given to the namespace in the environment variable :data:`TARGET_ENV`. Without it the namespace
serves both layouts: nothing says which slime the hooks are for, so neither name is wrong.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path

V031 = "v0.3.1"
MAIN = "main@624b824"
TARGETS = (V031, MAIN)  # oldest first, as slime_common.registry.KNOWN_SLIMES
TARGET_ENV = "SLIME_CHECK_SLIME_TARGET"
NEW_PACKAGE = "slime.observability"  # a package main added (slime #2298)


@dataclass(frozen=True)
class Module:
    """One module whose name differs between the known slimes.

    ``v031``/``main``: its dotted name in that slime, or None where that slime has no such module.
    ``prs``: the slime pull requests that moved, added or removed it. ``note``: for a module main
    removed, what became of its contents. ``backing``: the slime-check module that provides it in the
    compatibility namespace (under whichever name the target uses), or None where it is not provided.
    """

    v031: str | None
    main: str | None
    prs: tuple[str, ...]
    note: str = ""
    backing: str | None = None

    def name_in(self, target: str) -> str | None:
        return self.v031 if target == V031 else self.main


def _moved(name: str, backing: str | None = None) -> Module:
    return Module(f"slime.utils.{name}", f"slime.observability.{name}", ("#2298",), backing=backing)


# Checked against slime's source (git diff -M --name-status v0.3.1 624b824 -- slime) by
# tests/slime_rehearse/test_compat_layouts.py; the listing is committed in tests/fixtures/slime_layouts/.
MODULES: tuple[Module, ...] = (
    _moved("logging_utils"),
    _moved("metric_utils"),
    _moved("profile_utils"),
    _moved("tensorboard_utils"),
    _moved("timer"),
    _moved("trace_utils", backing="slime_rehearse.compat.backing.trace_utils"),
    _moved("wandb_utils"),
    Module("slime.utils.train_dump_utils", "slime.observability.train_data_utils", ("#2266", "#2298")),
    Module("slime.utils.train_metric_utils", None, ("#2298",),
           note="its log_perf_data_raw became log_perf_data in slime.observability.train_metric_utils"),
    Module(None, "slime.observability.rollout_data_utils", ("#2298",)),
    Module(None, "slime.observability.rollout_metrics", ("#2298",)),
    Module(None, "slime.observability.train_metric_utils", ("#2298",)),
    Module(None, "slime.utils.accelerator", ("#2216",)),
    Module(None, "slime.backends.megatron_utils.alignment", ("#2262",)),
)


def _prs(module: Module) -> str:
    return " and ".join(module.prs)


def known_target(target: str | None) -> str | None:
    """``target`` if it is a known slime, else None (both layouts)."""
    return target if target in TARGETS else None


def env_target() -> str | None:
    return known_target(os.environ.get(TARGET_ENV) or None)


def _row(fullname: str) -> tuple[Module, str] | None:
    """The row that names ``fullname`` (or a package around it), and the name it matched."""
    for module in MODULES:
        for name in (module.v031, module.main):
            if name and (fullname == name or fullname.startswith(name + ".")):
                return module, name
    return None


def has(fullname: str, target: str | None) -> bool:
    """Whether slime ``target`` has a module ``fullname``, as far as this table knows (a name the
    table does not list is taken to be in both)."""
    if target is None:
        return True
    if target == V031 and (fullname == NEW_PACKAGE or fullname.startswith(NEW_PACKAGE + ".")):
        return False
    found = _row(fullname)
    if found is None:
        return True
    module, name = found
    return module.name_in(target) == name


def explain(fullname: str, target: str | None) -> str | None:
    """Why slime ``target`` has no module ``fullname`` and what to import instead, or None where it has it."""
    if has(fullname, target):
        return None
    if target == MAIN:
        other = f"(or, if your slime is {V031}, check against it: --slime-version {V031})"
    else:
        other = "(or, if your slime is main, check against it: --slime-version main)"
    found = _row(fullname)
    if found is None:  # slime.observability itself, or a module of it the table does not list
        if fullname == NEW_PACKAGE:
            olds = ", ".join(m.v031.rpartition(".")[2] for m in MODULES if m.v031 and m.main and
                             m.main == f"{NEW_PACKAGE}.{m.v031.rpartition('.')[2]}")
            return (f"{NEW_PACKAGE} is not in slime {target}: slime #2298 added it after v0.3.1, moving "
                    f"slime.utils.{{{olds}}} into it; in v0.3.1 import them from slime.utils {other}")
        return f"{fullname} is not in slime {target}: {NEW_PACKAGE} was added after v0.3.1 (slime #2298) {other}"
    module, name = found
    rest = fullname[len(name):]
    ours = module.name_in(target)
    if ours is None and target == MAIN:
        note = f" ({module.note})" if module.note else ""
        return (f"{fullname} was removed from slime in {_prs(module)}, so slime {MAIN} has no such module{note}; "
                f"rewrite the hook for main {other}")
    if ours is None:
        return (f"{fullname} is not in slime {V031}: slime {_prs(module)} added it after v0.3.1; rewrite the hook "
                f"for v0.3.1 {other}")
    if target == MAIN:
        return (f"{fullname} moved to {ours + rest} in slime {_prs(module)}, so slime {MAIN} has no {fullname} "
                f"(no shim is left); import from {ours + rest} {other}")
    return (f"{fullname} is slime main's name (slime {_prs(module)}, after v0.3.1); slime {V031} has it as "
            f"{ours + rest}: import from {ours + rest} {other}")


def explain_import_error(message: str, target: str | None) -> str | None:
    """The explanation for a hook's ImportError text (``No module named 'slime.utils.timer'``) on slime
    ``target``, or None where the missing module is not one the layouts tell apart."""
    import re

    for name in re.findall(r"No module named '(slime(?:\.\w+)+)'", message):
        if (why := explain(name, target)) is not None:
            return why
    return None


def served(package: str, target: str | None) -> list[str]:
    """The submodules of compat ``package`` the finder serves for ``target`` (for "it has: ..." lists)."""
    names = set()
    if package == "slime" and has(NEW_PACKAGE, target):
        names.add("observability")
    for module in MODULES:
        for name in (module.v031, module.main):
            if module.backing and name and name.rpartition(".")[0] == package and has(name, target):
                names.add(name.rpartition(".")[2])
    return sorted(names)


# ---------------------------------------------------------------------------------------------
# the static check: the hook files' imports against the table
# ---------------------------------------------------------------------------------------------


def imported_modules(source: str) -> list[tuple[str, int]]:
    """Every ``slime.*`` module a Python source imports (module level or inside a function), with the
    line: ``import slime.utils.timer``, ``from slime.utils.timer import Timer`` and
    ``from slime.utils import timer`` (which names the module slime.utils.timer)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "slime"]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "slime":
            for alias in node.names:  # `from slime.utils import timer` names the module slime.utils.timer
                inner = f"{node.module}.{alias.name}"
                listed = inner == NEW_PACKAGE or ((row := _row(inner)) is not None and row[1] == inner)
                found.append((inner if listed else node.module, node.lineno))
    return sorted(set(found), key=lambda item: (item[1], item[0]))


def layout_findings(hook_files, target: str | None) -> list:
    """``config.hook_layout`` findings for the hook files (paths): a FAIL for each import of a module
    slime ``target`` does not have (moved, added or removed between v0.3.1 and main), naming the module,
    the slime pull request and the name to import instead. Files are parsed, not run; a file that
    cannot be read or parsed is skipped (the import check reports it). Empty where ``target`` is not a
    known slime."""
    from slime_check.findings import Finding, Status, slime_doc

    target = known_target(target)
    if target is None:
        return []
    out = []
    for path in hook_files:
        try:
            source = Path(path).read_text()
            modules = imported_modules(source)
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
            continue
        for name, line in modules:
            why = explain(name, target)
            if why is not None:
                out.append(Finding("config.hook_layout", Status.FAIL, f"{path}:{line}: {why}",
                                   f"Import the module by slime {target}'s name, or check against the slime you run "
                                   "(--slime-dir, --slime-version).",
                                   slime_doc("docs/en/get_started/customization.md")))
    return out
