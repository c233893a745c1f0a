"""Both console scripts are installed, teach with --help, and report bad input with exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def run(*args, **kw):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=300, **kw)


@pytest.mark.parametrize("prog", ["slime-check", "slime-ref"])
def test_help(prog):
    r = run(prog, "--help")
    assert r.returncode == 0, r.stderr
    assert prog in r.stdout and "Usage:" in r.stdout


@pytest.mark.parametrize("prog", ["slime-check", "slime-ref"])
def test_version(prog):
    r = run(prog, "--version")
    assert r.returncode == 0 and "0.1.0" in r.stdout


@pytest.mark.parametrize("prog", ["slime-check", "slime-ref"])
def test_unknown_command_exits_2_without_traceback(prog):
    r = run(prog, "no-such-command")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "no-such-command" in r.stderr


def test_make_tiny_prints_paths(tmp_path):
    out = tmp_path / "t"
    r = run("slime-ref", "make-tiny", "--out", str(out), env={**os.environ, "COLUMNS": "300"})
    assert r.returncode == 0, r.stderr
    assert str((out / "model").resolve()) in r.stdout.replace("\n", "")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["request"]["seed"] == 0


def test_make_tiny_bad_seed_exits_2(tmp_path):
    r = run("slime-ref", "make-tiny", "--out", str(tmp_path / "t"), "--seed", "abc")
    assert r.returncode == 2 and "--seed" in r.stderr and "Traceback" not in r.stderr


def test_module_entry_points():
    r = run(sys.executable, "-m", "slime_ref.cli", "--help")
    assert r.returncode == 0 and "make-tiny" in r.stdout

