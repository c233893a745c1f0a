"""bench/README.md is a guide whose results table is bench/results/'s JSON, and the diary is bench/LOG.md.

The table is rendered by bench/results_table.py; README must hold exactly that rendering, so a figure
cannot drift from the JSON it came from. Every bench the folder holds is described, every path the
guide names exists, and dated runs live in the log, not in the guide.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
sys.path.insert(0, str(BENCH))

import results_table  # noqa: E402

GUIDE = (BENCH / "README.md").read_text()


def test_the_readme_table_is_the_one_rendered_from_bench_results():
    assert results_table.in_readme(GUIDE) == results_table.render(), (
        "bench/README.md's results table differs from bench/results/; run python bench/results_table.py --write")


def test_each_row_gives_its_figure_with_date_card_commit_command_and_file():
    rows = [line for line in results_table.in_readme(GUIDE).splitlines()[3:-1]]
    assert len(rows) == len(results_table.ROWS)
    for line in rows:
        bench, figure, card, date, commit, command, json_file = (c.strip() for c in line.strip("|").split("|"))
        assert re.search(r"\d", figure), line
        assert card in ("H100", "H200") or card.startswith("CPU"), line
        assert re.match(r"20\d\d-\d\d-\d\d", date), line
        assert re.match(r"[0-9a-f]{7}", commit), line
        assert "bench/" in command, line
        assert (BENCH / "results" / json_file.strip("`")).is_file(), line


def test_the_final_runs_figures_are_speed_targets_medians():
    """The headline GPU rows against speed_targets.py's own summary of the same file."""
    import speed_targets

    path = results_table.newest(results_table.FINAL)
    out = speed_targets.summarize(speed_targets.from_results(path))
    table = results_table.in_readme(GUIDE)
    assert f"{out['training']['8x1024']['ours_tokens_per_s']['median']:,.0f} tok/s" in table
    assert f"{out['training']['8x1024']['ours_over_hf']:.2f}x HF + SDPA" in table
    assert f"{out['rollout']['tokens_per_s']['median'] / 1000:.1f}k generated tok/s" in table
    assert f"{out['grpo_step']['ours_over_trl']:.3f}" in table


def test_check_fails_on_a_stale_table_and_write_mends_it(tmp_path, monkeypatch, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(GUIDE.replace(results_table.render(), results_table.render().replace("tok/s", "tokens/s")))
    monkeypatch.setattr(results_table, "README", readme)
    assert results_table.main(["--check"]) == 1
    assert "run python bench/results_table.py --write" in capsys.readouterr().err
    assert results_table.main(["--write"]) == 0
    assert results_table.main(["--check"]) == 0 and readme.read_text() == GUIDE


def test_a_results_file_missing_what_its_row_reads_is_named(tmp_path, monkeypatch):
    (tmp_path / "smoke-time-cpu-2026-12-06.json").write_text('{"shapes": {}}')
    monkeypatch.setattr(results_table, "RESULTS", tmp_path)
    row = next(r for r in results_table.ROWS if r.source.startswith("smoke-time"))
    with pytest.raises(results_table.BadResults, match=r"smoke-time-cpu-2026-12-06.json: no 'plain'"):
        results_table.render_row(row)


def test_the_guide_is_short_and_describes_every_bench():
    assert len(GUIDE.splitlines()) < 200
    helpers = {"shaped_model.py", "grpo_harness.py", "results_table.py"}
    for script in sorted(BENCH.glob("*.py")):
        if script.name not in helpers:
            assert f"| `{script.name}` |" in GUIDE, f"bench/README.md does not describe {script.name}"
    for helper in helpers:
        assert f"`{helper}`" in GUIDE


def test_every_path_the_guide_names_exists():
    named = set(re.findall(r"(?:bench/)?gpu/[\w.]+\.(?:sh|py)", GUIDE))
    assert named, "the guide names no gpu/ script"
    for path in named:
        assert (BENCH / path.removeprefix("bench/")).is_file(), path
    for link in re.findall(r"\]\(([^)#]+)\)", GUIDE):
        assert (BENCH / link).resolve().exists(), link


def test_dated_runs_are_in_the_log_not_in_the_guide():
    log = (BENCH / "LOG.md").read_text()
    assert not [h for h in GUIDE.splitlines() if h.startswith("#") and re.search(r"20\d\d-\d\d-\d\d", h)]
    dated = [h for h in log.splitlines() if h.startswith("## ") and re.search(r"20\d\d-\d\d-\d\d", h)]
    assert len(dated) >= 14  # every dated run of the diary, the first of 2026-11-30 included
    assert any("2026-11-30" in h for h in dated) and any("2026-12-05" in h for h in dated)
