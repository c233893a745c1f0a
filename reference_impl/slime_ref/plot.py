"""``slime-ref plot RUN_DIR``: reward, KL, response length and phase times of a run, as one PNG."""

from __future__ import annotations

import os
from pathlib import Path

from slime_ref.errors import UserError
from slime_ref.utils.fileio import atomic_write_bytes
from slime_ref.utils.tracking import METRICS_FILE, read_metrics

PANELS = [
    ("Reward", ["rollout/raw_reward"], "eval/"),
    ("KL", ["train/ppo_kl", "train/kl_loss"], None),
    ("Response length (tokens)", ["rollout/response_length"], None),
    ("Time per rollout (s)", ["perf/rollout_time", "perf/train_time", "perf/update_weights_time"], None),
]


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)):
            xs.append(r["rollout_id"])
            ys.append(v)
    return xs, ys


def plot_run(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Draw the run's curves into ``out`` (default ``RUN_DIR/curves.png``) and return the path."""
    run_dir = Path(run_dir)
    if not (run_dir / METRICS_FILE).is_file():
        raise UserError(f"{run_dir} has no {METRICS_FILE}; pass the --output-dir of a slime-ref run")
    records = read_metrics(run_dir)
    if not records:
        raise UserError(f"{run_dir / METRICS_FILE} is empty: the run logged no rollout yet")

    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (title, keys, prefix) in zip(axes.flat, PANELS):
        if prefix:
            keys = keys + sorted({k for r in records for k in r if k.startswith(prefix)})
        drawn = False
        for key in keys:
            xs, ys = _series(records, key)
            if xs:
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=key)
                drawn = True
        ax.set_title(title)
        ax.set_xlabel("rollout id")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    fig.suptitle(f"slime-ref run: {run_dir.name}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    out = Path(out) if out else run_dir / "curves.png"
    atomic_write_bytes(out, buf.getvalue())
    return out
