"""``config``'s look at the hook modules a launch script names (``--custom-rm-path`` and friends).

slime loads each hook with ``importlib`` on the training node, so a misspelled module, a folder missing
from PYTHONPATH or a module of the other slime's layout is found only when the job reaches it. Where
the module's file is on this machine (the script's PYTHONPATH, including ``--runtime-env-json``'s
``env_vars``, ``--slime-dir``, the script's folder, the working directory), ``config``:

* reads its imports against the layout of the slime the job is judged by (``config.hook_layout``,
  :func:`slime_check.slime_layouts.layout_findings`);
* imports it in a separate interpreter with the same PYTHONPATH, as ``smoke`` does before a rehearsal
  (``config.hook_import``), with slime's names from the compatibility layer where slime is not
  installed here.

A module that is not on this machine is a SKIP naming where it was looked for: not a PASS.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from slime_check.findings import Finding, Status, slime_doc
from slime_check.slime_layouts import TARGET_ENV, explain, explain_import_error, layout_findings

HOOK_DOC = slime_doc("docs/en/get_started/customization.md")
SMOKE_DOC = "skill/references/smoke.md"
# the preflight's module (slime-rehearse), started by name in another interpreter: config never imports it
PREFLIGHT_MODULE = "slime_rehearse.smoke_runtime"


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


def write_hooks(hooks: dict[str, tuple[str, str]], out: Path, real_slime: bool = False,
                probe: dict | None = None, marks: Path | None = None) -> Path:
    """OUT/hooks/smoke_hooks.json: what the preflight imports and the smoke run's ``slime_smoke_hooks``
    wraps, and where it counts; the path goes to the run as SLIME_SMOKE_HOOKS_CONFIG. ``marks``: a
    memory-faithful run's folder for the generate calls' times, whose answers run to full length."""
    folder = out / "hooks"
    calls = folder / "calls"
    calls.mkdir(parents=True, exist_ok=True)
    config = folder / "smoke_hooks.json"
    memory = {}
    if marks is not None:
        marks.mkdir(parents=True, exist_ok=True)
        memory = {"full_length": True, "marks": str(marks)}
    config.write_text(json.dumps({"calls": str(calls), "hooks": hooks, "real_slime": real_slime,
                                  "probe": probe, **memory}, indent=1))
    return config


def preflight_hooks(hooks: dict[str, tuple[str, str]], env: dict, config: Path) -> tuple[list[Finding], dict]:
    """Import every hook the way the run will (same PYTHONPATH), before anything starts, and probe the
    reward's answer format (``python -m slime_rehearse.smoke_runtime preflight CONFIG``, another
    interpreter). (findings, the preflight's report)."""
    env = {k: v for k, v in env.items() if k != "COVERAGE_PROCESS_START"}  # the probe is not the run
    try:
        done = subprocess.run([sys.executable, "-m", PREFLIGHT_MODULE, "preflight", str(config)],
                              env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return [Finding("smoke.hook_import", Status.WARN, "importing the hooks took over 300 s; not checked.",
                        "Check what the hook modules do at import.", HOOK_DOC)], {}
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("SMOKE-PREFLIGHT ")), None)
    if line is None:
        tail = " ".join((done.stderr or "").strip().splitlines()[-1:])
        return [Finding("smoke.hook_import", Status.FAIL, f"importing the hooks crashed the interpreter: {tail}",
                        "Import the hook module by hand to see why.", HOOK_DOC)], {}
    report = json.loads(line.split(" ", 1)[1])
    out = []
    for hook_id, (flag, path) in hooks.items():
        if hook_id in report["errors"]:
            message = report["errors"][hook_id]
            if (moved := explain_import_error(message, env.get(TARGET_ENV))) and moved not in message:
                message += f" ({moved})"  # a real slime's bare "No module named": where the module went
            out.append(Finding("smoke.hook_import", Status.FAIL, f"{flag} {path} cannot be loaded: {message}",
                               "Fix the import (the module's folder must be on the workers' PYTHONPATH, e.g. in "
                               "ray job submit's runtime env); names missing from the slime compatibility layer "
                               "are listed in " + SMOKE_DOC + ".", HOOK_DOC))
        else:
            out.append(Finding("smoke.hook_import", Status.PASS, f"{flag} {path} imports"))
    return out, report


def _package_dir(name: str) -> Path | None:
    """The folder of installed top-level package ``name``, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def import_check(hooks: dict[str, tuple[str, str]], roots: list[Path], target: str | None,
                 env: dict[str, str]) -> list[Finding]:
    """Import each hook in another interpreter with the roots on PYTHONPATH (smoke's preflight, no probe).
    The preflight is slime-rehearse's; where it is not installed the import is a SKIP saying so."""
    rehearse, ref = _package_dir("slime_rehearse"), _package_dir("slime_ref")
    if rehearse is None or ref is None:
        missing = " and ".join(n for n, d in (("slime_rehearse", rehearse), ("slime_ref", ref)) if d is None)
        return [Finding("config.hook_import", Status.SKIP,
                        f"{flag} {value}: not import-checked ({missing} is not installed here).",
                        "Install slime-skill (pip install -e .) to import-check the hooks.", HOOK_DOC)
                for flag, value in hooks.values()]
    paths = [str(r) for r in roots]
    run_env = {**os.environ, **env}
    if importlib.util.find_spec("slime") is None:  # slime's names from the compatibility layer
        paths.append(str(rehearse / "compat"))
        if target:
            run_env[TARGET_ENV] = target
    paths.append(str(ref.parent))
    paths.append(str(rehearse.parent))
    with tempfile.TemporaryDirectory(prefix="slime-check-hooks-") as tmp:
        run_env.update({"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
                        "PYTHONPYCACHEPREFIX": str(Path(tmp) / "pycache"),
                        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        config = write_hooks(hooks, Path(tmp))
        findings, _ = preflight_hooks(hooks, run_env, config)
    return [Finding("config.hook_import", f.status, f.finding, f.fix, f.doc) for f in findings]
