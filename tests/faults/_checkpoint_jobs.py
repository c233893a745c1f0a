"""Training jobs for the checkpoint fault tests, run as ``python _checkpoint_jobs.py JOB ...``.

Each job trains the tiny model on two spawned ranks (gloo on 127.0.0.1, as in
``tests/megatron_workers.py``) and prints one JSON line with rank 0's result. A save or load
that fails with a UserError is reported in the result (``error``), as the CLI would print it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: megatron_workers

from megatron_workers import make_args, run_workers, synthetic_batch

ARGV = ["--global-batch-size", "4", "--micro-batch-size", "1", "--lr", "1e-3",
        "--attention-dropout", "0", "--hidden-dropout", "0"]


def train_and_save_worker(rank, world, port, model_dir, save, rollouts, load=None):
    """Train ``rollouts`` rollouts from wherever --load resumes, saving after each; stop at the first
    save that fails."""
    from slime_ref.backends.megatron.actor import MegatronActor
    from slime_ref.errors import UserError

    argv = [*ARGV, "--hf-checkpoint", model_dir, "--save", save, *(["--load", load] if load else [])]
    started = time.monotonic()
    try:
        actor = MegatronActor(make_args(argv), rank=rank, world_size=world, master_port=port)
    except UserError as e:
        return {"error": str(e), "phase": "load", "error_after_s": time.monotonic() - started}
    out = {"start": actor.start_rollout_id, "data_state": actor.data_state, "saved": [], "losses": {}, "error": None}
    for rollout_id in range(actor.start_rollout_id, actor.start_rollout_id + rollouts):
        metrics = actor.train(rollout_id, synthetic_batch(8, seed=rollout_id))
        out["losses"][rollout_id] = [m["train/loss"] for m in metrics]
        started = time.monotonic()
        try:
            actor.save(rollout_id, data_state={"next_offset": rollout_id + 1})
        except UserError as e:
            out.update(error=str(e), phase="save", failed_at=rollout_id, error_after_s=time.monotonic() - started)
            break
        out["saved"].append(rollout_id)
        out.setdefault("save_s", []).append(time.monotonic() - started)
    return out


def load_worker(rank, world, port, model_dir, dirs):
    """Load each checkpoint directory in turn into one actor; the error each raised (None if it loaded)."""
    from slime_ref.backends.megatron import checkpoint as ckpt
    from slime_ref.backends.megatron.actor import MegatronActor
    from slime_ref.backends.megatron.hf_weights import unwrap
    from slime_ref.errors import UserError

    actor = MegatronActor(make_args([*ARGV, "--hf-checkpoint", model_dir]), rank=rank, world_size=world,
                          master_port=port)
    errors = {}
    for path in dirs:
        try:
            ckpt.load_checkpoint(Path(path), unwrap(actor.model), actor.optimizer, actor.scheduler,
                                 flag=f"--load {Path(path).parent}")
            errors[path] = None
        except UserError as e:
            errors[path] = str(e)
    return {"errors": errors}


def main(job: str, spec: str) -> None:
    """``job`` is "save" (kwargs of train_and_save_worker) or "load" (of load_worker), ``spec`` JSON."""
    worker = {"save": train_and_save_worker, "load": load_worker}[job]
    results = run_workers(worker, 2, timeout=300, **json.loads(spec))
    # every rank must end the same way: the same rollouts saved, or the same error (timings aside)
    untimed = [{k: v for k, v in r.items() if not k.endswith("_s")} for r in results]
    agree = all(u == untimed[0] for u in untimed)
    print(json.dumps({**results[0], "ranks_agree": agree}, default=str))


if __name__ == "__main__":
    main(*sys.argv[1:])
