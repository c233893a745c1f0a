"""The training ranks as Ray actors, and the group that drives them (slime's RayTrainGroup).

Every rank holds a :class:`~slime_ref.backends.megatron.actor.MegatronActor`; the group calls the same
method on every rank (the methods are collective) and takes rank 0's answer. Rank 0 also owns the
trainer side of the weight sync (:mod:`slime_ref.weights`).
"""

from __future__ import annotations

import logging

import ray

from slime_ref.errors import RunError
from slime_ref.ray.placement import Placement, scheduling
from slime_ref.rollout.sglang_client import EngineError
from slime_ref.utils.net import allocate_port, node_address

logger = logging.getLogger(__name__)

TRAIN_ACTOR_SHARE = 0.4  # of a bundle, as slime: a colocated engine takes another share of it


class TrainActor:
    """One training rank. Created by :class:`TrainGroup` with Ray resources from its bundle."""

    def __init__(self, world_size: int, rank: int, master_addr: str | None, master_port: int | None):
        self.world_size, self.rank = world_size, rank
        if master_addr is None:
            master_addr = node_address()
            master_port = allocate_port(master_addr)
        self.master_addr, self.master_port = master_addr, master_port
        self.actor = None
        self.weight_sync = None

    def master(self) -> tuple[str, int]:
        return self.master_addr, self.master_port

    def pid(self) -> int:
        import os

        return os.getpid()

    def init(self, args) -> tuple[int, dict | None]:
        """Build the model and optimizer, load weights (resuming from --load). Returns the first
        rollout id to run and the data-source state saved with the checkpoint (or None)."""
        import torch

        from slime_ref.backends.megatron.actor import MegatronActor
        from slime_ref.weights.sync import WeightSync

        if not torch.cuda.is_available():
            torch.set_num_threads(max(1, args.train_num_threads))
        self.args = args
        self.actor = MegatronActor(args, rank=self.rank, world_size=self.world_size,
                                   master_addr=self.master_addr, master_port=self.master_port)
        if getattr(args, "role", "actor") == "actor":  # the critic's weights never go to the engines
            self.weight_sync = WeightSync(args, self.actor, is_sender=self.rank == 0)
        return self.actor.start_rollout_id, self.actor.data_state

    def train(self, rollout_id: int, batch: dict, values: dict | None = None):
        return self.actor.train(rollout_id, batch, values)

    def save(self, rollout_id: int, data_state: dict | None) -> str:
        return str(self.actor.save(rollout_id, data_state))

    def update_weights(self, engine_urls: list[str], version: int) -> dict:
        return self.weight_sync.update(engine_urls, version)

    def probe_log_probs(self, tokens: list[int], response_length: int) -> list[float]:
        """Log-probs of the last ``response_length`` tokens under the current weights (temperature 1)."""
        return self.actor.score_sequence(tokens, response_length)

    def offload(self) -> None:
        """Colocated: give the device to the engines while they generate."""
        self.actor.offload()

    def onload(self) -> None:
        self.actor.onload()

    def shutdown(self) -> None:
        if self.weight_sync is not None:
            self.weight_sync.close()


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


def ray_session_logs() -> str:
    """This Ray session's log directory (workers' stdout and stderr)."""
    try:
        return f"{ray._private.worker._global_node.get_session_dir_path()}/logs"
    except AttributeError:
        return "Ray's session directory (/tmp/ray/session_latest/logs)"


class TrainGroup:
    """``actor_num_nodes * actor_num_gpus_per_node`` TrainActors, one per bundle of the placement.

    ``role`` "critic" (``--advantage-estimator ppo``): the critic's ranks, on the same bundles as the
    actor's (slime gives the critic the actor's placement group); ``args`` are the critic's."""

    def __init__(self, args, placement: Placement, role: str = "actor"):
        self.role = role
        world_size = args.actor_num_nodes * args.actor_num_gpus_per_node
        remote_cls = ray.remote(TrainActor)
        resources = placement.bundle_resources(TRAIN_ACTOR_SHARE)
        env = {"env_vars": {"OMP_NUM_THREADS": str(max(1, args.train_num_threads))}}
        self.actors = []
        master = (None, None)
        for rank in range(world_size):
            actor = remote_cls.options(
                **resources,
                scheduling_strategy=scheduling(placement, placement.actor_bundles[rank]),
                runtime_env=env,
            ).remote(world_size, rank, *master)
            if rank == 0:
                master = ray.get(actor.master.remote(), timeout=120)
            self.actors.append(actor)

    def _all(self, method: str, *args, timeout: float | None = None):
        return self._wait(method, [getattr(a, method).remote(*args) for a in self.actors], timeout)

    def _wait(self, method: str, refs: list, timeout: float | None = None):
        """Every rank's result of ``method``; a rank that died or an engine that failed is one line."""
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.RayActorError as e:  # a rank's process died: killed, OOM, or a crash in C++
            rank = next((r for r, a in enumerate(self.actors) if a._actor_id.hex() == getattr(e, "actor_id", None)),
                        None)
            who = f"training rank {rank}" if rank is not None else "a training rank"
            raise RunError(f"{who} died during {method}() ({_first_line(e)}); its log is under "
                           f"{ray_session_logs()} (worker-*.err)") from None
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, EngineError):  # an engine failed during the weight update
                raise RunError(f"{method}: {cause}") from None
            raise

    def init(self, args) -> tuple[int, dict | None]:
        return self.init_wait(self.init_start(args))

    def init_start(self, args) -> list:
        """Start building every rank's model; :meth:`init_wait` takes the result. Between the two the
        caller may start other work (the engines), which then overlaps the model's build."""
        return [a.init.remote(args) for a in self.actors]

    def init_wait(self, refs: list) -> tuple[int, dict | None]:
        """(the first rollout id to run, the data-source state saved with the checkpoint)."""
        return self._wait("init", refs)[0]

    def process_ids(self) -> list[int]:
        return self._all("pid", timeout=60)

    def train(self, rollout_id: int, batch_ref, values: dict | None = None) -> list[dict]:
        """The actor's optimizer steps; with ppo, ``values`` are the critic's (from :meth:`train_critic`)."""
        return self._all("train", rollout_id, batch_ref, values)[0]

    def train_critic(self, rollout_id: int, batch_ref) -> tuple[list[dict], dict[int, list[float]]]:
        """The critic's steps: (rank 0's step metrics, every sample's old values by index)."""
        results = self._all("train", rollout_id, batch_ref)
        values: dict[int, list[float]] = {}
        for _, rank_values in results:
            values.update(rank_values)
        return results[0][0], values

    def save(self, rollout_id: int, data_state: dict | None) -> str:
        return self._all("save", rollout_id, data_state)[0]

    def update_weights(self, engine_urls: list[str], version: int) -> dict:
        return self._all("update_weights", engine_urls, version)[0]

    def probe_log_probs(self, tokens: list[int], response_length: int) -> list[float]:
        return self._all("probe_log_probs", tokens, response_length)[0]

    def offload(self) -> None:
        self._all("offload")

    def onload(self) -> None:
        self._all("onload")

    def shutdown(self) -> None:
        try:
            self._all("shutdown", timeout=60)
        finally:
            for a in self.actors:
                ray.kill(a)
