"""How long `slime-check prereqs` takes on this machine (target: under 2 s, end to end).

Runs the installed command several times as a user would (a fresh process each time, JSON output)
and prints one JSON object: wall-clock seconds per run, the median and the worst, and whether the
worst run met the target. Also times the checks alone, in-process, to show where the time goes.

    python bench/slime_check_prereqs.py [--runs 5] [--slime-dir ~/slime] [--output FILE]

With --slime-dir the runs identify that checkout (git describe, commit, local changes) and head the
report with it, as a user's `slime-check prereqs --slime-dir` does.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_S = 2.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--slime-dir", default=None, help="a slime checkout, passed to prereqs as --slime-dir")
    parser.add_argument("--output", default=None, help="also write the JSON here")
    args = parser.parse_args()
    command = ["slime-check", "prereqs", "--json"] + (["--slime-dir", args.slime_dir] if args.slime_dir else [])

    walls, status = [], None
    for _ in range(args.runs):
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        walls.append(time.perf_counter() - start)
        status = done.returncode
        report = json.loads(done.stdout)
        summary = report["summary"]

    from slime_check.prereqs import run_prereqs
    from slime_check.probes import LiveProbe

    start = time.perf_counter()
    run_prereqs(LiveProbe())
    checks_only = time.perf_counter() - start

    result = {
        "bench": "slime_check_prereqs",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {platform.system()}, python {platform.python_version()}, "
                   f"{os.cpu_count()} cores",
        "command": " ".join(command),
        "slime": (report.get("slime") or {}).get("label"),
        "runs": args.runs,
        "wall_s": [round(w, 3) for w in walls],
        "median_s": round(statistics.median(walls), 3),
        "max_s": round(max(walls), 3),
        "checks_in_process_s": round(checks_only, 3),
        "exit_status": status,
        "summary": summary,
        "target_s": TARGET_S,
        "meets_target": max(walls) < TARGET_S,
    }
    text = json.dumps(result)
    print(text)
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
