"""bench/pysample: the stack sampler engine_throughput.py --host-profile puts into SGLang's server
processes, and the summary that reads its output, on a child process whose hot function is known."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"

CHILD = r"""
import os, sys, time
from pathlib import Path
out = Path(os.environ["SLIME_BENCH_PYSAMPLE_DIR"])

def spin_here(seconds):
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += sum(range(200))
    return x

(out / "on").touch()
spin_here(0.5)
(out / "on").unlink()
deadline = time.monotonic() + 30
while not (out / f"{os.getpid()}.folded").exists() and time.monotonic() < deadline:
    time.sleep(0.01)
"""


def test_the_sampler_finds_the_function_a_process_spends_its_time_in(tmp_path):
    sys.path.insert(0, str(BENCH))
    from engine_throughput import host_profile_summary

    env = {**os.environ, "SLIME_BENCH_PYSAMPLE_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(BENCH / "pysample"), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", CHILD], env=env, check=True, timeout=60)
    folded = list(tmp_path.glob("*.folded"))
    assert len(folded) == 1 and not list(tmp_path.glob("*.active"))
    summary = host_profile_summary(tmp_path, wait_s=1)
    assert summary["main_thread_samples"] > 20
    assert list(summary["samples_by_thread"]) == ["MainThread"]
    assert summary["main_thread_inclusive_share"]["<string>:spin_here"] > 0.9
    assert "pysample" not in folded[0].read_text()  # the sampler does not sample itself


def test_without_the_variable_nothing_is_sampled(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(BENCH / "pysample")}
    env.pop("SLIME_BENCH_PYSAMPLE_DIR", None)
    out = subprocess.run([sys.executable, "-c", "import threading; print(len(threading.enumerate()))"],
                         env=env, check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "1"
