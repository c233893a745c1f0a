"""The verdict of a memory-faithful ``slime-check smoke`` (``--memory``): each GPU's measured peak per
phase beside ``slime-check plan``'s prediction for the job, and an out-of-memory error named by the
phase that ran out and by how much.

Measured: NVML's used memory of the card less what was in use before the run (``gpu_memory``), so the
figure is what the run took: every process, CUDA context, NCCL buffer and allocator cache included.
Predicted: ``plan`` on the job's own flags, on a card of the measured size. The phases line up as
the run shows them (``gpu_memory.read_timeline``): the rollout (the generate calls) against plan's
rollout; training (the log-prob passes and the optimizer steps) against the larger of plan's training
and log-prob phases; the weight update, where the run times it, against plan's; the whole run against
plan's peak. The switches between rollout and training are measured and shown, not predicted.
"""

from __future__ import annotations

import math
from pathlib import Path

from slime_check.findings import Finding, Status
from slime_rehearse.gpu_memory import (
    BETWEEN,
    GIB,
    ROLLOUT,
    STARTUP,
    TRAIN,
    WEIGHTS,
    OutOfMemory,
    coarse_trace,
    find_oom,
    peak_time,
    phase_peaks,
    process_peaks,
    read_timeline,
)
from slime_rehearse.smoke_verdict import flat

DOC = "skill/references/memory-sizing.md"
AGREEMENT = 0.10  # plan is held to the measured peak within 10%
MIB = 2**20


def card_for(total_bytes: int):
    """plan's card for an NVML total (bytes)."""
    from slime_check.plan_inputs import card_for_smi

    return card_for_smi(total_bytes // MIB, "NVML")


def adam_kernel(engine: str) -> str:
    """plan's ``--adam-kernel`` for the job run here: slime's Megatron takes TransformerEngine's FusedAdam,
    else Apex's, else torch's AdamW ("torch"); slime-ref runs torch's fused kernel on CUDA ("fused")."""
    from importlib import metadata

    if engine == "slime-ref":
        return "fused"
    names = {(d.metadata["Name"] or "").lower().replace("_", "-") for d in metadata.distributions()}
    fused = "apex" in names or any(n.startswith("transformer-engine") for n in names)
    return "fused" if fused else "torch"


def predicted(argv: list[str], reg, target: str | None, card, engine: str = "slime", kernel: str | None = None,
              sample_tokens: int | None = None) -> dict:
    """plan's per-phase peaks (bytes) for the job's argv on ``card``: {"rollout", "train", "peak", ...}.

    plan describes slime. slime-ref keeps the trainer's weights, gradients and optimizer state on the
    GPU while colocated engines generate (reference_impl/ARCHITECTURE.md, "where slime-ref differs"),
    so for ``engine="slime-ref"`` those bytes are added to the rollout in place of plan's sleeping
    trainer. ``kernel``: plan's ``--adam-kernel`` (default: this machine's, :func:`adam_kernel`).
    ``sample_tokens``: the run's samples, all this long (prompt + forced full-length answer): plan is
    made for the micro-batches they pack into, what the run measured; the job's worst case (samples
    of mixed lengths filling ``--max-tokens-per-gpu``) is kept beside it as ``job_train``."""
    from slime_check import plan as P
    from slime_check.launch_script import Origin, Word
    from slime_check.plan_inputs import plan_argv
    from slime_check.plan_report import findings as plan_findings

    words = [Word([a], Origin("argv", i + 1)) for i, a in enumerate(argv)]
    kernel = kernel or adam_kernel(engine)
    planned = plan_argv(words, reg, target, "the job", card, None, None, kernel)
    plan = planned.plan
    if sample_tokens and plan.job.trains:
        plan = P.make_plan(P.with_train(plan.job, sample_tokens=int(sample_tokens)))
    gpu_phases = [p for p in plan.phases if p.where != "host per node"]
    rollout = [p for p in gpu_phases if p.name.startswith("rollout")]
    weights = [p for p in gpu_phases if p.name.startswith("weight update")]
    train = [p for p in gpu_phases if p not in rollout and p not in weights]  # the steps and log-prob passes
    out = {"card": card.name, "colocate": plan.job.colocate, "adam_kernel": kernel,
           "phases": {p.name: int(p.total) for p in gpu_phases},
           "train": int(max(p.total for p in train)) if train else None,
           "train_phase": max(train, key=lambda p: p.total).name if train else None,
           "rollout": int(rollout[0].total) if rollout else None,
           "weights": int(max(p.total for p in weights)) if weights else None}
    if plan.job.trains:
        out["micro_batch_tokens"] = P.micro_batch_tokens(plan.job.train, plan.job.par)
    if plan is not planned.plan:
        out["sample_tokens"] = int(sample_tokens)
        out["job_train"] = int(max(p.total for p in P.training_phases(planned.plan)))
    if engine == "slime-ref" and plan.job.colocate and rollout:
        state = sum(i.bytes for i in train_phase_items(gpu_phases) if i.label.startswith(TRAIN_STATE))
        asleep = sum(i.bytes for i in rollout[0].items if i.label.startswith("trainer asleep"))
        out["rollout"] = int(out["rollout"] + state - asleep)
        out["weights"] = None  # its update runs beside that state too: plan's figure (slime's) does not apply
        out["note"] = "slime-ref: the training state stays on the GPU during the rollout and the weight update"
    out["peak"] = max(v for v in (out["train"], out["rollout"], out["weights"]) if v is not None)
    # the knob plan names for each GPU phase (its fix where a phase is near or over the card)
    out["fixes"] = {f.id: f.fix for f in plan_findings(planned) if f.fix and f.id in (
        "plan.train_memory", "plan.rollout_memory", "plan.colocated")}
    return out


TRAIN_STATE = ("actor weights", "actor gradients", "actor optimizer", "critic weights", "critic gradients",
               "critic optimizer")


def train_phase_items(phases) -> list:
    """The items of plan's first training phase (where the state's bytes are listed)."""
    return next((p.items for p in phases if "training step" in p.name), [])


def oom_fix(oom: OutOfMemory, plan: dict | None) -> str:
    """plan's knob for the phase that ran out."""
    fixes = (plan or {}).get("fixes", {})
    rollout_side = "SGLang" in oom.phase or "rollout (" in oom.phase
    first = ["plan.rollout_memory", "plan.colocated"] if rollout_side else ["plan.train_memory", "plan.colocated"]
    return next((fixes[k] for k in first if fixes.get(k)), "")


# the untimed rest of a job that does not colocate: no switches there, only the seconds around its windows
OUTSIDE = "outside the timed phases"


def busiest(gpus: list[dict]) -> dict:
    return max(gpus, key=lambda g: g["peak_bytes"] - g["baseline_bytes"])


def not_reached(gpus: list[dict], plan: dict | None, rolled_out: bool = False) -> list[str]:
    """The phases plan predicts that the run never got to (it stopped, or ran out of time, before them).
    ``rolled_out``: the run logged a rollout's metrics (a rollout function of the job's own that calls
    SGLang directly leaves no generate window, though it ran)."""
    if not gpus or not plan:
        return []
    phases = busiest(gpus)["phases"]
    return [what for what, key in ((ROLLOUT, "rollout"), (TRAIN, "train"))
            if plan.get(key) and what not in phases and not (what == ROLLOUT and rolled_out)]


def compare(gpus: list[dict], plan: dict | None, rolled_out: bool = False) -> list[dict]:
    """Rows of (what, measured bytes, predicted bytes, relative error) for the busiest GPU. The whole run's
    peak is set beside plan's only when the run reached every phase plan predicts: a run stopped at
    start-up has not met the peak plan names."""
    if not gpus:
        return []
    gpu = busiest(gpus)
    base = gpu["baseline_bytes"]
    rows = []
    pairs = [("peak", gpu["peak_bytes"], None if not_reached(gpus, plan, rolled_out) else plan and plan.get("peak")),
             (ROLLOUT, gpu["phases"].get(ROLLOUT), plan and plan.get("rollout")),
             (TRAIN, gpu["phases"].get(TRAIN), plan and plan.get("train")),
             (WEIGHTS, gpu["phases"].get(WEIGHTS), plan and plan.get("weights")),
             (BETWEEN if not plan or plan.get("colocate", True) else OUTSIDE, gpu["phases"].get(BETWEEN), None),
             (STARTUP, gpu["phases"].get(STARTUP), None)]
    for what, used, want in pairs:
        if used is None:
            continue
        took = max(0, used - base)
        rows.append({"what": what, "gpu": gpu["gpu"], "measured_bytes": took, "predicted_bytes": want,
                     "error": (want - took) / took if want and took else None})
    return rows


def memory_findings(gpus: list[dict], plan: dict | None, oom: OutOfMemory | None, response_length: list,
                    cap: int | None, fix: str = "") -> list[Finding]:
    out = []
    if oom is not None:
        short = oom.short_by
        numbers = ""
        if oom.requested is not None:
            numbers = (f": it asked for {oom.requested / GIB:.2f} GiB with {oom.free / GIB:.2f} GiB free on GPU "
                       f"{oom.gpu}, {short / GIB:.2f} GiB short")
        if oom.others:  # colocated: what the other side kept (an engine that did not release its pool, say)
            held = ", ".join(f"pid {pid} {n / GIB:.2f} GiB" for pid, n in oom.others)
            mine = f", the process that ran out {oom.this_process / GIB:.2f} GiB" if oom.this_process else ""
            numbers += f"; other processes on the GPU held {held}{mine}"
        out.append(Finding("smoke.memory.oom", Status.FAIL, f"The job ran out of GPU memory in {oom.phase}{numbers}. "
                           f"The full run would stop there at its first step ({oom.line})",
                           fix or "Run `slime-check plan` on the script and turn the knob it names for that phase.",
                           DOC))
    if not gpus:
        if oom is None:
            out.append(Finding("smoke.memory", Status.WARN, "no GPU memory was read (NVML not found): the peak was "
                               "not measured.", "Run the memory-faithful smoke on the GPU machine.", DOC))
        return out
    lengths = [x for x in response_length if x is not None]
    rolled_out = bool(response_length)  # a rollout logged its metrics
    rows = compare(gpus, plan, rolled_out)
    if oom is None and rows:
        peak = rows[0]
        total = next(g["total_bytes"] for g in gpus if g["gpu"] == peak["gpu"])
        parts = [f"{r['what']} {r['measured_bytes'] / GIB:.2f} GiB"
                 + (f" (plan {r['predicted_bytes'] / GIB:.2f}, {r['error']:+.0%})" if r["error"] is not None else "")
                 for r in rows]
        missing = not_reached(gpus, plan, rolled_out)
        near_full = peak["measured_bytes"] > 0.9 * total
        status = Status.WARN if near_full or missing else Status.PASS
        stopped = ""
        if missing:
            stopped = (f" The run stopped before {' and '.join('the ' + m for m in missing)}: the peak plan predicts "
                       f"({plan['peak'] / GIB:.2f} GiB) was not reached, so it is not measured.")
            fix = "See smoke.run; raise --timeout if the run was still starting up."
        elif near_full:
            fix = ("Within 10% of the card: a longer prompt or a fragmented allocator can tip it over; see "
                   "`slime-check plan` for the knob.")
        else:
            fix = ""
        packed = ""
        if plan and plan.get("sample_tokens"):
            packed = (f" plan's training figure is for this run's micro-batches of {plan['micro_batch_tokens']} "
                      f"tokens (samples of {plan['sample_tokens']}); the job's worst, samples of mixed lengths "
                      f"filling --max-tokens-per-gpu: {plan['job_train'] / GIB:.2f} GiB.")
        out.append(Finding("smoke.memory", status, f"GPU {peak['gpu']} of {total / GIB:.1f} GiB, taken by the run: "
                           + "; ".join(parts) + "." + stopped + packed, fix, DOC))
        off = [r for r in rows if r["error"] is not None and abs(r["error"]) > AGREEMENT]
        if off:
            out.append(Finding("smoke.memory.plan", Status.WARN, "plan's prediction is off by more than 10%: "
                               + "; ".join(f"{r['what']} {r['error']:+.0%}" for r in off) + ".",
                               "Trust the measured figure; report the job's flags so plan's estimate can be "
                               "corrected.", DOC))
    if cap and lengths and min(lengths) < 0.95 * cap:
        out.append(Finding("smoke.memory.length", Status.WARN, f"answers averaged {min(lengths):.0f} of the "
                           f"{cap} tokens --rollout-max-response-len allows: the peak was measured on shorter "
                           "sequences than the job's worst case.",
                           "A custom generate function that builds its own sampling parameters is not forced "
                           "to full length; pass sampling_params through to SGLang.", DOC))
    return out


def sample_tokens(metrics: list[dict]) -> int | None:
    """The run's samples' length, prompt + answer (slime's ``rollout/total_lengths``, the trainer's mean
    over a step's samples: with every answer forced to full length, prompts alone vary); None where
    the engine logs no such figure."""
    means = [flat(r)["rollout/total_lengths"] for r in metrics if "rollout/total_lengths" in flat(r)]
    return math.ceil(max(means)) if means else None


def memory_verdict(job, opts, out: Path, trace, log: str, metrics: list[dict], shrunk) -> tuple[dict, list[Finding]]:
    """The memory-faithful run's peaks per GPU and phase, plan's prediction beside them, and an OOM.
    ``trace``: the sampler's (None where NVML is absent); ``job``/``shrunk``/``opts``: smoke_job's."""
    timeline = read_timeline(out, log)
    gpus = phase_peaks(trace, timeline) if trace and trace.times else []
    plan, plan_error = None, None
    if gpus:
        try:
            plan = predicted(job.argv, opts.registry, opts.target, card_for(gpus[0]["total_bytes"]), opts.engine,
                             sample_tokens=sample_tokens(metrics))
        except Exception as e:  # a job plan cannot read still gets its measurement
            plan_error = f"{type(e).__name__}: {e}"
    oom = find_oom(log, timeline, peak_time(trace) if trace else None)
    # every rollout that logged its lengths: with --debug-rollout-only slime logs no rewards
    lengths = [flat(r)["rollout/response_length"] for r in metrics if "rollout/response_length" in flat(r)]
    notes = memory_findings(gpus, plan, oom, lengths, shrunk.user_max_len, oom_fix(oom, plan) if oom else "")
    report = {"gpus": gpus, "predicted": plan or ({"error": plan_error} if plan_error else None),
              "compared": compare(gpus, plan, bool(lengths)), "timeline": vars(timeline),
              "processes": process_peaks(trace, timeline) if trace else [],
              "trace": coarse_trace(trace) if trace and trace.times else None,
              "oom": None if oom is None else {**vars(oom), "short_by": oom.short_by}}
    return report, notes
