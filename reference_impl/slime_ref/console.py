"""What a training run shows in the terminal: a live progress line per phase, then a summary.

The loops report events (``setup``, ``train``, ``update_weights``, ``save``, ``eval``, ``logged``) to a
callback; :class:`RunDisplay` turns them into a rich progress bar with the latest reward and
phase, and prints eval results as they arrive. Logs of Ray workers, engines and the router go to
files under ``--output-dir`` instead of the terminal.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

PHASE_LABEL = {
    "setup": "setting up",
    "rollout": "generating",
    "train": "training",
    "update_weights": "syncing weights",
    "save": "saving",
    "eval": "evaluating",
}


class RunDisplay:
    def __init__(self, console: Console, total: int | None, title: str):
        self.console = console
        self.title = title
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task(title, total=total, status="setting up")
        self.last: dict = {}
        self.trained = False  # an eval before the first train step is the "before training" one

    def __enter__(self) -> RunDisplay:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def __call__(self, phase: str, **info) -> None:
        if phase == "logged":
            metrics = info["metrics"]
            if info["kind"] == "eval":
                shown = ", ".join(f"{k.removeprefix('eval/')} {v:.3f}" for k, v in metrics.items()
                                  if k.startswith("eval/") and isinstance(v, float) and "ratio" not in k)
                when = f"after rollout {info['rollout_id']}" if self.trained else "before training"
                self.progress.console.print(f"  eval {when}: {shown}")
                return
            self.last = metrics
            self.progress.update(self.task, completed=info["rollout_id"] + 1, status=self._status("rollout"))
            return
        if phase == "setup":
            self.progress.update(self.task, status=info.get("detail", "setting up"))
            return
        if phase == "train":
            self.trained = True
        if phase in ("train", "update_weights", "save", "eval") and "rollout_id" in info:
            self.progress.update(self.task, status=self._status(phase))

    def set_total(self, total: int) -> None:
        self.progress.update(self.task, total=total)

    def _status(self, phase: str) -> str:
        m = self.last
        if "train/pg_loss" not in m and "train/loss" in m:  # supervised (sft_loss): no rewards, a loss
            return f"{'trained' if phase == 'rollout' else PHASE_LABEL.get(phase, phase)} | loss {m['train/loss']:.3f}"
        parts = [PHASE_LABEL.get(phase, phase)]
        if "rollout/raw_reward" in m:
            parts.append(f"reward {m['rollout/raw_reward']:.3f}")
        if "rollout/response_length" in m:
            parts.append(f"len {m['rollout/response_length']:.1f}")
        if "train/pg_loss" in m:
            parts.append(f"pg_loss {m['train/pg_loss']:+.4f}")
        return " | ".join(parts)


def summary_table(summary: dict) -> Table:
    table = Table(title="Run summary", show_header=False)
    for key in ("reward_before", "reward_after"):
        if summary.get(key) is not None:
            table.add_row(key.replace("_", " "), f"{summary[key]:.3f}")
    table.add_row("wall time", f"{summary['wall_s']:.1f} s")
    for phase, seconds in sorted(summary["phase_s"].items(), key=lambda kv: -kv[1]):
        table.add_row(f"  {PHASE_LABEL.get(phase, phase)}", f"{seconds:.1f} s")
    table.add_row("outputs", summary["output_dir"])
    return table


def quiet_library_logs(output_dir: str) -> None:
    """Our INFO logs to a file in the run directory; warnings and errors to the terminal."""
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    handler = logging.FileHandler(Path(output_dir) / "driver.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root.addHandler(handler)
    for name in ("ray", "megatron", "transformers"):
        logging.getLogger(name).setLevel(logging.WARNING)


def run_with_console(train, args, title: str) -> dict:
    """Run ``train(args, progress=...)`` with the live display; print the summary and draw the curves."""
    from slime_ref.plot import plot_run
    from slime_ref.preflight import preflight

    preflight(args)  # a bad path or prompt file is one line, before the display and before Ray
    console = Console(stderr=True)
    quiet_library_logs(args.output_dir)
    with RunDisplay(console, args.num_rollout, title) as display:
        summary = train(args, progress=display)
    console.print(summary_table(summary))
    try:
        console.print(f"curves: {plot_run(args.output_dir)}")
    except Exception as e:  # a run with nothing logged has no curves; the summary still stands
        console.print(f"no curves drawn: {e}")
    return summary
