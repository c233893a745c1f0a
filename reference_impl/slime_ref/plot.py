"""``slime-ref plot RUN_DIR``: reward, KL, response length and phase times of a run, as one PNG.

With ``warmup_dir`` (the quick start's supervised warm-up run) a first panel shows the warm-up's
loss, so the picture starts where the model came from. The held-out eval reward is marked where it
was measured before training and at the end. A series that is 0 at every rollout is not drawn as a
flat line on a meaningless axis: the panel says it is 0, and why where the reason is known.
Legends sit below their panels, never on the lines.
"""

from __future__ import annotations

import os
from pathlib import Path

from slime_ref.errors import UserError
from slime_ref.utils.fileio import atomic_write_bytes
from slime_ref.utils.tracking import METRICS_FILE, read_metrics

PANELS = [
    ("Reward", ["rollout/raw_reward"], "eval/"),
    ("KL", ["train/kl_loss", "train/ppo_kl"], None),
    ("Response length (tokens)", ["rollout/response_length"], None),
    ("Time per rollout (s)", ["perf/rollout_time", "perf/train_time", "perf/update_weights_time"], None),
]

# why a series that never moves is 0, for the ones whose reason does not depend on the run
ALWAYS_ZERO_WHY = {
    "train/ppo_kl": "one optimizer step per rollout trains the policy that sampled",
    "train/kl_loss": "the policy has not moved from the reference model",
}


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)):
            xs.append(r["rollout_id"])
            ys.append(v)
    return xs, ys


def _eval_keys(records: list[dict]) -> list[str]:
    """The eval sets' mean rewards (eval/NAME), without their pass@k and truncation companions."""
    return sorted({k for r in records for k in r
                   if k.startswith("eval/") and "-pass@" not in k and not k.endswith("truncated_ratio")})


def _eval_before_training(records: list[dict], key: str) -> bool:
    """The first eval of ``key`` came before any training (it is logged ahead of rollout 0's record)."""
    for r in records:
        if key in r:
            return r["rollout_id"] == 0
        if any(k.startswith(("train/", "rollout/")) for k in r):
            return False
    return False


def _legend_below(ax) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ncol = 1 if max(len(label) for label in labels) > 40 else min(3, len(labels))
        ax.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2),
                  ncol=ncol, frameon=False)


def _draw_reward(ax, records: list[dict]) -> bool:
    drawn = False
    xs, ys = _series(records, "rollout/raw_reward")
    if xs:
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label="rollout/raw_reward (train)")
        drawn = True
    for key in _eval_keys(records):
        xs, ys = _series(records, key)
        if not xs:
            continue
        line, = ax.plot(xs, ys, marker="o", markersize=4, label=f"{key} (held-out)")
        drawn = True
        color = line.get_color()
        box = {"boxstyle": "round,pad=0.25", "fc": "white", "ec": color, "alpha": 0.9}
        first = "before training" if _eval_before_training(records, key) else f"rollout {xs[0]}"
        ax.plot([xs[0]], [ys[0]], marker="s", markersize=8, color=color)
        ax.annotate(f"{first}: {ys[0]:.3f}", (xs[0], ys[0]), xytext=(12, -18), textcoords="offset points",
                    fontsize=8, color=color, bbox=box, va="top")
        if len(xs) > 1:
            ax.plot([xs[-1]], [ys[-1]], marker="*", markersize=13, color=color)
            ax.annotate(f"after rollout {xs[-1]}: {ys[-1]:.3f}", (xs[-1], ys[-1]), xytext=(-12, -18),
                        textcoords="offset points", fontsize=8, color=color, ha="right", va="top", bbox=box)
    return drawn


def _draw_series(ax, records: list[dict], keys: list[str]) -> bool:
    drawn, zero = False, []
    for key in keys:
        xs, ys = _series(records, key)
        if not xs:
            continue
        if all(y == 0 for y in ys):
            zero.append(key)
            continue
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=key)
        drawn = True
    for key in zero:  # a legend entry without a line, below the panel, never over a curve
        why = f": {ALWAYS_ZERO_WHY[key]}" if key in ALWAYS_ZERO_WHY else ""
        ax.plot([], [], " ", label=f"{key} is 0 at every rollout{why}")
    if zero and not drawn:
        ax.text(0.5, 0.5, "0 at every rollout (see below)", ha="center", va="center", transform=ax.transAxes,
                color="dimgray", fontsize=9)
    return drawn or bool(zero)


def plot_run(run_dir: str | os.PathLike, out: str | os.PathLike | None = None, *,
             warmup_dir: str | os.PathLike | None = None) -> Path:
    """Draw the run's curves into ``out`` (default ``RUN_DIR/curves.png``) and return the path.
    ``warmup_dir``: a supervised run the model started from; its loss gets the first panel."""
    run_dir = Path(run_dir)
    if not (run_dir / METRICS_FILE).is_file():
        raise UserError(f"{run_dir} has no {METRICS_FILE}; pass the --output-dir of a slime-ref run")
    records = read_metrics(run_dir)
    if not records:
        raise UserError(f"{run_dir / METRICS_FILE} is empty: the run logged no rollout yet")
    warmup = read_metrics(Path(warmup_dir)) if warmup_dir and (Path(warmup_dir) / METRICS_FILE).is_file() else []

    import io

    import matplotlib.pyplot as plt

    fig = build_figure(records, warmup, f"slime-ref run: {run_dir.name}")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    out = Path(out) if out else run_dir / "curves.png"
    atomic_write_bytes(out, buf.getvalue())
    return out


def build_figure(records: list[dict], warmup: list[dict], title: str):
    """The matplotlib figure of :func:`plot_run` (a run's metrics records, and a warm-up's or [])."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = 3 if warmup else 2
    fig, axes = plt.subplots(2, ncols, figsize=(5.5 * ncols, 8), layout="constrained")
    slots = list(axes.flat)
    if warmup:
        ax = slots.pop(0)
        xs, ys = _series(warmup, "train/loss")
        ax.plot([x + 1 for x in xs], ys, color="tab:gray", label="train/loss (--loss-type sft_loss)")
        ax.set_title("Supervised warm-up (before GRPO)")
        ax.set_xlabel("warm-up step")
        ax.grid(alpha=0.3)
        _legend_below(ax)
    for ax, (panel, keys, prefix) in zip(slots, PANELS):
        drawn = _draw_reward(ax, records) if prefix else _draw_series(ax, records, keys)
        ax.set_title(panel if not (warmup and prefix) else f"{panel} (GRPO, from the warm-up model)")
        ax.set_xlabel("rollout id")
        ax.grid(alpha=0.3)
        if drawn:
            _legend_below(ax)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    for ax in slots[len(PANELS):]:
        ax.axis("off")
    fig.suptitle(title)
    return fig
