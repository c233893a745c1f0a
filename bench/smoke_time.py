"""Time `slime-check smoke` on slime-ref, per job shape, as a user runs it. Prints one JSON object.

Shapes (launch scripts in slime's shape; the embedded tiny assets are built first, not timed):

  plain             examples/run-tiny-grpo.sh: the quick start's GRPO script (target 90 s)
  dynamic_filter    tests/fixtures/smoke_jobs/run-agent-dapo.sh: slime's nonzero-std filter with
                    over-sampling, a tool-use generate, a reward that wants <answer> tags
  multi_turn_tools  the same with --responses scripting a tool call (its tool branch runs)
  rollout_function  tests/fixtures/smoke/run-rollout-fn.sh: a --rollout-function-path rollout
  ppo_critic        tests/fixtures/smoke_jobs/run-ppo.sh: the quick start's script with a critic

Each runs alone, one after another (run nothing else on the machine meanwhile). For each: the wall
seconds of the whole command, the seconds per phase it reports (checks, assets, run, and inside the
run: setup, rollout, train, update_weights, save, eval), its exit status and FAIL ids. Target: every
verdict within 180 s on 2 CPU cores.

    PYTHONPATH=reference_impl python bench/smoke_time.py                     # all shapes
    PYTHONPATH=reference_impl python bench/smoke_time.py --shapes plain --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOBS = REPO / "tests" / "fixtures" / "smoke_jobs"
TARGET_S = {"plain": 90}
DEFAULT_TARGET_S = 180


def shapes(tiny, work: Path) -> dict[str, list[str]]:
    """Each shape's smoke arguments (the script and what it reads from the environment)."""
    quick = ["--env", f"TINY={tiny.root}", "--env", f"OUT={work / 'user'}", "--env", f"WARM={tiny.model_dir}"]
    agent = [str(JOBS / "run-agent-dapo.sh"), "--env", f"TINY={tiny.root}"]
    return {
        "plain": [str(REPO / "examples" / "run-tiny-grpo.sh"), *quick],
        "dynamic_filter": agent,
        "multi_turn_tools": [*agent, "--responses", str(JOBS / "tool-responses.jsonl")],
        "rollout_function": [str(REPO / "tests" / "fixtures" / "smoke" / "run-rollout-fn.sh"),
                             "--env", f"TINY={tiny.root}"],
        "ppo_critic": [str(JOBS / "run-ppo.sh"), *quick],
    }


def run_once(args: list[str], out: Path, rollouts: int) -> dict:
    env = {**os.environ, "COLUMNS": "200",
           "PYTHONPATH": os.pathsep.join([str(REPO / "reference_impl"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-c", "from slime_rehearse.cli import main; main()", "smoke", *args, "--out", str(out),
           "--json", "--rollouts", str(rollouts)]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out.parent)
    wall = time.perf_counter() - start
    report = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    run = report.get("run", {})
    return {"returncode": done.returncode, "wall_s": round(wall, 1),
            "phase_s": {k: round(v, 1) for k, v in run.get("phase_s", {}).items()},
            "stand_in": run.get("stand_in"), "filter": run.get("filter"),
            "fails": [f["id"] for f in report.get("findings", []) if f["status"] == "FAIL"],
            "stderr_tail": done.stderr[-600:] if done.returncode not in (0, 1) else ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--shapes", nargs="+", default=None, metavar="SHAPE",
                        help="Which shapes (default: all): plain, dynamic_filter, multi_turn_tools, "
                             "rollout_function, ppo_critic.")
    parser.add_argument("--repeats", type=int, default=1, help="Runs per shape (the median is reported).")
    parser.add_argument("--rollouts", type=int, default=2, help="smoke --rollouts.")
    parser.add_argument("--keep", type=Path, default=None, help="Work here and keep it (default: a temp dir).")
    opts = parser.parse_args()
    root = opts.keep or Path(tempfile.mkdtemp(prefix="smb-", dir="/tmp"))  # short: Ray's socket paths
    try:
        from slime_ref.assets import make_tiny

        tiny = make_tiny(root / "tiny")
        table = shapes(tiny, root)
        unknown = sorted(set(opts.shapes or []) - set(table))
        if unknown:
            parser.error(f"--shapes: unknown {', '.join(unknown)} (known: {', '.join(table)})")
        results = {}
        for name in opts.shapes or list(table):
            runs = []
            for k in range(opts.repeats):
                print(f"{name}: run {k + 1} of {opts.repeats} ...", file=sys.stderr, flush=True)
                out = root / f"{name}-{k}"
                runs.append(run_once(table[name], out, opts.rollouts))
                shutil.rmtree(out, ignore_errors=True)
            walls = [r["wall_s"] for r in runs]
            results[name] = {"wall_s_median": statistics.median(walls), "wall_s": walls,
                             "target_s": TARGET_S.get(name, DEFAULT_TARGET_S), "runs": runs}
        print(json.dumps({"cpu_cores": os.cpu_count(), "rollouts": opts.rollouts, "shapes": results}, indent=2))
    finally:
        if opts.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
