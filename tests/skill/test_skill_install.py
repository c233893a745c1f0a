"""`slime-check skill install/uninstall`: the Hermes layout, rewritten links, the manifest, and removal
of exactly what was installed."""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import subprocess
import sys

import pytest

from skill_docs import REPO, bundle_files, dead_links, markdown_links
from slime_check.skill_install import MANIFEST_NAME, SKILL_NAME, installed_path


def run(*args, env=None, cwd=None):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=600, env=env, cwd=cwd)


def install(home, *extra):
    result = run("slime-check", "skill", "install", "--hermes-home", str(home), *extra)
    assert result.returncode == 0, result.stderr
    return home / "skills" / "mlops" / SKILL_NAME


def installed_files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


@pytest.fixture
def installed(tmp_path):
    return install(tmp_path / "hermes")


def test_install_lays_the_bundle_out_the_hermes_way(installed):
    manifest = json.loads((installed / MANIFEST_NAME).read_text())
    expected = sorted(installed_path(rel) for rel in bundle_files() if installed_path(rel))
    assert sorted(manifest["files"]) == expected
    assert installed_files(installed) == sorted([*expected, MANIFEST_NAME])
    for needed in ("SKILL.md", "references/troubleshooting.md", "templates/run-qwen3-4B-grpo-8gpu.sh",
                   "scripts/slime_log_summary.py", "assets/checklists/prerequisites.md",
                   "assets/examples/arith_task/reward.py"):
        assert needed in expected, needed
    assert "README.md" not in expected  # skill/README.md describes the repository folder only


def test_non_markdown_files_are_copied_byte_for_byte(installed):
    for rel in bundle_files():
        if installed_path(rel) and not rel.endswith(".md"):
            assert (installed / installed_path(rel)).read_bytes() == (REPO / rel).read_bytes(), rel


@pytest.mark.parametrize("rel", [f for f in bundle_files() if f.endswith(".md") and installed_path(f)])
def test_links_resolve_in_the_installed_copy_to_the_same_files(installed, rel):
    target_rel = installed_path(rel)
    assert dead_links(installed, target_rel) == []
    repo_links = markdown_links((REPO / rel).read_text(encoding="utf-8"))
    new_links = markdown_links((installed / target_rel).read_text(encoding="utf-8"))
    assert len(repo_links) == len(new_links)
    for old, new in zip(repo_links, new_links):
        if re.match(r"^[a-z]+:", old) or old.startswith("#"):
            assert new == old
            continue
        old_path, _, old_anchor = old.partition("#")
        new_path, _, new_anchor = new.partition("#")
        repo_target = posixpath.normpath(posixpath.join(posixpath.dirname(rel), old_path))
        assert posixpath.normpath(posixpath.join(posixpath.dirname(target_rel), new_path)) == installed_path(
            repo_target
        )
        assert new_anchor == old_anchor


def test_skill_dir_paths_in_skill_md_exist_in_the_installed_copy(installed):
    text = (installed / "SKILL.md").read_text(encoding="utf-8")
    paths = re.findall(r"\$\{HERMES_SKILL_DIR\}/([\w./-]+)", text)
    assert paths
    for rel in paths:
        assert (installed / rel).exists(), rel


def test_reinstall_replaces_files_and_drops_ones_no_longer_shipped(installed, tmp_path):
    manifest_path = installed / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    stale = installed / "references" / "retired.md"
    stale.write_text("from an older bundle\n")
    manifest["files"]["references/retired.md"] = hashlib.sha256(stale.read_bytes()).hexdigest()
    manifest_path.write_text(json.dumps(manifest))
    again = install(tmp_path / "hermes")
    assert again == installed and not stale.exists()
    assert "references/retired.md" not in json.loads(manifest_path.read_text())["files"]


def test_changed_files_are_never_overwritten_or_removed_without_force(installed, tmp_path):
    home = tmp_path / "hermes"
    skill_md = installed / "SKILL.md"
    skill_md.write_text(skill_md.read_text() + "\nmy notes\n")
    refused = run("slime-check", "skill", "install", "--hermes-home", str(home))
    assert refused.returncode == 2 and "SKILL.md" in refused.stderr and "--force" in refused.stderr
    assert "Traceback" not in refused.stderr and "my notes" in skill_md.read_text()

    kept = run("slime-check", "skill", "uninstall", "--hermes-home", str(home))
    assert kept.returncode == 0 and "Kept" in kept.stderr
    assert installed_files(installed) == ["SKILL.md"]
    # the kept file is no longer under slime-check's care: a plain install now refuses the folder
    again = run("slime-check", "skill", "install", "--hermes-home", str(home))
    assert again.returncode == 2 and "not installed by slime-check" in again.stderr


def test_force_overwrites_changed_files(installed, tmp_path):
    (installed / "SKILL.md").write_text("changed\n")
    install(tmp_path / "hermes", "--force")
    assert (installed / "SKILL.md").read_bytes() != b"changed\n"


def test_uninstall_removes_exactly_what_install_wrote(installed, tmp_path):
    home = tmp_path / "hermes"
    mine = installed / "references" / "my-notes.md"
    mine.write_text("mine\n")
    other_skill = home / "skills" / "mlops" / "other" / "SKILL.md"
    other_skill.parent.mkdir(parents=True)
    other_skill.write_text("---\nname: other\ndescription: x\n---\nbody\n")
    result = run("slime-check", "skill", "uninstall", "--hermes-home", str(home))
    assert result.returncode == 0, result.stderr
    assert installed_files(installed) == ["references/my-notes.md"]
    assert other_skill.exists()
    mine.unlink()
    install(home)
    assert run("slime-check", "skill", "uninstall", "--hermes-home", str(home)).returncode == 0
    assert not installed.exists() and other_skill.exists()


def test_install_refuses_a_folder_it_did_not_create(tmp_path):
    home = tmp_path / "hermes"
    foreign = home / "skills" / "mlops" / SKILL_NAME
    foreign.mkdir(parents=True)
    (foreign / "SKILL.md").write_text("someone else's\n")
    result = run("slime-check", "skill", "install", "--hermes-home", str(home))
    assert result.returncode == 2 and "not installed by slime-check" in result.stderr
    assert (foreign / "SKILL.md").read_text() == "someone else's\n"


def test_one_copy_only_across_categories(installed, tmp_path):
    result = run("slime-check", "skill", "install", "--hermes-home", str(tmp_path / "hermes"), "--category", "training")
    assert result.returncode == 2 and "already installed" in result.stderr
    missing = run(
        "slime-check", "skill", "uninstall", "--hermes-home", str(tmp_path / "hermes"), "--category", "training"
    )
    assert missing.returncode == 2 and "category mlops" in missing.stderr


@pytest.mark.parametrize("category", ["ML Ops", "../escape", ""])
def test_bad_category_is_one_line_exit_2(tmp_path, category):
    result = run("slime-check", "skill", "install", "--hermes-home", str(tmp_path), "--category", category)
    assert result.returncode == 2 and "--category" in result.stderr and "Traceback" not in result.stderr


def test_hermes_home_defaults_to_the_environment(tmp_path):
    env = {**os.environ, "HERMES_HOME": str(tmp_path / "from-env")}
    result = run("slime-check", "skill", "install", env=env)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "from-env" / "skills" / "mlops" / SKILL_NAME / "SKILL.md").is_file()


def test_a_wheel_install_ships_and_installs_the_same_bundle(installed, tmp_path):
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(REPO)]
    if _has_setuptools():
        build.insert(5, "--no-build-isolation")  # offline and fast; otherwise pip fetches setuptools
    built = run(*build)
    assert built.returncode == 0, built.stderr
    wheel = next(wheels.glob("slime_skill-*.whl"))
    assert (
        run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)).returncode
        == 0
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = run(sys.executable, "-c", "import slime_check; print(slime_check.__file__)", env=env, cwd=tmp_path)
    assert where.stdout.startswith(str(target)), where.stdout + where.stderr
    home = tmp_path / "hermes-from-wheel"
    result = run(
        sys.executable, "-m", "slime_rehearse.cli", "skill", "install", "--hermes-home", str(home), env=env,
        cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    from_wheel = json.loads((home / "skills" / "mlops" / SKILL_NAME / MANIFEST_NAME).read_text())["files"]
    from_repo = json.loads((installed / MANIFEST_NAME).read_text())["files"]
    assert from_wheel == from_repo


def _has_setuptools() -> bool:
    """setuptools new enough for pyproject.toml's build-system (>= 77) is already in this environment."""
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 77
