"""Will it fit, measured: `slime-check smoke --memory` on one GPU for Qwen3-shaped jobs, each GPU's
measured peak beside `slime-check plan`'s prediction. One JSON per process, and a summary.

    python bench/gpu/memory_fit.py --configs q06-1k-8k q06-1k-16k --engine slime-ref --out $OUT
    python bench/gpu/memory_fit.py --configs q17-1k-8k-rc --engine slime --out $OUT   # after install_slime_set.sh
    python bench/gpu/memory_fit.py --configs q06-1k-8k-split --side engines --engine slime --out $OUT  # then trainer

Each configuration is a GRPO job on one GPU (the skill's small template's flags), colocated except a
-split one, whose engines and trainer are measured one at a time (--side; a trainer's process trains
on the samples of the engines' process of its index, else of the first on the machine, so
`--side trainer --first-index 2 --repeat 2` needs one engines call), with random bf16 weights
of the named Qwen3 shape, built here by bench/shaped_model.py. The smoke forces every answer to
--rollout-max-response-len and trains on enough samples to fill the job's largest micro-batch, two
rollouts and two steps (the second is the first to train beside Adam's moments: runs before
2026-12-07 made one, whose backward lacked them), so the measured peak is the job's steady one.
plan is made for the micro-batches those equal samples pack into (``smoke_memory.predicted``'s
``sample_tokens``). A configuration whose name ends in ``-oom`` is built
to run out of memory: plan must FAIL it and the smoke must name the phase.

Environment: SLIME_DIR and MEGATRON_DIR for --engine slime (bench/gpu/install_slime_set.sh's env.sh),
SLIME_REF_PYTHONPATH (megatron-core for slime-ref) for --engine slime-ref.
Afterwards, here: python bench/gpu/memory_fit.py --summarize $OUT/memory-fit-*.json, and to keep them
python bench/gpu/memory_fit.py --merge bench/results/memory-fit-CARD-DATE.json $OUT/memory-fit-*.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "reference_impl") not in sys.path:
    sys.path.insert(0, str(REPO / "reference_impl"))

from slime_rehearse.gpu_memory import TRAIN  # noqa: E402  (the smoke's name for the training phase)

# slime's scripts/models/qwen3-*.sh, without the shape numbers (added per shape below)
QWEN3_FLAGS = ["--swiglu", "--group-query-attention", "--num-query-groups", "8", "--use-rotary-position-embeddings",
               "--disable-bias-linear", "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--rotary-base",
               "1000000", "--vocab-size", "151936", "--kv-channels", "128", "--qk-layernorm"]
SHAPES = {  # shape name: (layers, hidden, ffn, heads)
    "qwen3-0.6B": (28, 1024, 3072, 16),
    "qwen3-1.7B": (28, 2048, 6144, 16),
    "qwen3-4B": (36, 2560, 9728, 32),
}
# name: (shape, response length, --max-tokens-per-gpu, recompute, --sglang-mem-fraction-static)
# Together: three shapes, 1k and 8k responses, max-tokens 4096 to 16384, recompute on and off. On an 80 GB
# card the 4B jobs are for real slime: slime-ref keeps the trainer's state (67 GiB for 4B with Adam) on
# the GPU beside the pool while it generates. The offline set's Adam is torch's AdamW (no TransformerEngine
# or Apex), whose update takes 4 more bytes a parameter: q4-1k-4k-rc then needs 83.4 GiB, an H200.
CONFIGS = {
    "q06-1k-8k": ("qwen3-0.6B", 1024, 8192, False, 0.7),
    "q06-1k-16k": ("qwen3-0.6B", 1024, 16384, False, 0.7),
    "q06-8k-16k-rc": ("qwen3-0.6B", 8192, 16384, True, 0.7),
    "q17-1k-8k-rc": ("qwen3-1.7B", 1024, 8192, True, 0.5),
    "q4-1k-4k-rc": ("qwen3-4B", 1024, 4096, True, 0.3),
    "q4-1k-64k-oom": ("qwen3-4B", 1024, 65536, False, 0.7),
    # not colocated: the engines and the trainer each have a GPU of their own. One GPU measures one side
    # at a time, as slime runs them: --side engines (--debug-rollout-only, which saves its samples), then
    # --side trainer on the same machine (--load-debug-rollout-data: those full-length samples)
    "q06-1k-8k-split": ("qwen3-0.6B", 1024, 8192, False, 0.7),
}
SIDES = ("engines", "trainer")
# What the GPU machine's offline set needs (bench/README.md): no TransformerEngine, triton attention;
# and decode CUDA graphs up to batch 32 (a cold capture of SGLang's default 36 sizes takes 71 s; plan
# counts the graphs the flag asks for).
SET_FLAGS = ["--sglang-cuda-graph-max-bs", "32",
             "--transformer-impl", "local", "--spec", "te_named_local_spec", "te_named_local_spec",
             "--no-rope-fusion", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
             "--no-persist-layer-norm", "--sglang-attention-backend", "triton", "--sglang-sampling-backend",
             "pytorch", "--sglang-grammar-backend", "none"]


def side_flags(name: str, side: str | None, saved: Path | None) -> list[str]:
    """Where the job's GPUs go: colocated on one, or (a -split configuration) one side of two."""
    if not name.endswith("-split"):
        return ["--colocate"]
    if side == "engines":  # the smoke keeps the samples under its OUT/writes/ (``saved_samples``)
        return ["--rollout-num-gpus", "1", "--debug-rollout-only", "--save-debug-rollout-data", "/x/{rollout_id}.pt"]
    if side != "trainer" or saved is None:
        raise ValueError(f"{name} runs one side at a time: side engines, or trainer with the engines' samples")
    return ["--rollout-num-gpus", "1", "--load-debug-rollout-data", str(saved)]


def smoke_dir(work: Path, name: str, side: str | None, engine: str, index: int) -> Path:
    return work / f"smoke-{name}{'-' + side if side else ''}-{engine}-{index}"


def engines_samples(work: Path, name: str, engine: str, index: int) -> Path | None:
    """The samples a trainer process trains on: those of the engines' process of its own index, else of
    the first engines' process on this machine (the same full-length samples: a trainer's repeats need
    no new rollout)."""
    own = saved_samples(smoke_dir(work, name, "engines", engine, index))
    if own.parent.is_dir():
        return own
    others = sorted(work.glob(smoke_dir(work, name, "engines", engine, 0).name.rsplit("-", 1)[0] + "-*"),
                    key=lambda p: int(p.name.rsplit("-", 1)[1]))
    return next((saved_samples(p) for p in others if saved_samples(p).parent.is_dir()), None)


def saved_samples(smoke_out: Path) -> Path:
    return smoke_out / "writes" / "save-debug-rollout-data" / "{rollout_id}.pt"


def job_argv(name: str, model: Path, data: Path, side: str | None = None, saved: Path | None = None) -> list[str]:
    shape, response, max_tokens, recompute, fraction = CONFIGS[name]
    layers, hidden, ffn, heads = SHAPES[shape]
    return [
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", *side_flags(name, side, saved),
        "--num-gpus-per-node", "1",
        "--num-layers", str(layers), "--hidden-size", str(hidden), "--ffn-hidden-size", str(ffn),
        "--num-attention-heads", str(heads), *QWEN3_FLAGS,
        "--hf-checkpoint", str(model), "--ref-load", str(model),
        "--prompt-data", str(data), "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
        "--rm-type", "deepscaler", "--num-rollout", "100", "--rollout-batch-size", "8",
        "--n-samples-per-prompt", "8", "--global-batch-size", "64", "--rollout-max-response-len", str(response),
        "--rollout-max-prompt-len", "256", "--rollout-temperature", "1",
        "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1", "--context-parallel-size", "1",
        "--use-dynamic-batch-size", "--max-tokens-per-gpu", str(max_tokens),
        *(["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
          if recompute else []),
        "--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", "0.00", "--kl-loss-type", "low_var_kl",
        "--entropy-coef", "0.00", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
        "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.1",
        "--adam-beta1", "0.9", "--adam-beta2", "0.98",
        "--rollout-num-gpus-per-engine", "1", "--sglang-mem-fraction-static", str(fraction),
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
        "--attention-softmax-in-fp32", "--attention-backend", "flash", *SET_FLAGS,
    ]


def build_model(work: Path, shape: str) -> tuple[Path, Path]:
    """(the checkpoint, the prompts) for ``shape``, built once per machine."""
    out = work / shape
    info = work / f"{shape}.json"
    if not info.is_file():
        done = subprocess.run([sys.executable, str(REPO / "bench" / "shaped_model.py"), "--shape", shape, "--out",
                               str(out), "--tiny", str(work / "tiny")], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": f"{REPO / 'reference_impl'}:{REPO / 'bench'}"})
        if done.returncode != 0:
            raise SystemExit(f"building {shape} failed:\n{done.stderr[-2000:]}")
        info.write_text(done.stdout.strip().splitlines()[-1])
    built = json.loads(info.read_text())
    return Path(built["model"]), Path(built["train_data"])


def run_one(name: str, engine: str, work: Path, out: Path, index: int, timeout_s: float,
            extra: list[str] = (), side: str | None = None) -> dict:
    label = f"{name}-{side}" if side else name
    smoke_out = smoke_dir(work, name, side, engine, index)
    saved = engines_samples(work, name, engine, index) if side == "trainer" else None
    if side == "trainer" and saved is None:
        raise SystemExit(f"memory_fit.py: --side trainer trains on the samples --side engines saved "
                         f"(none under {work}): run --configs {name} --side engines --first-index {index} "
                         "on this machine first")
    shape = CONFIGS[name][0]
    model, data = build_model(work, shape)
    env = dict(os.environ, PYTHONPATH=str(REPO / "reference_impl"), PYTHONUNBUFFERED="1")
    extra_path = [str(REPO / "bench" / "gpu")]
    cmd = [sys.executable, "-m", "slime_rehearse.cli", "smoke", "--memory", "--with", engine, "--rollouts", "2",
           "--timeout", str(timeout_s), "--out", str(smoke_out), "--force", "--json"]
    if engine == "slime":
        cmd += ["--slime-dir", os.environ["SLIME_DIR"]]
        extra_path.insert(0, os.environ["MEGATRON_DIR"])
    elif os.environ.get("SLIME_REF_PYTHONPATH"):
        extra_path.insert(0, os.environ["SLIME_REF_PYTHONPATH"])
    cmd += ["--env", "PYTHONPATH=" + ":".join(extra_path), "--env", "CUDA_DEVICE_MAX_CONNECTIONS=1",
            "--", *job_argv(name, model, data, side, saved), *extra]
    t0 = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s + 120)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        report = {"stdout_tail": done.stdout[-3000:], "stderr_tail": done.stderr[-3000:]}
    result = {"config": name, "side": side, "engine": engine, "process": index, "returncode": done.returncode,
              "extra_flags": list(extra), "trained_on": str(saved.parents[2]) if saved else None,  # the engines' smoke
              "wall_s": round(time.time() - t0, 1), "shape": shape,
              "response_len": CONFIGS[name][1], "max_tokens_per_gpu": CONFIGS[name][2],
              "recompute": CONFIGS[name][3], "mem_fraction": CONFIGS[name][4], "colocate": side is None,
              "card": (((report.get("run") or {}).get("memory") or {}).get("predicted") or {}).get("card"),
              "memory": (report.get("run") or {}).get("memory"),
              # the memory findings, and whatever did not pass (what made the smoke's exit status)
              "findings": [f for f in report.get("findings", []) if f.get("id", "").startswith(("smoke.memory",
                           "smoke.run")) or f.get("status") not in ("PASS", "SKIP")],
              "response_length": (report.get("run") or {}).get("response_length"), "rollouts": 2,
              # where the smoke's seconds went: its checks, its assets, the run (Ray's head, slime's start-up)
              "phase_s": (report.get("run") or {}).get("phase_s")}
    if "stdout_tail" in report:
        result["raw"] = report
    log = smoke_out / "smoke.log"
    if log.is_file():  # beside the JSON: the timer lines and tracebacks the phases and an OOM come from
        with gzip.open(out / f"smoke-{label}-{engine}-{index}.log.gz", "wb") as f:
            f.write(log.read_bytes())
    (out / f"memory-fit-{label}-{engine}-{index}.json").write_text(json.dumps(result, indent=1))
    return result


def replan(run: dict, kernel: str = "torch") -> dict:
    """plan's prediction for a measured run (one JSON of this script), made again by the plan of this
    checkout: the run's configuration on the run's card (its NVML total), its samples' length
    (``sample_tokens``, from its log) and Adam kernel (the offline set has neither TransformerEngine
    nor Apex: torch's AdamW)."""
    from slime_common.registry import load_registry
    from slime_rehearse.smoke_memory import card_for, predicted

    saved = Path("/saved/{rollout_id}.pt") if run.get("side") == "trainer" else None
    argv = job_argv(run["config"], Path("/model"), Path("/prompts.jsonl"), run.get("side"), saved)
    card = card_for(run["memory"]["gpus"][0]["total_bytes"])
    return predicted(argv, load_registry("v0.3.1"), "v0.3.1", card, run["engine"], kernel, _sample_tokens(run))


def _sample_tokens(run: dict) -> int | None:
    """The run's samples' length: set on the stored runs of before 2026-12-07, else the smoke's prediction's."""
    return run.get("sample_tokens") or (((run.get("memory") or {}).get("predicted") or {}).get("sample_tokens"))


def _gib(n: float) -> float:
    return round(n / 2**30, 2)


def replanned(row: dict, runs: list[dict]) -> dict | None:
    """A summary row's prediction by this checkout's plan (``replan`` of the group's first run that knows
    its samples' length), beside the row's measured medians: what ``bench/results`` keeps as
    ``replanned`` so that a later plan's error is read against the same measurements."""
    first = next((r for r in runs if _sample_tokens(r)), runs[0])
    if not (first.get("memory") or {}).get("gpus"):
        return None
    plan = replan(first)
    out = {"micro_batch_tokens": plan.get("micro_batch_tokens"), "train_phase": plan.get("train_phase")}
    for what, key in (("peak", "peak"), (TRAIN, "train"), ("rollout", "rollout")):
        if what in row and plan.get(key):
            measured = row[what]["measured_gib"]
            out[what] = {"predicted_gib": _gib(plan[key]), "error": round((_gib(plan[key]) - measured) / measured, 3)}
    if plan.get("job_train"):
        out["job_worst_train_gib"] = _gib(plan["job_train"])
    return out


def made_two_steps(run: dict) -> bool:
    """Whether a run trained a second step, the first beside Adam's moments (runs before 2026-12-07: one)."""
    return (run.get("rollouts") or 1) >= 2


def process_role(name: str) -> str:
    """A GPU process's part in a slime job, from its command line (Ray and SGLang title their processes)."""
    if "sglang" in name.lower():
        return "engine"
    return "trainer" if "Train" in name else "other"


def process_shares(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Per role (trainer, engine), the median over the runs of its largest share per phase (GiB), from the
    smoke's per-process readings (runs from 2026-12-07 on): a role asleep in a phase holds there what is no
    allocator's. A run with two processes of one role counts their sum."""
    per_run: list[dict[tuple[str, str], int]] = []
    for r in runs:
        sums: dict[tuple[str, str], int] = {}
        for proc in (r.get("memory") or {}).get("processes") or []:
            for phase, used in proc["phases"].items():
                key = (process_role(proc["name"]), phase)
                sums[key] = sums.get(key, 0) + used
        if sums:
            per_run.append(sums)
    shares: dict[str, dict[str, float]] = {}
    for role, phase in sorted({k for s in per_run for k in s}):
        shares.setdefault(role, {})[phase] = _gib(statistics.median(s[(role, phase)] for s in per_run
                                                                     if (role, phase) in s))
    return shares


def merge(results: Path, new: list[Path]) -> list[str]:
    """Add this script's run JSONs to a ``bench/results`` file: each run once (by configuration, side,
    process and card), its NVML trace left out (the smoke's log keeps the windows), and the file's
    ``summary`` made again from all its runs. Written atomically; returns a line per run."""
    from slime_common.fileio import atomic_write_text

    data = json.loads(results.read_text())

    def key(r: dict) -> tuple:
        return r["config"], r.get("side"), r["process"], r.get("card")

    have = {key(r) for r in data["runs"]}
    said = []
    for path in new:
        run = json.loads(path.read_text())
        if key(run) in have:
            said.append(f"{path.name}: already in {results.name}")
            continue
        if (run.get("memory") or {}).pop("trace", None) is not None:
            run["memory"]["trace_note"] = "the trace is left out here; the smoke's log: bench/results' run notes"
        data["runs"].append(run)
        have.add(key(run))
        said.append(f"{path.name}: added (exit {run['returncode']}, {run['wall_s']} s)")
    data["summary"] = summarize_runs(data["runs"])["rows"]
    atomic_write_text(results, json.dumps(data, indent=1) + "\n")
    return said


def summarize(paths: list[Path], with_replan: bool = True) -> dict:
    """``summarize_runs`` of the run JSONs at ``paths``."""
    return summarize_runs([json.loads(path.read_text()) for path in paths], with_replan)


def summarize_runs(measured: list[dict], with_replan: bool = True) -> dict:
    """Per configuration, engine and card: for the whole run and for each phase plan predicts (rollout,
    training, weight update), the median measured peak of its processes with the spread, plan's
    prediction at the run and the error; ``replanned``: the same made by this checkout's plan (runs that
    know their samples' length); ``process_shares_gib``: each process's share per phase (``process_shares``);
    an -oom configuration: whether the smoke named the phase that ran out."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for r in measured:
        label = r["config"] + (f" ({r['side']})" if r.get("side") else "")
        groups.setdefault((label, r["engine"], r.get("card") or "?"), []).append(r)
    rows = []
    for (name, engine, card), runs in sorted(groups.items()):
        if not any(c.get("predicted_bytes") for r in runs for c in (r.get("memory") or {}).get("compared") or []) \
                and not any((r.get("memory") or {}).get("oom") for r in runs):
            continue  # stopped before plan and before any OOM (a start that failed): kept in runs, not summarized
        row = {"config": name, "engine": engine, "card": card, "processes": len(runs), **{k: runs[0][k] for k in (
            "shape", "response_len", "max_tokens_per_gpu", "recompute", "mem_fraction", "colocate")}}
        compared = [{c["what"]: c for c in ((r.get("memory") or {}).get("compared") or [])} for r in runs]
        # training and the whole run's peak: the runs whose second step trained beside Adam's moments, where
        # there are any (a run of one step, before 2026-12-07, measured a backward without them)
        steady = [c for c, r in zip(compared, runs, strict=True) if made_two_steps(r)]
        for what in sorted({w for c in compared for w in c}, key=lambda w: (w != "peak", w)):
            which = steady if what in (TRAIN, "peak") and any(what in c for c in steady) else compared
            measured = [c[what]["measured_bytes"] for c in which if what in c]
            predicted = next((c[what]["predicted_bytes"] for c in which if what in c), None)
            med = statistics.median(measured)
            row[what] = {"processes": len(measured), "measured_gib": _gib(med),
                         "spread_gib": _gib(max(measured) - min(measured)),
                         "predicted_gib": _gib(predicted) if predicted else None,
                         "error": round((predicted - med) / med, 3) if predicted and med else None}
        oom = [(r.get("memory") or {}).get("oom") for r in runs]
        if any(oom):
            row["oom_phase"] = next(o["phase"] for o in oom if o)
            row["oom_short_by_gib"] = next((_gib(o["short_by"]) for o in oom if o and o.get("short_by")), None)
        if shares := process_shares(runs):
            row["process_shares_gib"] = shares
        if with_replan and (again := replanned(row, runs)):
            row["replanned"] = again
        rows.append(row)
    return {"rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=[])
    p.add_argument("--engine", choices=["slime-ref", "slime"], default="slime-ref")
    p.add_argument("--repeat", type=int, default=1, help="separate processes per configuration")
    p.add_argument("--first-index", type=int, default=1)
    p.add_argument("--work", type=Path, default=Path("/tmp/memory-fit"))
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    p.add_argument("--timeout", type=float, default=480,
                   help="seconds for each smoke (a real slime start: 3-5 min; 4B on a fresh machine, whose first "
                   "SGLang start compiles triton's kernels: about 6 min before its rollout)")
    p.add_argument("--extra-flags", default="", metavar="'FLAGS'",
                   help="more train.py flags for every job, e.g. '--sglang-cuda-graph-max-bs 16'")
    p.add_argument("--side", choices=SIDES, default=None,
                   help="for a -split configuration: the engines (first), or the trainer on their samples")
    p.add_argument("--summarize", nargs="+", type=Path, default=None, metavar="JSON")
    p.add_argument("--merge", nargs="+", type=Path, default=None, metavar=("RESULTS", "JSON"),
                   help="add run JSONs to a bench/results file and summarize it again: "
                   "--merge bench/results/memory-fit-h100-*.json OUT/memory-fit-*.json; the results file "
                   "alone: its summary made again (plan now) after a change to plan")
    a = p.parse_args()
    if a.summarize:
        print(json.dumps(summarize(a.summarize), indent=1))
        return
    if a.merge:
        results, *new = a.merge
        missing = [str(f) for f in a.merge if not f.is_file()]
        if missing:
            p.error(f"--merge: no file {', '.join(missing)}")
        print("\n".join(merge(results, new)) or f"{results.name}: summary made again by this checkout's plan")
        return
    split = [n for n in a.configs if n.endswith("-split")]
    if split and (a.side is None or len(split) < len(a.configs)):
        p.error(f"{', '.join(split)} runs one side at a time: give it alone, with --side engines (then trainer)")
    if a.side and not split:
        p.error("--side is for a -split configuration (one that does not colocate)")
    a.work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    for i in range(a.first_index, a.first_index + a.repeat):
        for name in a.configs:
            r = run_one(name, a.engine, a.work, a.out, i, a.timeout, a.extra_flags.split(), a.side)
            peak = next((c for c in ((r.get("memory") or {}).get("compared") or []) if c["what"] == "peak"), None)
            print(f"{name}{' ' + a.side if a.side else ''} {a.engine} #{i}: rc={r['returncode']} {r['wall_s']} s"
                  + (f" measured {peak['measured_bytes'] / 2**30:.2f} GiB plan "
                     f"{(peak['predicted_bytes'] or 0) / 2**30:.2f} GiB" if peak else "")
                  + (f" OOM in {r['memory']['oom']['phase']}" if (r.get("memory") or {}).get("oom") else ""),
                  flush=True)
            for role, phases in process_shares([r]).items():  # a role asleep in a phase: what no allocator holds
                print(f"  {role}: " + ", ".join(f"{phase} {gib:.2f}" for phase, gib in phases.items()) + " GiB",
                      flush=True)


if __name__ == "__main__":
    main()
