"""``slime-check plan``, the engine and host side: SGLang's static pool and KV arithmetic, its
CUDA graphs and working set, the weight update, and host RAM per node.

What is exact and what is an estimate is said in :mod:`slime_check.plan`'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass

from slime_check.plan import (
    CUDA_CONTEXT,
    HOST_PER_SGLANG_RANK,
    HOST_PER_TRAIN_RANK,
    NCCL_BUFFERS,
    SGLANG_GRAPH_POOL,
    SGLANG_START_CONTEXT,
    _overhead,
    optimizer_bytes_per_param,
    param_tensors,
    state_items,
    total_params,
)
from slime_check.plan_job import GIB, MIB, Job, Phase, Shape, gib

# ---------------------------------------------------------------------------------------------
# Rollout (SGLang)
# ---------------------------------------------------------------------------------------------


@dataclass
class Engine:
    """One SGLang engine's arithmetic, per GPU."""

    tp: int
    engines: int
    mem_fraction: float
    mem_fraction_source: str
    weights: float
    kv_per_token: float
    pre: float  # free memory after SGLang's CUDA/NCCL start-up
    static: float  # what SGLang claims: context + weights + KV pool
    pool: float
    running: int  # requests in flight on one engine
    need: float  # KV those requests need at full length
    request_tokens: int
    graph_bs: int
    context: float  # what SGLang holds beside weights, pool and graphs once serving (context, kernels, NCCL)


def sglang_default_mem_fraction(job: Job, tp: int, graph_bs: int, prefill_bs_count: int) -> float:
    """SGLang 0.5.15's default ``mem_fraction_static`` (``server_args._handle_gpu_memory_settings``)."""
    ro, gpu_mem = job.rollout, job.card.smi_mib
    chunk = ro.chunked_prefill or default_chunked_prefill(gpu_mem)
    reserved = 512 + max(chunk, 2048) * 1.5
    if ro.graphs:
        reserved += graph_bs * 2
    reserved += tp * ro.pp / 8 * 1024
    if ro.prefill_graphs and ro.graphs:
        reserved += 1.5 * 1024 if job.shape.mla else prefill_bs_count * 8
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mem - reserved) / gpu_mem, 3)


def default_chunked_prefill(gpu_mem_mib: int) -> int:
    for below, size in ((35, 2048), (60, 4096), (160, 8192)):
        if gpu_mem_mib < below * 1024:
            return size
    return 16384


def default_graph_max_bs(gpu_mem_mib: int, tp: int) -> int:
    if gpu_mem_mib < 20 * 1024:
        return 8
    if gpu_mem_mib < 35 * 1024:
        return 24 if tp < 4 else 80
    if gpu_mem_mib < 60 * 1024:
        return 32 if tp < 4 else 160
    if gpu_mem_mib < 160 * 1024:
        return 256 if tp < 4 else 512
    return 512


def prefill_graph_sizes(max_bs: int) -> int:
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + list(range(576, 1025, 64))
             + list(range(1280, 4097, 256)) + list(range(4608, max_bs + 1, 512)))
    return sum(1 for s in sizes if s <= max_bs)


def kv_bytes_per_token(shape: Shape, tp: int, pp: int, dtype_bytes: int) -> float:
    layers = shape.layers / pp
    if shape.mla:
        return (shape.mla.kv_lora + shape.mla.qk_pos) * layers * dtype_bytes
    heads = max(1, shape.kv_heads // tp)  # SGLang replicates KV heads when TP exceeds them
    return 2 * heads * shape.head_dim * layers * dtype_bytes


def engine(job: Job) -> Engine:
    ro, shape = job.rollout, job.shape
    tp = max(1, ro.per_engine // ro.pp)
    engines = max(1, ro.gpus // ro.per_engine)
    graph_bs = ro.graph_max_bs or default_graph_max_bs(job.card.smi_mib, tp)
    chunk = ro.chunked_prefill or default_chunked_prefill(job.card.smi_mib)
    if ro.mem_fraction is not None:
        mf, source = ro.mem_fraction, "--sglang-mem-fraction-static"
    else:
        mf = sglang_default_mem_fraction(job, tp, graph_bs, prefill_graph_sizes(chunk))
        source = "SGLang's default for this card"
    embeddings = shape.vocab * shape.hidden * (1 if shape.tied else 2)  # kept in bf16 by FP8 checkpoints
    weights = ((total_params(shape) - embeddings) * ro.weight_bytes + 2 * embeddings) / (tp * ro.pp)
    start = (SGLANG_START_CONTEXT + (NCCL_BUFFERS if tp * ro.pp > 1 else 0)) * GIB
    pre = job.card.usable - start
    static = job.card.usable - pre * (1 - mf)
    pool = pre * mf - weights
    kv = kv_bytes_per_token(shape, tp, ro.pp, ro.kv_bytes)
    running = -(-ro.requests // engines)
    if ro.max_running:
        running = min(running, ro.max_running)
    request = ro.prompt + ro.response
    # SGLang sizes its pool from the memory free after its start; serving then loads more kernels and workspaces
    context = start + (CUDA_CONTEXT - SGLANG_START_CONTEXT) * GIB
    return Engine(tp, engines, mf, source, weights, kv, pre, static, pool, running, running * request * kv, request,
                  graph_bs, context)


def decode_bytes_per_request(shape: Shape, tp: int) -> float:
    """Working set of one request in a decode step (reused across layers) plus its fp32 logits."""
    h, f = shape.hidden, (shape.moe_ffn * shape.topk if shape.experts else shape.ffn)
    qkv = (shape.heads + 2 * shape.kv_heads) * shape.head_dim if not shape.mla else shape.heads * 3 * shape.mla.qk_head
    return 2 * 4 * h + 2 * qkv / tp + 2 * 3 * f / tp + shape.vocab * (2 / tp + 4)


def rollout_phase(job: Job) -> tuple[Phase, Engine]:
    eng = engine(job)
    shape, ro = job.shape, job.rollout
    phase = Phase(f"rollout (SGLang, {eng.engines} engine(s) of TP {eng.tp}"
                  + (f" x PP {ro.pp}" if ro.pp > 1 else "") + ")", "shared GPU" if job.colocate else "rollout GPU")
    phase.add("SGLang context + NCCL", eng.context, "estimate",
              "what it used when it sized its pool, and the kernels and workspaces it loads once serving")
    phase.add("SGLang weights", eng.weights, "exact",
              f"{total_params(shape) / 1e9:.2f} B parameters x {ro.weight_bytes:g} B / {eng.tp * ro.pp} GPUs"
              + (" (embeddings in bf16)" if ro.weight_bytes != 2 else ""))
    phase.add("KV cache pool (static)", max(0.0, eng.pool), "exact",
              f"{eng.mem_fraction:g} of {gib(eng.pre)} GiB free at start ({eng.mem_fraction_source}), "
              "less the weights; "
              f"{eng.kv_per_token / 1024:.1f} KiB per token")
    graphs = 0.0
    if ro.graphs:
        graphs = eng.graph_bs * decode_bytes_per_request(shape, eng.tp) + SGLANG_GRAPH_POOL * GIB
        phase.add("CUDA graphs", graphs, "estimate", f"decode batch sizes up to {eng.graph_bs}")
    chunk = ro.chunked_prefill or default_chunked_prefill(job.card.smi_mib)
    h, f = shape.hidden, (shape.moe_ffn * shape.topk if shape.experts else shape.ffn)
    qkv = (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    prefill = chunk * (2 * 4 * h + 2 * 3 * f / eng.tp + 2 * qkv / eng.tp)
    sampling = eng.running * shape.vocab * 4 * 3
    phase.add("prefill / sampling working set", max(prefill, sampling), "estimate",
              f"chunked prefill {chunk} tokens, or {eng.running} requests' fp32 logits x 3")
    if job.colocate:
        n = 2 if job.train.critic else 1
        phase.add("trainer asleep (colocated)", n * CUDA_CONTEXT * GIB, "estimate",
                  "torch_memory_saver released weights, gradients, optimizer; the context stays")
    elif job.trains:
        phase.add("NCCL group for weight updates", NCCL_BUFFERS * GIB, "estimate",
                  "joined after start-up: the trainer broadcasts its weights into the engines")
    return phase, eng


def update_phase(job: Job) -> Phase:
    """Pushing the trainer's weights into the engines (colocated: engine weights back on, KV not yet)."""
    buffer = 2 * 512 * MIB  # --update-weight-buffer-size bucket, gathered and flattened
    if job.colocate:
        eng = engine(job)
        phase = Phase("weight update", "shared GPU")
        phase.add("SGLang context + weights", eng.context + eng.weights, "exact")
        phase.add("update buckets", buffer, "estimate", "gathered HF tensors and their flattened bucket")
        phase.add("trainer context (asleep otherwise)", CUDA_CONTEXT * GIB, "estimate")
        return phase
    phase = Phase("weight update", "actor GPU")
    items, _ = state_items(job, job.par.pp - 1)
    phase.items += items
    phase.add("update buckets", buffer, "estimate")
    _overhead(job, phase, sleeping_engine=False)
    return phase


# ---------------------------------------------------------------------------------------------
# Host memory
# ---------------------------------------------------------------------------------------------


def pinned(numel_bytes: int) -> int:
    """torch's pinned host allocator rounds every allocation up to a power of two."""
    return 1 << max(0, (numel_bytes - 1).bit_length()) if numel_bytes > 0 else 0


def host_phase(job: Job) -> Phase:
    """Host RAM of one node: per training rank times the ranks on a node, plus the engines' processes."""
    phase = Phase("host RAM per node", "host per node", capacity=job.host_ram)
    if job.trains:  # --debug-rollout-only starts no trainer
        _training_host(job, phase)
    if job.rollout is not None:
        engine_gpus = min(job.rollout.gpus, job.gpus_per_node)
        phase.add("SGLang processes", engine_gpus * HOST_PER_SGLANG_RANK * GIB, "estimate",
                  f"{engine_gpus} x {HOST_PER_SGLANG_RANK:g} GiB")
    return phase


def _training_host(job: Job, phase: Phase) -> None:
    tr, par = job.train, job.par
    ranks = min(par.world, job.gpus_per_node)
    tensors = max((param_tensors(job.shape, par, s) for s in range(par.pp)), key=lambda ts: sum(t.numel for t in ts))
    one_copy = sum(pinned(2 * t.numel) for t in tensors)
    copies = ["actor"] + (["reference"] if tr.ref else []) \
        + (["old actor", "rollout actor"] if tr.keep_old_actor else []) \
        + (["teacher"] if tr.teacher else [])
    phase.add("pinned weight backups", ranks * one_copy * len(copies), "exact",
              f"{', '.join(copies)}: {gib(one_copy)} GiB each per rank (power-of-two pinned blocks) x {ranks} ranks")
    _, counts = state_items(job, par.pp - 1)
    if tr.cpu_adam:
        per = (optimizer_bytes_per_param(tr, on_host=True) + 4) * counts["shard"] * tr.cpu_adam_fraction
        phase.add("CPU Adam (--optimizer-cpu-offload)", ranks * per, "exact",
                  "master weights, 2 moments and fp32 gradients of the rank's shard")
    if tr.offload_train and not (tr.cpu_adam and tr.cpu_adam_fraction >= 1):
        on_gpu = 1 - (tr.cpu_adam_fraction if tr.cpu_adam else 0)
        per = optimizer_bytes_per_param(tr, job.bf16) * counts["shard"] * on_gpu
        phase.add("offloaded optimizer (--offload-train)", ranks * per, "exact",
                  "torch_memory_saver's CPU copy while the trainer sleeps (weights and gradients are not copied)")
    if tr.critic:
        critic, ccounts = state_items(job, par.pp - 1, critic=True)
        per = 2 * ccounts["params"] + optimizer_bytes_per_param(tr, job.bf16) * ccounts["shard"]
        phase.add("critic asleep (weights + optimizer)", ranks * per, "exact")
    phase.add("training processes", ranks * HOST_PER_TRAIN_RANK * GIB, "estimate",
              f"{ranks} x {HOST_PER_TRAIN_RANK:g} GiB")
