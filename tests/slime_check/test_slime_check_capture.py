"""slime-check capture writes this machine in the capture format; prereqs reads it back."""

from __future__ import annotations

import json
import os
import subprocess

from slime_check.prereqs import run_prereqs
from slime_check.probes import SECTIONS, CaptureProbe, LiveProbe, parse_capture


def test_capture_round_trip(tmp_path):
    out = tmp_path / "capture.txt"
    env = {**os.environ, "SLIME_CHECK_TEST_API_KEY": "hunter2", "NCCL_DEBUG": "INFO"}
    r = subprocess.run(
        ["slime-check", "capture", "--out", str(out)], capture_output=True, text=True, timeout=300, env=env
    )
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    sections = parse_capture(text)
    assert list(sections) == list(SECTIONS)  # every section, in order, each closed by its rc line
    assert "hunter2" not in text and "SLIME_CHECK_TEST_API_KEY=<redacted>" in text
    assert "NCCL_DEBUG=INFO" in sections["env (filtered)"].text

    fixture = subprocess.run(
        ["slime-check", "prereqs", "--fixture", str(out), "--json"], capture_output=True, text=True, timeout=120
    )
    assert fixture.returncode in (0, 1) and "Traceback" not in fixture.stderr
    report = json.loads(fixture.stdout)
    # the command heads its report with the slime it judges (slime.version); the checks come after
    assert report["findings"][0]["id"] == "slime.version" and "slime" in report
    from_capture = {f["id"]: f for f in report["findings"] if f["id"] != "slime.version"}
    live = {f.id: f for f in run_prereqs(LiveProbe())}
    assert set(from_capture) == set(live)
    # What does not change between the capture and now reads the same both ways.
    for check in ("gpu.driver", "container.runtime", "container.shm", "container.memlock", "container.stack",
                  "packages.python", "packages.torch", "packages.megatron", "packages.numpy", "system.host_ip"):
        assert from_capture[check]["status"] == live[check].status.value, check
        assert from_capture[check]["finding"] == live[check].finding, check
    assert {f.id for f in run_prereqs(CaptureProbe(out))} == set(live)
