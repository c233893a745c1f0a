"""The Megatron actor names the parts of a training step (``actor.phase``, a torch.profiler scope),
so a profile shows them and a benchmark can time them without patching the actor."""

from __future__ import annotations

import pytest

from megatron_workers import phases_worker, run_workers


@pytest.fixture(scope="module")
def phases(tiny):
    return run_workers(phases_worker, 1, model_dir=str(tiny.model_dir))[0]


def test_every_part_of_a_policy_step_runs_in_a_named_phase(phases):
    seen, _ = phases
    assert set(seen) == {"pack", "log_probs", "advantages", "forward", "loss", "metrics", "optimizer", "scheduler"}
    # one on-policy step reuses its training forward for the old log-probs: one pass of 2 micro-batches
    assert seen.count("forward") == seen.count("log_probs") == seen.count("loss") == 2


def test_the_phases_are_profiler_scopes(phases):
    seen, profiled = phases
    assert profiled == sorted(f"slime_ref/{name}" for name in set(seen))
