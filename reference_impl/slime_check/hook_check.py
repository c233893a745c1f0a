"""``config``'s look at the hook modules a launch script names (``--custom-rm-path`` and friends).

slime loads each hook with ``importlib`` on the training node, so a misspelled module, a folder missing
from PYTHONPATH or a module of the other slime's layout is found only when the job reaches it. Where
the module's file is on this machine (the script's PYTHONPATH, including ``--runtime-env-json``'s
``env_vars``, ``--slime-dir``, the script's folder, the working directory), ``config``:

* reads its imports against the layout of the slime the job is judged by (``config.hook_layout``,
  :func:`slime_check.compat.layout_findings`);
* imports it in a separate interpreter with the same PYTHONPATH, as ``smoke`` does before a rehearsal
  (``config.hook_import``), with slime's names from the compatibility layer where slime is not
  installed here.

A module that is not on this machine is a SKIP naming where it was looked for: not a PASS.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from slime_check.findings import Finding, Status, slime_doc

HOOK_DOC = slime_doc("docs/en/get_started/customization.md")


def module_file(module: str, roots: list[Path]) -> Path | None:
    """The file of dotted ``module`` under the first root that holds it (a.b -> a/b.py or a/b/__init__.py);
    found by path, never imported."""
    parts = module.split(".")
    for root in roots:
        base = root.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def search_roots(script: Path | None, slime_dir: Path | None, env: dict[str, str]) -> list[Path]:
    """Where slime's workers would find a hook module: the job's PYTHONPATH first, then --slime-dir,
    the script's folder and the working directory (slime's scripts run from the checkout)."""
    roots = [Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    roots += [p for p in (slime_dir, script.parent if script else None, Path.cwd()) if p is not None]
    seen, out = set(), []
    for root in roots:
        key = str(root.resolve()) if root.exists() else str(root)
        if key not in seen and root.is_dir():
            seen.add(key)
            out.append(root)
    return out


def check_hook_modules(hooks: list[tuple[str, str]], roots: list[Path], target: str | None,
                       env: dict[str, str]) -> list[Finding]:
    """Findings for ``hooks`` ([(flag, module.attribute)]): layout, then an import where the file is here."""
    from slime_check.compat.layouts import explain, layout_findings

    out: list[Finding] = []
    found: dict[str, tuple[str, str]] = {}
    files: list[Path] = []
    for flag, value in hooks:
        module = value.rpartition(".")[0]
        if module.split(".")[0] == "slime":  # slime's own hook: its name must exist in the judged slime
            why = explain(module, target) if target else None
            if why is not None:
                out.append(Finding("config.hook_layout", Status.FAIL, f"{flag} {value}: {why}",
                                   f"Use slime {target}'s module name, or check against the slime you run "
                                   "(--slime-dir, --slime-version).", HOOK_DOC))
            continue
        path = module_file(module, roots)
        if path is None:
            where = ", ".join(str(r) for r in roots) or "nowhere (no PYTHONPATH, --slime-dir or script folder)"
            out.append(Finding("config.hook_import", Status.SKIP,
                               f"{flag} {value}: module {module} is not on this machine (looked in {where}); "
                               "not import-checked.",
                               "Give --slime-dir, or --env PYTHONPATH=FOLDER for the folder holding it; "
                               "slime-check smoke imports it where the job runs.", HOOK_DOC))
            continue
        found[f"h{len(found)}"] = (flag, value)
        if path not in files:
            files.append(path)
    out += layout_findings(files, target)
    if found:
        out += import_check(found, roots, target, env)
    return out


def import_check(hooks: dict[str, tuple[str, str]], roots: list[Path], target: str | None,
                 env: dict[str, str]) -> list[Finding]:
    """Import each hook in another interpreter with the roots on PYTHONPATH (smoke's preflight, no probe)."""
    import importlib.util

    from slime_check.smoke import preflight_hooks, write_hooks

    paths = [str(r) for r in roots]
    run_env = {**os.environ, **env}
    if importlib.util.find_spec("slime") is None:  # slime's names from the compatibility layer
        from slime_check.compat import ROOT, TARGET_ENV

        paths.append(str(ROOT))
        if target:
            run_env[TARGET_ENV] = target
    import slime_ref

    paths.append(str(Path(slime_ref.__file__).resolve().parent.parent))
    with tempfile.TemporaryDirectory(prefix="slime-check-hooks-") as tmp:
        run_env.update({"PYTHONPATH": os.pathsep.join(paths), "PYTHONPYCACHEPREFIX": str(Path(tmp) / "pycache"),
                        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        config = write_hooks(hooks, Path(tmp))
        findings, _ = preflight_hooks(hooks, run_env, config)
    return [Finding("config.hook_import", f.status, f.finding, f.fix, f.doc) for f in findings]
