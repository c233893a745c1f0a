"""The skill is portable beyond Hermes: the installed copy passes both agentskills.io validators.

- `skills-ref` 0.1.1, the reference library (its CLI is `agentskills validate DIR`): strict YAML,
  only the spec's six top-level keys, `name` equal to the folder name.
- `agentskills-tools` 0.7.0 (its CLI is also `agentskills`; Python >= 3.12): `validate` and `lint`.

Hermes 0.19.0 itself is checked in test_skill_hermes.py (strict validation included). The two
validators share a command name and agentskills-tools needs a newer Python than slime-skill, so each
lives in its own virtual environment at the repository root, created on first use the way
`.venv-hermes` is: `.venv-skills-ref` (skipped when this Python already has skills-ref 0.1.1, as the
`dev` extra installs it) and `.venv-agentskills`, built from the first Python >= 3.12 found
(`SLIME_SKILL_PYTHON312`, `python3.13`/`python3.12` on PATH, or a pyenv install).
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from _ci import skip_or_fail_in_ci
from skill_docs import REPO
from slime_check.skill_install import SKILL_NAME

pytestmark = pytest.mark.timeout(1200)  # the first test may build a validator's environment

SKILLS_REF = "0.1.1"
AGENTSKILLS_TOOLS = "0.7.0"
SPEC_KEYS = {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}


def _run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False, **kw)


def _venv_with(venv: Path, python: str, requirement: str, probe: str) -> Path:
    """`venv`/bin/python with `requirement` installed (reused when the probe already passes)."""
    venv_python = venv / "bin" / "python"
    if venv_python.exists() and _run([venv_python, "-c", probe], timeout=120).returncode == 0:
        return venv_python
    shutil.rmtree(venv, ignore_errors=True)
    made = _run([python, "-m", "venv", venv], timeout=300)
    if made.returncode != 0:
        pytest.skip(f"cannot create {venv.name} with {python}: {made.stderr.strip()[-300:]}")
    install = _run([venv_python, "-m", "pip", "install", "-q", "--disable-pip-version-check", requirement], timeout=900)
    if install.returncode != 0 or _run([venv_python, "-c", probe], timeout=120).returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        tail = (install.stderr or install.stdout).strip().splitlines()[-1:]
        skip_or_fail_in_ci(f"could not install {requirement} into {venv.name}: {tail}")
    return venv_python


@pytest.fixture(scope="session")
def skills_ref_cli() -> list[str]:
    probe = f"import importlib.metadata as m; assert m.version('skills-ref') == '{SKILLS_REF}'; import skills_ref.cli"
    try:
        if importlib.metadata.version("skills-ref") == SKILLS_REF:
            return [sys.executable, "-m", "skills_ref.cli"]
    except importlib.metadata.PackageNotFoundError:
        pass
    python = _venv_with(REPO / ".venv-skills-ref", sys.executable, f"skills-ref=={SKILLS_REF}", probe)
    return [str(python), "-m", "skills_ref.cli"]


def _python312() -> str | None:
    override = os.environ.get("SLIME_SKILL_PYTHON312")
    candidates = [override] if override else []
    candidates += [sys.executable, shutil.which("python3.13"), shutil.which("python3.12")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")), reverse=True)
    for candidate in filter(None, candidates):
        if (
            _run([candidate, "-c", "import sys, venv; sys.exit(sys.version_info < (3, 12))"], timeout=60).returncode
            == 0
        ):
            return candidate
    return None


@pytest.fixture(scope="session")
def agentskills_tools_cli() -> list[str]:
    python = _python312()
    if python is None:
        pytest.skip("agentskills-tools needs Python >= 3.12 and none was found (set SLIME_SKILL_PYTHON312)")
    probe = f"import importlib.metadata as m; assert m.version('agentskills-tools') == '{AGENTSKILLS_TOOLS}'"
    venv_python = _venv_with(REPO / ".venv-agentskills", python, f"agentskills-tools=={AGENTSKILLS_TOOLS}", probe)
    return [str(venv_python.parent / "agentskills")]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The skill as `slime-check skill install` lays it out: a folder named after the skill."""
    home = tmp_path_factory.mktemp("hermes-home")
    result = _run(["slime-check", "skill", "install", "--hermes-home", home], timeout=300)
    assert result.returncode == 0, result.stderr
    return home / "skills" / "mlops" / SKILL_NAME


def frontmatter_text() -> str:
    text = (REPO / "SKILL.md").read_text(encoding="utf-8")
    return re.match(r"^---\n(.*?)\n---\n", text, re.DOTALL).group(1)


def test_frontmatter_is_the_shape_every_validator_accepts():
    text = frontmatter_text()
    meta = yaml.safe_load(text)
    assert set(meta) <= SPEC_KEYS, f"top-level keys beyond the agentskills.io spec: {sorted(set(meta) - SPEC_KEYS)}"
    assert meta["name"] == SKILL_NAME and meta["license"]
    # strictyaml (skills-ref) refuses flow style: no [a, b] or {a: b} anywhere
    assert not re.search(r":\s*[\[{]", text), "flow-style list or map in the frontmatter"
    assert re.fullmatch(r"\d+\.\d+\.\d+", meta["metadata"]["version"]) and meta["metadata"]["author"]
    # agentskills-tools and skills-ref disagree on the type of `compatibility`: it must not be there
    assert "compatibility" not in meta and "platforms" not in meta
    # the spec's metadata maps strings to strings; agentskills-tools' native manifest refuses anything else
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta["metadata"].items()), meta["metadata"]


def test_skills_ref_validates_the_installed_skill(skills_ref_cli, installed):
    result = _run([*skills_ref_cli, "validate", installed], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Valid skill" in result.stdout
    props = _run([*skills_ref_cli, "read-properties", installed], timeout=120)
    assert props.returncode == 0 and f'"name": "{SKILL_NAME}"' in props.stdout, props.stdout + props.stderr
    # skills-ref's loader keeps metadata as str(value): it must come back exactly as written
    assert json.loads(props.stdout)["metadata"] == yaml.safe_load(frontmatter_text())["metadata"]


def test_agentskills_tools_validates_and_lints_the_installed_skill(agentskills_tools_cli, installed):
    validate = _run([*agentskills_tools_cli, "validate", installed], timeout=120)
    assert validate.returncode == 0 and "0 errors" in validate.stdout, validate.stdout + validate.stderr
    lint = _run([*agentskills_tools_cli, "lint", installed], timeout=120)
    assert lint.returncode == 0 and "0 errors" in lint.stdout, lint.stdout + lint.stderr
    # the only warnings: no top-level version or when_to_use, which skills-ref forbids
    warnings = set(re.findall(r"warning ([a-z-]+):", lint.stdout))
    assert warnings <= {"missing-version", "missing-selection-metadata"}, lint.stdout
    # the native MCP manifest (what `agentskills serve` publishes) takes only string-valued metadata
    native = _run([*agentskills_tools_cli, "inspect", "--native", installed], timeout=120)
    assert native.returncode == 0 and "native manifest" in native.stdout, native.stdout + native.stderr
