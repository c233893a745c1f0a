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

Failures: a save that fails on any rank (a full disk, a lost mount) fails on every rank together,
promptly, with one :class:`~slime_ref.errors.UserError` naming ``--save`` and the iteration; the
``.partial`` directory is removed and the previous checkpoint stays current. The files megatron
writes from rank 0 alone (``common.pt``, ``.metadata``, ``metadata.json``) are written here between
agreement points, so that rank 0 failing alone never leaves the other ranks waiting in a collective
until the distributed timeout. A checkpoint that ``--load`` names but that is incomplete or
damaged is refused with a message naming the file; a run never silently starts from scratch.

The module imports torch only inside its functions, so that flag validation can check ``--load``
before anything heavy starts.
"""

from __future__ import annotations

import errno
import json
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from slime_ref.errors import UserError
from slime_ref.utils.fileio import atomic_write_text

TRACKER = "latest_checkpointed_iteration.txt"
RELEASE = "release"
# what dist_checkpointing writes into every checkpoint directory
CONFIG_FILE = "metadata.json"  # the format (megatron's CONFIG_FNAME)
COMMON_FILE = "common.pt"  # everything that is not a sharded tensor (megatron's COMMON_STATE_FNAME)
SHARD_INDEX = ".metadata"  # torch.distributed.checkpoint's index of the __<rank>_<n>.distcp shards
# keep the optimizer state resharding-friendly: any DP size can load it
_OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}
# errors of a full (or too small) disk, in the words the message uses
_DISK_FULL = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
              errno.EFBIG: "file too large for the file system"}
_NEARLY_FULL = 1 << 20  # bytes free below which a failed write counts as a full disk
_DAMAGED = ("the checkpoint is damaged; pass --ckpt-step N to load an earlier iter_* directory, "
            "or --load another checkpoint")


def iteration_dir(root: str | Path, iteration: int | str) -> Path:
    name = RELEASE if iteration == RELEASE else f"iter_{int(iteration):07d}"
    return Path(root) / name


def read_tracker(root: str | Path) -> int | str | None:
    """The iteration named by ``root``'s tracker (an int or "release"), or None if there is none."""
    path = Path(root) / TRACKER
    if not path.is_file():
        return None
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot be read ({e})") from e
    if text == RELEASE:
        return RELEASE
    if not re.fullmatch(r"\d+", text):
        raise UserError(f"{path}: expected an iteration number or 'release', found {text!r}; write the number "
                        "of the newest complete iter_* directory into it, or pass --ckpt-step N")
    return int(text)


def _iterations(root: Path) -> list[str]:
    """Names of the complete-looking ``iter_*`` directories under ``root`` (not ``.partial`` ones)."""
    try:
        return sorted(p.name for p in root.iterdir()
                      if re.fullmatch(r"iter_\d{7}", p.name) and (p / CONFIG_FILE).is_file())
    except OSError:
        return []


def find_checkpoint(path: str | Path, step: int | None = None) -> Path | None:
    """The checkpoint directory for ``--load path`` (a save root or an ``iter_*``/release dir), or None.

    ``step`` (``--ckpt-step``) picks an iteration instead of the tracker's. None means there is
    no checkpoint to resume: ``path`` is an HF directory, or a save directory no save has
    completed in yet. Checkpoints without a tracker are refused, not skipped.
    """
    path = Path(path)
    if (path / CONFIG_FILE).is_file() and (path.name == RELEASE or path.name.startswith("iter_")):
        return path
    try:
        iteration = step if step is not None else read_tracker(path)
    except UserError as e:
        raise UserError(f"--load {path}: {e}") from None
    if iteration is None:
        found = _iterations(path)
        if found:
            raise UserError(f"--load {path}: holds {', '.join(found)} but no {TRACKER}; pass --ckpt-step N to "
                            "pick one (or write its number into the tracker)")
        return None
    ckpt = iteration_dir(path, iteration)
    if not (ckpt / CONFIG_FILE).is_file():
        who = f"--ckpt-step {step}" if step is not None else f"the tracker ({TRACKER})"
        found = _iterations(path)
        here = f"complete checkpoints here: {', '.join(found)}" if found else "no complete checkpoint here"
        raise UserError(f"--load {path}: {who} names {ckpt.name}, which is missing or incomplete "
                        f"(no {CONFIG_FILE}); {here}")
    return ckpt


def is_megatron_checkpoint(path: str | Path) -> bool:
    path = Path(path)
    return (path / TRACKER).is_file() or (path / CONFIG_FILE).is_file()


def check_checkpoint_files(ckpt: str | Path, flag: str = "--load") -> None:
    """Refuse a checkpoint directory whose files are missing, empty or unparsable; reads no tensors.

    The message names the file. (Shard sizes are checked at load: :func:`check_shards`.)
    """
    ckpt = Path(ckpt)
    config = ckpt / CONFIG_FILE
    try:
        parsed = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"{flag}: {config} is not valid JSON ({e}); {_DAMAGED}") from e
    if not isinstance(parsed, dict) or parsed.get("sharded_backend") != "torch_dist":
        raise UserError(f"{flag}: {config} does not describe a torch_dist checkpoint (found {parsed!r}); {_DAMAGED}")
    for name in (COMMON_FILE, SHARD_INDEX):
        path = ckpt / name
        if not path.is_file() or path.stat().st_size == 0:
            raise UserError(f"{flag}: {path} is {'empty' if path.is_file() else 'missing'}; {_DAMAGED}")
    if not any(ckpt.glob("*.distcp")):
        raise UserError(f"{flag}: {ckpt} holds no *.distcp shard files; {_DAMAGED}")


def check_load(load: str | None, step: int | None = None) -> Path | None:
    """``--load`` checked before a run starts anything: the checkpoint directory it resumes from
    (None for an HF directory or a save directory with no checkpoint yet). Reads no tensors."""
    if not load:
        return None
    path = Path(load)
    if not path.exists():
        if step is not None:
            raise UserError(f"--load {load}: no such directory (--ckpt-step {step} needs a checkpoint)")
        return None  # the --save directory of a run that has not saved yet
    if not path.is_dir():
        raise UserError(f"--load {load}: a file, not a directory; pass the --save directory of the run to resume")
    found = find_checkpoint(path, step)
    if found is not None:
        check_checkpoint_files(found, f"--load {load}")
    return found


def check_shards(ckpt: str | Path, flag: str = "--load") -> None:
    """Every shard file the checkpoint's index names is there and long enough (a truncated file is
    named). Reads the index, not the tensors."""
    from torch.distributed.checkpoint import FileSystemReader

    ckpt = Path(ckpt)
    try:
        index = FileSystemReader(str(ckpt)).read_metadata()
    except Exception as e:  # unpickling a damaged file can raise nearly anything
        raise UserError(f"{flag}: {ckpt / SHARD_INDEX} cannot be read ({_one_line(e)}); {_DAMAGED}") from e
    needed: dict[str, int] = {}
    for info in (index.storage_data or {}).values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, size in sorted(needed.items()):
        shard = ckpt / name
        if not shard.is_file():
            raise UserError(f"{flag}: {shard} is missing; {_DAMAGED}")
        actual = shard.stat().st_size
        if actual < size:
            raise UserError(f"{flag}: {shard} is truncated ({actual} bytes, the index needs {size}); {_DAMAGED}")


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


# ---------------------------------------------------------------------------------------------
# RNG state


def _rng_state() -> dict:
    import numpy as np
    import torch
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return {
        "random": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": get_cuda_rng_tracker().get_states(),
    }


def _set_rng_state(state: dict) -> None:
    import numpy as np
    import torch
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


class _SaveFailed(Exception):
    """A save step failed on some rank; raised on every rank (after :func:`_agree`)."""

    def __init__(self, failures: list[tuple[int, str, int | None]]):
        super().__init__(failures)
        self.failures = failures  # (rank, one-line description, errno of a disk error or None)


_ERRNO_TEXT = re.compile(r"\[Errno (\d+)\]")


def _disk_errno(error: BaseException | None, _seen=None) -> int | None:
    """The errno of the first OSError behind ``error`` (its causes, and the per-rank failures a
    torch.distributed.checkpoint CheckpointException carries; pickled ones keep only their text)."""
    seen = _seen if _seen is not None else set()
    if error is None or id(error) in seen:
        return None
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno
    for inner in getattr(error, "failures", {}).values() if isinstance(getattr(error, "failures", None), dict) else ():
        found = _disk_errno(inner[0] if isinstance(inner, tuple) else inner, seen)
        if found is not None:
            return found
    for inner in (error.__cause__, error.__context__):
        found = _disk_errno(inner, seen)
        if found is not None:
            return found
    match = _ERRNO_TEXT.search(str(error))
    return int(match.group(1)) if match else None


def _describe(error: BaseException) -> str:
    """One line for a failed step: the OSError behind it ("[Errno 28] ...: 'file'") when there is
    one, else the first per-rank failure of a CheckpointException, else the error itself."""
    queue, seen, first_failure = [error], set(), None
    while queue:
        e = queue.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno is not None:
            return str(e)
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            inner = [f[0] if isinstance(f, tuple) else f for f in failures.values()]
            first_failure = first_failure or next(iter(inner), None)
            queue.extend(inner)
        queue.extend((e.__cause__, e.__context__))
    for candidate in (error, first_failure):
        for line in str(candidate or "").splitlines():  # a pickled error from another rank keeps its text
            found = _ERRNO_TEXT.search(line)
            if found:
                return line[found.start():].strip()
    return _one_line(first_failure or error)


def _free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the file system holding ``path``."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _classify(error: BaseException, where: Path) -> tuple[str, int | None]:
    """(description, errno) of a failed write under ``where``.

    torch's own file writer reports a full disk without an errno ("unexpected pos ..."); a write
    that failed while the disk holding ``where`` has (almost) nothing left is a full disk.
    """
    code = _disk_errno(error)
    if code is not None:
        return _describe(error), code
    free = _free_bytes(where)
    if free is not None and free < _NEARLY_FULL:
        return f"{free} bytes free on the disk that holds it", errno.ENOSPC
    return _describe(error), None


def _agree(error: BaseException | None, where: Path) -> None:
    """Collective: every rank learns whether the step it just ran failed anywhere; if so, all raise."""
    import torch.distributed as dist

    mine = None if error is None else _classify(error, where)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    failures = [(rank, *info) for rank, info in enumerate(everyone) if info is not None]
    if failures:
        raise _SaveFailed(failures) from error


def _on_rank0(step, where: Path) -> None:
    """Run ``step`` on rank 0 alone; the other ranks wait for it and fail with it."""
    import torch.distributed as dist

    error = None
    if dist.get_rank() == 0:
        try:
            step()
        except Exception as e:  # noqa: BLE001 -- any failure here is every rank's, via _agree
            error = e
    _agree(error, where)


def _save_strategy():
    """megatron's torch_dist shard writer, except that a failure to write the shard index
    (``.metadata``, rank 0 alone) is held for :func:`_agree` instead of raised between two
    collectives, which would leave the other ranks waiting until the distributed timeout."""
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    class Strategy(TorchDistSaveShardedStrategy):
        held_error: BaseException | None = None

        def _get_save_and_finalize_callbacks(self, writer, save_state_dict_ret):
            finish = writer.finish

            def finish_or_hold(*args, **kwargs):
                try:
                    return finish(*args, **kwargs)
                except Exception as e:  # noqa: BLE001 -- held, then raised on every rank by _agree
                    self.held_error = e

            writer.finish = finish_or_hold
            return super()._get_save_and_finalize_callbacks(writer, save_state_dict_ret)

    return Strategy("torch_dist", 1)


def _write(state: dict, directory: Path) -> None:
    """``dist_checkpointing.save(state, directory)`` in its steps, each failing on all ranks together.

    megatron writes ``common.pt`` and ``metadata.json`` from rank 0 alone, around the collective
    shard write; here each of them is followed by an agreement step.
    """
    import torch
    from megatron.core.dist_checkpointing.core import CheckpointingConfig, save_config
    from megatron.core.dist_checkpointing.state_dict_utils import save_preprocess
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    sharded, common = save_preprocess(state, validate_access_integrity=True)
    _on_rank0(lambda: torch.save(common, directory / COMMON_FILE), directory)
    strategy = _save_strategy()
    error = None
    try:
        strategy.save(sharded, str(directory))  # collective; a failed shard write raises on all ranks
    except (Exception, CheckpointException) as e:  # noqa: BLE001 -- _agree raises it on every rank
        error = e
    _agree(error or strategy.held_error, directory)
    _on_rank0(lambda: save_config(CheckpointingConfig(strategy.backend, strategy.version), str(directory)),
              directory)


def _publish(root: Path, partial: Path, final: Path, tracker_text: str) -> None:
    """Rank 0: ``partial`` becomes ``final``, then the tracker names it (both by atomic rename)."""
    if final.exists():
        stale = root / f".{final.name}.old"
        shutil.rmtree(stale, ignore_errors=True)
        final.rename(stale)
        partial.rename(final)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        partial.rename(final)
    atomic_write_text(root / TRACKER, tracker_text)


def _save(root: Path, final: Path, build_state, tracker_text: str) -> Path:
    """Write ``build_state()`` into ``root/.<final>.partial``, publish it as ``final``. Collective.

    On failure on any rank, every rank raises: :class:`UserError` for a disk error (the previous
    checkpoint is still current and the ``.partial`` directory is removed), RuntimeError otherwise.
    """
    import torch.distributed as dist

    partial = root / f".{final.name}.partial"

    def prepare() -> None:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)  # left by an earlier crash
        partial.mkdir()

    try:
        _on_rank0(prepare, root)
        _write(build_state(), partial)
        _on_rank0(lambda: _publish(root, partial, final, tracker_text), root)
    except _SaveFailed as failed:
        if dist.get_rank() == 0:
            shutil.rmtree(partial, ignore_errors=True)
        dist.barrier()  # every rank agreed on the failure: this barrier cannot hang
        raise _save_error(root, final, failed) from failed.__cause__
    return final


def _save_error(root: Path, final: Path, failed: _SaveFailed) -> Exception:
    rank, what, code = next((f for f in failed.failures if f[2] is not None), failed.failures[0])
    try:
        previous = read_tracker(root)
    except UserError:
        previous = None
    kept = (f"the newest complete checkpoint is still {iteration_dir(root, previous).name} ({TRACKER} unchanged)"
            if previous is not None else "no earlier checkpoint was written")
    if code in _DISK_FULL:
        return UserError(f"--save {root}: {_DISK_FULL[code]} while writing {final.name} ({what}); {kept}. "
                         f"Free space or point --save at a larger disk, then resume with --load {root}")
    if code is not None:
        return UserError(f"--save {root}: writing {final.name} failed ({what}); {kept}")
    return RuntimeError(f"--save {root}: writing {final.name} failed on rank {rank}: {what}; {kept}")


def save_checkpoint(root: str | Path, rollout_id: int, model, optimizer, scheduler, *,
                    data_state: dict | None = None, save_optimizer: bool = True) -> Path:
    """Write ``root/iter_<rollout_id>`` atomically and point the tracker at it. Collective."""
    root = Path(root)
    return _save(root, iteration_dir(root, rollout_id), lambda: _state_dict(
        model, optimizer, scheduler, rollout_id=rollout_id, data_state=data_state, with_optimizer=save_optimizer,
        with_rng=True, is_loading=False), f"{rollout_id}\n")


def save_release(root: str | Path, model) -> Path:
    """Weights only, as ``root/release`` with tracker "release" (what HF -> checkpoint conversion writes)."""
    root = Path(root)
    return _save(root, iteration_dir(root, RELEASE), lambda: {
        "model": model.sharded_state_dict(), "rollout_id": None, "data_state": None, "format": 1}, f"{RELEASE}\n")


def _materialize_adam_state(optimizer) -> None:
    """Give a fresh optimizer empty Adam state (step 0, zero moments) for the checkpoint to load into.

    Without TransformerEngine/Apex, megatron's distributed optimizer reads the step count from the
    torch optimizer's per-parameter state, which a never-stepped optimizer does not have yet.
    """
    import torch

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
    import torch

    steps = {g["step"] for g in state.get("optimizer", {}).get("param_groups", []) if g.get("step") is not None}
    if len(steps) != 1:
        return
    step = float(steps.pop())
    for megatron_optimizer in getattr(optimizer, "chained_optimizers", [optimizer]):
        for param_state in megatron_optimizer.optimizer.state.values():
            if "step" in param_state:
                param_state["step"] = torch.tensor(step)


def load_checkpoint(path: Path, model, optimizer=None, scheduler=None, *, load_optimizer: bool = True,
                    load_rng: bool = True, flag: str = "--load") -> LoadedCheckpoint:
    """Load a checkpoint directory (from :func:`find_checkpoint`) into the model (and optimizer). Collective.

    A weights-only checkpoint (``release``, or saved with ``--no-save-optim``) loads the model
    and leaves the optimizer and RNG as they are. A damaged checkpoint raises UserError naming the
    file and ``flag`` (the flag that named the checkpoint).
    """
    import torch
    from megatron.core import dist_checkpointing
    from megatron.core.safe_globals import register_safe_globals
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    # a damaged or incomplete checkpoint is refused by name, on every rank alike, before any collective
    check_checkpoint_files(path, flag)
    check_shards(path, flag)
    register_safe_globals()
    try:
        common = dist_checkpointing.load_common_state_dict(str(path))
    except Exception as e:
        raise UserError(f"{flag}: {path / COMMON_FILE} cannot be read ({_one_line(e)}); {_DAMAGED}") from e
    # a checkpoint saved with its optimizer also holds the LR scheduler's state in common.pt
    with_optimizer = load_optimizer and optimizer is not None and "opt_param_scheduler" in common
    if with_optimizer:
        _materialize_adam_state(optimizer)
    with_rng = load_rng and path.name != RELEASE
    template = _state_dict(model, optimizer, scheduler, rollout_id=None, data_state=None,
                           with_optimizer=with_optimizer, with_rng=with_rng, is_loading=True)
    try:
        loaded = dist_checkpointing.load(template, str(path))  # collective; a failed read raises on all ranks
    except (Exception, CheckpointException) as e:  # any failure: the checkpoint is refused
        raise UserError(f"{flag}: the shards of {path} cannot be loaded ({_describe(e)}); the checkpoint is "
                        "damaged or was saved for other model flags; pass --ckpt-step N to load an earlier "
                        "iter_* directory, or --load another checkpoint") from e
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

