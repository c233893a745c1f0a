"""Training checkpoints (``--save``/``--load``) in megatron's dist_checkpointing format, written atomically.

Layout, as Megatron writes it::

    SAVE/
      latest_checkpointed_iteration.txt   "3": the newest complete checkpoint (written last)
      iter_0000003/                       dist_checkpointing: __*_*.distcp, .metadata, common.pt, metadata.json
      release/                            what ``slime-ref convert`` writes from an HF model (weights only)

The iteration number is the rollout id. A checkpoint holds the model, the optimizer state
(``--no-save-optim`` leaves it out), the LR scheduler, every rank's RNG state, the rollout id and
whatever data-source state the training loop hands in.

Atomicity: all ranks write into ``SAVE/.iter_0000003.partial``; after a barrier rank 0 renames it to
``iter_0000003`` and only then rewrites the tracker (atomic rename too). A crash mid-save leaves at
most a ``.partial`` directory that nothing reads; the tracker still names the previous checkpoint.
"""

from __future__ import annotations

import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from slime_ref.errors import UserError
from slime_ref.utils.fileio import atomic_write_text

TRACKER = "latest_checkpointed_iteration.txt"
RELEASE = "release"
# keep the optimizer state resharding-friendly: any DP size can load it
_OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}


def iteration_dir(root: str | Path, iteration: int | str) -> Path:
    name = RELEASE if iteration == RELEASE else f"iter_{int(iteration):07d}"
    return Path(root) / name


def read_tracker(root: str | Path) -> int | str | None:
    """The iteration named by ``root``'s tracker (an int or "release"), or None if there is none."""
    path = Path(root) / TRACKER
    if not path.is_file():
        return None
    text = path.read_text().strip()
    if text == RELEASE:
        return RELEASE
    if not re.fullmatch(r"\d+", text):
        raise UserError(f"{path}: expected an iteration number or 'release', found {text!r}")
    return int(text)


def find_checkpoint(path: str | Path, step: int | None = None) -> Path | None:
    """The checkpoint directory for ``--load path`` (a save root or an ``iter_*``/release dir), or None.

    ``step`` (``--ckpt-step``) picks an iteration instead of the tracker's.
    """
    path = Path(path)
    if (path / "metadata.json").is_file() and (path.name == RELEASE or path.name.startswith("iter_")):
        return path
    iteration = step if step is not None else read_tracker(path)
    if iteration is None:
        return None
    ckpt = iteration_dir(path, iteration)
    if not (ckpt / "metadata.json").is_file():
        raise UserError(f"--load {path}: the tracker names {ckpt.name}, which is missing or incomplete")
    return ckpt


def is_megatron_checkpoint(path: str | Path) -> bool:
    path = Path(path)
    return (path / TRACKER).is_file() or (path / "metadata.json").is_file()


# ---------------------------------------------------------------------------------------------
# RNG state


def _rng_state() -> dict:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return {
        "random": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": get_cuda_rng_tracker().get_states(),
    }


def _set_rng_state(state: dict) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def _sharded_rng(state) -> object:
    """One RNG state per rank (every (pp, tp, dp) coordinate saves and loads its own)."""
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    shape = (
        ps.get_pipeline_model_parallel_world_size(),
        ps.get_tensor_model_parallel_world_size(),
        ps.get_data_parallel_world_size(),
    )
    offset = (
        ps.get_pipeline_model_parallel_rank(),
        ps.get_tensor_model_parallel_rank(),
        ps.get_data_parallel_rank(),
    )
    return ShardedObject("rng_state", state, shape, offset, replica_id=0)


# ---------------------------------------------------------------------------------------------
# save / load


@dataclass
class LoadedCheckpoint:
    iteration: int | str
    rollout_id: int | None
    data_state: dict | None
    path: Path


def _state_dict(model, optimizer, scheduler, *, rollout_id, data_state, with_optimizer, with_rng, is_loading):
    model_sd = model.sharded_state_dict()
    state = {"model": model_sd, "rollout_id": rollout_id, "data_state": data_state, "format": 1}
    if with_optimizer and optimizer is not None:
        state["optimizer"] = optimizer.sharded_state_dict(model_sd, is_loading=is_loading, metadata=_OPTIMIZER_METADATA)
        state["opt_param_scheduler"] = scheduler.state_dict() if scheduler is not None else None
    if with_rng:
        state["rng_state"] = _sharded_rng(_rng_state())
    return state


def save_checkpoint(root: str | Path, rollout_id: int, model, optimizer, scheduler, *,
                    data_state: dict | None = None, save_optimizer: bool = True) -> Path:
    """Write ``root/iter_<rollout_id>`` atomically and point the tracker at it. Collective."""
    from megatron.core import dist_checkpointing

    root = Path(root)
    final = iteration_dir(root, rollout_id)
    partial = root / f".{final.name}.partial"
    if dist.get_rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)  # left by an earlier crash
        partial.mkdir()
    dist.barrier()
    state = _state_dict(model, optimizer, scheduler, rollout_id=rollout_id, data_state=data_state,
                        with_optimizer=save_optimizer, with_rng=True, is_loading=False)
    dist_checkpointing.save(state, str(partial))
    dist.barrier()
    if dist.get_rank() == 0:
        if final.exists():
            stale = root / f".{final.name}.old"
            shutil.rmtree(stale, ignore_errors=True)
            final.rename(stale)
            partial.rename(final)
            shutil.rmtree(stale, ignore_errors=True)
        else:
            partial.rename(final)
        atomic_write_text(root / TRACKER, f"{rollout_id}\n")
    dist.barrier()
    return final


def save_release(root: str | Path, model) -> Path:
    """Weights only, as ``root/release`` with tracker "release" (what HF -> checkpoint conversion writes)."""
    from megatron.core import dist_checkpointing

    root = Path(root)
    final = iteration_dir(root, RELEASE)
    partial = root / f".{RELEASE}.partial"
    if dist.get_rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
    dist.barrier()
    state = {"model": model.sharded_state_dict(), "rollout_id": None, "data_state": None, "format": 1}
    dist_checkpointing.save(state, str(partial))
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        atomic_write_text(root / TRACKER, f"{RELEASE}\n")
    dist.barrier()
    return final


def _materialize_adam_state(optimizer) -> None:
    """Give a fresh optimizer empty Adam state (step 0, zero moments) for the checkpoint to load into.

    Without TransformerEngine/Apex, megatron's distributed optimizer reads the step count from the
    torch optimizer's per-parameter state, which a never-stepped optimizer does not have yet.
    """
    for megatron_optimizer in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = megatron_optimizer.optimizer
        if not isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)):
            continue
        for group in inner.param_groups:
            for p in group["params"]:
                if not inner.state[p]:
                    inner.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                      "exp_avg_sq": torch.zeros_like(p)}


def _restore_adam_step(optimizer, state: dict) -> None:
    """Put the saved Adam step count back into every parameter's state.

    megatron's parameter-state loader copies the per-parameter "step" from the load template (the
    placeholder above) over the value it just restored from the param groups; Adam's bias
    correction needs the real count.
    """
    steps = {g["step"] for g in state.get("optimizer", {}).get("param_groups", []) if g.get("step") is not None}
    if len(steps) != 1:
        return
    step = float(steps.pop())
    for megatron_optimizer in getattr(optimizer, "chained_optimizers", [optimizer]):
        for param_state in megatron_optimizer.optimizer.state.values():
            if "step" in param_state:
                param_state["step"] = torch.tensor(step)


def load_checkpoint(path: Path, model, optimizer=None, scheduler=None, *, load_optimizer: bool = True,
                    load_rng: bool = True) -> LoadedCheckpoint:
    """Load a checkpoint directory (from :func:`find_checkpoint`) into the model (and optimizer). Collective.

    A weights-only checkpoint (``release``, or saved with ``--no-save-optim``) loads the model
    and leaves the optimizer and RNG as they are.
    """
    from megatron.core import dist_checkpointing
    from megatron.core.safe_globals import register_safe_globals

    register_safe_globals()
    common = dist_checkpointing.load_common_state_dict(str(path))
    # a checkpoint saved with its optimizer also holds the LR scheduler's state in common.pt
    with_optimizer = load_optimizer and optimizer is not None and "opt_param_scheduler" in common
    if with_optimizer:
        _materialize_adam_state(optimizer)
    with_rng = load_rng and path.name != RELEASE
    template = _state_dict(model, optimizer, scheduler, rollout_id=None, data_state=None,
                           with_optimizer=with_optimizer, with_rng=with_rng, is_loading=True)
    loaded = dist_checkpointing.load(template, str(path))
    model.load_state_dict(loaded["model"])
    if with_optimizer:
        with torch.no_grad():  # the dp_reshardable loader copies into leaf main params
            optimizer.load_state_dict(loaded["optimizer"])
        _restore_adam_step(optimizer, loaded["optimizer"])
        if scheduler is not None and loaded.get("opt_param_scheduler") is not None:
            scheduler.load_state_dict(loaded["opt_param_scheduler"])
    elif optimizer is not None:
        # weights changed under the optimizer: refresh its fp32 master copy
        optimizer.reload_model_params()
    if with_rng:
        _set_rng_state(loaded["rng_state"])
    iteration = RELEASE if path.name == RELEASE else int(path.name.split("_")[1])
    return LoadedCheckpoint(iteration, loaded.get("rollout_id"), loaded.get("data_state"), path)

