"""The installed skill loads in the real Hermes Agent 0.19.0: listing, viewing, prompt index, strict
validation, the security scan, and a scripted agent turn that calls skill_view itself.

Hermes lives in its own virtual environment, `.venv-hermes` at the repository root, which the first
test that needs it creates (`pip install hermes-agent==0.19.0`, a few minutes, needs PyPI). Set
SLIME_SKILL_HERMES_PYTHON to a Python that already has hermes-agent 0.19.0 to use that instead.
Without network the tests skip; under CI (CI=true) a failed install fails them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from _ci import skip_or_fail_in_ci
from skill_docs import REPO
from slime_check.skill_install import SKILL_NAME

HERMES_VERSION = "0.19.0"
HERMES_VENV = REPO / ".venv-hermes"
PROBE = Path(__file__).parent / "hermes" / "probe_skill.py"
SCRIPTED_LLM = Path(__file__).parent / "hermes" / "scripted_llm.py"

pytestmark = pytest.mark.timeout(1800)  # the first test may build the Hermes environment


def _has_hermes(python: Path) -> bool:
    probe = "import importlib.metadata as m, tools.skills_tool; print(m.version('hermes-agent'))"
    result = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=300, cwd="/")
    return result.returncode == 0 and result.stdout.strip() == HERMES_VERSION


@pytest.fixture(scope="session")
def hermes_python() -> Path:
    """A Python with hermes-agent 0.19.0, in its own virtual environment (its dependencies are not ours)."""
    override = os.environ.get("SLIME_SKILL_HERMES_PYTHON")
    if override:
        assert _has_hermes(Path(override)), f"SLIME_SKILL_HERMES_PYTHON={override} has no hermes-agent {HERMES_VERSION}"
        return Path(override)
    python = HERMES_VENV / "bin" / "python"
    if python.exists() and _has_hermes(python):
        return python
    shutil.rmtree(HERMES_VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(HERMES_VENV)], check=True, timeout=300)
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"hermes-agent=={HERMES_VERSION}"],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    if install.returncode != 0:
        shutil.rmtree(HERMES_VENV, ignore_errors=True)
        tail = (install.stderr or install.stdout).strip().splitlines()[-1:]
        skip_or_fail_in_ci(f"could not install hermes-agent=={HERMES_VERSION} into .venv-hermes: {tail}")
    assert _has_hermes(python)
    return python


@pytest.fixture(scope="module")
def hermes_home(tmp_path_factory) -> Path:
    """A fresh Hermes home with the skill installed by `slime-check skill install`."""
    home = tmp_path_factory.mktemp("hermes-home")
    result = subprocess.run(
        ["slime-check", "skill", "install", "--hermes-home", str(home)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return home


@pytest.fixture(scope="module")
def skill_dir(hermes_home) -> Path:
    return hermes_home / "skills" / "mlops" / SKILL_NAME


def hermes_env(home: Path, **extra) -> dict:
    # Only what Hermes needs: no user config, keys or proxies leak in.
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "HERMES_HOME": str(home), "LANG": "C.UTF-8", **extra}
    return env


@pytest.fixture(scope="module")
def probe(hermes_python, hermes_home, skill_dir) -> dict:
    result = subprocess.run(
        [str(hermes_python), str(PROBE), SKILL_NAME, str(skill_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        env=hermes_env(hermes_home),
        cwd=hermes_home,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_skills_list_shows_the_skill_with_its_description(probe, skill_dir):
    listed = {s["name"]: s for s in probe["listed"]}
    assert listed[SKILL_NAME]["category"] == "mlops"
    description = listed[SKILL_NAME]["description"]
    assert description.startswith("Use when post-training LLMs with RL on slime")
    assert description in (skill_dir / "SKILL.md").read_text(encoding="utf-8")


def test_skill_view_succeeds_and_lists_every_shipped_file(probe, skill_dir):
    view = probe["view"]
    assert view["success"] and view["name"] == SKILL_NAME and view["readiness_status"] == "available"
    # no metadata.hermes map (agentskills.io metadata is string to string): Hermes shows no tags and
    # links no related skills, and needs neither to list, view, index or validate the skill
    assert view["tags"] == [] and view["related_skills"] == []
    linked = sorted(path for group in view["linked_files"].values() for path in group)
    shipped = sorted(
        p.relative_to(skill_dir).as_posix() for p in skill_dir.rglob("*") if p.is_file() and p.name != "SKILL.md"
        and not p.name.startswith(".")
    )
    assert linked == shipped
    assert "assets/checklists/prerequisites.md" in linked and "references/troubleshooting.md" in linked


def test_skill_view_reads_each_linked_file_exactly(probe, skill_dir):
    assert probe["reads"]
    for path, read in probe["reads"].items():
        assert read["success"], (path, read["error"])
        expected = hashlib.sha256((skill_dir / path).read_text(encoding="utf-8").encode("utf-8")).hexdigest()
        assert read["sha256"] == expected, path


def test_skill_view_fills_in_the_skill_folder(probe, skill_dir):
    content = probe["view_content"]
    assert f"cp {skill_dir}/templates/run-qwen3-4B-grpo-8gpu.sh" in content
    assert "${HERMES_SKILL_DIR}" not in content


def test_system_prompt_index_lists_the_skill(probe):
    index = probe["prompt_index"]
    assert "<available_skills>" in index
    assert f"- {SKILL_NAME}: Use when post-training LLMs with RL on slime" in index


def test_strict_frontmatter_validation_passes(probe):
    assert probe["strict_frontmatter_error"] is None


def test_security_scan_is_safe_within_limits(probe):
    scan, size, limits = probe["scan"], probe["size"], probe["limits"]
    assert scan["verdict"] == "safe", scan["findings"]
    assert scan["allowed"], scan["reason"]
    assert size["files"] <= limits["max_files"]
    assert size["total_bytes"] <= limits["max_total_kb"] * 1024
    assert size["largest_bytes"] <= limits["max_file_kb"] * 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_agent_turn_loads_the_skill_through_skill_view(hermes_python, tmp_path):
    home = tmp_path / "home"
    subprocess.run(["slime-check", "skill", "install", "--hermes-home", str(home)], check=True, timeout=300)
    port, log = _free_port(), tmp_path / "llm.jsonl"
    (home / "config.yaml").write_text(
        f"model:\n  provider: custom\n  base_url: http://127.0.0.1:{port}/v1\n  default: scripted\n  context_length: "
        f"131072\n"
    )
    server = subprocess.Popen(
        [sys.executable, str(SCRIPTED_LLM), str(port), str(log), SKILL_NAME, "references/troubleshooting.md"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout.readline().strip() == "ready", server.stderr.read()
        hermes = hermes_python.parent / "hermes"
        turn = subprocess.run(
            [str(hermes), "-z", "Set up a GRPO run with slime", "-t", "skills"],
            capture_output=True,
            text=True,
            timeout=600,
            env=hermes_env(home, OPENAI_API_KEY="scripted-llm-no-key"),
            cwd=home,
            stdin=subprocess.DEVNULL,
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert turn.returncode == 0, turn.stdout + turn.stderr
    assert "SCRIPTED-TURN-DONE" in turn.stdout
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(requests) == 3
    assert all(f"- {SKILL_NAME}:" in r["system_prompt"] for r in requests)
    skill_result = json.loads(requests[1]["tool_results"][0])
    assert skill_result["success"] and skill_result["name"] == SKILL_NAME
    assert "Never kill processes by name" in skill_result["content"]
    reference_result = json.loads(requests[2]["tool_results"][1])
    assert reference_result["success"]
    assert reference_result["content"].startswith("# Troubleshooting slime v0.3.1 runs")
