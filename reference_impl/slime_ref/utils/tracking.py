"""Where metrics go: a JSONL file in the run directory, and TensorBoard or W&B when asked.

Metric names follow slime's (``rollout/raw_reward``, ``train/pg_loss``, ``perf/train_time``, ...), so
dashboards built for slime read slime-ref runs unchanged. One record per rollout id::

    {"rollout_id": 3, "time": 1733000000.0, "rollout/raw_reward": 0.41, "train/pg_loss": ..., ...}

Flags (slime's names): ``--use-tensorboard``, ``--tb-project-name``, ``--tb-experiment-name``,
``--use-wandb``, ``--wandb-mode`` (``offline`` works without network), ``--wandb-project``,
``--wandb-group``, ``--wandb-dir``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
PREVIOUS_METRICS_FILE = "metrics.prev.jsonl"
logger = logging.getLogger(__name__)


def _plain(value: Any) -> Any:
    """Turn tensors and numpy scalars into JSON numbers; NaN/inf become None (JSON has no NaN)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """All records of a run's metrics.jsonl; a torn last line (a crash mid-write) is skipped."""
    path = Path(run_dir) / METRICS_FILE
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class Tracker:
    """Fan a metrics dict out to every sink that is switched on."""

    def __init__(self, args, run_dir: str | os.PathLike, start_rollout_id: int = 0):
        """A resumed run (``start_rollout_id`` > 0) appends to the run directory's metrics.jsonl; a run
        from rollout 0 starts a new one, and an earlier run's file is kept as metrics.prev.jsonl so
        that two runs' curves never mix."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / METRICS_FILE
        if start_rollout_id == 0 and path.is_file() and path.stat().st_size:
            os.replace(path, self.run_dir / PREVIOUS_METRICS_FILE)
            logger.warning("%s held an earlier run's metrics; they are now in %s", path, PREVIOUS_METRICS_FILE)
        self._jsonl = open(path, "a", encoding="utf-8")
        self._tb = None
        self._wandb = None
        if getattr(args, "use_tensorboard", False):
            self._tb = self._open_tensorboard(args)
        if getattr(args, "use_wandb", False):
            self._wandb = self._open_wandb(args)

    def _open_tensorboard(self, args):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # tensorboard itself is an optional dependency
            from slime_ref.errors import UserError

            raise UserError(f"--use-tensorboard needs the tensorboard package ({e}); pip install tensorboard") from e
        if os.environ.get("TENSORBOARD_DIR"):
            log_dir = Path(os.environ["TENSORBOARD_DIR"])
        else:
            project = args.tb_project_name or "slime-ref"
            experiment = args.tb_experiment_name or time.strftime("%Y%m%d_%H%M%S")
            log_dir = self.run_dir / "tensorboard" / project / experiment
        log_dir.mkdir(parents=True, exist_ok=True)
        return SummaryWriter(str(log_dir))

    def _open_wandb(self, args):
        try:
            import wandb
        except ImportError as e:
            from slime_ref.errors import UserError

            raise UserError(f"--use-wandb needs the wandb package ({e}); pip install wandb") from e
        mode = args.wandb_mode or os.environ.get("WANDB_MODE") or "online"
        wandb_dir = Path(args.wandb_dir) if args.wandb_dir else self.run_dir
        wandb_dir.mkdir(parents=True, exist_ok=True)
        return wandb.init(
            project=args.wandb_project or "slime-ref",
            group=args.wandb_group,
            mode=mode,
            dir=str(wandb_dir),
            config={k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool, type(None)))},
        )

    def log(self, metrics: dict[str, Any], rollout_id: int) -> None:
        record = {"rollout_id": rollout_id, "time": time.time()}
        record.update({k: _plain(v) for k, v in metrics.items()})
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        numeric = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k not in ("rollout_id", "time")}
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, rollout_id)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({**numeric, "rollout/step": rollout_id})

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
            # also stop the wandb-core service process W&B started for this run
            import wandb

            wandb.teardown()
