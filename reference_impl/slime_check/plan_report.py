"""``slime-check plan``'s report: the plan of one train invocation into findings, a table and JSON.

Each finding gives the verdict of a phase against the card, and where it does not pass, the knobs
that fix it with what each saves and costs (:func:`train_fixes`). The inputs are read in
:mod:`slime_check.plan_inputs`; the arithmetic lives in :mod:`slime_check.plan`. Nothing here
imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slime_check import plan as P
from slime_check import plan_job as J
from slime_check.findings import FAQ, QUICK_START, Finding, Status, slime_doc
from slime_check.plan_inputs import Planned

PERF_DOC = slime_doc(QUICK_START, "perf_args-performance-and-parallelism-parameters")
COLOCATE_DOC = slime_doc(QUICK_START, "colocated-actor-and-rollout")
FAQ_DOC = slime_doc(FAQ)


# ---------------------------------------------------------------------------------------------
# Findings: the verdict per phase, with the knob that fixes it and what that costs
# ---------------------------------------------------------------------------------------------


def _share(total: float, capacity: float) -> str:
    return f"{J.gib(total)} of {J.gib(capacity)} GiB ({100 * total / capacity:.0f}%)"


def _status(phase: J.Phase, capacity: float) -> Status:
    return Status(P.phase_verdict(phase, capacity))


def _cached_note(phase: J.Phase, capacity: float) -> str:
    if phase.total <= capacity or not phase.releasable:
        return ""
    return (f" Of that, {J.gib(phase.releasable)} GiB is the bf16 logits' freed block, which torch's allocator "
            "releases before it runs out: the step fits, with a cache flush each time.")


@dataclass
class Fix:
    job: J.Job
    flags: str  # what to write in the script
    what: str  # what it saves, after the saving in GiB
    cost: str
    rank: int  # cheaper knobs first


def _fix_candidates(job: J.Job, limit: float) -> list[Fix]:
    tr, par, shape = job.train, job.par, job.shape
    out = []
    floor = -(-tr.longest // par.cp)
    if tr.dynamic and tr.max_tokens:
        m = P.fitting_max_tokens(job, limit) or -(-floor // 1024) * 1024
        if m < tr.max_tokens:
            out.append(Fix(P.with_train(job, max_tokens=m), f"--max-tokens-per-gpu {m}", "activations and logits",
                           "more micro-batches per step, so slower steps", 0))
    elif tr.micro_batch > 1:
        out.append(Fix(P.with_train(job, micro_batch=1), "--micro-batch-size 1", "activations and logits",
                       "more micro-batches per step", 0))
    if tr.recompute != "full":
        out.append(Fix(P.with_train(job, recompute="full", recompute_method="uniform", recompute_layers=1),
                       "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
                       "activations", "one more forward per step (about a third more training time)", 1))
    elif (tr.recompute_layers or 1) > 1 or tr.recompute_method == "block":
        out.append(Fix(P.with_train(job, recompute_method="uniform", recompute_layers=1),
                       "--recompute-method uniform --recompute-num-layers 1", "activations",
                       "recomputation of every layer", 1))
    if tr.adam_kernel == "torch":
        from slime_check.prereqs_machine import PIN_TE

        out.append(Fix(P.with_train(job, adam_kernel="fused"),
                       f"pip install --no-build-isolation 'transformer_engine[pytorch]=={PIN_TE}'",
                       "Megatron's Adam becomes its FusedAdam, which updates in place: no sqrt of the moments",
                       "none: slime's image has it", 0))
    if not tr.cpu_adam:
        new = P.with_train(job, cpu_adam=True, cpu_adam_fraction=1.0, precision_aware=True)
        host = P.make_plan(new).host.total - P.make_plan(job).host.total
        out.append(Fix(new, "--optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer",
                       f"master weights and Adam moments, {J.gib(host)} GiB more host RAM per node",
                       "a slower optimizer step on the CPU", 2))
    if tr.longest > par.cp * (tr.max_tokens or 0) and par.world % (par.tp * par.pp * par.cp * 2) == 0:
        out.append(Fix(P.with_par(job, cp=par.cp * 2), f"--context-parallel-size {par.cp * 2}",
                       "each long sample split over more GPUs", "fewer data-parallel ranks, ring-attention traffic", 3))
    ep2 = par.ep * 2
    if shape.experts and shape.experts % ep2 == 0 and par.world % (ep2 * par.expert_tp * par.pp) == 0:
        out.append(Fix(P.with_par(job, ep=ep2), f"--expert-model-parallel-size {ep2}",
                       f"{shape.experts // ep2} experts a layer on each GPU",
                       "more all-to-all traffic between expert ranks", 3))
    tp2 = par.tp * 2
    if (par.world % (tp2 * par.pp * par.cp) == 0 and shape.heads % tp2 == 0 and shape.kv_heads % tp2 == 0
            and tp2 <= job.gpus_per_node):
        out.append(Fix(P.with_par(job, tp=tp2, sp=True), f"--tensor-model-parallel-size {tp2} --sequence-parallel",
                       "weights, activations and logits split further", "more communication in every layer", 3))
    return out


def train_fixes(job: J.Job, peak: float) -> list[str]:
    """Knobs that bring the training peak under 90% of the card, each with its saving and its cost.

    Single knobs that suffice, cheapest first; else the knobs that together do, largest saving first
    (a knob raised twice on the way is given once, at its last value)."""
    limit = P.WARN_FRACTION * job.card.usable

    def line(fix: Fix, before: float, after: float) -> str:
        return f"`{fix.flags}` → {J.gib(before - after)} GiB less ({fix.what}); {fix.cost}"

    options = [(f, P.peak_train(f.job)) for f in _fix_candidates(job, limit)]
    enough = sorted(((f, p) for f, p in options if p <= limit), key=lambda fp: fp[0].rank)
    if enough:
        return [line(f, peak, p) for f, p in enough[:3]]
    chain: dict[str, tuple[Fix, float, float]] = {}  # knob -> (fix, peak before it was first raised, after)
    current, current_peak = job, peak
    for _ in range(6):
        if current_peak <= limit:
            break
        candidates = [(f, P.peak_train(f.job)) for f in _fix_candidates(current, limit)]
        candidates = [(f, p) for f, p in candidates if p < current_peak - J.MIB]
        if not candidates:
            break
        fix, new_peak = min(candidates, key=lambda c: c[1])
        knob = fix.flags.split()[0]
        before = chain[knob][1] if knob in chain else current_peak
        chain[knob] = (fix, before, new_peak)
        current, current_peak = fix.job, new_peak
    if not chain:
        return []
    lines = [line(f, before, after) for f, before, after in chain.values()]
    verdict = "fits" if current_peak <= limit else "still does not fit: use more GPUs per model copy or a larger GPU"
    if len(lines) == 1:
        return [lines[0] + f": {J.gib(current_peak)} GiB, which {verdict}"]
    return lines + [f"all {len(lines)} together: {J.gib(current_peak)} GiB, which {verdict}"]


def _join(lines: list[str]) -> str:
    if len(lines) > 1 and lines[-1].startswith("all "):
        return "; then ".join(lines[:-1]) + "; " + lines[-1]
    return "; or ".join(lines)


def findings(planned: Planned) -> list[Finding]:
    plan, job = planned.plan, planned.plan.job
    card = job.card
    out = [_model_finding(planned)]
    if job.trains:
        train = max(P.training_phases(plan), key=lambda p: p.total)
        status = _status(train, card.usable)
        fix = "" if status is Status.PASS else _join(train_fixes(job, train.total))
        out.append(Finding("plan.train_memory", status,
                           f"Training peaks at {_share(train.total, card.usable)} per {card.name} in the {train.name}."
                           + _cached_note(train, card.usable),
                           fix or "Use more GPUs per model copy (TP, PP) or a larger GPU.", PERF_DOC))
    else:
        out.append(Finding("plan.train_memory", Status.SKIP, "--debug-rollout-only: no trainer is started."))
    if plan.engine is not None:
        out += _rollout_findings(plan)
    out.append(_host_finding(plan))
    return out


def _model_finding(planned: Planned) -> Finding:
    job = planned.plan.job
    shape = job.shape
    kind = f"MoE {shape.experts} experts top-{shape.topk}" if shape.experts else "dense"
    n = P.total_params(shape)
    count = f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"
    text = (f"Model from {planned.model_source}: {count} parameters ({kind}, "
            f"{shape.layers} layers, hidden {shape.hidden}, {shape.heads} heads / {shape.kv_heads} KV, "
            f"vocab {shape.vocab}); GPU {job.card.name} with {J.gib(job.card.usable)} GiB usable, "
            f"from {job.card.source}.")
    if planned.notes:
        text += " Assumed: " + "; ".join(note for note, _ in planned.notes) + "."
    if any(major for _, major in planned.notes):
        return Finding("plan.inputs", Status.WARN, text, "Give the model's config.json (--hf-checkpoint) or the "
                       "flags the notes name, so the shapes need no assumption.", PERF_DOC)
    return Finding("plan.inputs", Status.PASS, text)


def _rollout_findings(plan: P.Plan) -> list[Finding]:
    job, eng = plan.job, plan.engine
    card = job.card
    out = []
    rollout = next(p for p in plan.phases if p.name.startswith("rollout"))
    if eng.pool <= 0:
        need_mf = (eng.weights + J.GIB) / eng.pre
        out.append(Finding(
            "plan.rollout_memory", Status.FAIL,
            f"SGLang refuses to start: {eng.mem_fraction:g} x {J.gib(eng.pre)} GiB ({eng.mem_fraction_source}) "
            f"leaves no KV cache beside {J.gib(eng.weights)} GiB of weights per GPU.",
            f"`--sglang-mem-fraction-static {min(0.95, need_mf + 0.05):.2f}` or more (less room for the trainer when "
            f"colocated), or `--rollout-num-gpus-per-engine {eng.tp * 2}` (half the weights per GPU, half the "
            "engines).",
            COLOCATE_DOC))
        return out
    status = _status(rollout, card.usable)
    fix = ""
    if status is not Status.PASS:
        other = rollout.total - eng.static
        fit = (P.WARN_FRACTION * card.usable - other - (card.usable - eng.pre * 1)) / eng.pre
        fit = max(0.0, min(eng.mem_fraction - 0.01, math.floor(fit * 100) / 100))  # printed: 2 decimals, never up
        lost = (eng.mem_fraction - fit) * eng.pre
        fix = (f"`--sglang-mem-fraction-static {fit:.2f}` → {J.gib(lost)} GiB less KV cache per GPU "
               f"({int(lost // eng.kv_per_token):,} fewer tokens in flight per engine, so fewer concurrent requests)")
    out.append(Finding("plan.rollout_memory", status,
                       f"Rollout peaks at {_share(rollout.total, card.usable)} per GPU: SGLang claims "
                       f"{J.gib(eng.static)} GiB ({eng.mem_fraction:g} of the free memory, {eng.mem_fraction_source}) "
                       "plus its CUDA graphs and working set.", fix, COLOCATE_DOC))
    out.append(_kv_finding(plan))
    if job.colocate:
        shared = max((p for p in plan.phases if p.where == "shared GPU"), key=lambda p: p.total)
        status = _status(shared, card.usable)
        out.append(Finding("plan.colocated", status,
                           f"Colocated: the shared GPU peaks at {_share(shared.total, card.usable)} "
                           f"in the {shared.name} "
                           "(the other side asleep under torch_memory_saver, its context still there)."
                           + _cached_note(shared, card.usable),
                           "See the failing phase's fix above." if status is not Status.PASS else "", COLOCATE_DOC))
    return out


def _kv_finding(plan: P.Plan) -> Finding:
    job, eng = plan.job, plan.engine
    ro = job.rollout
    holds = int(eng.pool // eng.kv_per_token)
    longest = eng.request_tokens
    if ro.eval_response:
        longest = max(longest, ro.prompt + ro.eval_response)
    text = (f"KV pool {J.gib(eng.pool)} GiB per GPU = {holds:,} tokens per engine; {eng.running} requests in flight "
            f"per engine at {eng.request_tokens:,} tokens need {int(eng.running * eng.request_tokens):,}")
    if holds < longest:
        return Finding("plan.rollout_kv", Status.FAIL,
                       text + f"; one request of {longest:,} tokens does not fit: SGLang aborts it.",
                       f"Raise --sglang-mem-fraction-static or use `--rollout-num-gpus-per-engine {eng.tp * 2}`.",
                       COLOCATE_DOC)
    if holds < eng.running * eng.request_tokens:
        fit = holds // eng.request_tokens
        return Finding("plan.rollout_kv", Status.WARN,
                       text + f": {fit} of them fit at full length; SGLang queues or retracts the rest "
                       "(slower rollouts, not an out-of-memory).",
                       "Raise --sglang-mem-fraction-static where the GPU has room, use more GPUs per engine, "
                       "or lower --sglang-server-concurrency.", COLOCATE_DOC)
    return Finding("plan.rollout_kv", Status.PASS, text + ".")


def _host_finding(plan: P.Plan) -> Finding:
    host = plan.host
    if host.capacity is None:
        return Finding("plan.host_memory", Status.SKIP,
                       f"Host RAM per node: {J.gib(host.total)} GiB needed; the host's RAM is not known "
                       "(give --fixture CAPTURE or --host-ram GIB).")
    status = _status(host, host.capacity)
    fix = ""
    if status is not Status.PASS:
        fix = "Use nodes with more RAM, spread the actor over more nodes"
        if plan.job.train.cpu_adam:
            fix += ", or drop --optimizer-cpu-offload (its state then needs GPU memory)"
        if plan.job.train.ref:
            fix += "; the reference copy goes away only without KL (--kl-coef 0, no --use-kl-loss)"
    return Finding("plan.host_memory", status, f"Host RAM per node: {_share(host.total, host.capacity)}.", fix, FAQ_DOC)


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


STYLES = {"FAIL": "bold red", "WARN": "yellow", "PASS": "green"}


def peaks(plan: P.Plan) -> list[tuple[str, J.Phase]]:
    """Training and rollout apart, each with the phase that sets its peak; together where colocated."""
    out = []
    groups = (("training", ("training", "log-prob")), ("rollout", ("rollout",)), ("weight update", ("weight",)))
    for label, starts in groups:
        found = [p for p in plan.phases if any(w in p.name for w in starts)]
        if found:
            top = max(found, key=lambda p: p.total)
            out.append((f"{label} ({top.where})", top))
    if plan.job.colocate:
        out.append(("shared GPU, every phase", plan.peak("shared GPU")))
    return out + [("host RAM per node", plan.host)]


def render(planned: Planned, console) -> None:
    from rich.table import Table
    from rich.text import Text

    plan = planned.plan
    table = Table(title=f"slime-check plan: {planned.title}", title_justify="left", show_lines=False)
    table.add_column("phase / item")
    table.add_column("GiB", justify="right", no_wrap=True)
    table.add_column("how", no_wrap=True)
    table.add_column("detail")
    for phase in [*plan.phases, plan.host]:
        table.add_row(Text(f"{phase.name} [{phase.where}]", style="bold"), "", "", phase.note)
        for item in phase.items:
            table.add_row(f"  {item.label}", J.gib(item.bytes), item.kind, item.detail)
        capacity = phase.capacity
        style = STYLES.get(P.phase_verdict(phase), "")
        table.add_row(Text("  = peak", style=style), Text(J.gib(phase.total), style=style), "",
                      f"of {J.gib(capacity)}" if capacity else "")
    console.print(table)
    summary = Table(title="per-GPU peak (GiB)", title_justify="left")
    for column in ("where", "peak", "of", "share", "set by"):
        summary.add_column(column, justify="right" if column in ("peak", "of", "share") else "left")
    for where, phase in peaks(plan):
        capacity = phase.capacity
        style = STYLES.get(P.phase_verdict(phase), "")
        summary.add_row(where, Text(J.gib(phase.total), style=style), J.gib(capacity) if capacity else "?",
                        f"{100 * phase.total / capacity:.0f}%" if capacity else "", phase.name)
    console.print(summary)


def to_dict(planned: Planned) -> dict:
    plan = planned.plan
    job = plan.job

    def phase(p: J.Phase) -> dict:
        return {"name": p.name, "where": p.where, "note": p.note, "peak_bytes": int(p.total),
                "peak_gib": round(p.total / J.GIB, 3),
                "releasable_bytes": int(p.releasable),
                "capacity_bytes": p.capacity, "verdict": P.phase_verdict(p),
                "items": [{"item": i.label, "bytes": int(i.bytes), "gib": round(i.bytes / J.GIB, 3), "kind": i.kind,
                           "detail": i.detail} for i in p.items]}

    out = {"title": planned.title, "model_source": planned.model_source, "assumed": [note for note, _ in planned.notes],
           "gpu": {"name": job.card.name, "usable_bytes": job.card.usable, "source": job.card.source},
           "params": P.total_params(job.shape),
           "layout": {"actor_gpus": job.par.world, "tp": job.par.tp, "pp": job.par.pp, "cp": job.par.cp,
                      "dp": job.par.dp, "ep": job.par.ep, "colocate": job.colocate},
           "micro_batch_tokens": P.micro_batch_tokens(job.train, job.par),
           "phases": [phase(p) for p in plan.phases], "host": phase(plan.host),
           "peaks": {where: {"phase": p.name, "peak_bytes": int(p.total), "capacity_bytes": p.capacity,
                             "verdict": P.phase_verdict(p)} for where, p in peaks(plan)}}
    if plan.engine is not None:
        e = plan.engine
        out["engine"] = {"tp": e.tp, "engines": e.engines, "mem_fraction_static": e.mem_fraction,
                         "mem_fraction_source": e.mem_fraction_source, "kv_pool_bytes": int(e.pool),
                         "kv_bytes_per_token": e.kv_per_token, "requests_per_engine": e.running,
                         "kv_needed_bytes": int(e.need)}
    return out
