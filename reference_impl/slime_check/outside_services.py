"""What a hook's missing import means: the package, and the outside service it stands for.

A hook that cannot be imported fails the smoke before anything starts. Python's message names one
module ("No module named 'tau_bench'"); the user needs to know what that module is, whether
installing it is enough, and what else the job reaches that a rehearsal cannot stand in for: an LLM
API, a sandbox service, a GPU-only package. :data:`PACKAGES` holds that for the third-party modules
slime's own examples import (v0.3.1 ``examples/``); :func:`explain_missing` turns the message into
one line, and lists what else the hook file (and the modules beside it that it imports) needs and
this environment lacks, so one run names everything the user must provide.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Package:
    what: str  # the distribution and how to get it
    service: str | None = None  # the outside service behind it, if any
    note: str | None = None  # where it can run instead, when not here


PACKAGES: dict[str, Package] = {
    "tau_bench": Package("tau-bench (pip install -e a checkout of github.com/JD-ETH/tau-bench, --no-deps)",
                         "its user simulator calls an LLM API through litellm (slime's tau-bench example uses "
                         "Gemini: GEMINI_API_KEY); a rehearsal cannot stand in for it"),
    "litellm": Package("litellm (pip install litellm)", "an LLM API it calls, with that provider's key"),
    "strands": Package("strands-agents (pip install strands-sglang==0.4.2, as slime's strands_sglang example "
                       "says; it brings strands-agents)"),
    "strands_sglang": Package("strands-sglang (pip install strands-sglang==0.4.2)"),
    "sglang": Package("SGLang (the hook imports its Python package, e.g. FunctionCallParser)",
                      note="it installs on a CUDA machine: rehearse with slime-check smoke --with slime there"),
    "e2b": Package("the E2B SDK (pip install e2b)", "remote sandboxes from the E2B service (E2B_API_KEY)"),
    "e2b_code_interpreter": Package("the E2B code interpreter SDK (pip install e2b-code-interpreter)",
                                    "remote sandboxes from the E2B service (E2B_API_KEY)"),
    "openai": Package("the OpenAI client (pip install openai)", "an OpenAI-compatible API endpoint and its key"),
    "anthropic": Package("the Anthropic client (pip install anthropic)", "the Anthropic API and its key"),
    "wandb": Package("Weights & Biases (pip install wandb)", "the W&B service, or WANDB_MODE=offline"),
}

NO_MODULE = re.compile(r"No module named '([^']+)'")


def top_level_imports(path: Path) -> list[str]:
    """The absolute top-level modules ``path`` imports, in order of first appearance."""
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found = [node.module.split(".")[0]]
        else:
            continue
        names += [n for n in found if n not in names]
    return names


def missing_modules(path: Path, _seen: set[Path] | None = None) -> list[str]:
    """Top-level imports of ``path``, and of the modules beside it that it imports, that this
    interpreter cannot find (its sys.path and import hooks). The standard library is never missing."""
    from importlib.machinery import PathFinder

    seen = _seen if _seen is not None else set()
    seen.add(path.resolve())
    out: list[str] = []
    for name in top_level_imports(path):
        if name in sys.stdlib_module_names or name in sys.builtin_module_names:
            continue
        local = PathFinder.find_spec(name, [str(path.parent)])
        if local is not None:  # a module beside the hook: what it imports counts too
            origin = Path(local.origin) if local.origin and local.origin.endswith(".py") else None
            if origin is not None and origin.resolve() not in seen:
                out += [m for m in missing_modules(origin, seen) if m not in out]
            continue
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found and name not in out:
            out.append(name)
    return out


def describe(module: str) -> str:
    """``module``: what it is and, where one stands behind it, the outside service."""
    top = module.split(".")[0]
    package = PACKAGES.get(top)
    if package is None:
        return f"{top} is not installed where the hooks run"
    text = f"{top} is {package.what}"
    if package.service:
        text += f"; outside service: {package.service}"
    return f"{text}; {package.note}" if package.note else text


def explain_missing(message: str, hook_file: Path | None = None) -> str | None:
    """One line for a hook's "No module named X" message: what X is and the service behind it, then
    the hook file's other missing top-level imports. None when the message is not a missing module."""
    match = NO_MODULE.search(message)
    if not match:
        return None
    first = match.group(1).split(".")[0]
    if first == "slime":
        return None  # the compatibility layer's own messages say what it lacks
    modules = [first]
    if hook_file is not None and hook_file.is_file():
        modules += [m for m in missing_modules(hook_file) if m not in modules and m != "slime"]
    parts = [describe(m) for m in modules]
    also = f" (it also imports {', '.join(modules[1:])}, missing too)" if len(modules) > 1 else ""
    return "; ".join(parts) + also
