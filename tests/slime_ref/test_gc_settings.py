"""The garbage-collector setting of the process that reads rollouts (slime_ref.utils.gc_settings).
Its effect on a round's seconds is measured by bench/rollout_http.py --rollout-imports --freeze-gc;
here, what it does to the collector. It runs in a child process: freezing pytest's own would leak
into every later test."""

from __future__ import annotations

import json
import subprocess
import sys

from slime_ref.arguments import parse_args

CHILD = r"""
import gc, json, weakref
import slime_ref.ray.rollout_manager  # what the rollout manager's process holds, in part
from slime_ref.utils.gc_settings import FULL_COLLECTION_EVERY, freeze_after_setup

class Node:
    pass

before_threshold = gc.get_threshold()
kept = Node()                      # alive through the set-up: frozen, still freed by its reference count
kept_ref = weakref.ref(kept)
tracked_before = len(gc.get_objects())
frozen = freeze_after_setup()
tracked_after = len(gc.get_objects())
del kept
freed_by_refcount = kept_ref() is None
a, b = Node(), Node()              # a cycle made after the set-up: only the collector can free it
a.other, b.other = b, a
cycle_ref = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({"before_threshold": before_threshold, "threshold": gc.get_threshold(),
                  "full_every": FULL_COLLECTION_EVERY, "tracked_before": tracked_before,
                  "tracked_after": tracked_after, "frozen": frozen, "freeze_count": gc.get_freeze_count(),
                  "freed_by_refcount": freed_by_refcount, "cycle_collected": cycle_ref() is None}))
"""


def test_setup_objects_leave_the_collectors_walks_and_garbage_is_still_freed():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    # everything the set-up made is out of the generations the collector walks
    assert r["tracked_before"] > 10_000 and r["tracked_after"] < 100
    assert r["frozen"] >= 0.9 * r["tracked_before"]  # all but the garbage its first collection freed
    assert r["freeze_count"] < r["frozen"]  # the frozen object deleted afterwards went at once
    # full collections a tenth as often; the young and middle generations as Python sets them
    assert r["threshold"] == [*r["before_threshold"][:2], r["full_every"]] and r["full_every"] == 100
    assert r["before_threshold"][2] == 10
    # nothing is kept for good: reference counting frees frozen objects, the collector later cycles
    assert r["freed_by_refcount"] and r["cycle_collected"]


def test_the_rollout_manager_applies_it_once_set_up(tiny, tmp_path, monkeypatch):
    from slime_ref.ray.rollout_manager import RolloutManager
    from slime_ref.utils import gc_settings

    calls = []
    monkeypatch.setattr(gc_settings, "freeze_after_setup", lambda: calls.append("frozen") or 0)
    args = parse_args(["--hf-checkpoint", str(tiny.model_dir), "--prompt-data", str(tiny.train_path),
                       "--input-key", "prompt", "--label-key", "label", "--rollout-batch-size", "2",
                       "--n-samples-per-prompt", "2", "--global-batch-size", "4", "--num-rollout", "1",
                       "--debug-train-only", "--output-dir", str(tmp_path)])
    manager = RolloutManager(args, placement=None)
    assert manager.start() > 0 and calls == ["frozen"]
