"""Time `slime-check smoke` on the quick start's launch script (examples/run-tiny-grpo.sh) on slime-ref.

Builds the embedded tiny assets in a temporary folder (not timed), then runs the smoke command as a
user would and prints one JSON object: wall seconds of the whole command, the seconds per phase it
reports, its exit status and the machine's core count. Target: under 2 minutes on 2 CPU cores.

    PYTHONPATH=reference_impl python bench/smoke_time.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, default=None, help="Work here and keep it (default: a temp dir).")
    parser.add_argument("--rollouts", type=int, default=2)
    opts = parser.parse_args()
    root = opts.keep or Path(tempfile.mkdtemp(prefix="smb-", dir="/tmp"))
    try:
        from slime_ref.assets import make_tiny

        tiny = make_tiny(root / "tiny")
        env = {**os.environ, "COLUMNS": "200",
               "PYTHONPATH": os.pathsep.join([str(REPO / "reference_impl"), os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, "-c", "from slime_check.cli import main; main()", "smoke",
               str(REPO / "examples" / "run-tiny-grpo.sh"), "--out", str(root / "smoke"), "--json",
               "--rollouts", str(opts.rollouts), "--env", f"TINY={tiny.root}", "--env", f"OUT={root / 'user'}",
               "--env", f"WARM={tiny.model_dir}"]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
        wall = time.perf_counter() - start
        report = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
        run = report.get("run", {})
        print(json.dumps({
            "script": "examples/run-tiny-grpo.sh", "cpu_cores": os.cpu_count(), "rollouts": opts.rollouts,
            "returncode": done.returncode, "wall_s": round(wall, 1), "target_s": 120,
            "phase_s": {k: round(v, 1) for k, v in run.get("phase_s", {}).items()},
            "peak_rss_gib": round(run.get("peak_rss_gib", 0.0), 2),
            "summary": report.get("summary"),
            "fails": [f["id"] + ": " + f["finding"][:160] for f in report.get("findings", []) if f["status"] == "FAIL"],
            "stderr_tail": done.stderr[-800:] if done.returncode not in (0, 1) else "",
        }, indent=2))
    finally:
        if opts.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
