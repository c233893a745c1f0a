"""How the three packages depend on each other.

``slime_common`` (errors, atomic writes, the flag registry) imports neither of the others;
``slime_ref`` never imports ``slime_check``; ``slime_check`` reaches the trainer only lazily (the
quick start). Inside ``slime_ref`` the subpackages import each other without a cycle. And
``slime-check prereqs`` loads no Ray, no torch and nothing of the trainer.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "reference_impl"
PACKAGES = ("slime_common", "slime_check", "slime_ref")


def _unit(module: str) -> str:
    """The node a module belongs to: a top-level package, or a first-level part of slime_ref."""
    parts = module.split(".")
    if parts[0] == "slime_ref" and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """Every import between units, at module level or inside a function."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        if "bundle" in path.relative_to(ROOT).parts:
            continue
        source = _unit(_module_name(path))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module]
            else:
                continue
            for target in targets:
                if target.split(".")[0] in PACKAGES and _unit(target) != source:
                    graph[source].add(_unit(target))
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None


def test_no_import_cycle():
    graph = import_graph()
    assert graph["slime_ref.weights"], "the walk found no imports: is ROOT right?"
    assert find_cycle(graph) is None


def test_packages_depend_in_one_direction():
    graph = import_graph()
    assert not {t for t in graph["slime_common"] if t != "slime_common"}
    ref_targets = {t for src, targets in graph.items() if src.startswith("slime_ref") for t in targets}
    assert "slime_check" not in ref_targets
    assert "slime_ref.ray" not in graph["slime_ref.weights"]


def test_slime_check_reaches_the_trainer_only_lazily():
    """Module-level imports of slime_check's modules never name slime_ref. The `slime` compatibility
    namespace (slime_check/compat) is exempt: it is slime-ref's face for users' hooks, put on a smoke
    run's path, and never imported by slime_check itself."""
    for path in (ROOT / "slime_check").rglob("*.py"):
        if "bundle" in path.parts or "compat" in path.parts:
            continue
        for node in ast.parse(path.read_text()).body:
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not [n for n in names if n.split(".")[0] == "slime_ref"], path


def test_prereqs_imports_no_ray_torch_or_trainer(tmp_path):
    code = (
        "import atexit, json, sys\n"
        "atexit.register(lambda: print('MODULES ' + json.dumps(sorted({m.split('.')[0] for m in sys.modules})),"
        " file=sys.stderr))\n"
        "sys.argv = ['slime-check', 'prereqs', '--json']\n"
        "from slime_check.cli import main\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("MODULES "))
    loaded = set(json.loads(line[len("MODULES "):]))
    assert "slime_check" in loaded and "slime_common" in loaded
    assert not loaded & {"ray", "torch", "slime_ref", "numpy", "transformers", "megatron"}
    json.loads(proc.stdout)  # it did run the checks
