"""Which slime a job runs: the --slime-dir checkout, the importable package, the image; and the
known slime (v0.3.1 or main@624b824) each is judged as. Repositories are built in tmp_path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slime_check import slime_identity
from slime_check.findings import Status
from slime_check.slime_identity import MAIN, V031, identify, image_source, read_checkout

MAIN_SOURCES = Path(__file__).parents[1] / "fixtures" / "slime_sources" / "main-624b824"  # slime 624b824's files

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def slime_repo(path: Path, tag: str | None = "v0.3.1", version: str = "0.3.1") -> Path:
    """A slime-shaped git repository with one commit, tagged ``tag``."""
    (path / "slime").mkdir(parents=True)
    (path / "slime" / "__init__.py").write_text("")
    (path / "setup.py").write_text(f'from setuptools import setup\nsetup(name="slime", version="{version}")\n')
    git(path, "init", "-q")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "slime")
    if tag:
        git(path, "tag", tag)
    return path


def commit_more(path: Path) -> None:
    (path / "slime" / "later.py").write_text("x = 1\n")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "later")


@pytest.fixture
def no_importable(monkeypatch):
    """This interpreter's own slime (if any) stays out of the test."""
    monkeypatch.setattr(slime_identity, "importable_slime", lambda: None)


def test_v031_tag_is_judged_as_v031(tmp_path, no_importable):
    repo = slime_repo(tmp_path / "slime")
    ident = identify(repo, {})
    assert ident.target == V031 and ident.identified
    src = ident.sources[0]
    assert src.describe == "v0.3.1" and src.dirty is False and len(src.commit) == 40
    assert ident.label.startswith("slime v0.3.1 (") and "clean" in ident.label and str(repo) in ident.label
    (finding,) = ident.findings()
    assert finding.status is Status.PASS and "v0.3.1" in finding.finding


def test_a_commit_past_v031_is_judged_as_main(tmp_path, no_importable):
    repo = slime_repo(tmp_path / "slime")
    commit_more(repo)
    ident = identify(repo, {})
    assert ident.target == MAIN
    assert ident.sources[0].describe.startswith("v0.3.1-1-g")
    assert "newer than v0.3.1" in ident.sources[0].relation and ident.label.startswith(f"slime {MAIN} (")


def test_local_changes_are_reported(tmp_path, no_importable):
    repo = slime_repo(tmp_path / "slime")
    (repo / "slime" / "__init__.py").write_text("# edited\n")
    ident = identify(repo, {})
    assert ident.target == V031 and ident.sources[0].dirty is True
    assert "local changes" in ident.label and "local changes" in ident.findings()[0].finding


def test_older_and_newer_tags(tmp_path, no_importable):
    assert identify(slime_repo(tmp_path / "old", "v0.2.4"), {}).target == V031
    assert "older than v0.3.1" in identify(tmp_path / "old", {}).sources[0].relation
    newer = identify(slime_repo(tmp_path / "new", "v0.4.0"), {})
    assert newer.target == MAIN and f"judged as {MAIN}" in newer.sources[0].relation


def test_nothing_identifies_the_slime(no_importable):
    ident = identify(None, {})
    assert ident.target == MAIN and not ident.identified and ident.sources == []
    (finding,) = ident.findings()
    assert finding.status is Status.WARN and "Nothing identifies your slime" in finding.finding
    assert MAIN in finding.finding and "--slime-dir" in finding.fix


def test_a_tree_without_git_by_its_layout(tmp_path, no_importable):
    main_tree = tmp_path / "main"
    shutil.copytree(MAIN_SOURCES / "slime", main_tree / "slime")
    (main_tree / "slime" / "observability").mkdir()  # #2298's folder: main's layout
    ident = identify(main_tree, {})
    assert ident.target == MAIN and "observability" in ident.sources[0].relation
    old_tree = tmp_path / "old"
    (old_tree / "slime").mkdir(parents=True)
    (old_tree / "setup.py").write_text('setup(name="slime", version="0.3.1")\n')
    assert identify(old_tree, {}).target == V031
    bare = tmp_path / "bare"
    bare.mkdir()
    assert not identify(bare, {}).identified  # no git, no version, no layout: nothing to go on


def test_image_against_checkout_is_a_finding(tmp_path, no_importable):
    repo = slime_repo(tmp_path / "slime")
    ident = identify(repo, {"SLIME_IMAGE": "slimerl/slime:latest"})
    assert ident.target == V031  # the checkout decides
    mismatch = [f for f in ident.findings() if f.id == "slime.version_mismatch"]
    assert len(mismatch) == 1 and mismatch[0].status is Status.WARN
    assert "slimerl/slime:latest" in mismatch[0].finding and str(repo) in mismatch[0].finding
    assert "v0.3.1" in mismatch[0].finding and MAIN in mismatch[0].finding
    agree = identify(repo, {"SLIME_IMAGE": "slimerl/slime:v0.3.1"})
    assert not [f for f in agree.findings() if f.id == "slime.version_mismatch"]


def test_importable_slime_against_checkout_is_a_finding(tmp_path, monkeypatch):
    installed = slime_repo(tmp_path / "installed")
    commit_more(installed)
    monkeypatch.delitem(sys.modules, "slime", raising=False)
    monkeypatch.syspath_prepend(str(installed))
    checkout = slime_repo(tmp_path / "checkout")
    ident = identify(checkout, {})
    kinds = [s.kind for s in ident.sources]
    assert kinds == ["slime-dir", "importable"] and ident.target == V031
    (mismatch,) = [f for f in ident.findings() if f.id == "slime.version_mismatch"]
    assert str(installed) in mismatch.finding and MAIN in mismatch.finding
    # without --slime-dir the importable package decides
    assert identify(None, {}).target == MAIN
    assert "slime" not in sys.modules  # located, never imported


def test_slime_version_option_wins_and_a_source_against_it_is_reported(tmp_path, no_importable):
    repo = slime_repo(tmp_path / "slime")
    ident = identify(repo, {}, version="main")
    assert ident.target == MAIN and ident.decided_by.kind == "option"
    assert any(f.id == "slime.version_mismatch" for f in ident.findings())
    with pytest.raises(ValueError, match="--slime-version 0.9"):
        identify(None, {}, version="0.9")


def test_image_tags():
    assert image_source({"SLIME_IMAGE": "slimerl/slime:v0.3.1"}).target == V031
    assert image_source({"SLIME_IMAGE_TAG": "nightly-dev"}).target == MAIN
    unknown = image_source({"SLIME_IMAGE": "registry:5000/team/slime:prod"})
    assert unknown.target is None and "names no slime version" in unknown.relation
    assert image_source({}) is None


def test_a_folder_inside_another_repository_is_not_its_checkout(tmp_path):
    outer = slime_repo(tmp_path / "outer", "v0.4.0")
    inner = outer / "vendor" / "slime"
    (inner / "slime").mkdir(parents=True)
    src = read_checkout(inner, "slime-dir")
    assert src.commit is None and src.target is None  # the outer repo's tag says nothing about it


def run_cli(*args, **kw):
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("SLIME_IMAGE", None)
    return subprocess.run(["slime-check", *map(str, args)], capture_output=True, text=True, timeout=120, env=env,
                          **kw)


def test_prereqs_heads_with_the_slime_and_stays_fast(tmp_path):
    repo = slime_repo(tmp_path / "slime")
    t = time.perf_counter()
    r = run_cli("prereqs", "--slime-dir", repo, "--json", "--only", "system")
    elapsed = time.perf_counter() - t
    report = json.loads(r.stdout)
    assert report["slime"]["target"] == V031 and report["slime"]["sources"][0]["describe"] == "v0.3.1"
    assert report["findings"][0]["id"] == "slime.version"
    shown = run_cli("prereqs", "--slime-dir", repo, "--only", "system")
    assert shown.stdout.splitlines()[0].startswith("slime: slime v0.3.1 (")
    assert elapsed < 5  # the bench figure (bench/README) is the full prereqs under 2 s; CI machines vary
    bad = run_cli("config", "--slime-version", "v9", "--", "--num-rollout", "1")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--slime-version" in bad.stderr
