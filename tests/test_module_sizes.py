"""Every Python module of the product stays small enough to read in one sitting: at most 600 lines.

A module that grows past the limit is split along a seam a newcomer would name (see
reference_impl/ARCHITECTURE.md section 2 for the layout). Test fixtures and generated data are not
modules anyone reads top to bottom, so they are left out.
"""

from __future__ import annotations

from pathlib import Path

REFERENCE_IMPL = Path(__file__).resolve().parents[1] / "reference_impl"
MAX_LINES = 600
NOT_READ_AS_CODE = {"fixtures", "generated", "__pycache__"}  # folders of test inputs and generated data


def line_count(path: Path) -> int:
    """Lines as ``wc -l`` counts them: newline characters."""
    return path.read_bytes().count(b"\n")


def product_modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if not NOT_READ_AS_CODE & set(p.relative_to(root).parts))


def test_line_count_is_what_wc_counts(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("a = 1\nb = 2\nc = 3")  # no newline after the last line: wc -l says 2
    assert line_count(module) == 2


def test_fixtures_and_generated_data_are_left_out(tmp_path):
    for rel in ("pkg/kept.py", "pkg/fixtures/big.py", "pkg/generated/table.py", "pkg/__pycache__/x.py",
                "pkg/data.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    assert product_modules(tmp_path) == [tmp_path / "pkg" / "kept.py"]


def test_no_module_under_reference_impl_exceeds_600_lines():
    modules = product_modules(REFERENCE_IMPL)
    assert len(modules) > 50, "the package modules were not found"
    too_long = {str(p.relative_to(REFERENCE_IMPL)): n for p in modules if (n := line_count(p)) > MAX_LINES}
    assert too_long == {}, f"modules over {MAX_LINES} lines (split them along a real seam): {too_long}"
