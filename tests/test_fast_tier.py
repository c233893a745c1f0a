"""The fast tier (`pytest -m fast`) stays what README says: no process, no server, no Ray."""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import FAST_MODULES, NOT_FAST, _Guard

TESTS = Path(__file__).resolve().parent


def test_the_guard_refuses_a_process_and_a_listening_socket_then_restores_them():
    with _Guard(), pytest.raises(AssertionError, match="fast-tier test"):
        subprocess.run(["true"], check=False)
    with _Guard(), socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        with pytest.raises(AssertionError, match="NOT_FAST"):
            s.listen()
    assert subprocess.run(["true"], check=False).returncode == 0  # restored after the block


def test_every_listed_module_and_exception_exists():
    assert sorted(m for m in FAST_MODULES if not (TESTS / m).is_file()) == []
    for nodeid in NOT_FAST:
        path, _, name = nodeid.partition("::")
        module = Path(path).relative_to("tests").as_posix()
        assert module in FAST_MODULES, nodeid
        function = re.sub(r"\[.*\]$", "", name)
        assert re.search(rf"^def {re.escape(function)}\(", (TESTS / module).read_text(), re.M), nodeid


def test_this_module_is_not_in_the_fast_tier_it_runs_processes():
    assert Path(__file__).name not in FAST_MODULES
