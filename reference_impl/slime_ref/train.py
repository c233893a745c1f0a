"""``slime-ref train``: the synchronous RL loop, slime's ``train.py`` at reference size.

    placement  = one placement group (trainer bundles, then engine bundles; shared with --colocate)
    rollout    = RolloutManager: data source, engines, sglang-router          (slime_ref/ray/rollout_manager.py)
    actor      = TrainGroup: one MegatronActor per rank                        (slime_ref/ray/train_actor.py)
    critic     = --advantage-estimator ppo: a second TrainGroup on the actor's bundles, value head

    actor.update_weights()                    # engines start from the trainer's weights
    for rollout_id in range(start, num_rollout):
        maybe eval (before training)
        data = rollout.generate(rollout_id)   # prompts -> engines via router -> rewards -> group-normalised
        values = critic.train(rollout_id, data)   # ppo: values, GAE returns, value-loss steps
        actor.train(rollout_id, data, values) # ref/old log-probs, advantages, optimizer steps
                                              # (not during the first --num-critic-only-steps rollouts)
        maybe save (actor [+ critic] + optimizer + RNG + data-source position, atomically)
        actor.update_weights()                # pause engines, flush cache, push weights, continue
        maybe eval
"""

from __future__ import annotations

import logging
import time

import ray

from slime_ref.run import Run, should_run_periodic_action

logger = logging.getLogger(__name__)


def train(args, progress=None) -> dict:
    """Run training to ``--num-rollout``; returns the run summary (also written to the run dir).

    ``progress``: an optional callable receiving phase events (see :mod:`slime_ref.console`)."""
    with Run(args, progress=progress) as run:
        run.update_weights(rollout_id=-1)
        if args.num_rollout == 0 and args.eval_interval is not None:
            run.eval(rollout_id=0)

        for rollout_id in range(run.start_rollout_id, args.num_rollout):
            if args.eval_interval is not None and rollout_id == 0 and not args.skip_eval_before_train:
                run.eval(rollout_id)

            phase = time.perf_counter()
            data_ref, metrics_ref = run.rollout.generate.remote(rollout_id)
            metrics = ray.get(metrics_ref)
            metrics["perf/rollout_time"] = time.perf_counter() - phase  # wall time, Ray hops included
            run.offload_rollout()

            run.onload_train()
            metrics.update(run.train(rollout_id, data_ref))

            if should_run_periodic_action(rollout_id, args.save_interval, run.num_rollout_per_epoch,
                                          args.num_rollout):
                metrics.update(run.save(rollout_id))

            run.offload_train()
            run.onload_rollout()
            metrics.update(run.update_weights(rollout_id))
            run.log(metrics, rollout_id)

            if should_run_periodic_action(rollout_id, args.eval_interval, run.num_rollout_per_epoch):
                run.eval(rollout_id)
        return run.summary()
