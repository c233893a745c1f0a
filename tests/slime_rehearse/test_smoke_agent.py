"""slime-check smoke on an agentic DAPO-style job in slime's shape (tests/fixtures/smoke_jobs/
run-agent-dapo.sh): a tool-use generate, a reward that wants <answer> tags, slime's own nonzero-std
dynamic filter with over-sampling, a checkpoint that is not on this machine. Whole rehearsals (slow)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

TESTS = Path(__file__).resolve().parents[1]
JOBS = TESTS / "fixtures" / "smoke_jobs"
REPO = TESTS.parent
CLI = [sys.executable, "-c", "from slime_rehearse.cli import main; main()"]
TOOL_BRANCH = "run_tool"  # the function only a tool call reaches (agent_hooks/calculator.py)


@pytest.fixture(scope="module")
def tiny():
    from slime_ref.assets import make_tiny

    root = Path(tempfile.mkdtemp(prefix="sma-", dir="/tmp"))
    yield make_tiny(root / "tiny")
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def out():
    path = Path(tempfile.mkdtemp(prefix="sm-", dir="/tmp"))
    yield path / "out"
    shutil.rmtree(path, ignore_errors=True)


def rehearse(out: Path, tiny, *args: str) -> tuple[int, dict]:
    env = {**os.environ, "COLUMNS": "200",
           "PYTHONPATH": os.pathsep.join([str(REPO / "reference_impl"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([*CLI, "smoke", str(JOBS / "run-agent-dapo.sh"), "--out", str(out), "--json",
                           "--env", f"TINY={tiny.root}", *args], capture_output=True, text=True, timeout=600, env=env)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-4000:]
    return done.returncode, json.loads(done.stdout)


def by_id(report: dict, finding_id: str) -> list[dict]:
    return [f for f in report["findings"] if f["id"] == finding_id]


def calculator(report: dict) -> dict:
    return next(c for c in report["run"]["coverage"] if c["file"].endswith("calculator.py"))


def left_running(marker: str) -> list[int]:
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []):
                found.append(p.info["pid"])
        except psutil.Error:
            continue
    return found


@pytest.mark.slow
def test_a_scripted_tool_call_reaches_the_tool_branch_and_the_answer_format_is_learned(out, tiny):
    rc, report = rehearse(out, tiny, "--responses", str(JOBS / "tool-responses.jsonl"))
    assert rc == 0, json.dumps([f for f in report["findings"] if f["status"] != "PASS"], indent=1)[-4000:]
    run = report["run"]
    # the label probe learned that the reward wants <answer> tags, and does not cry wolf
    assert run["label_probe"]["shapes"]["answer_tags"] == 1.0
    (fmt,) = by_id(report, "smoke.reward_format")
    assert fmt["status"] == "PASS" and "answer_tags" in fmt["finding"]
    # the stand-in engine scripted part of each group: rewards vary, slime's filter keeps groups
    assert run["stand_in"]["scripted"] > 0 and run["stand_in"]["sampled"] > 0
    assert by_id(report, "smoke.reward")[0]["status"] == "PASS"
    assert run["filter"]["groups_seen"] > run["filter"]["groups_dropped"]
    assert max(run["rewards"]) > 0
    # the scripted tool call ran the tool branch, in the rollout manager's process
    assert TOOL_BRANCH in calculator(report)["functions_run"]
    assert run["hooks"]["agent_hooks.calculator.generate"]["errors"] == 0
    # log-probs of scripted answers are the model's own: the weight check still holds
    assert run["weight_check_max_abs_diff"] and max(run["weight_check_max_abs_diff"]) < 1e-4
    assert left_running(str(out)) == []


@pytest.mark.slow
def test_without_responses_the_tool_branch_is_named_as_never_run_and_a_filter_dropping_spread_fails(out, tiny):
    rc, report = rehearse(out, tiny, "--env", "FILTER=agent_hooks.filters.keep_only_perfect")
    assert rc == 1
    (failed,) = by_id(report, "smoke.filter")
    assert failed["status"] == "FAIL" and "dropped every group" in failed["finding"]
    counts = report["run"]["filter"]
    assert counts["dropped_with_spread"] > 0 and counts["starved"] > 0  # the guard still let it train
    assert by_id(report, "smoke.run")[0]["status"] == "PASS"
    # nothing called the tool: its branch is named, with its lines and the way to reach it
    entry = calculator(report)
    assert TOOL_BRANCH not in entry["functions_run"]
    branch = next(g for g in entry["missing"] if g["function"] == "generate")
    warn = [f for f in by_id(report, "smoke.coverage") if f["status"] == "WARN" and "generate (calculator.py)"
            in f["finding"]]
    assert warn and f"{branch['lines'][0]}" in warn[0]["finding"] and "--responses" in warn[0]["fix"]
    assert left_running(str(out)) == []
