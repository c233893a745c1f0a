"""Running the GPU final-run scripts on a machine without a GPU: a python3 shim on PATH records what
each job would run, so tests read the order, the skips and the log."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def run_recorded(script: Path, tmp_path: Path, *jobs: str, out: Path | None = None, **env_vars: str):
    """``bash script jobs...`` with python3 recording its arguments; (process, calls, final_run.log)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "python3"
    shim.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "calls.txt"}\n')
    shim.chmod(0o755)
    if out is None:
        out = tmp_path / "out"
        out.mkdir(exist_ok=True)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "OUT": str(out), **env_vars}
    proc = subprocess.run(["bash", str(script), *jobs], capture_output=True, text=True, env=env, timeout=60)
    calls = (tmp_path / "calls.txt").read_text().splitlines() if (tmp_path / "calls.txt").exists() else []
    log = (out / "final_run.log").read_text() if (out / "final_run.log").exists() else ""
    return proc, calls, log
