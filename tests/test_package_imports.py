"""How the four packages depend on each other.

``slime_common`` (errors, atomic writes, the flag registry) imports none of the others. ``slime_check``
(prereqs, capture, config lint: it reads, probes and reports) imports nothing of ``slime_ref`` or
``slime_rehearse``, not even inside a function. ``slime_ref`` (the trainer) imports nothing of
``slime_check`` or ``slime_rehearse``. ``slime_rehearse`` (the ``slime-check`` command, smoke, quick
start, the ``slime`` compatibility namespace) sits above both. Inside ``slime_ref`` the subpackages
import each other without a cycle. And ``slime-check prereqs`` loads no Ray, no torch and nothing of
the trainer.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "reference_impl"
PACKAGES = ("slime_common", "slime_check", "slime_ref", "slime_rehearse")


def _unit(module: str) -> str:
    """The node a module belongs to: a top-level package, or a first-level part of slime_ref."""
    parts = module.split(".")
    if parts[0] == "slime_ref" and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Every import between units, at module level or inside a function."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in root.rglob("*.py"):
        if "bundle" in path.relative_to(root).parts:
            continue
        source = _unit(_module_name(path, root))
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


def _targets(graph: dict[str, set[str]], package: str) -> set[str]:
    """The top-level packages that ``package``'s modules import (any level, inside functions too)."""
    return {t.split(".")[0] for src, targets in graph.items() if src.split(".")[0] == package for t in targets}


def test_packages_depend_in_one_direction():
    graph = import_graph()
    assert _targets(graph, "slime_common") <= {"slime_common"}
    assert not _targets(graph, "slime_ref") & {"slime_check", "slime_rehearse"}
    assert not _targets(graph, "slime_check") & {"slime_ref", "slime_rehearse"}
    assert "slime_ref.ray" not in graph["slime_ref.weights"]


def test_the_rehearsal_sits_above_both_tools():
    """slime_rehearse is what joins the checker to the trainer: it imports both, and the walk sees it."""
    graph = import_graph()
    assert {"slime_check", "slime_ref"} <= _targets(graph, "slime_rehearse")


def test_the_walk_sees_function_level_imports(tmp_path):
    """An import inside a function is an edge too (the checker may not reach the trainer lazily)."""
    (tmp_path / "slime_check").mkdir()
    (tmp_path / "slime_check" / "lazy.py").write_text(
        "def f():\n    import slime_ref.train\n    from slime_rehearse import smoke_runtime\n")
    assert import_graph(tmp_path)["slime_check"] == {"slime_ref.train", "slime_rehearse"}


def test_slime_check_finds_the_rehearsal_by_name_only():
    """config's hook import check runs slime_rehearse's preflight in another interpreter, by module name;
    no module of slime_check names slime_ref or slime_rehearse in importlib.import_module or __import__."""
    for path in (ROOT / "slime_check").rglob("*.py"):
        if "bundle" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                func = ast.unparse(node.func)
                if func in ("importlib.import_module", "import_module", "__import__"):
                    assert str(node.args[0].value).split(".")[0] not in ("slime_ref", "slime_rehearse"), path


def test_prereqs_imports_no_ray_torch_or_trainer(tmp_path):
    code = (
        "import atexit, json, sys\n"
        "atexit.register(lambda: print('MODULES ' + json.dumps(sorted({m.split('.')[0] for m in sys.modules})),"
        " file=sys.stderr))\n"
        "sys.argv = ['slime-check', 'prereqs', '--json']\n"
        "from slime_rehearse.cli import main\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("MODULES "))
    loaded = set(json.loads(line[len("MODULES "):]))
    assert "slime_check" in loaded and "slime_common" in loaded
    assert not loaded & {"ray", "torch", "slime_ref", "numpy", "transformers", "megatron"}
    json.loads(proc.stdout)  # it did run the checks


def _code_strings(path: Path) -> list[int]:
    """Lines of string constants in ``path`` (docstrings aside) that parse as Python of 5 lines or more
    with a def or an import: code kept in a string, which no linter reads."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                and node.value.count("\n") >= 5 and ("def " in node.value or "import " in node.value)):
            try:
                ast.parse(node.value)
            except SyntaxError:
                continue
            found.append(node.lineno)
    return found


def test_no_python_code_lives_in_a_string():
    found = {str(p.relative_to(ROOT)): lines for p in ROOT.rglob("*.py")
             if "bundle" not in p.parts and (lines := _code_strings(p))}
    assert found == {}, "move it to a module of its own, run by path or by module name"


def test_the_rehearsal_modules_stay_under_600_lines():
    long = {p.name: n for p in (ROOT / "slime_rehearse").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}
