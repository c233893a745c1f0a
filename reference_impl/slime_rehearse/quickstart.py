"""``slime-check quickstart``: a small, safe GRPO run after the checks pass.

1. checks   the machine (prerequisites for this run, and what a full slime run would still need)
2. assets   the embedded tiny Qwen3, tokenizer and arithmetic task (``slime-ref make-tiny``)
3. warm-up  a short supervised warm-up through slime's ``--loss-type sft_loss`` path
4. GRPO     the real stack: Ray, sglang-router, engines, the Megatron actor and weight sync
5. summary  eval reward before and after, time per phase, a reward plot, the trained model (HF),
            and next steps that run as printed on this run's own outputs

Repeatable: the warm-up reads its data in a seeded order, and GRPO passes slime's
``--sglang-enable-deterministic-inference``, so every request carries a sampling seed (slime's:
``--rollout-seed`` + the sample's place in its group) and the tokens drawn do not depend on which
request reached the engine first. The same ``--seed`` on the same machine gives the same rewards,
losses, eval numbers and trained weights. (What still varies: timings, and the engine-vs-trainer
log-prob gap, ``train/train_rollout_logprob_abs_diff``, in its 7th digit: the engine batches
concurrent requests as they arrive, and float sums group differently.)

Safety: everything is written under ``--out`` (Ray's session files included), every server binds a
free loopback port, and only the processes this run started are stopped, also on Ctrl-C. A FAIL
among the checks stops the run before anything starts, unless ``--force``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from slime_check.findings import Finding, Status
from slime_common.errors import UserError
from slime_common.fileio import atomic_write_json

DOC = "skill/references/reference-implementation.md"


@dataclass
class QuickstartConfig:
    """The recipe. Tuned so that on 2 CPU cores it finishes in minutes and GRPO clearly moves the
    held-out reward (see reference_impl/ARCHITECTURE.md, "The embedded default")."""

    seed: int = 0
    warmup_steps: int = 150
    warmup_batch: int = 64
    warmup_lr: float = 3e-3
    num_rollout: int = 80
    rollout_batch_size: int = 8
    n_samples_per_prompt: int = 8
    lr: float = 3e-4
    max_response_len: int = 8
    eval_interval: int = 20
    n_samples_per_eval_prompt: int = 8
    extra: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# checks for this run (the full slime prerequisites are printed beside them)


def quickstart_checks(out: Path) -> list[Finding]:
    import psutil

    findings = []
    py = sys.version_info
    findings.append(Finding("quickstart.python", Status.PASS if py >= (3, 10) else Status.FAIL,
                            f"Python {py.major}.{py.minor}.{py.micro}", "Use Python 3.10 or newer.", DOC))
    missing = [m for m in ("torch", "megatron.core", "ray", "sglang_router", "transformers", "aiohttp")
               if importlib.util.find_spec(m.split(".")[0]) is None
               or (m == "megatron.core" and importlib.util.find_spec("megatron.core") is None)]
    findings.append(Finding(
        "quickstart.packages", Status.FAIL if missing else Status.PASS,
        f"missing: {', '.join(missing)}" if missing else "torch, megatron-core, ray, sglang-router, transformers",
        "Install slime-skill with the README's command (it pins a CPU torch on machines without GPUs).", DOC))
    available = psutil.virtual_memory().available / 2**30
    findings.append(Finding(
        "quickstart.memory", Status.PASS if available >= 6 else (Status.WARN if available >= 4 else Status.FAIL),
        f"{available:.1f} GiB of memory available (the run peaks near 4 GiB)",
        "Close other programs, or run on a machine with 6 GiB free.", DOC))
    usage = shutil.disk_usage(out if out.exists() else out.parent if out.parent.exists() else Path.cwd())
    free = usage.free / 2**30
    findings.append(Finding("quickstart.disk", Status.PASS if free >= 2 else Status.FAIL,
                            f"{free:.1f} GiB free for {out}", "Free 2 GiB or pass --out on another disk.", DOC))
    shm = shutil.disk_usage("/dev/shm").total / 2**30 if os.path.isdir("/dev/shm") else 0.0
    findings.append(Finding(
        "quickstart.shm", Status.PASS if shm >= 1.5 else Status.FAIL,
        f"/dev/shm is {shm:.1f} GiB (Ray's object store takes 1 GiB here)",
        "In Docker pass --shm-size=16g (slime's docs) or at least 2g.", DOC))
    cpus = os.cpu_count() or 1
    findings.append(Finding("quickstart.cpus", Status.PASS if cpus >= 2 else Status.WARN, f"{cpus} CPU cores",
                            "With 1 core the run still works, more slowly.", DOC))
    import torch

    gpu = torch.cuda.is_available()
    engine = "real SGLang" if gpu and importlib.util.find_spec("sglang") else "the built-in engine"
    findings.append(Finding("quickstart.device", Status.PASS,
                            f"{'CUDA' if gpu else 'CPU'}: trainer on megatron-core, rollouts on {engine}", "", DOC))
    return findings


# ---------------------------------------------------------------------------------------------
# the run


def warmup_argv(cfg: QuickstartConfig, assets, out: Path) -> list[str]:
    return [
        "--hf-checkpoint", str(assets.model_dir),
        "--prompt-data", str(assets.sft_path), "--input-key", "messages",
        "--rollout-function-path", "slime_ref.rollout.sft_rollout.generate_rollout",
        "--loss-type", "sft_loss", "--calculate-per-token-loss", "--disable-compute-advantages-and-returns",
        "--debug-train-only", "--rollout-shuffle", "--rollout-seed", str(cfg.seed),
        "--num-rollout", str(cfg.warmup_steps), "--rollout-batch-size", str(cfg.warmup_batch),
        "--global-batch-size", str(cfg.warmup_batch),
        "--lr", str(cfg.warmup_lr), "--lr-decay-style", "constant", "--weight-decay", "0.0",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--seed", str(cfg.seed),
        "--use-dynamic-batch-size", "--max-tokens-per-gpu", "8192",
        "--actor-num-gpus-per-node", "1",
        "--save", str(out / "warmup" / "checkpoint"), "--save-interval", str(cfg.warmup_steps),
        "--save-hf", str(out / "warmup" / "hf"),
        "--output-dir", str(out / "warmup"),
    ]


def grpo_argv(cfg: QuickstartConfig, assets, out: Path) -> list[str]:
    warm = out / "warmup" / "hf"
    return [
        "--hf-checkpoint", str(warm),
        "--prompt-data", str(assets.train_path), "--input-key", "prompt", "--label-key", "label",
        "--apply-chat-template", "--rollout-shuffle", "--rollout-seed", str(cfg.seed),
        "--rm-type", assets.manifest["rm_type"],
        "--num-rollout", str(cfg.num_rollout), "--rollout-batch-size", str(cfg.rollout_batch_size),
        "--n-samples-per-prompt", str(cfg.n_samples_per_prompt),
        "--global-batch-size", str(cfg.rollout_batch_size * cfg.n_samples_per_prompt),
        "--rollout-max-response-len", str(cfg.max_response_len), "--rollout-temperature", "1.0",
        "--advantage-estimator", "grpo", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
        "--lr", str(cfg.lr), "--lr-decay-style", "constant", "--weight-decay", "0.0",
        "--adam-beta1", "0.9", "--adam-beta2", "0.98",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--seed", str(cfg.seed),
        "--use-dynamic-batch-size", "--max-tokens-per-gpu", "8192",
        "--eval-prompt-data", "arith", str(assets.eval_path), "--eval-interval", str(cfg.eval_interval),
        "--n-samples-per-eval-prompt", str(cfg.n_samples_per_eval_prompt),
        # KL to the warm-up model, measured and logged (train/kl_loss), not trained on (coefficient 0)
        "--use-kl-loss", "--kl-loss-coef", "0.0", "--kl-loss-type", "low_var_kl",
        # slime's switch for repeatable rollouts: a sampling seed on every request
        "--sglang-enable-deterministic-inference",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--colocate",
        "--check-weight-update-equal",
        # the trained model: a Megatron checkpoint after the last rollout, and an HF copy of it
        "--save", str(out / "grpo" / "checkpoint"), "--save-interval", str(cfg.num_rollout),
        "--save-hf", str(out / "grpo" / "hf"),
        "--output-dir", str(out / "grpo"),
        *cfg.extra,
    ]


TOWARD_SLIME = """\
Toward a real slime run, on the GPU machine: slime-check prereqs there (fix every FAIL), a launch
script from skill/templates/, then slime-check config and slime-check smoke on it as above; while it
runs, watch rollout/raw_reward and train/kl_loss as in reward.png."""


def shown_path(path: Path) -> str:
    """``path`` as the user types it from here: relative below the working directory, else absolute."""
    import shlex

    try:
        text = str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        text = str(path)
    return shlex.quote(text)


def example_script(name: str = "run-tiny-grpo.sh") -> Path | None:
    """The repository's ``examples/NAME`` when slime-skill runs from its clone (an editable install)."""
    import slime_check

    path = Path(slime_check.__file__).resolve().parents[2] / "examples" / name
    return path if path.is_file() else None


def next_steps(out: Path, assets) -> list[tuple[str, str]]:
    """(command, what it does) for each next step: commands that run as printed, from the working
    directory, on this run's own outputs."""
    import json
    import shlex

    rows = assets.eval_path.read_text().splitlines()
    held_out = [json.loads(rows[i])["prompt"][-1]["content"] for i in sorted({0, len(rows) // 2, len(rows) - 1})]
    steps = [(f"slime-ref generate {shown_path(out / 'grpo' / 'hf')} " + " ".join(shlex.quote(p) for p in held_out),
              "your GRPO-trained model answers held-out prompts (grpo/hf is a plain HF checkpoint)")]
    script = example_script()
    if script is not None:
        tiny = f"--env TINY={shown_path(out / 'assets')}"
        steps.append((f"slime-check config {tiny} {shown_path(script)}",
                      "checks a slime launch script (this GRPO as slime's flag arrays) before it runs"))
        steps.append((f"slime-check smoke {tiny} --out {shown_path(out / 'smoke')} {shown_path(script)}",
                      "rehearses that script at toy size: data keys, rewards, weight sync (about 2 minutes)"))
    return steps


class InterruptLatch:
    """Ctrl-C stops the quick start even when Python swallows the first KeyboardInterrupt.

    A KeyboardInterrupt raised while the interpreter runs a finalizer (``__del__``, a weakref
    callback, garbage collection) is printed as "Exception ignored" and dropped, and the run would
    go on to the end. SIGINT therefore also sets a latch, and every phase event of the run checks
    it (``guard``), so the run stops at its next phase at the latest.
    """

    def __init__(self):
        self.interrupted = False
        self._previous = None

    def _handle(self, signum, frame):
        self.interrupted = True
        raise KeyboardInterrupt

    def guard(self, progress) -> _Guarded:
        """``progress`` (a run's phase-event callable), raising KeyboardInterrupt once interrupted."""
        return _Guarded(self, progress)

    def __enter__(self) -> InterruptLatch:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGINT, self._previous)


class _Guarded:
    """A phase-event callable that first checks the latch; its other attributes are the display's."""

    def __init__(self, latch: InterruptLatch, progress):
        self._latch, self._progress = latch, progress

    def __call__(self, *args, **kwargs):
        if self._latch.interrupted:
            raise KeyboardInterrupt
        return self._progress(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._progress, name)


def run_quickstart(out: Path, cfg: QuickstartConfig, force: bool, console) -> dict:
    from rich.table import Table

    from slime_check.findings import render
    from slime_check.prereqs import run_prereqs
    from slime_check.probes import LiveProbe

    wall_start = time.perf_counter()
    phase_s: dict[str, float] = {}
    out.mkdir(parents=True, exist_ok=True)

    # 1. checks
    start = time.perf_counter()
    console.rule("[bold]1/5  checks")
    slime_findings = run_prereqs(LiveProbe())
    counts = {s: sum(f.status is s for f in slime_findings) for s in Status}
    tally = (f"PASS {counts[Status.PASS]}, WARN {counts[Status.WARN]}, FAIL {counts[Status.FAIL]}, "
             f"SKIP {counts[Status.SKIP]}")
    import torch

    if torch.cuda.is_available():
        console.print(f"A full slime run on this machine: {tally} (details: slime-check prereqs)")
    else:
        console.print(f"Preview, not this run's verdict: a full slime run needs a GPU node; this machine as one "
                      f"would give {tally} (run slime-check prereqs on the GPU node)")
    findings = quickstart_checks(out)
    render(findings, "This quick start needs", console)
    phase_s["checks"] = time.perf_counter() - start
    failed = [f.id for f in findings if f.status is Status.FAIL]
    if failed and not force:
        raise UserError(f"quick start refused: {', '.join(failed)} failed (see above); fix them, or pass --force")

    # 2. assets
    from slime_ref.assets import make_tiny

    start = time.perf_counter()
    console.rule("[bold]2/5  the embedded tiny model and task")
    assets = make_tiny(out / "assets", seed=cfg.seed)
    console.print(f"tiny Qwen3 ({assets.manifest['num_parameters']:,} parameters) and single-digit addition: "
                  f"{assets.manifest['num_train']} train / {assets.manifest['num_eval']} eval prompts, "
                  f"reward --rm-type {assets.manifest['rm_type']}")
    phase_s["assets"] = time.perf_counter() - start

    from slime_ref.arguments import parse_args
    from slime_ref.console import RunDisplay, quiet_library_logs
    from slime_ref.ray.placement import init_ray

    quiet_library_logs(str(out))
    import ray

    from slime_ref.utils import reaper

    started_ray = init_ray(min_cpus=4, object_store_mb=1024, temp_dir=str(out / "ray"))
    guardian = reaper.start() if started_ray else None  # stops the run's processes if this one is killed
    try:
        with InterruptLatch() as latch:
            # 3. warm-up
            from slime_ref.train import train

            start = time.perf_counter()
            console.rule("[bold]3/5  supervised warm-up (--loss-type sft_loss)")
            args = parse_args(warmup_argv(cfg, assets, out))
            with RunDisplay(console, args.num_rollout, "warm-up") as display:
                train(args, progress=latch.guard(display))
            phase_s["warmup"] = time.perf_counter() - start

            # 4. GRPO
            start = time.perf_counter()
            console.rule("[bold]4/5  GRPO: engines behind sglang-router, Megatron actor, weight sync")
            args = parse_args(grpo_argv(cfg, assets, out))
            with RunDisplay(console, args.num_rollout, "GRPO") as display:
                grpo = train(args, progress=latch.guard(display))
            phase_s["grpo"] = time.perf_counter() - start
            grpo_args = args
    finally:
        if started_ray:
            ray.shutdown()
        if guardian is not None:
            reaper.stop(guardian)

    # 5. summary
    from slime_ref.plot import plot_run

    console.rule("[bold]5/5  summary")
    plot = plot_run(out / "grpo", out / "reward.png", warmup_dir=out / "warmup")
    steps = next_steps(out, assets)
    summary = {
        "reward_before": grpo["reward_before"],
        "reward_after": grpo["reward_after"],
        "reward_gain": (grpo["reward_after"] - grpo["reward_before"])
        if grpo["reward_before"] is not None and grpo["reward_after"] is not None else None,
        "eval": grpo["eval"],
        "wall_s": time.perf_counter() - wall_start,
        "phase_s": {**phase_s, **{f"grpo/{k}": v for k, v in grpo["phase_s"].items()}},
        "checks": [f.to_dict() for f in findings],
        "outputs": {"assets": str(assets.root), "warmup": str(out / "warmup"), "grpo": str(out / "grpo"),
                    "plot": str(plot), "metrics": str(out / "grpo" / "metrics.jsonl"),
                    "trained_model_hf": grpo_args.save_hf, "checkpoint": grpo_args.save},
        "config": {k: v for k, v in vars(cfg).items() if k != "extra"},
        # slime's --sglang-enable-deterministic-inference: the same seed gives the same numbers
        "repeatable": True,
        "next_steps": [command for command, _ in steps],
    }
    atomic_write_json(out / "summary.json", summary)

    table = Table(title="slime-check quickstart", show_header=False)
    table.add_row("eval reward (held-out prompts)",
                  f"before training {summary['reward_before']:.3f} -> after {cfg.num_rollout} rollouts "
                  f"{summary['reward_after']:.3f} ({summary['reward_gain']:+.3f})")
    table.add_row("wall time", f"{summary['wall_s']:.0f} s")
    for key in ("checks", "assets", "warmup", "grpo"):
        table.add_row(f"  {key}", f"{phase_s.get(key, 0.0):.1f} s")
    for key in ("rollout", "train", "update_weights", "eval", "setup"):
        if key in grpo["phase_s"]:
            table.add_row(f"    grpo {key}", f"{grpo['phase_s'][key]:.1f} s")
    table.add_row("reward plot", str(plot))
    table.add_row("trained model (HF)", grpo_args.save_hf)
    table.add_row("summary", str(out / "summary.json"))
    table.add_row("repeatable", f"--seed {cfg.seed} again gives the same numbers (timings aside)")
    console.print(table)
    console.print("Next steps, from this directory (each command runs as printed):", highlight=False)
    for command, what in steps:
        console.print(f"  {command}", markup=False, highlight=False, soft_wrap=True)
        console.print(f"      {what}", markup=False, highlight=False, style="dim")
    console.print(TOWARD_SLIME, markup=False, highlight=False)
    return summary


@click.command("quickstart")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("slime-quickstart"),
              show_default=True, help="Everything the run writes goes under this directory.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the assets, data order and model.")
@click.option("--num-rollout", type=click.IntRange(1), default=None, help="GRPO rollouts (default: the tuned recipe).")
@click.option("--force", is_flag=True, help="Run even if a check FAILs.")
def quickstart(out: Path, seed: int, num_rollout: int | None, force: bool) -> None:
    """Checks, then a small, safe GRPO run on an embedded tiny model, end to end.

    \b
    It builds a tiny Qwen3 and an arithmetic task offline, warms the model up with a few
    supervised steps, then trains it with GRPO on the real stack (Ray, sglang-router, engines,
    Megatron actor, weight sync) and reports the held-out reward before and after. It writes only
    under --out, uses free loopback ports, and stops exactly the processes it started.
    Results: OUT/summary.json (reward_before, reward_after, wall_s, phase_s, next_steps),
    OUT/reward.png, the trained model OUT/grpo/hf (HF) and OUT/grpo/checkpoint (Megatron).
    The same --seed gives the same numbers (slime's --sglang-enable-deterministic-inference).
    """
    from slime_rehearse.cli import _console

    cfg = QuickstartConfig(seed=seed)
    if num_rollout is not None:
        cfg.num_rollout = num_rollout
        cfg.eval_interval = max(1, min(cfg.eval_interval, num_rollout))
    run_quickstart(out.resolve(), cfg, force, _console())  # piped: 200 columns, as prereqs and config
