"""Training throughput of the Megatron actor vs HF transformers + SDPA, on one GPU; prints JSON.

Model: Qwen3-0.6B shapes (28 layers, hidden 1024, 16 heads, 8 KV heads, head_dim 128, FFN 3072,
vocab 151936, tied embeddings, QK-norm) with random bf16 weights, written once as an HF checkpoint.

- ``ours``: ``MegatronActor.train`` with ``--loss-type sft_loss --bf16``: one optimizer step of
  BATCH packed sequences per call (varlen flash attention, compiled RMSNorm/RoPE/SwiGLU, chunked
  vocab log-probs, megatron's distributed optimizer with fp32 master weights, foreach gradient
  clipping and torch's fused AdamW), the actor's real training path including packing, with
  ``--cuda-graph-impl local --cuda-graph-scope full_iteration --cuda-graph-warmup-steps 1`` (and
  ``--no-check-for-nan-in-loss-and-grad``, which megatron requires with them): after
  one eager step of a shape, its forward and backward replay from one CUDA graph
  (``backends/megatron/step_graphs.py``); ``cuda_graph_steps`` counts eager, captured and replayed steps.
- ``ours_no_cuda_graph``: the same without the CUDA graph flags. ``--profile`` times the phases of
  eager steps, so profile this variant to see where an eager step's host time goes.
- ``hf_sdpa``: ``Qwen3ForCausalLM(attn_implementation="sdpa")`` in bf16, loss from ``labels``,
  ``torch.optim.AdamW`` on the bf16 parameters (the baseline; on one H200, torch 2.11.0+cu130,
  megatron-core 0.16.1, medians of 3 separate processes, 2026-12-03: ours / HF = 1.72x at 8x1024,
  1.54x at 4x2048 and 1.41x at 2x4096, 38-40% MFU; without the CUDA graphs 0.99-1.07x).
- opt-in comparisons: ``ours_compiled_layers`` (every decoder layer wrapped in torch.compile;
  megatron's layer code breaks the graph in several places), ``ours_eager`` (nothing compiled) and
  ``ours_stock_optimizer`` (megatron's per-parameter loops and torch's default AdamW path instead
  of ``optimizer_kernels``).

Each step: forward, backward, optimizer. ``--warmup`` steps, then the mean of ``--steps`` steps.
FLOPs per step: 6 * N * tokens + 6 * layers * batch * seq^2 * heads * head_dim (causal attention,
forward and backward); MFU divides TFLOP/s by ``--peak-tflops`` (790: measured dense bf16 on H200).

``--profile`` then runs ``--profile-steps`` more steps of each variant and shape with every phase
bracketed by ``torch.cuda.synchronize()`` (packing, forward, log-probs, loss, backward, gradient
finalisation, the optimizer's parts, scheduler, metrics for ``ours``; forward, backward, optimizer
for ``hf_sdpa``). Each phase reports ``wall_ms`` (from an idle GPU to the phase's last kernel
done) and ``host_ms`` (Python time to issue it): host close to wall means the phase is bound by the
host, not the GPU. Then one step under ``torch.profiler`` gives the GPU time per kernel class and
the top kernels (``gpu_busy_ms`` against the step's ``wall_ms`` shows the GPU's idle time), the
host's time by operator, every place one step makes the host wait for the device (torch's sync
debug mode, counted by Python stack), and a few facts that decide speed: which attention kernel ran,
which optimizer kernels, torch.compile's graph counts. ``--trace-dir`` also writes a Chrome trace of
that step per variant and shape.

    python bench/train_throughput.py                     # 8 x 1024, 4 x 2048 and 2 x 4096
    python bench/train_throughput.py --variants ours,hf_sdpa,ours_compiled_layers
    python bench/train_throughput.py --variants ours_no_cuda_graph,hf_sdpa --profile --trace-dir traces
"""

from __future__ import annotations

import argparse
import functools
import gc
import gzip
import json
import os
import socket
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

QWEN3_06B = dict(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
    tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
)


def write_random_checkpoint(out: Path) -> int:
    """Random bf16 Qwen3-0.6B-shaped HF checkpoint in ``out``; returns its parameter count."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(Qwen3Config(**QWEN3_06B)).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    del model
    return n


def step_flops(n_params: int, batch: int, seq: int) -> float:
    c = QWEN3_06B
    attention = 6 * c["num_hidden_layers"] * batch * seq**2 * c["num_attention_heads"] * c["head_dim"]
    return 6 * n_params * batch * seq + attention


def timed(step, warmup: int, steps: int) -> tuple[float, float, list[float]]:
    """(mean seconds per step, peak GiB allocated, each step's milliseconds) over ``steps`` steps
    after ``warmup``.

    Each step's time is the GPU clock between CUDA events recorded after the steps, read once all
    have run: no host sync inside the loop, so a host-bound step is timed as it runs. They tell a
    process slowed by one stalled step from one slower at every step.
    """
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    start = time.perf_counter()
    marks[0].record()
    for mark in marks[1:]:
        step()
        mark.record()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / steps
    each_ms = [round(a.elapsed_time(b), 2) for a, b in zip(marks, marks[1:])]
    return seconds, torch.cuda.max_memory_allocated() / 2**30, each_ms


def tokens(batch: int, seq: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seq * 1000 + batch)
    return torch.randint(1, QWEN3_06B["vocab_size"], (batch, seq), generator=g)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# --profile


class PhaseClock:
    """Wall and host time of named (nested) phases, each bracketed by ``torch.cuda.synchronize()``.

    A phase starts on an idle GPU, so ``wall`` is the time to issue and finish it, and ``host`` the
    time Python spent issuing it. Nested phases are named "parent/child".
    """

    def __init__(self):
        self.wall = defaultdict(float)
        self.host = defaultdict(float)
        self.calls = defaultdict(int)
        self.order: list[str] = []  # paths in the order they first started
        self._stack: list[str] = []

    @contextmanager
    def phase(self, name: str):
        self._stack.append(name)
        path = "/".join(self._stack)
        if path not in self.order:
            self.order.append(path)
        torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            issued = time.perf_counter()
            torch.cuda.synchronize()
            done = time.perf_counter()
            self._stack.pop()
            self.wall[path] += done - start
            self.host[path] += issued - start
            self.calls[path] += 1

    def wrap(self, owner, attr: str, name: str):
        """Time every call of ``owner.attr`` as phase ``name``; returns the undo function."""
        original = getattr(owner, attr)
        had_own = attr in getattr(owner, "__dict__", {})

        @functools.wraps(original)
        def timed(*args, **kwargs):
            with self.phase(name):
                return original(*args, **kwargs)

        setattr(owner, attr, timed)

        def undo():
            if had_own:
                setattr(owner, attr, original)
            else:
                delattr(owner, attr)

        return undo

    def report(self, steps: int, root: str = "step") -> dict:
        """{phase: {"wall_ms", "host_ms", "calls"}} per step, children of ``root`` without its prefix."""
        out = {}
        for path in self.order:
            name = root if path == root else path.removeprefix(root + "/")
            out[name] = {"wall_ms": round(1000 * self.wall[path] / steps, 2),
                         "host_ms": round(1000 * self.host[path] / steps, 2),
                         "calls": round(self.calls[path] / steps, 2)}
        children = [p for p in self.wall if p.count("/") == 1 and p.startswith(root + "/")]
        out["unaccounted"] = {
            "wall_ms": round(1000 * (self.wall[root] - sum(self.wall[p] for p in children)) / steps, 2)
        }
        return out


def instrument_ours(actor, clock: PhaseClock) -> list:
    """Phase timers on ``MegatronActor.train``: the actor's own phases (``actor.phase``: pack, forward,
    log_probs, loss, metrics, optimizer, scheduler) and, inside megatron-core, the backward, the
    gradient reduction and the optimizer's parts. Returns undo functions."""
    from megatron.core import distributed as mdist
    from megatron.core.optimizer import optimizer as moptimizer
    from megatron.core.pipeline_parallel import schedules

    scope = actor.phase

    @contextmanager
    def timed_phase(name):
        with scope(name), clock.phase(name):
            yield

    actor.phase = timed_phase

    def restore():
        actor.phase = scope

    undo = [
        restore,
        clock.wrap(schedules, "backward_step", "backward"),
        clock.wrap(mdist, "finalize_model_grads", "grad_finalize"),
        clock.wrap(moptimizer, "get_grad_norm_fp32", "grad_norm"),
        clock.wrap(moptimizer, "clip_grad_by_total_norm_fp32", "clip"),
        clock.wrap(actor.model, "start_param_sync", "param_gather"),
    ]
    for sub in getattr(actor.optimizer, "chained_optimizers", [actor.optimizer]):
        undo += [clock.wrap(sub, "_copy_model_grads_to_main_grads", "grads_to_fp32"),
                 clock.wrap(sub.optimizer, "step", "adam"),
                 clock.wrap(sub, "_copy_main_params_to_model_params", "params_to_bf16")]
    return undo


def profile_phases(step, instrument, steps: int) -> dict:
    clock = PhaseClock()
    undo = instrument(clock)
    try:
        for _ in range(steps):
            with clock.phase("step"):
                step()
    finally:
        for fn in reversed(undo):
            fn()
    return clock.report(steps)


KERNEL_CLASSES = (  # (class, substrings of the kernel name), first match wins
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "matmul")),
    ("attention", ("flash", "fmha", "attention")),
    ("triton (compiled)", ("triton",)),
    ("multi_tensor (foreach/fused optim)", ("multi_tensor", "foreach", "fused_adam", "fusedadam")),
    ("reduce", ("reduce", "norm")),
    ("copy/cast", ("copy", "memcpy", "memset", "fill", "cast")),
    ("index/gather/scatter", ("index", "gather", "scatter", "embedding")),
    ("elementwise", ("elementwise", "vectorized", "unrolled")),
    ("nccl", ("nccl",)),
)


def kernel_profile(step, trace_path: Path | None, top: int) -> dict:
    """One step under torch.profiler: GPU time per kernel class, the top kernels, GPU busy vs wall."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    per_kernel = defaultdict(lambda: [0.0, 0])  # name -> [ms, count], device-side events only
    for evt in prof.events():
        if evt.device_type == DeviceType.CUDA:
            per_kernel[evt.name][0] += evt.time_range.elapsed_us() / 1000
            per_kernel[evt.name][1] += 1
    rows = sorted(((name, ms, n) for name, (ms, n) in per_kernel.items()), key=lambda r: -r[1])
    classes = defaultdict(float)
    for name, ms, _ in rows:
        low = name.lower()
        kind = next((c for c, keys in KERNEL_CLASSES if any(k in low for k in keys)), "other")
        classes[kind] += ms
    if trace_path is not None:
        raw = trace_path.with_suffix("")
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as f, gzip.open(trace_path, "wb") as out:
            out.write(f.read())
        raw.unlink()
    host_ops = sorted((e for e in prof.key_averages() if e.self_cpu_time_total > 0),
                      key=lambda e: -e.self_cpu_time_total)
    return {
        "wall_ms": round(wall * 1000, 2),
        "gpu_busy_ms": round(sum(r[1] for r in rows), 2),
        "kernel_launches": sum(r[2] for r in rows),
        "by_class_ms": {k: round(v, 2) for k, v in sorted(classes.items(), key=lambda kv: -kv[1])},
        "top_kernels": [[name[:100], round(ms, 3), n] for name, ms, n in rows[:top]],
        # host time by operator, own time only: a device wait shows up as cudaStreamSynchronize,
        # cudaMemcpyAsync or aten::_local_scalar_dense near the top
        "top_host_ops": [[e.key[:100], round(e.self_cpu_time_total / 1000, 3), e.count] for e in host_ops[:top]],
    }


def sync_points(step, top: int) -> list:
    """Where one step makes the host wait for the device: torch's sync debug mode warns at every
    synchronising call; each warning's Python stack is counted by its innermost frames."""
    import traceback
    import warnings

    here = os.path.abspath(__file__)
    seen: dict[str, int] = defaultdict(int)
    original = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1]
                  if "/warnings.py" not in f.filename and f.filename != here]
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames[-4:]))
        seen[where] += 1

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = original
    return [[where, n] for where, n in sorted(seen.items(), key=lambda kv: -kv[1])[:top]]


def diagnostics_ours(actor) -> dict:
    """Which attention, optimizer and compiled paths the actor actually used."""
    from megatron.core.optimizer import clip_grads
    from torch._dynamo.utils import counters

    from slime_ref.backends.megatron import layers, optimizer_kernels

    inner = optimizer_kernels.torch_adam_optimizers(actor.optimizer)
    return {
        "varlen_attention": {"available": layers.varlen_attention() is not None,
                             "failed": list(layers._varlen_unusable),
                             "fallback_calls": dict(FALLBACK_CALLS)},
        "optimizer": {"megatron": [type(o).__name__ for o in getattr(actor.optimizer, "chained_optimizers", [])],
                      "inner": [type(o).__name__ for o in inner],
                      "fused": [bool(g.get("fused")) for o in inner for g in o.param_groups],
                      "foreach": [g.get("foreach") for o in inner for g in o.param_groups],
                      "l2_norm": clip_grads.l2_norm_impl.__name__,
                      "scale": clip_grads.multi_tensor_scale_impl.__name__},
        "dynamo": {"stats": dict(counters["stats"]), "graph_breaks": sum(counters["graph_break"].values()),
                   "frames": dict(counters["frames"])},
    }


FALLBACK_CALLS = {"attention_padded": 0, "attention_per_sequence": 0}


def count_attention_fallbacks() -> None:
    """Count calls of the non-flash attention paths (both 0 when varlen flash attention ran)."""
    from slime_ref.backends.megatron import layers

    for name in FALLBACK_CALLS:
        original = getattr(layers, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            FALLBACK_CALLS[_name] += 1
            return _original(*args, **kwargs)

        setattr(layers, name, counted)


def progress(variant: str, key: str, tokens_per_step: int, seconds: float, peak: float) -> None:
    """One line per measurement on stderr as it comes, so that a run cut short still shows it."""
    print(f"[{variant} {key}] {seconds * 1000:.1f} ms/step, {tokens_per_step / seconds:,.0f} tok/s, "
          f"peak {peak:.1f} GiB", file=sys.stderr, flush=True)


def profile_step(step, instrument, name: str, opts) -> dict:
    """--profile: the phase breakdown and the kernel profile of ``step`` (errors reported, not raised)."""
    out = {}
    try:
        out["phases"] = profile_phases(step, instrument, opts.profile_steps)
    except Exception as e:  # keep the rest of the run
        out["phases"] = {"error": f"{type(e).__name__}: {e}"}
    try:
        out["sync_points"] = sync_points(step, opts.top_kernels)
    except Exception as e:
        out["sync_points"] = {"error": f"{type(e).__name__}: {e}"}
    try:
        trace = opts.trace_dir / f"{name}.json.gz" if opts.trace_dir else None
        out["kernels"] = kernel_profile(step, trace, opts.top_kernels)
    except Exception as e:
        out["kernels"] = {"error": f"{type(e).__name__}: {e}"}
    return out


OURS_VARIANTS = ("ours", "ours_no_cuda_graph", "ours_compiled_layers", "ours_eager", "ours_stock_optimizer")


@contextmanager
def variant_setup(variant: str):
    """Patch the backend for a comparison variant of ``ours`` while its actor is built and run.

    - ``ours_eager``: no torch.compile: our RMSNorm, RoPE and log-prob kernels and megatron's
      SwiGLU / bias-dropout-add fusions run eagerly (is compiling them worth it?).
    - ``ours_stock_optimizer``: megatron's per-parameter optimizer loops and torch's default
      multi-tensor AdamW, as before ``optimizer_kernels`` (what do the optimizer kernels gain?).
    """
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as moptimizer

    from slime_ref.backends.megatron import actor as actor_module
    from slime_ref.backends.megatron import layers, logprobs, optimizer_kernels

    saved = []

    def patch(owner, attr, value):
        saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)

    if variant == "ours_eager":
        for module, name in [(layers, "rms_norm"), (layers, "norm_rope_qk"), (logprobs, "_chunk_stats"),
                             (logprobs, "_chunk_grad"), (logprobs, "_dense_grad")]:
            patch(module, name, getattr(module, name).__wrapped__)
        build = actor_module.transformer_config
        patch(actor_module, "transformer_config", lambda arch, args: build(arch, args, use_gpu_fusions=False))
    if variant == "ours_stock_optimizer":
        patch(clip_grads, "l2_norm_impl", utils.local_multi_tensor_l2_norm)
        patch(clip_grads, "multi_tensor_scale_impl", utils.local_multi_tensor_scale)
        patch(moptimizer, "multi_tensor_scale_impl", utils.local_multi_tensor_scale)
        patch(optimizer_kernels, "install", lambda: False)
        patch(optimizer_kernels, "use_fused_adam", lambda optimizer: 0)
    try:
        yield
    finally:
        for owner, attr, value in reversed(saved):
            setattr(owner, attr, value)


def bench_ours(model_dir: Path, shapes, warmup: int, steps: int, variant: str, opts) -> dict:
    with variant_setup(variant):
        return _bench_ours(model_dir, shapes, warmup, steps, variant, opts)


def _bench_ours(model_dir: Path, shapes, warmup: int, steps: int, variant: str, opts) -> dict:
    from slime_ref.arguments import build_parser, validate_args
    from slime_ref.backends.megatron.actor import MegatronActor
    from slime_ref.backends.megatron.megatron_flags import add_megatron_arguments

    results = {}
    actor = None
    for batch, seq in shapes:
        argv = ["--hf-checkpoint", str(model_dir), "--bf16", "--loss-type", "sft_loss", "--lr", "1e-5",
                "--rollout-batch-size", str(batch), "--n-samples-per-prompt", "1", "--num-rollout", "1000",
                "--global-batch-size", str(batch), "--micro-batch-size", str(batch),
                "--attention-dropout", "0", "--hidden-dropout", "0", "--use-distributed-optimizer"]
        if variant != "ours_no_cuda_graph":  # each shape's step replayed from a CUDA graph after one eager step
            argv += ["--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration",
                     "--no-check-for-nan-in-loss-and-grad", "--cuda-graph-warmup-steps", "1"]
        args = validate_args(add_megatron_arguments(build_parser()).parse_args(argv))
        if actor is None:
            actor = MegatronActor(args, rank=0, world_size=1, master_port=free_port())
            if variant == "ours_compiled_layers":
                for layer in actor.model.module.decoder.layers:
                    layer.compile(dynamic=True)
        actor.args = args
        if actor.step_graphs is not None:
            actor.step_graphs.counts = dict.fromkeys(actor.step_graphs.counts, 0)
        ids = tokens(batch, seq).tolist()
        data = {"tokens": ids, "response_lengths": [seq - 1] * batch, "loss_masks": [[1] * (seq - 1)] * batch,
                "rewards": [0.0] * batch, "raw_reward": [0.0] * batch, "truncated": [0] * batch,
                "sample_indices": list(range(batch))}
        counter = iter(range(10**6))

        def step(actor=actor, counter=counter, data=data):
            return actor.train(next(counter), data)

        seconds, peak, each_ms = timed(step, warmup, steps)
        key = f"{batch}x{seq}"
        results[key] = {"step_s": seconds, "peak_gib": peak, "step_ms_each": each_ms}
        if actor.step_graphs is not None:  # this shape's steps (the counts restart for each shape)
            results[key]["cuda_graph_steps"] = dict(actor.step_graphs.counts)
        progress(variant, key, batch * seq, seconds, peak)
        if opts.profile:
            results[key].update(
                profile_step(step, lambda clock, actor=actor: instrument_ours(actor, clock), f"{variant}_{key}", opts)
            )
    if opts.profile:
        results["diagnostics"] = diagnostics_ours(actor)
    actor = None
    gc.collect()
    torch.cuda.empty_cache()
    return results


def bench_hf(model_dir: Path, shapes, warmup: int, steps: int, opts) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    results = {}
    for batch, seq in shapes:
        ids = tokens(batch, seq).cuda()
        clock = None  # set while profiling

        @contextmanager
        def phase(name):  # reads the clock `instrument` sets for this shape
            if clock is None:  # noqa: B023
                yield
            else:
                with clock.phase(name):  # noqa: B023
                    yield

        def step(ids=ids):
            with phase("forward"):  # the loss from labels is part of HF's forward
                loss = model(input_ids=ids, labels=ids).loss
            with phase("backward"):
                loss.backward()
            with phase("optimizer"):
                optimizer.step()
            with phase("zero_grad"):
                optimizer.zero_grad(set_to_none=True)

        def instrument(c):
            nonlocal clock
            clock = c

            def undo():
                nonlocal clock
                clock = None

            return [undo]

        seconds, peak, each_ms = timed(step, warmup, steps)
        key = f"{batch}x{seq}"
        results[key] = {"step_s": seconds, "peak_gib": peak, "step_ms_each": each_ms}
        progress("hf_sdpa", key, batch * seq, seconds, peak)
        if opts.profile:
            results[key].update(profile_step(step, instrument, f"hf_sdpa_{key}", opts))
    model = optimizer = None
    gc.collect()
    torch.cuda.empty_cache()
    return results


def summary_text(report: dict, profile: dict, top: int) -> str:
    """The --profile results as a few aligned tables (also in the JSON)."""
    lines = []
    variants = list(profile)
    for key, row in report["results"].items():
        head = "  ".join(f"{v} {row[v]['tokens_per_s']} tok/s ({row[v]['step_ms']} ms)"
                         for v in variants if "tokens_per_s" in row.get(v, {}))
        lines += ["", f"== {key}: {head}  ours/hf {row.get('ours_vs_hf_sdpa', '-')}"]
        phases = {v: profile[v].get(key, {}).get("phases", {}) for v in variants}
        names = []
        for v in variants:
            names += [n for n in phases[v] if n not in names and n != "error"]
        lines.append(f"{'phase (ms per step)':<32}" + "".join(f"{v + ' wall/host':>34}" for v in variants))
        for n in names:
            cells = []
            for v in variants:
                ph = phases[v].get(n)
                if not ph:
                    cells.append("")
                    continue
                host = f"{ph['host_ms']:<8.2f}" if "host_ms" in ph else f"{'-':<8}"
                cells.append(f"{ph['wall_ms']:>10.2f} / {host} x{ph.get('calls', 1):<5g}")
            lines.append(f"{'  ' * n.count('/') + n:<32}" + "".join(f"{c:>34}" for c in cells))
        for v in variants:
            if "error" in phases[v]:
                lines.append(f"  {v} phases: {phases[v]['error']}")
        for v in variants:
            k = profile[v].get(key, {}).get("kernels", {})
            if "error" in k or not k:
                lines.append(f"{v} kernels: {k.get('error', 'none')}")
                continue
            classes = ", ".join(f"{c} {ms}" for c, ms in k["by_class_ms"].items())
            lines.append(f"{v} GPU busy {k['gpu_busy_ms']} of {k['wall_ms']} ms wall, {k['kernel_launches']} kernels: "
                         f"{classes}")
            for name, ms, n in k["top_kernels"][:top]:
                lines.append(f"    {ms:>9.3f} ms {n:>5}x  {name}")
            lines.append(f"{v} host time by operator (own time):")
            for name, ms, n in k.get("top_host_ops", [])[:top]:
                lines.append(f"    {ms:>9.3f} ms {n:>5}x  {name}")
            syncs = profile[v].get(key, {}).get("sync_points")
            if syncs:
                lines.append(f"{v} host waits for the device at:")
                lines += [f"    {n:>5}x  {where}" for where, n in syncs] if isinstance(syncs, list) \
                    else [f"    {syncs}"]
    for v in variants:
        if "diagnostics" in profile[v]:
            lines.append(f"{v} diagnostics: {json.dumps(profile[v]['diagnostics'])}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="8x1024,4x2048,2x4096", help="comma-separated BATCHxSEQ")
    parser.add_argument("--variants", default="ours,hf_sdpa",
                        help="comma-separated: ours, hf_sdpa, ours_no_cuda_graph, ours_compiled_layers, ours_eager, "
                             "ours_stock_optimizer")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--profile", action="store_true", help="per-phase and per-kernel breakdown of each step")
    parser.add_argument("--profile-steps", type=int, default=3, help="synchronised steps the phase times average")
    parser.add_argument("--top-kernels", type=int, default=12, help="kernels listed per variant and shape")
    parser.add_argument("--trace-dir", type=Path, default=None, help="with --profile: Chrome traces (.json.gz) here")
    a = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"error": "needs a CUDA GPU"}))
        sys.exit(2)
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    variants = a.variants.split(",")
    if a.trace_dir:
        a.trace_dir.mkdir(parents=True, exist_ok=True)
    if a.profile:
        count_attention_fallbacks()

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "qwen3-0.6b-random"
        n_params = write_random_checkpoint(model_dir)
        raw = {}
        for variant in variants:
            try:
                if variant == "hf_sdpa":
                    raw[variant] = bench_hf(model_dir, shapes, a.warmup, a.steps, a)
                elif variant in OURS_VARIANTS:
                    raw[variant] = bench_ours(model_dir, shapes, a.warmup, a.steps, variant, a)
                else:
                    raise ValueError(f"unknown variant; known: hf_sdpa, {', '.join(OURS_VARIANTS)}")
            except Exception as e:  # report the variant's failure, keep the others
                raw[variant] = {"error": f"{type(e).__name__}: {e}"}
            if a.out:  # what is measured so far survives a run cut short
                a.out.write_text(json.dumps({"partial": raw}, default=str) + "\n")

    report = {
        "model": "Qwen3-0.6B shapes, random bf16 weights",
        "parameters": n_params,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "flops_per_step": "6*N*tokens + 6*layers*batch*seq^2*heads*head_dim",
        "peak_tflops": a.peak_tflops,
        "results": {},
    }
    profile = {}
    for batch, seq in shapes:
        key = f"{batch}x{seq}"
        row = {}
        for variant, res in raw.items():
            if "error" in res:
                row[variant] = res
                continue
            s = res[key]["step_s"]
            tflops = step_flops(n_params, batch, seq) / s / 1e12
            row[variant] = {"tokens_per_s": round(batch * seq / s), "tflops": round(tflops, 1),
                            "mfu": round(tflops / a.peak_tflops, 4), "step_ms": round(s * 1000, 1),
                            "peak_gib": round(res[key]["peak_gib"], 1), "step_ms_each": res[key]["step_ms_each"]}
            if "cuda_graph_steps" in res[key]:
                row[variant]["cuda_graph_steps"] = res[key]["cuda_graph_steps"]
            if a.profile:
                profile.setdefault(variant, {})[key] = {k: res[key][k] for k in ("phases", "kernels", "sync_points")
                                                        if k in res[key]}
        if "tokens_per_s" in row.get("ours", {}) and "tokens_per_s" in row.get("hf_sdpa", {}):
            row["ours_vs_hf_sdpa"] = round(row["ours"]["tokens_per_s"] / row["hf_sdpa"]["tokens_per_s"], 3)
        report["results"][key] = row
    for variant, res in raw.items():
        if a.profile and "diagnostics" in res:
            profile.setdefault(variant, {})["diagnostics"] = res["diagnostics"]
    if a.profile:
        report["profile"] = profile
    text = json.dumps(report, indent=1)
    if a.out:
        a.out.write_text(text + "\n")
    if a.profile:
        # the headline JSON last, so that it ends the output; the full profile is in --out
        summary = summary_text(report, profile, min(a.top_kernels, 8))
        print(summary)
        if a.out:
            a.out.with_suffix(".txt").write_text(summary + "\n")
        print(json.dumps({k: v for k, v in report.items() if k != "profile"}, indent=2))
    else:
        print(text)


if __name__ == "__main__":
    main()
