"""Ray start-up and placement, as slime does it: one placement group, actors pinned to its bundles.

Layout of the one placement group (``args`` use slime's flag names)::

    disaggregated: [actor_0 .. actor_{A-1}] [engine bundles: rollout_num_gpus]
    (A = actor_num_nodes * actor_num_gpus_per_node)
    --colocate:    [max(A, rollout_num_gpus) bundles, shared by train actors and engines]

On a GPU cluster a bundle is ``{"GPU": 1, "CPU": 1}``. On a machine without GPUs it is ``{"CPU": 1}``
and the "GPU counts" above count CPU slots instead, so the same flags describe the same topology.

Clusters: without ``RAY_ADDRESS`` a private local cluster starts, bound to 127.0.0.1. With
``RAY_ADDRESS`` set (after ``ray start --head`` on the head node and ``ray start --address=HEAD:6379``
on the others) slime-ref joins that cluster; that is how a run goes multi-node.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

PG_READY_TIMEOUT_S = 120


@dataclass
class Placement:
    """A placement group and the bundle indices each role uses."""

    pg: object
    use_gpu: bool
    actor_bundles: list[int]
    rollout_bundles: list[int]

    def bundle_resources(self, share: float) -> dict:
        """Resources an actor takes from its bundle; ``share`` < 1 lets roles share a bundle."""
        return {"num_gpus": share, "num_cpus": share} if self.use_gpu else {"num_cpus": share}


def init_ray(min_cpus: int, object_store_mb: int = 1024, temp_dir: str | None = None) -> bool:
    """Join ``RAY_ADDRESS`` if set, else start a local loopback cluster. Returns True if it started one."""
    import ray

    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
        return False
    # Logical CPU slots may exceed physical cores: each slot is a placement, not a core.
    with _quiet_token_auth_notice():
        ray.init(
            # "local": always a new private cluster, never one a stale /tmp/ray/ray_current_cluster names
            address="local",
            num_cpus=max(min_cpus, os.cpu_count() or 1),
            include_dashboard=False,
            object_store_memory=object_store_mb * 1024 * 1024,
            # worker output stays in Ray's session logs (/tmp/ray/session_latest/logs), not the terminal
            log_to_driver=False,
            configure_logging=False,
            **_temp_dir(temp_dir),
        )
    return True


# Ray's logger for its token-authentication set-up, and the notice it logs whenever it starts a local
# cluster with token authentication on (its default when RAY_AUTH_MODE is unset).
_TOKEN_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
_TOKEN_AUTH_NOTICE = "Token authentication is enabled for this Ray cluster"


class _DropTokenAuthNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_TOKEN_AUTH_NOTICE)


@contextlib.contextmanager
def _quiet_token_auth_notice():
    """Ray's "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to
    opt out..." is left out while a run starts a cluster of its own: the cluster is private to the
    run, bound to 127.0.0.1, and stopped with it, so the notice tells its user nothing. Ray still
    turns token authentication on exactly as it would; every other message of Ray's passes."""
    log = logging.getLogger(_TOKEN_AUTH_LOGGER)
    drop = _DropTokenAuthNotice()
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


def _temp_dir(path: str | None) -> dict:
    """Ray's session files under ``path``, if its socket paths fit the 107-byte Unix limit."""
    if path is None:
        return {}
    path = os.path.abspath(path)
    if len(path) + len("/session_2026-01-01_00-00-00_000000_99999/sockets/plasma_store") > 107:
        logging.getLogger(__name__).warning("%s is too long a path for Ray's sockets; Ray uses /tmp/ray", path)
        return {}
    os.makedirs(path, exist_ok=True)
    return {"_temp_dir": path}


def placement_layout(args) -> tuple[int, int]:
    """(bundles in the group, index of the first rollout bundle), slime's arithmetic."""
    actor_slots = args.actor_num_nodes * args.actor_num_gpus_per_node
    if getattr(args, "debug_train_only", False):
        return actor_slots, actor_slots
    if getattr(args, "debug_rollout_only", False):  # no trainer: the engines' bundles alone
        return args.rollout_num_gpus, 0
    if args.colocate:
        return max(actor_slots, args.rollout_num_gpus), 0
    return actor_slots + args.rollout_num_gpus, actor_slots


def cluster_has_gpus() -> bool:
    import ray

    return ray.cluster_resources().get("GPU", 0) > 0


def create_placement(args) -> Placement:
    """Reserve the bundles for the whole run in one PACK placement group, or fail with the reason."""
    import ray
    from ray.util.placement_group import placement_group

    from slime_ref.errors import UserError

    num_bundles, rollout_offset = placement_layout(args)
    use_gpu = cluster_has_gpus()
    bundle = {"GPU": 1, "CPU": 1} if use_gpu else {"CPU": 1}
    pg = placement_group([dict(bundle) for _ in range(num_bundles)], strategy="PACK")
    ready, _ = ray.wait([pg.ready()], timeout=PG_READY_TIMEOUT_S)
    if not ready:
        have = ray.cluster_resources()
        ray.util.remove_placement_group(pg)
        unit = "GPUs" if use_gpu else "CPU slots"
        raise UserError(
            f"could not place {num_bundles} bundles of {bundle} within {PG_READY_TIMEOUT_S}s "
            f"(cluster has {have.get('GPU', 0):g} GPUs, {have.get('CPU', 0):g} CPUs): reduce "
            f"--actor-num-gpus-per-node / --rollout-num-gpus, or use --colocate to share {unit}"
        )
    actor_slots = args.actor_num_nodes * args.actor_num_gpus_per_node
    return Placement(
        pg=pg,
        use_gpu=use_gpu,
        actor_bundles=list(range(actor_slots)),
        rollout_bundles=list(range(rollout_offset, rollout_offset + args.rollout_num_gpus)),
    )


def scheduling(placement: Placement, bundle_index: int):
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(
        placement_group=placement.pg,
        placement_group_bundle_index=bundle_index,
        placement_group_capture_child_tasks=True,
    )
