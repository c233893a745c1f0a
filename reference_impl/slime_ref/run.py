"""What the training loops share: set-up and tear-down of a run, its phases, timing and logs.

:class:`Run` starts (or joins) Ray, reserves the placement group, creates the rollout manager (data
source, engines, router) and the training group, restores a checkpoint from ``--load``, and stops
everything it started on the way out -- normal exit, error or Ctrl-C. Each phase method times itself
into ``perf/*`` metrics; :meth:`Run.log` writes one record per rollout to ``--output-dir``.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from pathlib import Path

import ray

from slime_ref.errors import RunError, UserError
from slime_ref.utils import reaper
from slime_ref.utils.fileio import atomic_write_json
from slime_ref.utils.tracking import Tracker

logger = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"
TIMELINE_FILE = "timeline.jsonl"  # {"phase", "rollout_id", "start", "end"} a line: train, update_weights
PROCESSES_FILE = "processes.json"  # pid of each role: driver, rollout manager, train ranks, engines, router
# A fixed sequence scored by trainer and engines after each sync (--check-weight-update-equal).
PROBE_RESPONSE_LENGTH = 4


def should_run_periodic_action(rollout_id: int, interval: int | None, num_rollout_per_epoch: int | None = None,
                               num_rollout: int | None = None) -> bool:
    """slime's cadence: every ``interval`` rollouts, at epoch ends, and (with ``num_rollout``) at the last."""
    if interval is None:
        return False
    if num_rollout is not None and rollout_id == num_rollout - 1:
        return True
    step = rollout_id + 1
    return step % interval == 0 or (num_rollout_per_epoch is not None and step % num_rollout_per_epoch == 0)


def surely_builtin_engines(args) -> bool:
    """The run's engines are the built-in ones (decided without importing torch in the driver: with
    ``--rollout-engine auto`` and SGLang installed, they may be SGLang's)."""
    if args.rollout_engine != "auto":
        return args.rollout_engine == "builtin"
    import importlib.util

    return importlib.util.find_spec("sglang") is None


def _unwrap(error: BaseException) -> BaseException:
    """The user-facing cause of an error raised inside a Ray actor or task. An engine that failed to
    answer (retried as slime retries) is a RunError: its message names the engine and the route."""
    from slime_ref.rollout.sglang_client import EngineError

    cause = error
    while isinstance(cause, ray.exceptions.RayError) and getattr(cause, "cause", None) is not None:
        cause = cause.cause
    if isinstance(cause, EngineError):
        return RunError(f"an engine failed: {cause}")
    return cause


class Run:
    def __init__(self, args, progress=None):
        self.args = args
        self.progress = progress  # a callable(event: str, **info), e.g. the quick start's display
        self.phase_seconds: dict[str, float] = defaultdict(float)
        self.eval_history: list[tuple[int, dict]] = []
        self.started_ray = False
        self.reaper = None
        self.rollout = None
        self.actor = None
        self.critic = None  # --advantage-estimator ppo: the critic's TrainGroup, on the actor's bundles
        self.tracker = None
        self.weight_version = 0
        self.start_rollout_id = 0
        self.num_rollout_per_epoch = None
        self.wall_start = time.perf_counter()

    # -- set-up and tear-down -------------------------------------------------------------------

    def __enter__(self) -> Run:
        try:
            self._setup()
        except BaseException as e:
            self._teardown()
            cause = _unwrap(e)
            if cause is not e and isinstance(cause, (UserError, RunError)):
                raise cause from None
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._teardown()
        if exc is not None:
            cause = _unwrap(exc)
            if cause is not exc and isinstance(cause, (UserError, RunError)):
                raise cause from None

    def _setup(self) -> None:
        from slime_ref.data.source import resolve_num_rollout
        from slime_ref.preflight import preflight
        from slime_ref.ray.placement import create_placement, init_ray, placement_layout
        from slime_ref.ray.rollout_manager import RolloutManager
        from slime_ref.ray.train_actor import TrainGroup

        args = self.args
        preflight(args)  # paths it will write, prompt files it will read: found now, not after Ray starts
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "args.json").write_text(json.dumps({k: v for k, v in vars(args).items()
                                                   if _jsonable(v) and not k.startswith("_")},
                                                  indent=2, sort_keys=True, default=str))
        start = time.perf_counter()
        self._event("setup", detail="starting Ray")
        bundles, _ = placement_layout(args)
        self.started_ray = init_ray(min_cpus=bundles + 2, object_store_mb=args.ray_object_store_mb)
        if self.started_ray:  # if this process is killed outright, the reaper stops what it started
            self.reaper = reaper.start()
        placement = create_placement(args)

        self._event("setup", detail="starting engines and router" if args.rollout_num_gpus else "loading data")
        manager_cls = ray.remote(RolloutManager)
        self.rollout = manager_cls.options(num_cpus=0).remote(args, placement)
        rollout_started = self.rollout.start.remote()
        actor_built = None
        # The built-in engines start while the model is built: neither needs the other. Real SGLang
        # sizes its memory pool from what the GPU has free at its start, so it starts alone.
        if not args.debug_rollout_only and surely_builtin_engines(args):
            self.actor = TrainGroup(args, placement)
            actor_built = self.actor.init_start(args)
        num_prompts = ray.get(rollout_started, timeout=1800)
        self.num_rollout_per_epoch = resolve_num_rollout(args, num_prompts)
        args.rollout_engine_urls = ray.get(self.rollout.get_engine_urls.remote())
        if not args.debug_rollout_only:
            self._event("setup", detail="building the Megatron model")
            if actor_built is None:
                self.actor = TrainGroup(args, placement)
                actor_built = self.actor.init_start(args)
            self.start_rollout_id, data_state = self.actor.init_wait(actor_built)
            if args.use_critic:
                from slime_ref.arguments import critic_args

                self._event("setup", detail="building the critic")
                c_args = critic_args(args)
                self.critic = TrainGroup(c_args, placement, role="critic")
                critic_start, _ = self.critic.init(c_args)
                if critic_start == 0 and self.start_rollout_id:  # e.g. a GRPO checkpoint continued with PPO
                    logger.warning("no critic checkpoint in %s: the critic starts fresh at rollout %d",
                                   c_args.load, self.start_rollout_id)
                elif critic_start != self.start_rollout_id:
                    raise UserError(f"the critic's checkpoint ({c_args.load}) resumes at rollout {critic_start}, "
                                    f"the actor's ({args.load}) at {self.start_rollout_id}; load a matching pair")
            if data_state is not None:
                ray.get(self.rollout.load_data_state.remote(data_state))
        self.tracker = Tracker(args, out, self.start_rollout_id)
        atomic_write_json(out / PROCESSES_FILE, self._process_ids())
        self.phase_seconds["setup"] += time.perf_counter() - start
        if self.progress is not None and hasattr(self.progress, "set_total"):
            self.progress.set_total(args.num_rollout)  # known only now when --num-epoch sets it

    def _process_ids(self) -> dict:
        """Which process is which role: for an operator who must find one, and for the fault tests."""
        import os

        ids = {"driver": os.getpid(), **ray.get(self.rollout.process_ids.remote(), timeout=60)}
        if self.actor is not None:
            ids["train_ranks"] = self.actor.process_ids()
        if self.critic is not None:
            ids["critic_ranks"] = self.critic.process_ids()
        return ids

    def _teardown(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None
        try:
            if self.critic is not None:
                self.critic.shutdown()
            if self.actor is not None:
                self.actor.shutdown()
            if self.rollout is not None:
                ray.get(self.rollout.dispose.remote(), timeout=180)
                ray.kill(self.rollout)
        except Exception as e:  # tear-down must go on: the processes below still need stopping
            logger.warning("while stopping the run: %s", e)
        finally:
            self.actor = self.critic = self.rollout = None
            if self.started_ray:
                ray.shutdown()
                self.started_ray = False
            if self.reaper is not None:
                reaper.stop(self.reaper)
                self.reaper = None

    # -- phases ---------------------------------------------------------------------------------

    def _event(self, phase: str, **info) -> None:
        if self.progress is not None:
            self.progress(phase, **info)

    def _mark(self, phase: str, rollout_id: int, wall_start: float) -> None:
        """One line of TIMELINE_FILE: when a phase ran, in wall-clock seconds (what a GPU memory trace
        is lined up against: `slime-check smoke --memory` reads each phase's peak from it)."""
        line = json.dumps({"phase": phase, "rollout_id": rollout_id, "start": round(wall_start, 3),
                           "end": round(time.time(), 3)})
        with open(Path(self.args.output_dir) / TIMELINE_FILE, "a") as f:  # appended: a line per phase
            f.write(line + "\n")

    def train(self, rollout_id: int, data_ref) -> dict:
        if self.actor is None:  # --debug-rollout-only: slime's actor returns from train() at once
            return {}
        self._event("train", rollout_id=rollout_id)
        start, wall_start = time.perf_counter(), time.time()
        if self.critic is None:
            steps = self.actor.train(rollout_id, data_ref)
        else:  # slime: the critic trains first; its values give the actor's GAE advantages
            steps, values = self.critic.train_critic(rollout_id, data_ref)
            if rollout_id >= self.args.num_critic_only_steps:
                steps = _merge_steps(steps, self.actor.train(rollout_id, data_ref, values))
        elapsed = time.perf_counter() - start
        self.phase_seconds["train"] += elapsed
        self._mark("train", rollout_id, wall_start)
        # train/* averaged over the optimizer steps; perf/* timers come with the last step only
        names = {k for s in steps for k in s if k != "train/step"}
        metrics = {k: sum(s[k] for s in steps if k in s) / sum(k in s for s in steps) for k in sorted(names)}
        metrics["perf/train_time"] = elapsed
        return metrics

    def update_weights(self, rollout_id: int) -> dict:
        if self.actor is None or not self.args.rollout_engine_urls:
            return {}
        self._event("update_weights", rollout_id=rollout_id)
        start, wall_start = time.perf_counter(), time.time()
        self.weight_version += 1
        ray.get(self.rollout.check_engines.remote())
        if self.args.use_fault_tolerance:  # engines the watch stopped restart now, then get the weights
            urls = ray.get(self.rollout.recover.remote())
            if urls != self.args.rollout_engine_urls:
                self.args.rollout_engine_urls = urls
                atomic_write_json(Path(self.args.output_dir) / PROCESSES_FILE, self._process_ids())
        try:
            metrics = self.actor.update_weights(self.args.rollout_engine_urls, self.weight_version)
        except RunError:  # an engine that died during the update: the watch's error names it and its log
            ray.get(self.rollout.check_engines.remote())
            raise
        if self.args.check_weight_update_equal:
            metrics["perf/weight_check_max_abs_diff"] = self.check_weights()
        self.phase_seconds["update_weights"] += time.perf_counter() - start
        self._mark("update_weights", rollout_id, wall_start)
        return metrics

    def check_weights(self) -> float:
        """Trainer and every engine score one fixed sequence; fail unless they agree (exactly in fp32 on CPU)."""
        import torch

        tokens = list(range(3, 3 + 12))
        theirs = ray.get(self.rollout.score.remote(tokens, PROBE_RESPONSE_LENGTH))
        ours = self.actor.probe_log_probs(tokens, PROBE_RESPONSE_LENGTH)
        worst = max(abs(a - b) for engine in theirs for a, b in zip(engine, ours))
        tolerance = 1e-5 if not torch.cuda.is_available() else 5e-2
        if worst > tolerance:
            raise RuntimeError(f"--check-weight-update-equal: an engine's log-probs differ from the trainer's by "
                               f"{worst:.3g} (> {tolerance:g}) after weight version {self.weight_version}")
        return worst

    def save(self, rollout_id: int) -> dict:
        self._event("save", rollout_id=rollout_id)
        start = time.perf_counter()
        data_state = ray.get(self.rollout.data_state.remote())
        self.actor.save(rollout_id, data_state)
        if self.critic is not None:
            self.critic.save(rollout_id, data_state)
        elapsed = time.perf_counter() - start
        self.phase_seconds["save"] += elapsed
        return {"perf/save_time": elapsed}

    def eval(self, rollout_id: int) -> dict:
        self._event("eval", rollout_id=rollout_id)
        start = time.perf_counter()
        metrics = ray.get(self.rollout.eval.remote(rollout_id))
        elapsed = time.perf_counter() - start
        self.phase_seconds["eval"] += elapsed
        metrics["perf/eval_time"] = elapsed
        self.eval_history.append((rollout_id, metrics))
        self.log(metrics, rollout_id, kind="eval")
        return metrics

    # colocated: engines and trainer take turns on the same devices
    def offload_rollout(self) -> None:
        if self.args.offload_rollout and self.args.rollout_engine_urls:
            ray.get(self.rollout.offload.remote())

    def onload_rollout(self) -> None:
        if self.args.offload_rollout and self.args.rollout_engine_urls:
            ray.get(self.rollout.onload.remote())

    def offload_train(self) -> None:
        if self.args.offload_train:
            self.actor.offload()
            if self.critic is not None:
                self.critic.offload()

    def onload_train(self) -> None:
        if self.args.offload_train:
            self.actor.onload()
            if self.critic is not None:
                self.critic.onload()

    # -- logs -----------------------------------------------------------------------------------

    def log(self, metrics: dict, rollout_id: int, kind: str = "rollout") -> None:
        if kind == "rollout":
            self.phase_seconds["rollout"] += metrics.get("perf/rollout_time", 0.0)
        self.tracker.log(metrics, rollout_id)
        self._event("logged", rollout_id=rollout_id, kind=kind, metrics=metrics)

    def summary(self) -> dict:
        first_eval = self.eval_history[0][1] if self.eval_history else {}
        last_eval = self.eval_history[-1][1] if self.eval_history else {}
        names = [name for name, _ in self.args.eval_datasets]
        key = f"eval/{names[0]}" if names else None
        summary = {
            "num_rollout": self.args.num_rollout,
            "start_rollout_id": self.start_rollout_id,
            "reward_before": first_eval.get(key),
            "reward_after": last_eval.get(key),
            "eval": {str(rid): m for rid, m in self.eval_history},
            "wall_s": time.perf_counter() - self.wall_start,
            "phase_s": dict(self.phase_seconds),
            "output_dir": str(Path(self.args.output_dir).resolve()),
        }
        atomic_write_json(Path(self.args.output_dir) / SUMMARY_FILE, summary)
        return summary


def _merge_steps(critic_steps: list[dict], actor_steps: list[dict]) -> list[dict]:
    """The critic's and the actor's step metrics side by side (train/value_loss beside train/pg_loss);
    the actor's win where names meet (train/lr, train/grad_norm, train/step)."""
    merged = []
    for i in range(max(len(critic_steps), len(actor_steps))):
        step = dict(critic_steps[i]) if i < len(critic_steps) else {}
        if i < len(actor_steps):
            step.update(actor_steps[i])
        merged.append(step)
    return merged


def _jsonable(value) -> bool:
    return isinstance(value, (int, float, str, bool, type(None), list, tuple, dict))

